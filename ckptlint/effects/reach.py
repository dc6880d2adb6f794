"""What a region runs, and what that code reads, writes and draws.

From a region's values (functions, module instances, partials, torch functions) the analysis
follows every call it can resolve, into any module of the project: ``module(...)`` runs the
class's ``forward``, ``self.helper()`` its method, ``nn.Sequential`` its elements. Each
function is analysed once per binding of its parameters; calls are followed to a bounded
depth. What cannot be resolved is left out: the rules built on this only report what they
saw.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from ckptlint.effects.restores import restored
from ckptlint.memos import process_memo
from ckptlint.project.index import Module
from ckptlint.project.scopes import (
    COMPREHENSIONS,
    FUNCTIONS,
    Binding,
    Body,
    Scope,
    child_nodes,
    node_position,
)
from ckptlint.resolution.bodies import children_run_here, own_nodes
from ckptlint.resolution.evaluator import Evaluator
from ckptlint.resolution.values import (
    Arguments,
    ClassValue,
    Context,
    Elements,
    External,
    FunctionValue,
    Instance,
    ModuleValue,
    PartialValue,
    Sequence,
    Value,
    Values,
    known,
)
from ckptlint.resolution.versions import at_least
from ckptlint.torch_catalogue import (
    CONTAINERS,
    MUTATING_METHODS,
    RANDOM_METHODS,
    is_random_function,
    is_random_module_class,
    short_name,
)

# Calls are followed this many levels below the region.
MAX_CALL_DEPTH = 8
# Global state read or written this close to the region (its own code, what that calls) is
# the region's business; deeper down, in a framework's accessors and caches (a process
# group set up once, a tracker made on first use), it is set-up that no linter can time.
# In the site's own module (the user's code) the region is followed further.
NEAR_DEPTH = 1
HOME_DEPTH = 3
_DEFINITIONS = (*FUNCTIONS, ast.ClassDef, ast.Lambda)


@dataclass(frozen=True)
class Location:
    module: Module
    line: int

    def describe(self, relative_to: Module) -> str:
        """``line 12`` in the reporting file, ``path:12`` elsewhere."""
        if self.module is relative_to:
            return f"line {self.line}"
        return self.module.cite(self.line)


@dataclass(frozen=True)
class GlobalRead:
    """A read of module-level state: a module global (``name``), or a class attribute
    (``name`` is ``Class.attribute``) of a class of ``module``."""

    module: Module  # the module the global (or the class) belongs to
    name: str
    where: Location
    # Read through a name imported from ``module`` (``from cfg import TABLE``): the import
    # bound the object once, so only a change of its content reaches the reader.
    imported: bool = False

    @property
    def what(self) -> str:
        return "class attribute" if "." in self.name else "module global"


@dataclass(frozen=True)
class GlobalWrite:
    """A statement that rebinds or mutates a module-level object."""

    module: Module  # the module the global belongs to
    name: str
    where: Location
    how: str  # "assigns", "mutates"


@dataclass(frozen=True)
class RandomDraw:
    what: str
    where: Location | None  # None: the region itself (``checkpoint(F.dropout, x)``)


@dataclass
class FunctionFacts:
    """What one function body (``node``, run in ``context``) does by itself, before
    following its calls (what each may call is evaluated only when a reach goes past it)."""

    node: ast.AST
    context: Context
    reads: list[GlobalRead] = field(default_factory=list)
    writes: list[GlobalWrite] = field(default_factory=list)
    draws: list[RandomDraw] = field(default_factory=list)
    calls: list[tuple[ast.Call, Context]] = field(default_factory=list)
    # Writes under ``if flag:`` where the parameter ``flag`` defaults to a false constant
    # (``force_reset=False``): they run only for callers that pass it.
    opt_in_writes: list[tuple[OptIn, GlobalWrite]] = field(default_factory=list)


@dataclass(frozen=True)
class OptIn:
    """A parameter that switches a branch on: its name and place among the positionals."""

    name: str
    index: int | None  # None: keyword-only

    def passed_by(self, call: ast.Call | None, bound: bool) -> bool:
        """Whether ``call`` may pass a true value for it (unknown calls may)."""
        if call is None:
            return True
        for keyword in call.keywords:
            if keyword.arg is None or keyword.arg == self.name:
                return not _false_constant(keyword.value)
        if self.index is None:
            return False
        given = call.args
        if any(isinstance(a, ast.Starred) for a in given):
            return True
        index = self.index - 1 if bound else self.index
        return len(given) > index and not _false_constant(given[index])


@dataclass
class Reach:
    """Everything a region runs, as deep as ``depth_for`` allows for each function."""

    depth_for: Callable[[FunctionValue], int] = lambda function: MAX_CALL_DEPTH
    # Random functions called at the last level count (CKP301 follows every level); a near
    # reach has no use for them, so the calls of its last level are never evaluated.
    draws_at_the_edge: bool = True
    functions: list[FunctionValue] = field(default_factory=list)
    reads: list[GlobalRead] = field(default_factory=list)
    writes: list[GlobalWrite] = field(default_factory=list)
    draws: list[RandomDraw] = field(default_factory=list)

    def runs_code_of(self, location: Location) -> bool:
        """Whether ``location`` lies inside one of the functions the region runs."""
        return _inside(location, self.functions)


def _inside(location: Location, functions: list[FunctionValue]) -> bool:
    return any(
        f.module is location.module
        and f.node.lineno <= location.line <= (f.node.end_lineno or f.node.lineno)
        for f in functions
    )


class ReachAnalysis:
    def __init__(self, evaluator: Evaluator) -> None:
        self.evaluator = evaluator

    def reach(self, region: Values) -> Reach:
        """What the region runs, to ``MAX_CALL_DEPTH`` levels of calls everywhere."""
        return self._reach(region, Reach())

    def near(self, region: Values, home: Module) -> Reach:
        """What the region's own code does, and the code it calls directly; in ``home`` (the
        site's module, the user's code) to ``HOME_DEPTH`` levels."""

        def depth_for(function: FunctionValue) -> int:
            return HOME_DEPTH if function.module is home else NEAR_DEPTH

        return self._reach(region, Reach(depth_for, draws_at_the_edge=False))

    def _reach(self, region: Values, reach: Reach) -> Reach:
        seen: dict[object, int] = {}
        for value in known(region):
            self._collect(value, None, reach, 0, seen)
        return reach

    def _collect(
        self, value: Value, call: ast.Call | None, reach: Reach, depth: int, seen: dict[object, int]
    ) -> None:
        if depth > MAX_CALL_DEPTH:
            return
        if isinstance(value, PartialValue):
            for inner in known(value.inner):
                bound = self._bound_partial(inner, value)
                self._collect(bound, None, reach, depth, seen)
        elif isinstance(value, External):
            self._external(value, call, reach, None)
        elif isinstance(value, Instance):
            self._instance(value, call, reach, depth, seen)
        elif isinstance(value, FunctionValue):
            self._function(value, call, reach, depth, seen)
        elif isinstance(value, (Sequence, Elements)):
            self._elements(value, reach, depth, seen)

    def _elements(
        self, container: Value, reach: Reach, depth: int, seen: dict[object, int]
    ) -> None:
        """A container's elements are parts of the region (``nn.Sequential``, a list of
        blocks): each container once."""
        if ("container", container) in seen:
            return
        seen[("container", container)] = depth
        for element in known(self.evaluator.iterate((container,))):
            self._collect(element, None, reach, depth, seen)

    def _bound_partial(self, inner: Value, partial: PartialValue) -> Value:
        """The function a partial calls, with the partial's own arguments bound."""
        if not isinstance(inner, FunctionValue):
            return inner
        arguments = Arguments.of(partial.call, partial.context)
        arguments = Arguments(arguments.positional[1:], arguments.keywords, True, ())
        context = self.evaluator.bind(inner, arguments)
        return FunctionValue(
            inner.node, Context(context.module, inner.context.scope, context.env), inner.bound
        )

    def _external(
        self, value: External, call: ast.Call | None, reach: Reach, where: Location | None
    ) -> None:
        if is_random_function(value.name) and not _switched_off(call, value.name):
            reach.draws.append(RandomDraw(f"`{value.name}`", where))

    def _instance(
        self,
        instance: Instance,
        call: ast.Call | None,
        reach: Reach,
        depth: int,
        seen: dict[object, int],
    ) -> None:
        cls = instance.cls
        if isinstance(cls, External):
            name = cls.name
            if is_random_module_class(name) and not _module_switched_off(instance):
                where = None
                if instance.call is not None and instance.context is not None:
                    where = Location(instance.context.module, instance.call.lineno)
                reach.draws.append(RandomDraw(f"`nn.{short_name(name)}`", where))
            elif name in CONTAINERS:
                self._elements(instance, reach, depth, seen)
            return
        key = ("instance", cls)
        if seen.get(key, depth + 1) <= depth:
            return
        seen[key] = depth
        # What an instance runs does not depend on where it was made (constructor arguments
        # are not followed): one canonical instance per class shares the work across sites.
        instance = Instance(cls, exact=False)
        member = self.evaluator.member
        own_call = [c for c in member((instance,), "__call__") if isinstance(c, FunctionValue)]
        for callee in own_call or known(member((instance,), "forward")):
            self._collect(callee, None, reach, depth, seen)  # calling a module runs forward

    def _function(
        self,
        function: FunctionValue,
        call: ast.Call | None,
        reach: Reach,
        depth: int,
        seen: dict[object, int],
    ) -> None:
        if depth > reach.depth_for(function):
            return
        context = self.evaluator.bind(function, None)
        key = (function.node, context)
        facts = self.facts(function, context)
        bound = function.bound is not None
        for switch, write in facts.opt_in_writes:
            if ("opt-in", write) not in seen and switch.passed_by(call, bound):
                seen[("opt-in", write)] = depth
                reach.writes.append(write)
        first = key not in seen
        if not first and seen[key] <= depth:
            return
        seen[key] = depth  # reached again, closer to the region: its callees may now count
        if first:
            reach.functions.append(function)
            reach.reads.extend(facts.reads)
            reach.writes.extend(facts.writes)
            reach.draws.extend(facts.draws)
        if depth == reach.depth_for(function) and not reach.draws_at_the_edge:
            return  # what its calls run lies past the reach
        for call, callees in self._callees(facts):
            for callee in known(callees):
                if isinstance(callee, External):
                    self._external(callee, call, reach, Location(function.module, call.lineno))
                else:
                    self._collect(callee, call, reach, depth + 1, seen)

    def _callees(self, facts: FunctionFacts) -> list[tuple[ast.Call, Values]]:
        """What each call of a body may call (asked of the solver: evaluated once a run)."""
        key = ("callees", facts.node, facts.context)
        return self.evaluator.solver.ask(key, self._callees_of, facts, fallback=[])

    def _callees_of(self, facts: FunctionFacts) -> list[tuple[ast.Call, Values]]:
        """A method called on a local variable or a parameter other than ``self``
        (``hidden_states.view(...)``: most calls of a model's body) is not followed: what
        it runs is the object's, which the analysis cannot tell."""
        evaluate = self.evaluator.evaluate
        return [
            (call, evaluate(call.func, where))
            for call, where in facts.calls
            if not _method_of_a_local(call.func, where.scope)
        ]

    def facts(self, function: FunctionValue, context: Context) -> FunctionFacts:
        key = ("facts", function.node, context)
        return self.evaluator.solver.ask(
            key, self._facts_of, function, context, fallback=FunctionFacts(function.node, context)
        )

    def _facts_of(self, function: FunctionValue, context: Context) -> FunctionFacts:
        """One pass over the body: global reads, calls, random draws and global writes
        (an assignment's targets, a mutating method's receiver; not those the function puts
        back, see ``restores``), then the writes sorted into those that always run and those
        behind an opt-in switch."""
        body = function.node.body
        statements = [body] if isinstance(body, ast.expr) else body
        module = function.module
        facts = FunctionFacts(function.node, context)
        writes: list[tuple[GlobalWrite, Scope]] = []
        switches = _opt_in_parameters(function.node.args)
        switched: list[tuple[int, int, OptIn]] = []
        module_names = module.scopes.module.bindings  # a global is bound there, or nowhere
        for node, scope in self.nodes_with_scopes(statements, context.scope, module):
            if isinstance(node, ast.Name):
                if isinstance(node.ctx, ast.Load) and node.id in module_names:
                    position = node_position(node)
                    location = Location(module, node.lineno)
                    if module_data(node.id, scope, position):
                        facts.reads.append(GlobalRead(module, node.id, location))
                    else:
                        imported = self._imported_data(node.id, scope, position, module)
                        if imported is not None:
                            owner, name = imported
                            facts.reads.append(GlobalRead(owner, name, location, imported=True))
            elif isinstance(node, ast.Attribute):
                if isinstance(node.ctx, ast.Load):
                    where = context.at(scope) if scope is not context.scope else context
                    read = (node.value, node.attr, node.lineno)
                    facts.reads.extend(self._module_attribute_reads(*read, where))
            elif isinstance(node, ast.Call):
                where = context.at(scope) if scope is not context.scope else context
                facts.calls.append((node, where))
                named = _getattr_with_a_name(node)
                if named is not None:  # ``getattr(cfg, "SCALE", 1.0)``
                    facts.reads.extend(self._module_attribute_reads(*named, node.lineno, where))
                callee = node.func
                if isinstance(callee, ast.Attribute) and callee.attr in RANDOM_METHODS:
                    what = f"`.{callee.attr}()`"
                    facts.draws.append(RandomDraw(what, Location(module, node.lineno)))
                mutation = _mutation(node, scope, module)
                if mutation is not None and not is_memo_call(node):
                    if restored(function.node, node) is None:
                        writes.append((mutation, scope))
            elif isinstance(node, _ASSIGNING):
                made = list(_assignment_writes(node, scope, module))
                if made and restored(function.node, node) is None:
                    writes.extend((w, scope) for w in made)
            elif isinstance(node, ast.If) and switches:
                test, branch = node.test, node.body
                if isinstance(test, ast.Name) and branch and test.id in switches:
                    last = branch[-1].end_lineno or branch[-1].lineno
                    switched.append((branch[0].lineno, last, switches[test.id]))
        for write, scope in writes:
            if guarded_by_test_of(statements, write, scope):
                continue
            switch = _switch_of(switched, write.where.line)
            if switch is None:
                facts.writes.append(write)
            else:
                facts.opt_in_writes.append((switch, write))
        return facts

    def _module_attribute_reads(
        self, receiver: ast.expr, attribute: str, line: int, context: Context
    ) -> Iterator[GlobalRead]:
        """``config.SCALE`` where ``config`` is a module of the project, and ``Config.scale``
        where ``Config`` is a class of the project whose body assigns ``scale``. Only a
        receiver named at module level (an import, a class, a module global) or the ``cls``
        of a classmethod is evaluated: one rooted in a local variable or another parameter
        (``self.config``, ``hidden_states.shape``, most of a body's attribute reads) names no
        module or class the analysis could tell."""
        if not _names_a_module_or_class(receiver, context.scope):
            return
        for owner in self.evaluator.evaluate(receiver, context):
            if isinstance(owner, ModuleValue):
                target = owner.module
                bindings = target.scopes.module.bindings.get(attribute, [])
                if bindings and all(_is_data(b.node) for b in bindings):
                    yield GlobalRead(target, attribute, Location(context.module, line))
            elif isinstance(owner, ClassValue) and _at_module_level(owner):
                bindings = self.evaluator.scope_of(owner).bindings.get(attribute, [])
                if bindings and all(_is_data(b.node) for b in bindings):
                    name = f"{owner.node.name}.{attribute}"
                    yield GlobalRead(owner.module, name, Location(context.module, line))

    def _imported_data(
        self, name: str, scope: Scope, position: tuple[int, int], module: Module
    ) -> tuple[Module, str] | None:
        """The project module whose module-level data ``name`` is, and its name there, when
        ``name`` is bound here only by ``from <module> import <its name>`` (followed through
        re-exports)."""
        bindings = scope.lookup(name, position)
        if len(bindings) != 1 or bindings[0].scope.kind != "module":
            return None
        project = self.evaluator.project
        binding, importer = bindings[0], module
        for _ in range(_MAX_REEXPORTS):
            target = binding.imported
            if target is None or target.name is None:
                return None
            absolute = importer.resolve_import(target.level, target.module)
            owner = None if absolute is None else project.module_named(absolute)
            if owner is None:
                return None
            found = owner.scopes.module.bindings.get(target.name, [])
            if len(found) == 1 and found[0].imported is not None:
                binding, importer = found[0], owner
                continue
            if found and all(_is_data(b.node) for b in found):
                return owner, target.name
            return None
        return None

    def nodes_with_scopes(
        self, statements: Body, scope: Scope, module: Module
    ) -> Iterator[tuple[ast.AST, Scope]]:
        """Nodes of a body with the scope each is evaluated in (comprehensions have their
        own), not descending into nested definitions. Where no branch is decided the walk
        depends on the tree and its scopes alone: made once per body and scope, and kept."""
        deciding = self.evaluator.target_torch is not None and module.tests_versions
        if deciding:
            return self._walk_with_scopes(statements, scope, module, deciding)
        key = (id(statements), id(scope))
        found = _NODES_WITH_SCOPES.get(key)
        if found is None or found[0] is not statements or found[1] is not scope:
            walked = tuple(self._walk_with_scopes(statements, scope, module, deciding))
            found = _NODES_WITH_SCOPES[key] = (statements, scope, walked)
        return iter(found[2])

    def _walk_with_scopes(
        self, statements: Body, scope: Scope, module: Module, deciding: bool
    ) -> Iterator[tuple[ast.AST, Scope]]:
        stack = [(node, scope) for node in reversed(statements)]
        scopes = module.scopes
        while stack:
            node, node_scope = stack.pop()
            yield node, node_scope
            if isinstance(node, COMPREHENSIONS):
                inner = scopes.function_scope(node) or scopes.build_nested(node, node_scope)
                stack.extend((child, inner) for child in reversed(children_run_here(node)))
                continue
            if deciding and isinstance(node, ast.If):
                children = self._live_branches(node, Context(module, node_scope))
            else:
                children = children_run_here(node)
            stack.extend((child, node_scope) for child in reversed(children))

    def _live_branches(self, node: ast.If, context: Context) -> list[ast.AST]:
        """An ``if``'s test and the branches that run on the torch the project targets."""
        true, false = self.evaluator.test_versions(node.test, context)
        targeted = at_least(self.evaluator.target_torch)
        children: list[ast.AST] = [node.test]
        if not targeted.intersect(true).empty:
            children.extend(node.body)
        if not targeted.intersect(false).empty:
            children.extend(node.orelse)
        return children


# (body, scope, walk): a body's nodes with their scopes (see nodes_with_scopes), the body
# and scope kept so that their ids are never reused while an entry lives.
_Walk = tuple[tuple[ast.AST, Scope], ...]
_NODES_WITH_SCOPES: dict[tuple[int, int], tuple[Body, Scope, _Walk]] = process_memo()


# Imports followed from a reader to the module that assigns the global.
_MAX_REEXPORTS = 4


def _at_module_level(cls: ClassValue) -> bool:
    return cls.context.scope.kind == "module"


def _method_of_a_local(func: ast.expr, scope: Scope) -> bool:
    """``x.view`` where ``x`` is a local variable or a parameter other than ``self``/``cls``."""
    if not isinstance(func, ast.Attribute):
        return False
    root = func.value
    while isinstance(root, ast.Attribute):
        root = root.value
    if not isinstance(root, ast.Name):
        return False
    bindings = scope.lookup(root.id, node_position(root))
    return bool(bindings) and all(b.scope.kind == "function" and not _is_self(b) for b in bindings)


def _is_self(binding: Binding) -> bool:
    """The first parameter of a method (``self``, or ``cls`` of a classmethod)."""
    function = binding.scope.node
    if not isinstance(binding.node, ast.arg) or not isinstance(function, FUNCTIONS):
        return False
    positional = [*function.args.posonlyargs, *function.args.args]
    return (
        bool(positional) and positional[0] is binding.node and binding.scope.self_name is not None
    )


def _names_a_module_or_class(receiver: ast.expr, scope: Scope) -> bool:
    """Whether ``receiver`` (``cfg``, ``pkg.cfg``, ``Config``) is rooted in a name bound at
    module level, or in the first parameter of a classmethod (see
    ``_module_attribute_reads``)."""
    root = receiver
    while isinstance(root, ast.Attribute):
        root = root.value
    if not isinstance(root, ast.Name):
        return False
    bindings = scope.lookup(root.id, node_position(root))
    if not bindings:
        return False
    return all(b.scope.kind == "module" or _is_class_parameter(b) for b in bindings)


def _is_class_parameter(binding: Binding) -> bool:
    function = binding.scope.node
    if not isinstance(binding.node, ast.arg) or not isinstance(function, FUNCTIONS):
        return False
    positional = [*function.args.posonlyargs, *function.args.args]
    return (
        bool(positional)
        and positional[0] is binding.node
        and any(isinstance(d, ast.Name) and d.id == "classmethod" for d in function.decorator_list)
    )


def module_data(name: str, scope: Scope, position: tuple[int, int]) -> bool:
    """Whether ``name`` refers only to module-level assignments (not imports, functions or
    classes): a global whose value can change."""
    bindings = scope.lookup(name, position)
    return bool(bindings) and all(b.scope.kind == "module" and _is_data(b.node) for b in bindings)


def _is_data(node: ast.AST) -> bool:
    return not isinstance(node, (*_DEFINITIONS, ast.Import, ast.ImportFrom))


_ASSIGNING = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)


def _mutation(call: ast.Call, scope: Scope, module: Module) -> GlobalWrite | None:
    """The module-level object a call mutates (``CACHE.append(...)``, also what
    ``CACHE.setdefault(k, []).append(...)`` appends to), if any."""
    callee = call.func
    if isinstance(callee, ast.Attribute) and callee.attr in MUTATING_METHODS:
        receiver = callee.value
        if _is_setdefault(receiver):
            receiver = receiver.func.value  # type: ignore[attr-defined]
        root = root_name(receiver)
        if root is not None and module_data(root.id, scope, node_position(root)):
            return GlobalWrite(module, root.id, Location(module, call.lineno), "mutates")
    return None


def _assignment_writes(statement: ast.stmt, scope: Scope, module: Module) -> Iterator[GlobalWrite]:
    """The writes an assignment statement's targets make (its calls are seen as nodes)."""
    for target in assigned_targets(statement):
        if isinstance(target, ast.Name):
            if target.id in scope.global_names:
                where = Location(module, statement.lineno)
                yield GlobalWrite(module, target.id, where, "assigns")
            continue
        root = root_name(target)
        if root is not None and module_data(root.id, scope, node_position(root)):
            yield GlobalWrite(module, root.id, Location(module, statement.lineno), "mutates")


def global_writes(statement: ast.stmt, scope: Scope, module: Module) -> Iterator[GlobalWrite]:
    """Rebinding of a ``global`` name, or mutation of a module-level data object."""
    if isinstance(statement, _ASSIGNING):
        yield from _assignment_writes(statement, scope, module)
    for node in header_nodes(statement):
        if isinstance(node, ast.Call) and not fills_from_key(node):
            mutation = _mutation(node, scope, module)
            if mutation is not None:
                yield mutation


def assigned_targets(statement: ast.stmt) -> list[ast.expr]:
    if isinstance(statement, ast.Assign):
        targets: list[ast.expr] = []
        for target in statement.targets:
            targets.extend(_flatten_target(target))
        return targets
    if isinstance(statement, (ast.AugAssign, ast.AnnAssign)):
        if statement.value is not None or isinstance(statement, ast.AugAssign):
            return [statement.target]
        return []
    if isinstance(statement, ast.Delete):
        return [t for t in statement.targets if not isinstance(t, ast.Name)]
    return []


def _flatten_target(target: ast.expr) -> list[ast.expr]:
    found: list[ast.expr] = []
    stack = [target]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Tuple, ast.List)):
            stack.extend(reversed(node.elts))
        elif isinstance(node, ast.Starred):
            stack.append(node.value)
        else:
            found.append(node)
    return found


def root_name(expression: ast.expr) -> ast.Name | None:
    """``CACHE`` in ``CACHE[key].items``; None when the chain goes through a call."""
    while isinstance(expression, (ast.Attribute, ast.Subscript)):
        expression = expression.value
    return expression if isinstance(expression, ast.Name) else None


_BODY_FIELDS = ("body", "orelse", "finalbody", "handlers", "cases")


def header_nodes(statement: ast.stmt) -> Iterator[ast.AST]:
    """Nodes of a statement outside its nested statement bodies and definitions."""
    if isinstance(statement, _DEFINITIONS):
        return
    stack: list[ast.AST] = []
    for name, value in ast.iter_fields(statement):
        if name in _BODY_FIELDS:
            continue
        if isinstance(value, ast.AST):
            stack.append(value)
        elif isinstance(value, list):
            stack.extend(v for v in value if isinstance(v, ast.AST))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, ast.Lambda):
            stack.extend(child_nodes(node))


def _getattr_with_a_name(call: ast.Call) -> tuple[ast.expr, str] | None:
    """``getattr(receiver, "name"[, default])``: the receiver and the name."""
    if not (isinstance(call.func, ast.Name) and call.func.id == "getattr" and len(call.args) > 1):
        return None
    name = call.args[1]
    if isinstance(name, ast.Constant) and isinstance(name.value, str):
        return call.args[0], name.value
    return None


def _is_setdefault(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "setdefault"
    )


def is_memo_call(node: ast.AST) -> bool:
    """``CACHE.setdefault(key, build(key))``: writes only a key that is missing, so running
    it again writes nothing. Not with an empty container as the value (``setdefault(key,
    [])``): that entry is made to be filled, by each run."""
    if not _is_setdefault(node):
        return False
    value = node.args[1] if len(node.args) > 1 else None  # type: ignore[attr-defined]
    if isinstance(value, (ast.List, ast.Dict, ast.Set)):
        return False
    return not (
        isinstance(value, ast.Call)
        and isinstance(value.func, (ast.Name, ast.Attribute))
        and _callee_name(value.func) in _EMPTY_CONTAINERS
    )


_EMPTY_CONTAINERS = frozenset("list dict set defaultdict OrderedDict deque".split())


def fills_from_key(node: ast.AST) -> bool:
    """``CACHE.setdefault(key, build(key))``: a memo whose value is built from its key, so
    whoever fills the entry, and whenever, a reader finds the same value. (A registration,
    ``NORMS.setdefault(name, function)``, puts a value the key does not decide.)"""
    if not is_memo_call(node):
        return False
    key, value = node.args[:2] if len(node.args) > 1 else (None, None)  # type: ignore[attr-defined]
    if not isinstance(value, ast.Call) or key is None:
        return False
    keys = {n.id for n in ast.walk(key) if isinstance(n, ast.Name)}
    used = [*value.args, *(k.value for k in value.keywords)]
    return any(isinstance(n, ast.Name) and n.id in keys for u in used for n in ast.walk(u))


def _callee_name(expression: ast.Name | ast.Attribute) -> str:
    return expression.id if isinstance(expression, ast.Name) else expression.attr


def guarded_by_test_of(body: Body, write: GlobalWrite, scope: Scope) -> bool:
    """A write after a test of the same global, or of a ``global`` the function keeps as a
    "loaded" flag (``if KERNEL is None:``, ``if key not in CACHE:``, ``if _loaded != impl:``,
    an early ``return`` when set already), or of what was looked up in it (``m =
    CACHE.get(key)`` ... ``if m is None:``), or in the ``except`` of a ``try`` that reads it
    (``try: return CACHE[key] except KeyError: CACHE[key] = ...``): a lazy initialisation or
    a memo, which a second run leaves as it was."""
    sentinels = {write.name, *scope.global_names}
    nodes = own_nodes(body)
    looked_up = {
        node.targets[0].id
        for node in nodes
        if isinstance(node, ast.Assign)
        and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Name)
        and _looks_up(node.value, write.name)
        and node.lineno < write.where.line
    }
    for node in nodes:
        if isinstance(node, (ast.If, ast.While, ast.IfExp, ast.Assert)):
            test = node.test
            if (test.end_lineno or test.lineno) >= write.where.line:
                continue
            if any(isinstance(n, ast.Name) and n.id in sentinels for n in ast.walk(test)):
                return True
            if _tests_presence(test, looked_up):
                return True
        elif isinstance(node, ast.Try) and _in_a_handler(node, write.where.line):
            if any(
                isinstance(n, ast.Name) and n.id == write.name
                for statement in node.body
                for n in ast.walk(statement)
            ):
                return True
    return False


def _looks_up(value: ast.expr, name: str) -> bool:
    """``NAME.get(key)`` or ``NAME.get(key, None)``: None when the key is missing."""
    return (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Attribute)
        and value.func.attr == "get"
        and isinstance(value.func.value, ast.Name)
        and value.func.value.id == name
        and not value.keywords
        and (len(value.args) == 1 or (len(value.args) == 2 and _is_none(value.args[1])))
    )


def _tests_presence(test: ast.expr, names: set[str]) -> bool:
    """``m is None``, ``m is not None``, ``not m`` or ``m`` for one of ``names``: whether
    the lookup found the key (a test of its value, ``m < 10``, decides more)."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test = test.operand
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        if isinstance(test.ops[0], (ast.Is, ast.IsNot)) and _is_none(test.comparators[0]):
            test = test.left
    return isinstance(test, ast.Name) and test.id in names


def _is_none(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _in_a_handler(node: ast.Try, line: int) -> bool:
    return any(
        handler.lineno <= line <= (handler.end_lineno or handler.lineno)
        for handler in node.handlers
    )


def _opt_in_parameters(arguments: ast.arguments) -> dict[str, OptIn]:
    positional = [*arguments.posonlyargs, *arguments.args]
    defaulted = positional[len(positional) - len(arguments.defaults) :]
    found = {
        a.arg: OptIn(a.arg, positional.index(a))
        for a, default in zip(defaulted, arguments.defaults, strict=True)
        if _false_constant(default)
    }
    for a, default in zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True):
        if default is not None and _false_constant(default):
            found[a.arg] = OptIn(a.arg, None)
    return found


def _switch_of(spans: list[tuple[int, int, OptIn]], line: int) -> OptIn | None:
    for first, last, switch in spans:
        if first <= line <= last:
            return switch
    return None


def _false_constant(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and not node.value


def _switched_off(call: ast.Call | None, qualified: str) -> bool:
    """``F.dropout(x, p=0)`` or ``training=False``: draws nothing."""
    if call is None or "dropout" not in qualified:
        return False
    return _literal_argument(call, "p", 1) == 0 or _literal_argument(call, "training", 2) is False


def _module_switched_off(instance: Instance) -> bool:
    """``nn.Dropout(0)``: draws nothing."""
    return instance.call is not None and _literal_argument(instance.call, "p", 0) == 0


def _literal_argument(call: ast.Call, keyword: str, index: int) -> object:
    """A constant argument's value, or None when it is absent or not a constant."""
    for given in call.keywords:
        if given.arg == keyword:
            return given.value.value if isinstance(given.value, ast.Constant) else None
    if len(call.args) > index and isinstance(call.args[index], ast.Constant):
        return call.args[index].value  # type: ignore[attr-defined]
    return None
