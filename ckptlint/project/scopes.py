"""Lexical scopes of a module: which bindings a name may refer to at a given place.

A scope records every binding of every name in source order; a lookup folds those bindings
the way control flow would: an unconditional binding replaces what came before, a binding
under ``if``/``for``/``while``/``except``/``match`` adds an alternative. Lookups follow
Python's rules (function locals, ``global``/``nonlocal``, class bodies invisible from
methods) and keep source order, so results never depend on hashing.

Statements are visited recursively (Python itself bounds their nesting); expressions, whose
depth the input controls (``a + a + ...``, nested calls, nested lambdas), iteratively.
"""

from __future__ import annotations

import ast
import re
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

from ckptlint.lazy_tree import mark_read
from ckptlint.memos import process_memo

ScopeKind = Literal["module", "class", "function"]
Position = tuple[int, int]
COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
# The nodes a walk of a body starts from: its statements, or ``[lambda.body]``.
Body = Sequence[ast.AST]


@dataclass(frozen=True)
class ImportTarget:
    """What an import statement binds: ``from <level dots><module> import <name>`` or, with
    ``name`` None, ``import <module>`` (binding the module itself)."""

    level: int
    module: str
    name: str | None


@dataclass(frozen=True, eq=False, slots=True)
class Binding:
    """One place where a name is bound.

    ``value`` is the assigned expression (``name = value``, walrus, the iterable of a ``for``
    when ``iterated``); ``path`` picks the element of a tuple target (``a, (b, c) = ...``);
    ``imported`` says what an import binds. Definitions, parameters and other bindings
    have neither value nor import.
    """

    name: str
    node: ast.AST
    scope: Scope
    position: Position
    conditional: bool
    value: ast.expr | None = None
    imported: ImportTarget | None = None
    iterated: bool = False
    path: tuple[int, ...] = ()
    # The sides of the ``if`` statements (outside loops) the binding is made in, each as
    # (the statement's id, 0 for its body, 1 for its ``else``): see ``Scope.exclusive``.
    sides: tuple[tuple[int, int], ...] = ()
    # The scope whose code makes the binding, where it is not ``scope``: a function that
    # rebinds a global (``global fn; fn = lambda: ...``). Its value is evaluated there.
    runs_in: Scope | None = None


@dataclass(eq=False)
class Scope:
    kind: ScopeKind
    node: ast.AST
    parent: Scope | None
    bindings: dict[str, list[Binding]] = field(default_factory=dict)
    global_names: set[str] = field(default_factory=set)
    nonlocal_names: set[str] = field(default_factory=set)
    # For class scopes: ``self.<attr> = value`` assignments made in the class's methods.
    instance_attributes: dict[str, list[Binding]] = field(default_factory=dict)
    # For method scopes: the name of the instance parameter (``self``).
    self_name: str | None = None
    # For the module scope: ``from <module> import *`` statements, in order.
    star_imports: list[ImportTarget] = field(default_factory=list)
    # The sides of its ``if`` statements (outside loops): where each starts and ends, and
    # its (statement id, side). A use on one side never sees a binding on the other (the
    # branches of an ``if``/``elif`` chain are exclusive).
    exclusive: list[tuple[Position, Position, tuple[int, int]]] = field(default_factory=list)
    # How many times ``bind`` added to ``bindings`` (scopes built on demand later add
    # bindings to the module's: ``global x`` in a function): what keeps an index current.
    bound: int = 0
    # For the module scope: its bindings by the top-level statement they are made in.
    _by_statement: tuple[int, dict[int, list[Binding]]] | None = field(
        default=None, repr=False, compare=False
    )
    # ``all_reaching``'s folds, each with the ``bound`` it was made at.
    _reaching: dict[str, tuple[int, list[Binding]]] | None = field(
        default=None, repr=False, compare=False
    )

    def __repr__(self) -> str:
        name = getattr(self.node, "name", type(self.node).__name__)
        return f"<{self.kind} scope {name}@{getattr(self.node, 'lineno', 0)}>"

    @property
    def module(self) -> Scope:
        scope = self
        while scope.parent is not None:
            scope = scope.parent
        return scope

    @property
    def enclosing_class(self) -> Scope | None:
        """The class whose method this scope is, when it is a method."""
        if self.self_name is not None and self.parent is not None:
            return self.parent
        return None

    def bindings_near(self, sorted_lines: list[int]) -> list[Binding]:
        """The module scope's bindings made in the top-level statements holding one of
        ``sorted_lines`` (ascending): what a look at a few lines of a long module needs,
        found without walking every binding of it."""
        body: list[ast.stmt] = self.node.body  # type: ignore[attr-defined]
        known = self._by_statement
        if known is None or known[0] != self.bound:
            starts = _starts(body)
            groups: dict[int, list[Binding]] = {}
            for bindings in self.bindings.values():
                for binding in bindings:
                    index = bisect_right(starts, binding.position[0]) - 1
                    groups.setdefault(index, []).append(binding)
            known = self._by_statement = (self.bound, groups)
        groups = known[1]
        return [b for i in _indices_touching(body, sorted_lines) for b in groups.get(i, ())]

    def all_reaching(self, name: str) -> list[Binding]:
        """The bindings of ``name`` that may reach code run after the scope's own (a nested
        function's): folded once until the scope binds more, for each of a module's
        thousand functions may ask."""
        if self._reaching is None:
            self._reaching = {}  # most scopes are never asked
        known = self._reaching.get(name)
        if known is None or known[0] != self.bound:
            known = self._reaching[name] = (self.bound, fold(self.bindings.get(name, []), None))
        return list(known[1])

    def lookup(self, name: str, position: Position | None = None) -> list[Binding]:
        """Bindings ``name`` may refer to when used in this scope at ``position``.

        An empty list means the name is not bound in the module (a builtin, undefined, or
        from a star import).
        """
        scope: Scope | None = self
        from_nested = False
        while scope is not None:
            if name in scope.global_names:
                return scope.module.all_reaching(name)
            if name in scope.nonlocal_names:
                scope, from_nested = scope.parent, True
                continue
            if name in scope.bindings and not (from_nested and scope.kind == "class"):
                bindings = scope.bindings[name]
                if from_nested or position is None:
                    return scope.all_reaching(name)
                if scope.exclusive:
                    bindings = _on_this_side(bindings, scope, position)
                return fold(bindings, position)
            from_nested = from_nested or scope.kind != "class"
            scope = scope.parent
        return []


def _on_this_side(bindings: list[Binding], scope: Scope, position: Position) -> list[Binding]:
    """The bindings a use at ``position`` can see: none made on the other side of an
    ``if`` the use is on one side of."""
    if all(not b.sides for b in bindings):
        return bindings
    here = {key for start, end, key in scope.exclusive if start <= position < end}
    other = {(statement, 1 - side) for statement, side in here}
    return [b for b in bindings if not other.intersection(b.sides)]


def fold(bindings: list[Binding], position: Position | None) -> list[Binding]:
    """Fold bindings in source order as control flow would (see module docstring).

    With a position, only bindings before it count, unless none do (a use inside a loop
    may see a binding made later in the loop body).
    """
    if position is not None:
        before = [b for b in bindings if b.position < position]
        if before:
            bindings = before
    possible: list[Binding] = []
    for binding in bindings:
        if binding.conditional:
            possible.append(binding)
        else:
            possible = [binding]
    return possible


@dataclass
class ModuleScopes:
    """Scopes of one module: the module's own, and the scope each definition body runs in.

    Only the module's statements are visited up front (see ``build_scopes``); the scope of a
    definition body, lambda or comprehension is built on first request.
    """

    module: Scope
    scope_of_function: dict[int, Scope]
    skipped: dict[int, tuple[ast.AST, Scope]]
    outward_lines: frozenset[int] = frozenset()

    def function_scope(self, node: ast.AST) -> Scope | None:
        """The scope of a def, lambda, class or comprehension, building it if it was skipped."""
        scope = self.scope_of_function.get(id(node))
        if scope is not None or id(node) not in self.skipped:
            mark_read(node)  # the scope holds what the body binds
            return scope
        _, parent = self.skipped.pop(id(node))
        # Built on demand for a lookup: bindings only (walrus ones too); nested bodies wait.
        builder = _ScopeBuilder(self.module, parent, candidate_lines=self.outward_lines)
        builder.visit_definition_body(node)
        self._merge(builder)
        return self.scope_of_function.get(id(node))

    def build_nested(self, node: ast.AST, parent: Scope) -> Scope:
        """The scope of a lambda or comprehension in an expression that was not visited."""
        builder = _ScopeBuilder(self.module, parent, candidate_lines=None)
        builder.expressions([node])
        self._merge(builder)
        return self.scope_of_function[id(node)]

    def _merge(self, builder: _ScopeBuilder) -> None:
        """Record what a later builder found."""
        self.scope_of_function.update(builder.scope_of_function)
        self.skipped.update(builder.skipped)


def build_scopes(tree: ast.Module, outward_lines: frozenset[int] = frozenset()) -> ModuleScopes:
    """Scopes of ``tree``: the module's bindings now, every other scope on first request.

    Binding statements are always recorded, so lookups stay exact; so are the bindings
    made on ``outward_lines`` (see ``lines_binding_outward``), in whatever body they are.
    Other expressions and the definition bodies are visited when a scope inside them is
    first asked for.
    """
    module = Scope("module", tree, None)
    builder = _ScopeBuilder(module, module, outward_lines)
    builder.visit_body(tree.body)
    return ModuleScopes(module, builder.scope_of_function, builder.skipped, outward_lines)


_OUTWARD_STATEMENT = re.compile(r"(?:^|[;:])[ \t]*(?:global|nonlocal)[ \t]")


def lines_binding_outward(lines: list[str], text: str) -> frozenset[int]:
    """Lines (1-based) that may bind a name in a scope around the one they are in: ``:=``
    (a comprehension's binds in the function around it), ``global`` and ``nonlocal``. A
    body holding one is visited when its module's scopes are built, so that a name bound
    there is known whichever scope is asked for first (a module global set only inside
    a method used to be unknown until something asked for that method's scope)."""
    found: set[int] = set()
    if ":=" in text:
        found.update(n for n, line in enumerate(lines, 1) if ":=" in line)
    if "global" in text or "nonlocal" in text:
        found.update(
            n
            for n, line in enumerate(lines, 1)
            if ("global" in line or "nonlocal" in line) and _OUTWARD_STATEMENT.search(line)
        )
    return frozenset(found)


def node_position(node: ast.AST) -> Position:
    """Where a node starts, for ordering bindings and uses."""
    return (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))


def end_position(node: ast.AST) -> Position:
    """Where a node ends."""
    start: int = getattr(node, "lineno", 0)
    end: int | None = getattr(node, "end_lineno", None)
    column: int | None = getattr(node, "end_col_offset", None)
    return (end or start, column or 0)


def nested_bodies(statement: ast.stmt) -> list[list[ast.stmt]]:
    """The statement lists a compound statement holds: body, else, finally, each except
    handler's and each match case's, in that order."""
    bodies: list[list[ast.stmt]] = []
    for name in ("body", "orelse", "finalbody"):
        value = getattr(statement, name, None)
        if isinstance(value, list):
            bodies.append(value)
    bodies.extend(handler.body for handler in getattr(statement, "handlers", []))
    bodies.extend(case.body for case in getattr(statement, "cases", []))
    return bodies


def body_containing(statement: ast.stmt, line: int) -> list[ast.stmt]:
    """The one of ``statement``'s nested bodies that spans ``line`` ([] if none does)."""
    for body in nested_bodies(statement):
        if body and body[0].lineno <= line <= (body[-1].end_lineno or body[-1].lineno):
            return body
    return []


def statements_at(body: list[ast.stmt], line: int) -> list[ast.stmt]:
    """The statements containing ``line``, outermost first, by bisecting bodies."""
    path: list[ast.stmt] = []
    while body:
        index = bisect_right(_first_lines(body), line) - 1
        if index < 0:
            break
        statement = body[index]
        if (statement.end_lineno or statement.lineno) < line:
            break
        path.append(statement)
        body = body_containing(statement, line)
    return path


def _first_lines(body: list[ast.stmt]) -> list[int]:
    """The first line of each statement of a body (computed once a body: bisected often)."""
    found = _FIRST_LINES.get(id(body))
    if found is None or found[0] is not body or len(found[1]) != len(body):
        found = _FIRST_LINES[id(body)] = (body, [s.lineno for s in body])
    return found[1]


# body id: (the body, kept so that its id is never reused while the entry lives; its lines)
_FIRST_LINES: dict[int, tuple[list[ast.stmt], list[int]]] = process_memo()


def child_nodes(node: ast.AST) -> list[ast.AST]:
    """``ast.iter_child_nodes`` without the ``Load``/``Store``/``Del`` markers (nothing reads
    them as nodes) and without its two generators: every walk of the analysis asks."""
    fields = _CHILD_FIELDS.get(type(node))
    if fields is None:
        fields = _CHILD_FIELDS[type(node)] = tuple(f for f in node._fields if f != "ctx")
    children: list[ast.AST] = []
    for name in fields:
        value = getattr(node, name, None)
        if isinstance(value, ast.AST):
            children.append(value)
        elif isinstance(value, list):
            children.extend(item for item in value if isinstance(item, ast.AST))
    return children


_CHILD_FIELDS: dict[type, tuple[str, ...]] = {}


def statements_touching(body: list[ast.stmt], sorted_lines: list[int]) -> list[ast.stmt]:
    """The statements of ``body`` whose span (decorators included) holds one of
    ``sorted_lines`` (ascending), in source order: bisected, so looking at a few lines of a
    long module costs those lines, not the module."""
    return [body[index] for index in _indices_touching(body, sorted_lines)]


def _indices_touching(body: list[ast.stmt], sorted_lines: list[int]) -> list[int]:
    if not body:
        return []
    starts = _starts(body)
    end = body[-1].end_lineno or body[-1].lineno
    within = sorted_lines[bisect_left(sorted_lines, starts[0]) : bisect_right(sorted_lines, end)]
    found: set[int] = set()
    for line in within:
        index = bisect_right(starts, line) - 1
        # statements sharing a line (``a = 1; b = 2``) all hold it
        while index >= 0 and index not in found:
            statement = body[index]
            if (statement.end_lineno or statement.lineno) < line:
                break
            found.add(index)
            index -= 1
    return sorted(found)


def _starts(body: list[ast.stmt]) -> list[int]:
    """The first line of each statement of a body, decorators included (computed once a
    body)."""
    found = _STARTS.get(id(body))
    if found is None or found[0] is not body or len(found[1]) != len(body):
        starts = [
            min([s.lineno, *(d.lineno for d in getattr(s, "decorator_list", ()))]) for s in body
        ]
        found = _STARTS[id(body)] = (body, starts)
    return found[1]


# body id: (the body, kept so that its id is never reused while the entry lives; its starts)
_STARTS: dict[int, tuple[list[ast.stmt], list[int]]] = process_memo()


def touches_lines(node: ast.AST, sorted_lines: list[int]) -> bool:
    """Whether any of ``sorted_lines`` (ascending) falls within the node's line span."""
    start = getattr(node, "lineno", None)
    if start is None:
        return True
    end = getattr(node, "end_lineno", None) or start
    index = bisect_left(sorted_lines, start)
    return index < len(sorted_lines) and sorted_lines[index] <= end


def is_type_checking(test: ast.expr) -> bool:
    """``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``): a branch that never runs."""
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def method_self_name(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """The instance parameter of a method (None for static and class methods)."""
    if any(
        isinstance(d, ast.Name) and d.id in ("staticmethod", "classmethod")
        for d in node.decorator_list
    ):
        return None
    positional = [*node.args.posonlyargs, *node.args.args]
    return positional[0].arg if positional else None


def parameter_defaults(args: ast.arguments) -> dict[ast.arg, ast.expr]:
    positional = [*args.posonlyargs, *args.args]
    found = dict(
        zip(positional[len(positional) - len(args.defaults) :], args.defaults, strict=True)
    )
    found.update({p: d for p, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d})
    return found


def parameters(args: ast.arguments) -> Iterator[ast.arg]:
    for arg in (*args.posonlyargs, *args.args, args.vararg, *args.kwonlyargs, args.kwarg):
        if arg is not None:
            yield arg


class _ScopeBuilder:
    """One pass over the tree that records bindings per scope and the scope of each call."""

    def __init__(self, module: Scope, scope: Scope, candidate_lines: frozenset[int] | None) -> None:
        self.module = module
        self.scope = scope
        self.candidate_lines = None if candidate_lines is None else sorted(candidate_lines)
        self.conditional = False
        self.sides: tuple[tuple[int, int], ...] = ()  # see Binding.sides
        self.in_loop = False
        self.scope_of_function: dict[int, Scope] = {}
        self.skipped: dict[int, tuple[ast.AST, Scope]] = {}

    def touches_candidates(self, node: ast.AST) -> bool:
        return self.candidate_lines is None or touches_lines(node, self.candidate_lines)

    # -- scopes ----------------------------------------------------------------------------
    def run_in(self, scope: Scope, action: Callable[[], None]) -> None:
        saved = self.scope, self.conditional, self.sides, self.in_loop
        self.scope, self.conditional, self.sides, self.in_loop = scope, False, (), False
        try:
            action()
        finally:
            self.scope, self.conditional, self.sides, self.in_loop = saved

    def new_function_scope(
        self, node: ast.AST, args: ast.arguments, self_name: str | None
    ) -> Scope:
        scope = Scope("function", node, self.scope, self_name=self_name)
        self.scope_of_function[id(node)] = scope
        defaults = parameter_defaults(args)
        for arg in parameters(args):
            value = defaults.get(arg)  # a parameter with a default: its value when not passed
            binding = Binding(arg.arg, arg, scope, node_position(arg), False, value)
            scope.bindings.setdefault(arg.arg, []).append(binding)
        return scope

    def visit_definition_body(self, node: ast.AST) -> None:
        """Build the scope of a def, lambda, class or comprehension whose body was skipped."""
        if isinstance(node, ast.ClassDef):
            scope = Scope("class", node, self.scope)
            self.scope_of_function[id(node)] = scope
            self.run_in(scope, lambda: self.visit_body(node.body))
        elif isinstance(node, FUNCTIONS):
            self_name = method_self_name(node) if self.scope.kind == "class" else None
            scope = self.new_function_scope(node, node.args, self_name)
            self.run_in(scope, lambda: self.visit_body(node.body))
        else:  # a lambda or comprehension reached outside its expression
            self.expressions([node])

    def skip_body(self, node: ast.AST) -> bool:
        """Remember a definition whose body need not be visited now."""
        if self.touches_candidates(node):
            return False
        self.skipped[id(node)] = (node, self.scope)
        return True

    # -- bindings --------------------------------------------------------------------------
    def bind(
        self,
        name: str,
        node: ast.AST,
        scope: Scope | None = None,
        *,
        after: ast.AST | None = None,
        **facts: object,
    ) -> None:
        """Bind ``name`` at ``node``; a binding made by evaluating ``after`` (an assigned
        value, a loop's iterable) takes effect where that expression ends, so a use inside
        it (``x = f(x)``) sees the bindings before it, not this one."""
        target = scope or self.scope
        conditional = self.conditional
        runs_in = None
        if name in target.global_names and target is not self.module:
            # A function rebinding a global may never run: an alternative, not a replacement.
            target, conditional, runs_in = self.module, True, target
        position = node_position(node) if after is None else end_position(after)
        sides = self.sides if target is self.scope else ()
        binding = Binding(
            name,
            node,
            target,
            position,
            conditional,
            sides=sides,
            runs_in=runs_in,
            **facts,  # type: ignore[arg-type]
        )
        target.bindings.setdefault(name, []).append(binding)
        target.bound += 1

    def bind_target(
        self,
        target: ast.expr,
        value: ast.expr | None,
        *,
        iterated: bool = False,
        path: tuple[int, ...] = (),
    ) -> None:
        """Bind the names of an assignment target; tuples bind element by element."""
        stack = [(target, path)]
        while stack:
            node, node_path = stack.pop()
            if isinstance(node, ast.Name):
                self.bind(
                    node.id, node, after=value, value=value, iterated=iterated, path=node_path
                )
            elif isinstance(node, (ast.Tuple, ast.List)):
                starred = any(isinstance(e, ast.Starred) for e in node.elts)
                for index, element in reversed(list(enumerate(node.elts))):
                    # After a starred element the index no longer says which value it gets.
                    stack.append((element, () if starred else (*node_path, index)))
            elif isinstance(node, ast.Starred):
                stack.append((node.value, ()))
            else:
                self.expressions([node])
                if isinstance(node, ast.Attribute):
                    self.record_instance_attribute(node, value, node_path)

    def record_instance_attribute(
        self, target: ast.Attribute, value: ast.expr | None, path: tuple[int, ...]
    ) -> None:
        owner = self.scope.enclosing_class
        if (
            owner is not None
            and isinstance(target.value, ast.Name)
            and target.value.id == self.scope.self_name
        ):
            position = node_position(target)
            binding = Binding(target.attr, target, self.scope, position, True, value, path=path)
            owner.instance_attributes.setdefault(target.attr, []).append(binding)

    def function_scope_for_walrus(self) -> Scope:
        scope = self.scope
        while scope.parent is not None and isinstance(scope.node, COMPREHENSIONS):
            scope = scope.parent
        return scope

    # -- statements ------------------------------------------------------------------------
    def visit_body(self, statements: list[ast.stmt], *, conditional: bool | None = None) -> None:
        saved = self.conditional
        if conditional is not None:
            self.conditional = saved or conditional
        for statement in statements:
            self.statement(statement)
        self.conditional = saved

    def statement(self, node: ast.stmt) -> None:
        handler = getattr(self, f"visit_{type(node).__name__}", None)
        if handler is not None:
            handler(node)
        else:  # expression statements, return, raise, assert, delete, pass...
            self.expressions(child_nodes(node))

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.expressions([*node.decorator_list, *outside_parts(node.args)])
        if node.returns is not None:
            self.expressions([node.returns])
        self.bind(node.name, node)
        if not self.skip_body(node):
            self.visit_definition_body(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.expressions([*node.decorator_list, *node.bases, *(k.value for k in node.keywords)])
        self.bind(node.name, node)
        if not self.skip_body(node):
            self.visit_definition_body(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.asname:
                self.bind(alias.asname, node, imported=ImportTarget(0, alias.name, None))
            else:
                top = alias.name.split(".", 1)[0]
                self.bind(top, node, imported=ImportTarget(0, top, None))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        for alias in node.names:
            if alias.name == "*":
                if self.scope is self.module:
                    self.module.star_imports.append(ImportTarget(node.level, module, None))
                continue
            target = ImportTarget(node.level, module, alias.name)
            self.bind(alias.asname or alias.name, node, imported=target)

    def visit_Assign(self, node: ast.Assign) -> None:
        self.expressions([node.value])
        for target in node.targets:
            self.bind_target(target, node.value)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.expressions([node.annotation] if node.value is None else [node.value, node.annotation])
        if node.value is not None or not isinstance(node.target, ast.Name):
            self.bind_target(node.target, node.value)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self.expressions([node.value])
        if isinstance(node.target, ast.Name):
            self.bind(node.target.id, node.target, after=node.value)
        else:
            self.expressions([node.target])

    def visit_Global(self, node: ast.Global) -> None:
        self.scope.global_names.update(node.names)

    def visit_Nonlocal(self, node: ast.Nonlocal) -> None:
        self.scope.nonlocal_names.update(node.names)

    def visit_For(self, node: ast.For | ast.AsyncFor) -> None:
        self.expressions([node.iter])
        saved = self.conditional
        self.conditional = True
        self.bind_target(node.target, node.iter, iterated=True)
        self.conditional = saved
        self.in_loop, was_in_loop = True, self.in_loop
        self.visit_body(node.body, conditional=True)
        self.in_loop = was_in_loop
        self.visit_body(node.orelse, conditional=True)

    visit_AsyncFor = visit_For

    def visit_While(self, node: ast.While) -> None:
        self.expressions([node.test])
        self.in_loop, was_in_loop = True, self.in_loop
        self.visit_body(node.body, conditional=True)
        self.in_loop = was_in_loop
        self.visit_body(node.orelse, conditional=True)

    def visit_If(self, node: ast.If) -> None:
        if is_type_checking(node.test):  # never runs: binds nothing; its else always runs
            self.visit_body(node.orelse)
            return
        self.expressions([node.test])
        for side, body in enumerate((node.body, node.orelse)):
            if self.in_loop or not body:  # a later pass of a loop sees either side
                self.visit_body(body, conditional=True)
                continue
            key = (id(node), side)
            span = (node_position(body[0]), end_position(body[-1]))
            self.scope.exclusive.append((*span, key))
            saved = self.sides
            self.sides = (*saved, key)
            self.visit_body(body, conditional=True)
            self.sides = saved

    def visit_Try(self, node: ast.Try) -> None:
        self.visit_body(node.body)
        for handler in node.handlers:
            if handler.type is not None:
                self.expressions([handler.type])
            saved = self.conditional
            self.conditional = True
            if handler.name:
                self.bind(handler.name, handler)
            self.visit_body(handler.body)
            self.conditional = saved
        self.visit_body(node.orelse, conditional=True)
        self.visit_body(node.finalbody)

    visit_TryStar = visit_Try

    def visit_With(self, node: ast.With | ast.AsyncWith) -> None:
        for item in node.items:
            self.expressions([item.context_expr])
            if item.optional_vars is not None:
                self.bind_target(item.optional_vars, None)
        self.visit_body(node.body)

    visit_AsyncWith = visit_With

    def visit_Match(self, node: ast.Match) -> None:
        self.expressions([node.subject])
        for case in node.cases:
            saved = self.conditional
            self.conditional = True
            self.patterns(case.pattern)
            if case.guard is not None:
                self.expressions([case.guard])
            self.visit_body(case.body)
            self.conditional = saved

    def patterns(self, pattern: ast.pattern) -> None:
        for node in ast.walk(pattern):
            name = getattr(node, "name", None) or getattr(node, "rest", None)
            if isinstance(name, str):
                self.bind(name, node)
            if isinstance(node, ast.MatchValue):
                self.expressions([node.value])

    # -- expressions (iterative) -----------------------------------------------------------
    def expressions(self, roots: list[ast.AST]) -> None:
        """Visit expressions without recursion; lambdas and comprehensions get their scopes."""
        stack: list[tuple[ast.AST, Scope]] = [(root, self.scope) for root in reversed(roots)]
        saved = self.scope
        try:
            while stack:
                node, scope = stack.pop()
                if isinstance(node, ast.expr) and not self.touches_candidates(node):
                    continue
                self.scope = scope
                if isinstance(node, ast.Lambda):
                    stack.extend((part, scope) for part in reversed(outside_parts(node.args)))
                    inner = self.new_function_scope(node, node.args, None)
                    stack.append((node.body, inner))
                elif isinstance(node, COMPREHENSIONS):
                    stack.extend(self.comprehension(node))
                elif isinstance(node, ast.NamedExpr):
                    self.bind(
                        node.target.id,
                        node.target,
                        scope=self.function_scope_for_walrus(),
                        after=node.value,
                        value=node.value,
                    )
                    stack.append((node.value, scope))
                else:
                    stack.extend((child, scope) for child in reversed(_children(node)))
        finally:
            self.scope = saved

    def comprehension(self, node: ast.AST) -> list[tuple[ast.AST, Scope]]:
        """Bind a comprehension's targets in its own scope; return the parts still to visit."""
        generators: list[ast.comprehension] = node.generators  # type: ignore[attr-defined]
        outer = self.scope
        inner = Scope("function", node, outer)
        self.scope_of_function[id(node)] = inner
        self.scope = inner
        for generator in generators:
            self.bind_target(generator.target, generator.iter, iterated=True)
        self.scope = outer
        elements = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]  # type: ignore[attr-defined]
        work = [(generators[0].iter, outer)]
        for index, generator in enumerate(generators):
            if index:
                work.append((generator.iter, inner))
            work.extend((condition, inner) for condition in generator.ifs)
        work.extend((element, inner) for element in elements)
        return list(reversed(work))


def outside_parts(args: ast.arguments) -> list[ast.expr]:
    """Defaults and annotations: evaluated where the def or lambda is, not in its body."""
    parts: list[ast.expr] = [d for d in (*args.defaults, *args.kw_defaults) if d is not None]
    parts.extend(arg.annotation for arg in parameters(args) if arg.annotation is not None)
    return parts


def _children(node: ast.AST) -> list[ast.AST]:
    """Child nodes to visit; ``ast.keyword``/``comprehension`` wrappers are looked through."""
    return child_nodes(node)
