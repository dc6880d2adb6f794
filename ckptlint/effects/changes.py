"""Where a module global changes while the program runs, as opposed to while it is set up.

A recompute can only see another value than its forward when something changes the global
between the two. Module-level statements run once, at import; so do functions used only at
import (a registry's ``register`` decorator, decorator factories), functions called only
from constructors (a kernel handle loaded when the model is built), and writes under a test
of the same global (``if KERNEL is None: KERNEL = load()``, a memo). None of those is a
run-time change. Changes are searched in the global's own module and in every other module
of the project that may write it: through the module object (``config.SCALE = 2``) or
through the name it imported (``from config import TABLE`` ... ``TABLE["k"] = v``). Which
modules those are is a text search over all the project's files, so the answer does not
depend on which files a run names.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator

from ckptlint.effects.reach import (
    GlobalWrite,
    Location,
    assigned_targets,
    fills_from_key,
    global_writes,
    guarded_by_test_of,
    header_nodes,
    root_name,
)
from ckptlint.effects.restores import restored
from ckptlint.project.index import Module, Project
from ckptlint.project.scopes import (
    FUNCTIONS,
    Binding,
    Scope,
    body_containing,
    node_position,
    statements_at,
)
from ckptlint.project.search import ATTRIBUTE_WRITES, CONTENT_WRITES, NAMES
from ckptlint.regions.steps import runs_backward
from ckptlint.resolution.bodies import own_nodes
from ckptlint.resolution.evaluator import Evaluator
from ckptlint.resolution.values import UNKNOWN, ClassValue, Context, ModuleValue
from ckptlint.torch_catalogue import MUTATING_METHODS

Function = ast.FunctionDef | ast.AsyncFunctionDef

# Functions that run while objects are built, not between a forward and its backward.
SETUP_FUNCTIONS = frozenset(
    "__init__ __new__ __post_init__ __init_subclass__ __set_name__ __setstate__"
    " _init_weights init_weights reset_parameters _reset_parameters".split()
)
# Names that announce set-up: seeding and (lazy) initialisation, which training runs before
# its steps, not between a forward and its backward (``model_parallel_cuda_manual_seed``,
# ``initialize_rng_tracker(force_reset=True)``).
_SETUP_NAME = re.compile(r"^_*(init|initiali[sz]e|setup|set_up)(_|$)|seed")
_MAX_CALLER_DEPTH = 3
_DEFINITIONS = (*FUNCTIONS, ast.ClassDef, ast.Lambda)


class ChangeFinder:
    def __init__(self, project: Project, evaluator: Evaluator) -> None:
        self.project = project
        self.evaluator = evaluator

    def changes_of(self, module: Module, name: str) -> list[GlobalWrite]:
        """Run-time rebinding or mutation of ``module.name`` anywhere the run can see."""
        key = ("changes", module, name)
        return self.evaluator.solver.ask(key, self._changes_of, module, name, fallback=[])

    def _changes_of(self, module: Module, name: str) -> list[GlobalWrite]:
        if "." in name:
            return list(self._class_attribute_changes(module, *name.split(".")))
        found = list(self._changes_in_own_module(module, name))
        for other in self._other_modules(module, ATTRIBUTE_WRITES, name):
            found.extend(self._changes_through_attribute(other, module, name))
        for other in self._other_modules(module, CONTENT_WRITES, name):
            found.extend(self._changes_through_import(other, module, name))
        return found

    def _changes_in_own_module(self, module: Module, name: str) -> Iterator[GlobalWrite]:
        seen: set[tuple[int, str]] = set()
        for line in module.lines_naming(name):
            for statement, functions, scope in self._statements_in_function(module, line):
                writes = [
                    write
                    for write in global_writes(statement, scope, module)
                    if write.name == name
                    and (write.where.line, write.how) not in seen
                    and not guarded_by_test_of(functions[-1].body, write, scope)
                ]
                if not writes or self._undone_within_a_step(module, statement, functions):
                    continue
                if not self.runs_at_setup_only(module, functions, 0):
                    for write in writes:
                        seen.add((write.where.line, write.how))
                        yield write

    def _changes_through_attribute(
        self, other: Module, owner: Module, name: str
    ) -> Iterator[GlobalWrite]:
        """``alias.NAME = ...``, ``alias.NAME[k] = ...``, ``alias.NAME.append(...)`` in another
        module's functions, where ``alias`` is ``owner``."""

        def is_owner(receiver: ast.expr, functions: list[Function], context: Context) -> bool:
            return any(
                isinstance(v, ModuleValue) and v.module is owner
                for v in self.evaluator.evaluate(receiver, context)
            )

        yield from self._attribute_writes(other, name, is_owner, owner, name)

    def _class_attribute_changes(
        self, module: Module, class_name: str, attribute: str
    ) -> Iterator[GlobalWrite]:
        """``Config.scale = ...`` (also ``Config.table[k] = ...``, ``Config.items.append()``)
        in a function of any module, where ``Config`` is the class ``class_name`` of
        ``module``, and ``cls.scale = ...`` in a classmethod of that class."""
        classes = [
            b.node
            for b in module.scopes.module.bindings.get(class_name, [])
            if isinstance(b.node, ast.ClassDef)
        ]
        if len(classes) != 1:
            return
        cls = classes[0]

        def is_class(receiver: ast.expr, functions: list[Function], context: Context) -> bool:
            return _is_class_parameter(receiver, functions[-1], cls) or any(
                isinstance(v, ClassValue) and _same_class(v, module, cls)
                for v in self.evaluator.evaluate(receiver, context)
            )

        name = f"{class_name}.{attribute}"
        others = list(self._other_modules(module, ATTRIBUTE_WRITES, attribute))
        for other in [module, *others]:
            yield from self._attribute_writes(other, attribute, is_class, module, name)

    def _attribute_writes(
        self,
        other: Module,
        attribute: str,
        receives: Callable[[ast.expr, list[Function], Context], bool],
        owner: Module,
        name: str,
    ) -> Iterator[GlobalWrite]:
        """Statements in ``other``'s run-time functions that write ``X.attribute`` (rebind it,
        or change its content) where ``receives`` says ``X`` is the object in question: a
        change of ``owner``'s ``name``."""
        spellings = (f".{attribute}", f'"{attribute}"', f"'{attribute}'")
        for line in other.lines_naming(attribute):  # each spelling names it
            text = other.line_text(line)
            if not any(spelling in text for spelling in spellings):
                continue
            for statement, functions, scope in self._statements_in_function(other, line):
                context = Context(other, scope)
                rebinds = [
                    rebinds
                    for receiver, written, rebinds in _written_attributes(statement)
                    if written == attribute and receives(receiver, functions, context)
                ]
                if not rebinds or self._undone_within_a_step(other, statement, functions):
                    continue
                if not self.runs_at_setup_only(other, functions, 0):
                    how = "assigns" if any(rebinds) else "mutates"
                    yield GlobalWrite(owner, name, Location(other, statement.lineno), how)

    def _changes_through_import(
        self, other: Module, owner: Module, name: str
    ) -> Iterator[GlobalWrite]:
        """``NAME[k] = ...``, ``NAME.attr = ...``, ``NAME.append(...)`` in another module's
        functions, where ``NAME`` is ``owner``'s global imported by name, also through a
        local alias (``table = NAME`` ... ``table[k] = v``)."""
        imported = [b for b in other.scopes.module.bindings.get(name, []) if b.imported]
        if not imported or not any(self._binds_global_of(other, b, owner) for b in imported):
            return
        for line in other.lines_naming(name):
            for statement, functions, scope in self._statements_in_function(other, line):
                written: ast.stmt | None = statement
                if not any(
                    write.id == name
                    and any(b.imported for b in scope.lookup(name, node_position(write)))
                    for write in _content_writes(statement)
                ):
                    aliased = _alias_of(statement, name, scope)
                    written = None if aliased is None else _first_write(functions[-1], aliased)
                if written is None or self._undone_within_a_step(other, written, functions):
                    continue
                if not self.runs_at_setup_only(other, functions, 0):
                    yield GlobalWrite(owner, name, Location(other, written.lineno), "mutates")

    def _binds_global_of(self, other: Module, binding: Binding, owner: Module) -> bool:
        """Whether an import in ``other`` binds ``owner``'s global (directly, or re-exported
        through a package's ``__init__``)."""
        target = binding.imported
        assert target is not None
        if (
            target.name == binding.name
            and other.resolve_import(target.level, target.module) == owner.name
        ):
            return True
        own = owner.scopes.module.bindings.get(binding.name, [])
        if not own:
            return False
        mine = self.evaluator.binding_values(own[-1], self.evaluator.module_context(owner))
        theirs = self.evaluator.binding_values(binding, self.evaluator.module_context(other))
        return any(value in theirs for value in mine if value is not UNKNOWN)

    def _other_modules(self, module: Module, kind: str, name: str) -> Iterator[Module]:
        """The project's other modules whose text may do ``kind`` to ``name``."""
        for path in self.project.files_matching(kind, name):
            if path != module.path:
                other = self.project.module_at(path)
                if other is not None:
                    yield other

    def _statements_in_function(
        self, module: Module, line: int
    ) -> list[tuple[ast.stmt, list[Function], Scope]]:
        """The innermost statements at ``line`` (several where ``;`` joins them), each with
        the functions around it (outermost first) and its scope; none at module or class
        level (those run at import)."""
        path = statements_at(module.tree.body, line)
        functions = [n for n in path if isinstance(n, FUNCTIONS)]
        if not functions or isinstance(path[-1], _DEFINITIONS):
            return []
        scope = None
        for definition in path:  # outermost first: building one builds those inside
            if isinstance(definition, (*FUNCTIONS, ast.ClassDef)):
                scope = module.scopes.function_scope(definition)
        if scope is None:
            return []
        body = body_containing(path[-2], line) if len(path) > 1 else module.tree.body
        return [
            (statement, functions, scope)
            for statement in body
            if statement.lineno <= line <= (statement.end_lineno or statement.lineno)
            and not isinstance(statement, _DEFINITIONS)
        ]

    def _undone_within_a_step(
        self, module: Module, statement: ast.stmt, functions: list[Function]
    ) -> bool:
        """Whether the function puts the statement's write back (``restores``) within an
        extent that runs the backward too (``try: loss.backward() finally: X = old``, each
        ``with manager():`` block using the context manager), or that calls nothing: a
        forward and its recompute both see the set value, or neither does. A restore around
        the forward alone is a change the recompute sees."""
        function = functions[-1]
        extents = {restored(function, node) for node in (statement, *header_nodes(statement))}
        extents.discard(None)
        if not extents:
            return False
        for extent in extents:
            if isinstance(extent, ast.Try):
                if not runs_backward(extent) and _calls_anything(extent):
                    return False
            elif not self._every_with_runs_backward(module, function):
                return False
        return True

    def _every_with_runs_backward(self, module: Module, manager: Function) -> bool:
        """Whether every use of the context manager ``manager`` in the project is a ``with``
        whose block runs the backward (unused: a user may enter it anywhere)."""
        uses = 0
        for other in self._modules_naming(module, manager.name):
            for line in other.lines_naming(manager.name):
                if other is module and line == manager.lineno:
                    continue
                path = statements_at(other.tree.body, line)
                if path and isinstance(path[-1], (ast.Import, ast.ImportFrom)):
                    continue
                blocks = [
                    s
                    for s in path
                    if isinstance(s, (ast.With, ast.AsyncWith))
                    and any(_calls_named(item.context_expr, manager.name) for item in s.items)
                ]
                if not blocks or not runs_backward(blocks[-1]):
                    return False
                uses += 1
        return uses > 0

    def runs_at_setup_only(self, module: Module, functions: list[Function], depth: int) -> bool:
        """Whether the outermost of ``functions`` runs only while the program is set up: a
        constructor-like method, a function named for seeding or initialisation, or a function
        whose every use is at module or class level, in a decorator, or in such a function."""
        outermost = functions[0]
        name = outermost.name
        if name in SETUP_FUNCTIONS or _SETUP_NAME.search(name):
            return True
        if depth >= _MAX_CALLER_DEPTH:
            return False
        uses = [
            (other, line)
            for other in self._modules_naming(module, name)
            for line in other.lines_naming(name)
            if not (other is module and line == outermost.lineno)
        ]
        if not uses:
            return False  # public API nobody here calls: a user may call it at any time
        for other, line in uses:
            path = statements_at(other.tree.body, line)
            callers = [n for n in path if isinstance(n, FUNCTIONS)]
            if callers and not self.runs_at_setup_only(other, callers, depth + 1):
                return False
        return True

    def _modules_naming(self, module: Module, name: str) -> list[Module]:
        """The module itself, and the other loaded modules that import ``name`` from it or
        name it as an attribute (``module.name``)."""
        found = [module]
        for other in self._other_modules(module, NAMES, name):
            lines = other.lines_naming(name)
            if not lines:
                continue
            spelled = any(f".{name}" in other.line_text(line) for line in lines)
            if spelled or self._imports_from(other, module, name):
                found.append(other)
        return found

    def _imports_from(self, other: Module, module: Module, name: str) -> bool:
        for binding in other.scopes.module.bindings.get(name, []):
            target = binding.imported
            if target is not None and target.name == name:
                if other.resolve_import(target.level, target.module) == module.name:
                    return True
        return False


def _calls_anything(statement: ast.Try) -> bool:
    """Whether a ``try`` runs a call before its ``finally`` (only then can code that reads
    the global run while it is set)."""
    parts = [*statement.body, *statement.handlers, *statement.orelse]
    return any(isinstance(node, ast.Call) for part in parts for node in ast.walk(part))


def _calls_named(expression: ast.expr, name: str) -> bool:
    """``name(...)`` or ``x.name(...)``."""
    if not isinstance(expression, ast.Call):
        return False
    func = expression.func
    return (func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)) == name


def _same_class(value: ClassValue, module: Module, cls: ast.ClassDef) -> bool:
    return value.module.path == module.path and value.node.lineno == cls.lineno


def _is_class_parameter(expression: ast.expr, function: Function, cls: ast.ClassDef) -> bool:
    """``cls`` in ``cls.scale = ...`` inside a ``@classmethod`` defined in ``cls``'s body."""
    if not isinstance(expression, ast.Name) or not any(
        isinstance(d, ast.Name) and d.id == "classmethod" for d in function.decorator_list
    ):
        return False
    parameters = [*function.args.posonlyargs, *function.args.args]
    if not parameters or parameters[0].arg != expression.id:
        return False
    return any(statement is function for statement in cls.body)


def _written_attributes(statement: ast.stmt) -> Iterator[tuple[ast.expr, str, bool]]:
    """The attributes a statement writes, as (receiver, attribute name, whether it rebinds
    it): ``x.A = v``, ``del x.A``, ``setattr(x, "A", v)``, ``vars(x)["A"] = v`` rebind;
    ``x.A[k] = v`` and ``x.A.append(v)`` change its content (in a lambda too)."""
    for target in assigned_targets(statement):
        named = _named_item(target)
        if named is not None:
            yield (*named, True)
            continue
        rebinds = True
        while isinstance(target, ast.Subscript):
            target, rebinds = target.value, False
        if isinstance(target, ast.Attribute):
            yield target.value, target.attr, rebinds
    for node in _nodes_run(statement):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in ("setattr", "delattr") and len(node.args) > 1:
            name = node.args[1]
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                yield node.args[0], name.value, True
        elif (
            isinstance(func, ast.Attribute)
            and func.attr in MUTATING_METHODS
            and isinstance(func.value, ast.Attribute)
            and not fills_from_key(node)  # a memo: the entries read stay
        ):
            yield func.value.value, func.value.attr, False


def _named_item(target: ast.expr) -> tuple[ast.expr, str] | None:
    """``vars(x)["A"]`` or ``x.__dict__["A"]``: (``x``, ``"A"``)."""
    if not isinstance(target, ast.Subscript):
        return None
    key, holder = target.slice, target.value
    if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
        return None
    if isinstance(holder, ast.Attribute) and holder.attr == "__dict__":
        return holder.value, key.value
    if (
        isinstance(holder, ast.Call)
        and isinstance(holder.func, ast.Name)
        and holder.func.id == "vars"
        and len(holder.args) == 1
    ):
        return holder.args[0], key.value
    return None


def _nodes_run(statement: ast.stmt) -> Iterator[ast.AST]:
    """A statement's own nodes (``header_nodes``), with the bodies of its lambdas: one made
    in a function runs there, mostly (``(lambda: setattr(cfg, "X", v))()``, callbacks)."""
    for node in header_nodes(statement):
        yield node
        if isinstance(node, ast.Lambda):
            yield from ast.walk(node.body)


def _alias_of(statement: ast.stmt, name: str, scope: Scope) -> str | None:
    """``alias`` for a statement ``alias = name`` binding a local of ``scope``."""
    if (
        isinstance(statement, ast.Assign)
        and len(statement.targets) == 1
        and isinstance(statement.targets[0], ast.Name)
        and isinstance(statement.value, ast.Name)
        and statement.value.id == name
        and statement.targets[0].id in scope.bindings
    ):
        return statement.targets[0].id
    return None


def _first_write(function: Function, name: str) -> ast.stmt | None:
    """The first statement of ``function`` (not of a nested definition) that changes the
    content of its local ``name``."""
    for statement in own_nodes(function.body):
        if isinstance(statement, ast.stmt) and not isinstance(statement, _DEFINITIONS):
            if any(write.id == name for write in _content_writes(statement)):
                return statement
    return None


def _content_writes(statement: ast.stmt) -> Iterator[ast.Name]:
    """The names whose content a statement changes: ``NAME[k] = ``, ``NAME.a.b += ``,
    ``del NAME[k]``, ``NAME.update(...)`` (not ``NAME = ``, which rebinds a name)."""
    for target in assigned_targets(statement):
        if not isinstance(target, ast.Name):
            root = root_name(target)
            if root is not None:
                yield root
    for node in _nodes_run(statement):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in MUTATING_METHODS
            and not fills_from_key(node)  # a memo: the entries read stay
        ):
            root = root_name(node.func.value)
            if root is not None:
                yield root


__all__ = ["ChangeFinder", "SETUP_FUNCTIONS", "root_name"]
