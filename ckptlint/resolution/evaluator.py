"""One evaluator for the whole project: the possible values of an expression.

Names are looked up through the module's scopes, imports are followed into the project's
other modules (absolute, relative, re-exports through ``__init__``, star imports), classes
resolve their members through their bases in any module, calls of project functions give
what those functions return (with parameters bound to the call's arguments), and torch's
containers (``nn.ModuleList``, ``nn.Sequential``, ``nn.ModuleDict``) give their elements.

Every lookup is bounded (depth, cycles) and memoised per expression and context, so the cost
does not grow with how deeply the input nests. Whatever cannot be seen is ``UNKNOWN``.
"""

from __future__ import annotations

import ast
import builtins
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import replace
from typing import TypeGuard, TypeVar

from packaging.version import Version

from ckptlint.memos import process_memo
from ckptlint.project.index import Module, Project
from ckptlint.project.scopes import (
    FUNCTIONS,
    Binding,
    Scope,
    body_containing,
    fold,
    node_position,
    parameter_defaults,
    statements_at,
)
from ckptlint.resolution.bodies import (
    DEFINITIONS,
    first_parameter,
    line_span,
    own_nodes,
    statements_on_line,
)
from ckptlint.resolution.mappings import Unknown, flows_of, held, may_lack
from ckptlint.resolution.solver import Solver
from ckptlint.resolution.values import (
    CONTEXT_DEPTH,
    UNKNOWN,
    Argument,
    Arguments,
    CallKeywords,
    ClassValue,
    Constant,
    Context,
    Elements,
    Environment,
    External,
    Flow,
    FunctionValue,
    Instance,
    Mapping,
    Method,
    ModuleValue,
    Parameter,
    PartialValue,
    Row,
    Sequence,
    Super,
    TorchVersionTest,
    Value,
    Values,
    activations,
    held_contexts,
    known,
    limit_context,
    unique,
)
from ckptlint.resolution.versions import (
    DISTRIBUTION_VERSIONS,
    EVERY_VERSION,
    NO_VERSION,
    TEST_HELPERS,
    TORCH_VERSION,
    VERSION_PARSERS,
    VersionRange,
    at_least,
    helper_test,
    names_torch_version,
    parse_version,
)
from ckptlint.torch_catalogue import (
    CONTAINERS,
    MAPPING_CONTAINERS,
    RETURNS_ITS_MODULE,
    SEQUENTIAL_CONTAINERS,
    canonical,
)

T = TypeVar("T")
PARTIAL = "functools.partial"
# At most this many values per expression (in source order), then UNKNOWN: a name bound in
# thousands of branches, or a container of thousands of elements, costs no more than that.
MAX_VALUES = 64
# ``return g(...)`` chains are followed through at most this many functions (then UNKNOWN).
MAX_TAIL_CALLS = 1_000
_UNKNOWN: Values = (UNKNOWN,)
_BUILTINS = frozenset(dir(builtins))
_ITERATION_BUILTINS = frozenset({"list", "tuple", "iter", "reversed", "sorted", "set", "frozenset"})


class Evaluator:
    """``duck_typing``: an unannotated parameter's attributes are looked up in the classes
    its module defines or imports (see ``_duck_typed_member``); used only for regions, where
    guessing what ``model.transformer.h`` holds is worth its cost and its risk.

    Every lookup goes through the run's ``Solver``: memoised, bounded, the same in any order
    (see ``resolution.solver``)."""

    def __init__(
        self,
        project: Project,
        *,
        duck_typing: bool = False,
        target_torch: Version | None = None,
        solver: Solver | None = None,
    ) -> None:
        self.project = project
        self.duck_typing = duck_typing
        self.solver = solver if solver is not None else Solver()
        self._kind = "duck" if duck_typing else "exact"  # keys differ between the two views
        # The oldest torch the project runs on (None: not known, no branch is decided).
        self.target_torch = target_torch
        self._targeted = at_least(target_torch)
        self._contexts: dict[Context, Context] = {}
        self._methods_built: set[int] = set()
        self._derived: dict[str, dict[str, list[ast.ClassDef]]] = {}

    # -- entry points ----------------------------------------------------------------------
    def module_context(self, module: Module) -> Context:
        return Context(module, module.scopes.module)

    def evaluate(self, expression: ast.expr, context: Context) -> Values:
        if context.env and isinstance(expression, ast.Name) and _module_level(expression, context):
            context = Context(context.module, context.scope)  # what it names binds nothing
        return self._guarded((expression, context), self._evaluate, expression, context)

    def member(self, values: Values, attribute: str) -> Values:
        return (
            unique(
                v
                for value in values
                for v in self._guarded(("member", value, attribute), self._member, value, attribute)
            )
            or _UNKNOWN
        )

    def iterate(self, values: Values) -> Values:
        """What iterating over any of ``values`` yields."""
        return (
            unique(
                v
                for value in values
                for v in self._guarded(("iterate", value), self._elements, value)
            )
            or _UNKNOWN
        )

    def _guarded(
        self, key: Hashable, compute: Callable[..., Iterable[Value]], *args: object
    ) -> Values:
        """Asked of the solver: memoised, bounded, UNKNOWN where cut or failed."""
        return self.solver.ask((self._kind, key), _values_of, compute, *args, fallback=_UNKNOWN)

    def _ask(self, key: Hashable, compute: Callable[..., T], *args: object, fallback: T) -> T:
        """Any other question, asked of the solver (keys differ between the two views)."""
        return self.solver.ask((self._kind, key), compute, *args, fallback=fallback)

    def call_result(self, callee: Values, call: ast.Call, context: Context) -> Values:
        return unique(v for value in callee for v in self._call(value, call, context)) or (UNKNOWN,)

    def bind(self, function: FunctionValue, arguments: Arguments | None) -> Context:
        """The context ``function``'s body runs in when it receives ``arguments`` (None: a
        call the analysis does not see, parameters unbound)."""
        node = function.node
        scope = self.scope_of(function)
        env: list[tuple[ast.arg, Argument]] = list(function.context.env)
        positional = [*node.args.posonlyargs, *node.args.args]
        if function.bound is not None and positional:
            env.append((positional[0], Argument(None, None, function.bound)))
            positional = positional[1:]
        if arguments is not None:
            supplied: set[str] = set()
            for parameter, flow in zip(positional, arguments.positional, strict=False):
                if flow is None:  # a *args: the rest is not known
                    break
                env.append((parameter, passed_on(Argument(*flow))))
                supplied.add(parameter.arg)
            by_name = {p.arg: p for p in (*positional, *node.args.kwonlyargs)}
            for name, flow in arguments.keywords.items():
                if name in by_name:
                    env.append((by_name[name], passed_on(Argument(*flow))))
                    supplied.add(name)
            for parameter, default in parameter_defaults(node.args).items():
                if parameter.arg not in supplied and not arguments.double_star:
                    left_out = Argument(default, function.context, (), True, parameter, node)
                    env.append((parameter, left_out))
            if node.args.kwarg is not None:
                taken = frozenset(p.arg for p in (*node.args.posonlyargs, *node.args.args))
                held = self._keywords(node, arguments, taken | frozenset(by_name))
                env.append((node.args.kwarg, Argument(None, None, (held,))))
        return self.context(function.module, scope, tuple(env))

    def _keywords(self, node: ast.AST, arguments: Arguments, taken: frozenset[str]) -> CallKeywords:
        """What ``node``'s ``**kwargs`` holds: the keywords ``arguments`` pass by name and
        spread. A caller's own ``**kwargs`` handed on unchanged (used only as ``**kw``) is
        replaced by what its caller passed, so a chain of wrappers forwarding ``**kwargs``
        binds the keywords of the call that wrote them, whatever its length."""
        spread: list[Flow] = []
        keywords: dict[str, Flow] = {}
        owner: ast.AST | None = node
        for flow in arguments.spread:
            passed = self._handed_on(*flow) if len(arguments.spread) == 1 else None
            if passed is None:
                spread.append(flow)
                continue
            inner = passed.arguments
            keywords.update((k, v) for k, v in inner.keywords.items() if k not in passed.taken)
            spread.extend(inner.spread)
            owner = passed.owner
        if owner is node:
            spread = [_canonical(flow) for flow in arguments.spread]
            if spread != list(arguments.spread):
                arguments = replace(arguments, spread=tuple(spread))
            return CallKeywords(arguments, taken, node)
        keywords.update(arguments.keywords)
        merged = Arguments((), keywords, bool(spread), arguments.calls, tuple(spread))
        return CallKeywords(merged, taken, owner)

    def _handed_on(self, expression: ast.expr, context: Context) -> CallKeywords | None:
        """The keywords a ``**kwargs`` parameter holds when ``expression`` is that parameter
        of the function ``context`` runs, which uses it only to spread it (no edit)."""
        if not isinstance(expression, ast.Name):
            return None
        bindings = context.scope.lookup(expression.id, node_position(expression))
        if len(bindings) != 1 or bindings[0].scope is not context.scope:
            return None
        function = context.scope.node
        if not isinstance(function, FUNCTIONS) or bindings[0].node is not function.args.kwarg:
            return None
        argument = context.argument(bindings[0].node)
        if argument is None or len(argument.values) != 1:
            return None
        (held,) = argument.values
        if not isinstance(held, CallKeywords) or not only_spread(function, expression.id):
            return None
        return held

    def context(self, module: Module, scope: Scope, env: Environment = ()) -> Context:
        """The context binding ``env`` in ``scope``, its nesting bounded (``limit_context``)
        and one object per distinct binding: contexts nest (an argument holds its caller's
        context), and comparing equal copies would walk the whole nest at every level."""
        context = Context(module, scope, env)
        if env:
            recursive = any(scope in activations(inner) for _, inner in _argument_contexts(env))
            context = limit_context(context, 1 if recursive else CONTEXT_DEPTH)
        return self._contexts.setdefault(context, context)

    def scope_of(self, function: FunctionValue | ClassValue) -> Scope:
        scopes = function.context.module.scopes
        scope = scopes.function_scope(function.node)
        if scope is None:  # a lambda in an expression the scope builder did not visit
            scope = scopes.build_nested(function.node, function.context.scope)
        return scope

    def returned(self, function: FunctionValue, arguments: Arguments | None) -> Values:
        """What calling ``function`` returns (union over its ``return`` statements)."""
        return self._returned_in(function, self.bind(function, arguments))

    def _returned_in(self, function: FunctionValue, inner: Context) -> Values:
        """The union over the ``return`` statements. A ``return g(...)`` of a project
        function is followed in a loop, not by asking what the call gives: a chain of
        wrappers each returning the next one's result costs no evaluation depth."""
        results: list[Value] = []
        pending: list[tuple[FunctionValue, Context]] = [(function, inner)]
        done: set[tuple[ast.AST, Context]] = set()
        while pending and len(done) < MAX_TAIL_CALLS:
            function, inner = pending.pop(0)
            if (function.node, inner) in done:
                continue
            done.add((function.node, inner))
            if isinstance(function.node, ast.Lambda):
                results.extend(self.evaluate(function.node.body, inner))
                continue
            for node in own_nodes(function.node.body):
                if isinstance(node, (ast.Yield, ast.YieldFrom)):
                    results.append(UNKNOWN)  # a generator
                    break
                if isinstance(node, ast.Return):
                    if node.value is None:
                        results.append(Constant(None))
                        continue
                    tail = self._tail_call(node.value, inner)
                    if tail is None:
                        results.extend(self.evaluate(node.value, inner))
                    else:
                        pending.extend(tail)
        if pending:
            results.append(UNKNOWN)  # more tail calls than followed
        return unique(results) or (Constant(None),)

    def _tail_call(
        self, expression: ast.expr, context: Context
    ) -> list[tuple[FunctionValue, Context]] | None:
        """For ``return g(...)`` where ``g`` may only be project functions (no version test
        known by name): each with the context the call runs its body in."""
        if not isinstance(expression, ast.Call):
            return None
        functions = [
            v for v in self.evaluate(expression.func, context) if isinstance(v, FunctionValue)
        ]
        callee = self.evaluate(expression.func, context)
        if len(functions) != len(callee) or any(_called_name(v) in TEST_HELPERS for v in callee):
            return None
        arguments = Arguments.of(expression, context)
        return [(function, self.bind(function, arguments)) for function in functions]

    def mro(self, cls: ClassValue) -> list[ClassValue | External]:
        """The class and its bases, left to right, each once (external bases end a branch;
        a cycle of bases ends where it closes)."""
        return self._ask(("mro", cls), self._mro, cls, fallback=[cls])

    def _mro(self, cls: ClassValue) -> list[ClassValue | External]:
        order: list[ClassValue | External] = [cls]
        outer = cls.context
        for base in cls.node.bases:
            for value in self.evaluate(base, outer):
                for ancestor in self.mro(value) if isinstance(value, ClassValue) else [value]:
                    if isinstance(ancestor, (ClassValue, External)) and ancestor not in order:
                        order.append(ancestor)
        return order

    def instance_assignments(self, cls: ClassValue, attribute: str) -> list[Binding]:
        """``self.<attribute> = ...`` in the methods of ``cls`` (every method is scoped)."""
        scope = self.scope_of(cls)
        if id(scope) not in self._methods_built:
            self._methods_built.add(id(scope))
            for statement in cls.node.body:
                if isinstance(statement, FUNCTIONS):
                    cls.context.module.scopes.function_scope(statement)
        return scope.instance_attributes.get(attribute, [])

    # -- expressions -----------------------------------------------------------------------
    def _evaluate(self, node: ast.expr, context: Context) -> Iterator[Value]:
        if isinstance(node, ast.Name):
            yield from self._name(node, context)
        elif isinstance(node, ast.Attribute):
            yield from self.member(self.evaluate(node.value, context), node.attr)
        elif isinstance(node, ast.Call):
            yield from self._call_expression(node, context)
        elif isinstance(node, ast.Subscript):
            yield from self._subscript(node, context)
        elif isinstance(node, ast.Constant):
            yield Constant(node.value)
        elif isinstance(node, ast.Lambda):
            yield FunctionValue(node, context)
        elif isinstance(node, (ast.List, ast.Tuple, ast.Set, ast.ListComp, ast.SetComp)):
            yield Sequence(node, context)
        elif isinstance(node, ast.GeneratorExp):
            yield Sequence(node, context)
        elif isinstance(node, (ast.Dict, ast.DictComp)):
            yield Mapping(node, context)
        elif isinstance(node, ast.BoolOp):
            for operand in node.values:
                yield from self.evaluate(operand, context)
        elif isinstance(node, ast.IfExp):
            yield from self.evaluate(node.body, context)
            yield from self.evaluate(node.orelse, context)
        elif isinstance(node, ast.NamedExpr):
            yield from self.evaluate(node.value, context)
        elif isinstance(node, ast.Compare) and len(node.ops) == 1:
            yield self._version_comparison(node, context)
        else:
            yield UNKNOWN

    def _version_comparison(self, node: ast.Compare, context: Context) -> Value:
        """``torch.__version__ >= "1.11"`` (torch's version compares as a version, also
        with a tuple) or ``version.parse(torch.__version__) < version.parse("2.0")``."""
        operator = _COMPARISONS.get(type(node.ops[0]))
        if operator is None or not _mentions_a_version(node):
            return UNKNOWN
        left = self.evaluate(node.left, context)
        right = self.evaluate(node.comparators[0], context)
        if not _is_torch_version(left):
            left, right, operator = right, left, _MIRRORED[operator]
        version = _version_literal(right) if _is_torch_version(left) else None
        if version is None:
            return UNKNOWN
        return TorchVersionTest(VersionRange.compared(operator, version))

    def _name(self, node: ast.Name, context: Context) -> Iterator[Value]:
        bindings = self._live(context.scope.lookup(node.id, node_position(node)), context.module)
        if not bindings:
            yield from self._unbound_name(node.id, context.module)
            return
        for binding in bindings:
            yield from self.binding_values(binding, context)

    def _unbound_name(self, name: str, module: Module) -> Values:
        """A name no statement of the module binds: star imports, then builtins.

        Star imports are searched depth first in statement order, each module once, so a
        cycle of them (``a`` imports ``*`` from ``b``, ``b`` from ``a``) ends, however many
        files it spans."""
        visited = {module.path}
        stack = [(module, list(reversed(module.scopes.module.star_imports)))]
        while stack:
            importer, targets = stack[-1]
            if not targets:
                stack.pop()
                continue
            target = targets.pop()
            absolute = importer.resolve_import(target.level, target.module)
            imported = None if absolute is None else self.project.module_named(absolute)
            if imported is not None:
                if imported.path in visited:
                    continue
                visited.add(imported.path)
                bindings = imported.scopes.module.bindings.get(name)
                if bindings:
                    context = self.module_context(imported)
                    return unique(
                        v for b in fold(bindings, None) for v in self.binding_values(b, context)
                    )
                stack.append((imported, list(reversed(imported.scopes.module.star_imports))))
            elif absolute is not None and name not in _BUILTINS:
                return (External(f"{absolute}.{name}"),)
        return (External(f"builtins.{name}"),) if name in _BUILTINS else (UNKNOWN,)

    def binding_values(self, binding: Binding, context: Context) -> Values:
        node = binding.node
        if binding.imported is not None:  # imports chain through modules: bounded
            key = (binding, self.module_context(context.module))
            return self._guarded(key, self._imported, binding, context.module)
        if isinstance(node, FUNCTIONS):
            function = FunctionValue(node, context.at(binding.scope))
            if node.decorator_list and binding.scope.kind != "class":
                return self._ask(
                    ("decorated", function), self._decorated, function, fallback=(function,)
                )
            return (function,)
        if isinstance(node, ast.ClassDef):
            return (ClassValue(node, context.at(binding.scope)),)
        if isinstance(node, ast.arg):
            return self._parameter(node, binding, context)
        if binding.value is None:
            return (UNKNOWN,)
        values = self.evaluate(binding.value, context.at(binding.scope))
        if not binding.iterated and not binding.path:
            values = _made_for(values, binding)
        if binding.iterated:
            values = self.iterate(values)
        for index in binding.path:
            values = unique(v for value in values for v in _item(value, index, self)) or (UNKNOWN,)
        return values

    def _decorated(self, function: FunctionValue) -> Values:
        """What a decorated ``def`` binds its name to: each project decorator (innermost
        first) called with what the ones below it made (``@functools.wraps`` and any
        decorator the analysis cannot see leave the function as it is)."""
        node = function.node
        assert not isinstance(node, ast.Lambda)
        outer = function.context
        current: Values = (function,)
        for decorator in reversed(node.decorator_list):
            made: list[Value] = []
            for value in self.evaluate(decorator, outer):
                made.extend(self._decorate(value, current))
            current = unique(made) or current
        return current

    def _decorate(self, decorator: Value, decorated: Values) -> Values:
        """``decorator(decorated)``, for a project function taking it first."""
        if not isinstance(decorator, FunctionValue) or isinstance(decorator.node, ast.Lambda):
            return decorated
        parameters = [*decorator.node.args.posonlyargs, *decorator.node.args.args]
        if decorator.bound is not None or not parameters:
            return decorated
        given = (parameters[0], Argument(None, None, decorated))
        scope = self.scope_of(decorator)
        inner = self.context(decorator.module, scope, (*decorator.context.env, given))
        returned = self._returned_in(decorator, inner)
        return known(returned) or decorated

    def argument_values(self, argument: Argument) -> Values:
        """What a parameter bound to ``argument`` holds (followed to where it was written)."""
        argument = passed_on(argument)
        if argument.expression is None:
            return argument.values
        return self.evaluate(argument.expression, argument.context)  # type: ignore[arg-type]

    def _parameter(self, node: ast.arg, binding: Binding, context: Context) -> Values:
        argument = context.argument(node)
        if argument is not None:
            return self.argument_values(argument)
        scope = binding.scope
        owner = scope.enclosing_class
        if owner is not None and scope.self_name == node.arg and _is_first(node, scope.node):
            return (Instance(ClassValue(owner.node, context.at(owner.parent)), exact=False),)  # type: ignore[arg-type]
        values: list[Value] = [Parameter(node, scope.node, context.module)]
        if binding.value is not None:  # what callers pass, the default where they omit it
            function = FunctionValue(scope.node, context.at(scope.parent))  # type: ignore[arg-type]
            key = ("passed", node, context.module)
            passed = self._guarded(key, self._passed_by_callers, function, node)
            if passed == (UNKNOWN,):  # callers the analysis cannot all see
                passed = self.evaluate(binding.value, context.at(scope.parent))  # type: ignore[arg-type]
            values.extend(passed)
        if node.annotation is not None and not isinstance(node.annotation, ast.Constant):
            for annotated in self.evaluate(node.annotation, context.at(scope.parent)):  # type: ignore[arg-type]
                if isinstance(annotated, ClassValue):
                    values.append(Instance(annotated, exact=False))
        return tuple(values)

    def _passed_by_callers(self, function: FunctionValue, parameter: ast.arg) -> Values:
        """What the calls of a private function pass as ``parameter`` (its default where a
        call leaves it out); UNKNOWN when some call may be unseen or pass it in ``**``."""
        callers = self.callers(function)
        if callers is None:
            return (UNKNOWN,)
        values: list[Value] = []
        for callee, arguments in callers:
            argument = self.bind(callee, arguments).argument(parameter)
            if argument is None:
                return (UNKNOWN,)
            values.extend(self.argument_values(argument))
        return tuple(values)

    def callers(self, function: FunctionValue) -> list[tuple[FunctionValue, Arguments]] | None:
        """The calls of a function, each with the callee as called (bound to its instance)
        and its arguments, when all can be seen: a private function (``_name``) of which
        every use in its module is a call, a ``functools.partial`` or an introspection
        (``inspect.signature``). A call that cannot bind (a keyword the function does not
        take) raises, so it passes nothing. None: a public function, or one that escapes."""
        node = function.node
        if isinstance(node, ast.Lambda) or not _is_private(node.name):
            return None
        key = ("callers", node, function.module)
        return self._ask(key, self._find_callers, function, fallback=None)

    def _find_callers(
        self, function: FunctionValue
    ) -> list[tuple[FunctionValue, Arguments]] | None:
        node = function.node
        module = function.module
        found: list[tuple[FunctionValue, Arguments]] = []
        seen: set[int] = set()
        for line in module.lines_naming(node.name):  # type: ignore[union-attr]
            for statement, scope in statements_on_line(module, line):
                context = Context(module, scope)
                parents = {
                    id(child): parent
                    for parent in _statement_nodes(statement)
                    for child in ast.iter_child_nodes(parent)
                }
                for reference in _statement_nodes(statement):
                    if id(reference) in seen or not _refers_to(reference, node.name):  # type: ignore[union-attr]
                        continue
                    seen.add(id(reference))
                    use = self._use(reference, parents.get(id(reference)), context, node)
                    if use is None:
                        return None
                    found.extend(use)
        return found

    def _use(
        self, reference: ast.expr, parent: ast.AST | None, context: Context, node: ast.AST
    ) -> list[tuple[FunctionValue, Arguments]] | None:
        """How one reference uses the function: the calls it makes ([] when it is not the
        function, or only looks at it); None when it lets the function escape."""
        values = self.evaluate(reference, context)
        ours = [v for v in values if isinstance(v, FunctionValue) and v.node is node]
        if not ours:
            return [] if known(values) == values else None
        if isinstance(parent, ast.Call) and parent.func is reference:
            arguments = Arguments.of(parent, context)
        elif isinstance(parent, ast.Call) and parent.args and parent.args[0] is reference:
            called = _names(self.evaluate(parent.func, context))
            if any(name in _INTROSPECTION for name in called):
                return []
            if called != [PARTIAL]:
                return None
            partial = Arguments((), {}, False, ()).then(parent, context, skip=1)
            # what the partial is called with later is not known: more may come
            arguments = Arguments((*partial.positional, None), partial.keywords, True, ())
        elif isinstance(parent, ast.Call) and any(a is reference for a in parent.args):
            called = _names(self.evaluate(parent.func, context))
            return [] if called and all(name in _INTROSPECTION for name in called) else None
        else:
            return None
        return [(callee, arguments) for callee in ours if _accepts(callee, arguments)]

    def _imported(self, binding: Binding, module: Module) -> Values:
        target = binding.imported
        assert target is not None
        absolute = module.resolve_import(target.level, target.module)
        if absolute is None:
            return (UNKNOWN,)
        if target.name is None:  # ``import a.b`` binds ``a``; ``import a.b as c`` binds a.b
            return (self.module_value(absolute),)
        source = self.project.module_named(absolute)
        if source is None:
            if self.project.layout.is_project_package(absolute):
                return (self.module_value(f"{absolute}.{target.name}"),)
            return (External(canonical(f"{absolute}.{target.name}")),)
        return self._module_member(source, target.name) or (UNKNOWN,)

    def module_value(self, name: str) -> Value:
        module = self.project.module_named(name)
        if module is not None:
            return ModuleValue(module)
        if self.project.layout.is_project_package(name):
            return External(name)  # a namespace package: its members are submodules
        return External(canonical(name))

    def _module_member(
        self, module: Module, name: str, *, follow_submodules: bool = True
    ) -> Values:
        bindings = self._live(module.scopes.module.bindings.get(name, []), module)
        if bindings:
            context = self.module_context(module)
            return unique(v for b in fold(bindings, None) for v in self.binding_values(b, context))
        if follow_submodules and module.is_package:
            submodule = self.project.module_named(f"{module.name}.{name}")
            if submodule is not None:
                return (ModuleValue(submodule),)
        return self._unbound_name(name, module) if module.scopes.module.star_imports else ()

    # -- torch versions --------------------------------------------------------------------
    def versions_at(self, module: Module, node: ast.AST) -> VersionRange:
        """The torch versions ``node`` runs on: the targeted ones, as far as the ``if`` and
        ``x if test else y`` around it that test the torch version allow."""
        versions = self._targeted
        if not module.tests_versions:
            return versions
        line = node.lineno  # type: ignore[attr-defined]
        scope = module.scopes.module
        innermost: ast.stmt | None = None
        for statement in statements_at(module.tree.body, line):
            if isinstance(statement, ast.If) and statement is not node:
                taken = _branch_taken(statement.body, statement.orelse, line)
                if taken is not None:
                    true, false = self.test_versions(statement.test, Context(module, scope))
                    versions = versions.intersect(true if taken else false)
            if isinstance(statement, (*FUNCTIONS, ast.ClassDef)) and statement is not node:
                scope = module.scopes.function_scope(statement) or scope
            innermost = statement
        if innermost is not None and innermost is not node:
            for branch in _branches_around(innermost, node):
                test, taken = branch
                true, false = self.test_versions(test, Context(module, scope))
                versions = versions.intersect(true if taken else false)
        return versions

    def test_versions(self, test: ast.expr, context: Context) -> tuple[VersionRange, VersionRange]:
        """The torch versions on which ``test`` may be true, and those on which it may be
        false (every version for a test that does not look at the torch version)."""
        return self._ask(
            ("versions", test, context),
            self._test_versions,
            test,
            context,
            fallback=(EVERY_VERSION, EVERY_VERSION),
        )

    def _test_versions(self, test: ast.expr, context: Context) -> tuple[VersionRange, VersionRange]:
        found = None
        if isinstance(test, ast.BoolOp):
            parts = [self.test_versions(value, context) for value in test.values]
            true, false = parts[0]
            for part_true, part_false in parts[1:]:
                if isinstance(test.op, ast.And):
                    true, false = true.intersect(part_true), false.union(part_false)
                else:
                    true, false = true.union(part_true), false.intersect(part_false)
            found = (true, false)
        elif isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            found = self.test_versions(test.operand, context)[::-1]
        elif _mentions_a_version(test):
            values = self.evaluate(test, context)
            if all(isinstance(value, TorchVersionTest) for value in values):
                true, false = NO_VERSION, NO_VERSION
                for value in values:
                    true = true.union(value.versions)  # type: ignore[union-attr]
                    false = false.union(value.versions.complement())  # type: ignore[union-attr]
                found = (true, false)
        return found or (EVERY_VERSION, EVERY_VERSION)

    def _live(self, bindings: list[Binding], module: Module) -> list[Binding]:
        """Bindings made in code that runs on the targeted torch (all, with no target)."""
        if self.target_torch is None or not module.tests_versions:
            return bindings
        return [b for b in bindings if not self.versions_at(module, b.node).empty]

    # -- members ---------------------------------------------------------------------------
    def _member(self, value: Value, attribute: str) -> Values:
        if isinstance(value, External):
            if self.project.layout.is_project_package(value.name):
                return (self.module_value(f"{value.name}.{attribute}"),)
            return (External(canonical(f"{value.name}.{attribute}")),)
        if isinstance(value, ModuleValue):
            return self._module_member(value.module, attribute) or (UNKNOWN,)
        if isinstance(value, Instance):
            return self._instance_member(value, attribute)
        if isinstance(value, ClassValue):
            return self._class_member(value, attribute, None)
        if isinstance(value, Super):
            return self._super_member(value, attribute)
        if isinstance(value, (Mapping, Sequence)):
            return (Method(value, attribute),)
        if isinstance(value, CallKeywords) and attribute in _KEY_READS:
            return (Method(value, attribute),)
        if isinstance(value, FunctionValue) and attribute == "__call__":
            return (value,)
        if self.duck_typing and isinstance(value, Parameter) and self._untyped(value):
            return self._duck_typed_member(value.module, attribute)
        return (UNKNOWN,)

    def _untyped(self, parameter: Parameter) -> bool:
        """No annotation, or one naming no project class (``model: nn.Module``)."""
        annotation = parameter.node.annotation
        if annotation is None:
            return True
        annotated = self.evaluate(annotation, self.module_context(parameter.module))
        return not any(isinstance(value, ClassValue) for value in annotated)

    def _duck_typed_member(self, module: Module, attribute: str) -> Values:
        """``model.transformer`` where nothing says what ``model`` is: the member of each
        class the module defines or imports that has such an attribute (or UNKNOWN)."""
        results: list[Value] = []
        for cls in self.visible_classes(module):
            if any(self.instance_assignments(c, attribute) for c in self._project_mro(cls)):
                results.extend(self._member_in_mro(cls, attribute, Instance(cls, exact=False)))
        return unique(results) or (UNKNOWN,)

    def visible_classes(self, module: Module) -> list[ClassValue]:
        """Classes a module binds at its top level under a capitalised name (defined or
        imported): what an unannotated parameter of its functions most likely is."""
        return self._ask(("visible", module), self._visible_classes, module, fallback=[])

    def _visible_classes(self, module: Module) -> list[ClassValue]:
        found: list[ClassValue] = []
        context = self.module_context(module)
        for name, bindings in module.scopes.module.bindings.items():
            if not name[:1].isupper():
                continue
            for binding in fold(bindings, None):
                for value in self.binding_values(binding, context):
                    if isinstance(value, ClassValue) and value not in found:
                        found.append(value)
        return found

    def _project_mro(self, cls: ClassValue) -> list[ClassValue]:
        return [c for c in self.mro(cls) if isinstance(c, ClassValue)]

    def member_under(self, values: Values, attribute: str, flags: frozenset[str]) -> Values:
        """``x.attribute`` read where ``x.<flag>`` is true for each of ``flags`` (``if
        self.gradient_checkpointing: self._gradient_checkpointing_func(...)``): a value
        stored by a call that, in the same block, sets one of those flags false cannot be
        the one read there, provided every store that may set the flag true also stores
        the attribute (a later call made the flag true, and stored its own value)."""
        results: list[Value] = []
        for value in values:
            if isinstance(value, Instance):
                key = ("member under", value, attribute, flags)
                results.extend(self._guarded(key, self._instance_member, value, attribute, flags))
            else:
                results.extend(self.member((value,), attribute))
        return unique(results) or (UNKNOWN,)

    def _instance_member(
        self, instance: Instance, attribute: str, flags: frozenset[str] = frozenset()
    ) -> Values:
        cls = instance.cls
        if isinstance(cls, External):
            return self._external_instance_member(instance, attribute)
        results: list[Value] = []
        classes = [cls]
        if not instance.exact:
            classes.extend(self._subclasses_overriding(cls, attribute))
        for owner in classes:
            view = instance if owner is cls else Instance(owner, exact=False)
            results.extend(self._member_in_mro(owner, attribute, view, flags))
        if attribute == "__call__" and not known(tuple(results)):
            return (instance,)  # ``module.__call__`` runs the module, as calling it does
        if attribute in _MODULE_ITERATORS and not known(tuple(results)):
            return (Method(instance, attribute),)  # nn.Module's own, not overridden
        return unique(results) or (UNKNOWN,)

    def _member_in_mro(
        self,
        cls: ClassValue,
        attribute: str,
        instance: Instance,
        flags: frozenset[str] = frozenset(),
    ) -> Values:
        order = self.mro(cls)
        for owner in order:
            if isinstance(owner, External):
                break
            assigned = self.instance_assignments(owner, attribute)
            if assigned and flags:
                return unique(
                    v for b in assigned for v in self._stored_under(b, owner, instance, flags)
                )
            if assigned:
                return unique(v for b in assigned for v in self._assigned(b, owner, instance))
        return self._first_member(order, attribute, instance)

    def _stored_under(
        self, binding: Binding, owner: ClassValue, instance: Instance, flags: frozenset[str]
    ) -> Values:
        """``self.<attribute> = value`` as seen where ``flags`` are true (see
        ``member_under``): the values its method's calls store, less those of calls that
        set a flag false beside it; as ``_assigned`` when that cannot be told."""
        method = binding.scope.node
        self_name = binding.scope.self_name
        if not isinstance(method, FUNCTIONS) or binding.value is None or self_name is None:
            return self._assigned(binding, owner, instance)
        beside = _block_of(method, binding.position[0])
        switches = [
            statement.value
            for statement in beside
            if _stores(statement, self_name, flags) and isinstance(statement, ast.Assign)
        ]
        attribute = binding.name
        if not switches or not all(
            self._set_true_only_with(flag, attribute, instance) for flag in flags
        ):
            return self._assigned(binding, owner, instance)
        callers = self.callers(FunctionValue(method, Context(owner.module, binding.scope.parent)))  # type: ignore[arg-type]
        if callers is None:
            return self._assigned(binding, owner, instance)
        results: list[Value] = []
        for callee, arguments in callers:
            context = self.bind(FunctionValue(method, callee.context, (instance,)), arguments)
            if any(all(_falsy(v) for v in self.evaluate(w, context)) for w in switches):
                continue  # this call switches the flag off: its value is never read there
            values = self.evaluate(binding.value, context)
            for index in binding.path:
                values = unique(v for value in values for v in _item(value, index, self))
            results.extend(values)
        return tuple(results)

    def _set_true_only_with(self, flag: str, attribute: str, instance: Instance) -> bool:
        """Whether every ``self.<flag> = ...`` of the instance's classes that may set it
        true also stores ``self.<attribute>`` in the same block."""
        cls = instance.cls
        if not isinstance(cls, ClassValue):
            return False
        owners = [*self._project_mro(cls), *self._subclasses_overriding(cls, flag)]
        for owner in owners:
            for store in self.instance_assignments(owner, flag):
                if isinstance(store.value, ast.Constant) and not store.value.value:
                    continue
                method, self_name = store.scope.node, store.scope.self_name
                if not isinstance(method, FUNCTIONS) or self_name is None:
                    return False
                block = _block_of(method, store.position[0])
                if not any(_stores(s, self_name, frozenset({attribute})) for s in block):
                    return False
        return True

    def _assigned(self, binding: Binding, owner: ClassValue, instance: Instance) -> Values:
        if binding.value is None:
            return (UNKNOWN,)
        method = binding.scope
        node = method.node
        if (
            isinstance(node, FUNCTIONS)
            and node.name == "__init__"
            and instance.call is not None
            and instance.context is not None
            and method.parent is not None
        ):  # stored by the constructor: its parameters are what the instance was made with
            initialiser = FunctionValue(node, Context(owner.module, method.parent), (instance,))
            made = Arguments.of(instance.call, instance.context)
            values = self.evaluate(binding.value, self.bind(initialiser, made))
        else:
            self_parameter = first_parameter(node)
            env: Environment = ()
            if self_parameter is not None:
                env = ((self_parameter, Argument(None, None, (instance,))),)
            values = self.evaluate(binding.value, self.context(owner.module, method, env))
        for index in binding.path:  # ``self.stages, info = make_stages(...)``
            values = unique(v for value in values for v in _item(value, index, self)) or (UNKNOWN,)
        return values if binding.path else _made_for(values, binding)

    def _class_member(self, cls: ClassValue, attribute: str, instance: Instance | None) -> Values:
        order = self.mro(cls)
        if attribute == "apply" and any(
            isinstance(owner, External) and owner.name in AUTOGRAD_FUNCTIONS for owner in order
        ):
            own = self._first_member(order, attribute, instance)
            if not known(own):  # ``C.apply`` of a ``torch.autograd.Function``: torch's own
                return (Method(cls, "apply"),)
            return own
        return self._first_member(order, attribute, instance)

    def _first_member(
        self, owners: list[ClassValue | External], attribute: str, instance: Instance | None
    ) -> Values:
        """The member as the first of ``owners`` (an MRO, or its tail) that defines it; an
        external class on the way may define it too, so UNKNOWN."""
        for owner in owners:
            if isinstance(owner, External):
                return (UNKNOWN,)
            scope = self.scope_of(owner)
            bindings = scope.bindings.get(attribute)
            if not bindings:
                continue
            results: list[Value] = []
            class_context = Context(owner.module, scope)
            for binding in fold(bindings, None):
                node = binding.node
                if isinstance(node, FUNCTIONS):
                    function = FunctionValue(node, class_context)
                    results.append(_bind_method(function, instance, owner))
                else:
                    for value in self.binding_values(binding, class_context):
                        results.append(_unwrap_descriptor(value, instance))
            return unique(results) or (UNKNOWN,)
        return (UNKNOWN,)

    def _super_member(self, value: Super, attribute: str) -> Values:
        instance = next((v for v in value.instance if isinstance(v, Instance)), None)
        order = self.mro(instance.cls) if instance and isinstance(instance.cls, ClassValue) else []
        if value.cls not in order:
            order = self.mro(value.cls)
        return self._first_member(order[order.index(value.cls) + 1 :], attribute, instance)

    def _subclasses_overriding(self, cls: ClassValue, attribute: str) -> list[ClassValue]:
        """Classes of the same module deriving from ``cls`` (by base name, transitively)
        that define or assign ``attribute``: a ``self`` inside ``cls`` may be one of them."""
        module = cls.module
        derived = self._derived_by_base_name(module)
        subclasses: list[ast.ClassDef] = []
        names = [cls.node.name]
        while names:
            for statement in derived.get(names.pop(), ()):
                if statement is not cls.node and statement not in subclasses:
                    subclasses.append(statement)
                    names.append(statement.name)
        found: list[ClassValue] = []
        for statement in sorted(subclasses, key=lambda s: s.lineno):
            subclass = ClassValue(statement, self.module_context(module))
            scope = self.scope_of(subclass)
            if attribute in scope.bindings or self.instance_assignments(subclass, attribute):
                found.append(subclass)
        return found

    def _derived_by_base_name(self, module: Module) -> dict[str, list[ast.ClassDef]]:
        """A module's top-level classes by the last names of their bases (built once)."""
        index = self._derived.get(module.path)
        if index is None:
            index = self._derived[module.path] = {}
            for statement in module.tree.body:
                if isinstance(statement, ast.ClassDef):
                    for base in statement.bases:
                        name = _base_name(base)
                        if name is not None:
                            index.setdefault(name, []).append(statement)
        return index

    def _external_instance_member(self, instance: Instance, attribute: str) -> Values:
        name = instance.cls.name  # type: ignore[union-attr]
        if name in MAPPING_CONTAINERS and instance.call is not None:
            return self._mapping_item(instance, Constant(attribute))
        if name in CONTAINERS and attribute in ("values", "items", "children", "modules", "keys"):
            return (Method(instance, attribute),)
        if name in CONTAINERS and attribute in ("named_children", "named_modules"):
            return (Method(instance, attribute),)
        if attribute == "__call__":
            return (instance,)
        if instance.origin is not None and instance.context is not None:
            assigned = self._attributes_set(instance.origin, attribute, instance.context)
            if assigned:  # ``down = nn.Module(); down.block = Block()``
                return assigned
        return (External(f"{name}.{attribute}"),)  # a method, by its qualified name

    def _attributes_set(self, origin: Binding, attribute: str, context: Context) -> Values:
        """Values assigned to ``<name>.<attribute>`` in the function that made ``name``."""
        module = context.module
        span = line_span(origin.scope.node if origin.scope.kind == "function" else None)
        results: list[Value] = []
        for line in module.lines_naming(origin.name):
            if span is not None and not span[0] <= line <= span[1]:
                continue
            for statement, scope in statements_on_line(module, line):
                if not isinstance(statement, ast.Assign):
                    continue
                for target in statement.targets:
                    if (
                        isinstance(target, ast.Attribute)
                        and target.attr == attribute
                        and isinstance(target.value, ast.Name)
                        and target.value.id == origin.name
                    ):
                        here = Context(module, scope, context.env if scope is origin.scope else ())
                        results.extend(self.evaluate(statement.value, here))
        return unique(results)

    # -- calls -----------------------------------------------------------------------------
    def _call_expression(self, call: ast.Call, context: Context) -> Values:
        callee = self.evaluate(call.func, context)
        return self.call_result(callee, call, context)

    def _call(self, callee: Value, call: ast.Call, context: Context) -> Iterator[Value]:
        name = _called_name(callee)
        test = helper_test(name, [_constant(a) for a in call.args]) if name else None
        if test is not None:  # ``is_torch_version(">=", "1.11.0")``
            yield TorchVersionTest(test)
        elif isinstance(callee, External):
            yield from self._external_call(callee.name, call, context)
        elif isinstance(callee, ClassValue):
            yield Instance(callee, call, context)
        elif isinstance(callee, FunctionValue):
            yield from self.returned(callee, Arguments.of(call, context))
        elif isinstance(callee, Method) and callee.name in _KEY_READS:
            yield from self._key_read(call, context)
        elif isinstance(callee, Method):
            yield from self._method_call(callee)
        else:
            yield UNKNOWN

    def _external_call(self, name: str, call: ast.Call, context: Context) -> Iterator[Value]:
        arguments, keywords = _arguments(call)
        first = arguments[0] if arguments and not isinstance(arguments[0], ast.Starred) else None
        if name == PARTIAL and first is not None:
            yield PartialValue(self.evaluate(first, context), call, context)
        elif name in VERSION_PARSERS and first is not None:
            yield from self._parsed_version(self.evaluate(first, context))
        elif name in DISTRIBUTION_VERSIONS and _constant(first) == "torch":
            yield External(TORCH_VERSION)
        elif name in RETURNS_ITS_MODULE and first is not None:  # ``weight_norm(conv)``
            yield from self.evaluate(first, context)
        elif name in ("builtins.staticmethod", "builtins.classmethod") and first is not None:
            yield from self.evaluate(first, context)
        elif name == "builtins.getattr" and len(arguments) >= 2:
            attribute = arguments[1]
            if isinstance(attribute, ast.Constant) and isinstance(attribute.value, str):
                yield from self.member(self.evaluate(arguments[0], context), attribute.value)
                if len(arguments) > 2:
                    yield from self.evaluate(arguments[2], context)
            else:
                yield UNKNOWN
        elif name == "builtins.super":
            yield from self._super(context)
        elif name == "builtins.dict":
            yield Mapping(call, context)
        elif name in ("builtins.enumerate", "builtins.zip") and first is not None:
            columns = [self.iterate(self.evaluate(a, context)) for a in arguments]
            if name == "builtins.enumerate":
                columns = [(UNKNOWN,), columns[0]]
            yield Elements((Row(tuple(columns)),))
        elif name.removeprefix("builtins.") in _ITERATION_BUILTINS and first is not None:
            yield Elements(self.iterate(self.evaluate(first, context)))
        elif name.rpartition(".")[2][:1].isupper():  # a class, by convention
            yield Instance(External(name), call, context)
        elif name == "collections.OrderedDict":
            yield Mapping(call, context)
        else:
            yield UNKNOWN

    def _parsed_version(self, values: Values) -> Iterator[Value]:
        """``version.parse(x)``: torch's version stays torch's, a literal becomes a version."""
        for value in values:
            if _is_torch_version((value,)):
                yield External(TORCH_VERSION)
            elif isinstance(value, Constant) and parse_version(value.value) is not None:
                yield Constant(parse_version(value.value))
            else:
                yield UNKNOWN

    def _super(self, context: Context) -> Iterator[Value]:
        scope = context.scope
        while scope.parent is not None and scope.enclosing_class is None:
            scope = scope.parent
        owner = scope.enclosing_class
        if owner is None or owner.parent is None:
            yield UNKNOWN
            return
        cls = ClassValue(owner.node, context.at(owner.parent))  # type: ignore[arg-type]
        self_parameter = first_parameter(scope.node)
        instance: Values = (UNKNOWN,)
        if self_parameter is not None:
            binding = scope.bindings[self_parameter.arg][0]
            instance = self._parameter(self_parameter, binding, context.at(scope))
        yield Super(cls, instance)

    def _key_read(self, call: ast.Call, context: Context) -> Values:
        """``m.get("k", d)``, ``m.pop("k", d)``, ``m.setdefault("k", d)`` of a mapping: what
        it holds under ``k`` there (see ``mappings``), or ``d`` where it may lack it."""
        func = call.func
        key = call.args[0] if call.args else None
        if not isinstance(func, ast.Attribute) or not isinstance(key, ast.Constant):
            return _UNKNOWN
        if not isinstance(key.value, str):
            return _UNKNOWN
        state = held(self, func.value, context, key.value)
        results = [v for flow in flows_of(state, key.value) for v in self.evaluate(*flow)]
        if may_lack(state, key.value):
            results.extend(self.evaluate(call.args[1], context) if len(call.args) > 1 else ())
            if func.attr == "get" and len(call.args) == 1:
                results.append(Constant(None))
        if any(isinstance(item, Unknown) for item in state):
            results.append(UNKNOWN)
        return unique(results) or _UNKNOWN

    def _method_call(self, method: Method) -> Iterator[Value]:
        receiver, name = method.receiver, method.name
        if name in ("values", "children", "modules"):
            yield Elements(self._container_values(receiver))
        elif name in ("items", "named_children", "named_modules"):
            yield Elements((Row(((UNKNOWN,), self._container_values(receiver))),))
        else:
            yield UNKNOWN

    def _submodules(self, instance: Instance) -> Values:
        """What ``children()`` of a project module yields: the modules its classes assign to
        ``self`` (any attribute that evaluates to a module instance)."""
        cls = instance.cls
        if not isinstance(cls, ClassValue):
            return (UNKNOWN,)
        found: list[Value] = []
        for owner in self.mro(cls):
            if not isinstance(owner, ClassValue):
                break
            scope = self.scope_of(owner)
            self.instance_assignments(owner, "")  # every method scoped
            for bindings in scope.instance_attributes.values():
                for binding in bindings:
                    values = self._assigned(binding, owner, instance)
                    found.extend(v for v in values if isinstance(v, Instance))
        return unique(found) or (UNKNOWN,)

    # -- containers ------------------------------------------------------------------------
    def added_to(self, origin: Binding, context: Context) -> Values:
        """Values added to a container through the name it was made for: ``.append(x)``,
        ``.extend(xs)``, ``.insert(i, x)``, ``.add_module(n, x)``, ``[key] = x``, ``+= xs``,
        in the function that made it (or, for ``self.<name>``, in its class's methods)."""
        module = context.module
        owner = origin.scope if origin.scope.kind == "function" else None
        is_attribute = isinstance(origin.node, ast.Attribute)
        span = line_span(owner.node if owner is not None and not is_attribute else None)
        if is_attribute:
            cls = origin.scope.enclosing_class
            span = line_span(cls.node if cls is not None else None)
        results: list[Value] = []
        for line in module.lines_naming(origin.name):
            if span is not None and not span[0] <= line <= span[1]:
                continue
            for statement, scope in statements_on_line(module, line):
                for expression in _added_expressions(statement, origin, is_attribute):
                    here = Context(module, scope, context.env if scope is owner else ())
                    added, spread = expression
                    values = self.evaluate(added, here)
                    results.extend(self.iterate(values) if spread else values)
        return unique(results)

    def _elements(self, value: Value) -> Values:
        if isinstance(value, Elements):
            return value.of
        if isinstance(value, Sequence):
            return self._sequence_elements(value)
        if isinstance(value, Mapping):
            return (UNKNOWN,)  # keys
        if isinstance(value, Instance) and isinstance(value.cls, External):
            if value.cls.name in SEQUENTIAL_CONTAINERS:
                return self._container_values(value)
            return (UNKNOWN,)
        return (UNKNOWN,)

    def _sequence_elements(self, sequence: Sequence) -> Values:
        values = self._literal_elements(sequence)
        if sequence.origin is None:
            return values
        return unique((*values, *self.added_to(sequence.origin, sequence.context)))

    def _literal_elements(self, sequence: Sequence) -> Values:
        node, context = sequence.node, sequence.context
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            results: list[Value] = []
            for element in node.elts:
                if isinstance(element, ast.Starred):
                    results.extend(self.iterate(self.evaluate(element.value, context)))
                else:
                    results.extend(self.evaluate(element, context))
            return unique(results) or (UNKNOWN,)
        scope = context.module.scopes.function_scope(node) or context.module.scopes.build_nested(
            node, context.scope
        )
        return self.evaluate(node.elt, context.at(scope))

    def _container_values(self, value: Value) -> Values:
        """The modules (or values) a torch container or a mapping holds, also those added
        later through the name it was made for."""
        values = self._constructed_values(value)
        origin = getattr(value, "origin", None)
        context = getattr(value, "context", None)
        if origin is None or context is None:
            return values
        return unique((*known(values), *self.added_to(origin, context))) or (UNKNOWN,)

    def _constructed_values(self, value: Value) -> Values:
        if isinstance(value, Instance) and isinstance(value.cls, ClassValue):
            return self._submodules(value)
        if isinstance(value, Mapping):
            return self._mapping_values(value.node, value.context)
        if not isinstance(value, Instance) or value.call is None or value.context is None:
            return (UNKNOWN,)
        name = value.cls.name if isinstance(value.cls, External) else ""
        arguments, keywords = _arguments(value.call)
        context = value.context
        if name in MAPPING_CONTAINERS:
            if not arguments:
                return unique(v for k in keywords.values() for v in self.evaluate(k, context))
            return unique(
                v
                for mapping in self.evaluate(arguments[0], context)
                for v in (
                    self._mapping_values(mapping.node, mapping.context)
                    if isinstance(mapping, Mapping)
                    else (UNKNOWN,)
                )
            )
        if name == "torch.nn.ModuleList":
            if not arguments:
                return (UNKNOWN,)
            return self.iterate(self.evaluate(arguments[0], context))
        if name == "torch.nn.Sequential":
            results: list[Value] = []
            for argument in arguments:
                if isinstance(argument, ast.Starred):
                    results.extend(self.iterate(self.evaluate(argument.value, context)))
                    continue
                for value_of in self.evaluate(argument, context):
                    if isinstance(value_of, Mapping):  # Sequential(OrderedDict(...))
                        results.extend(self._mapping_values(value_of.node, value_of.context))
                    else:
                        results.append(value_of)
            return unique(results) or (UNKNOWN,)
        return (UNKNOWN,)

    def _mapping_values(self, node: ast.AST, context: Context) -> Values:
        if isinstance(node, ast.Dict):
            return unique(v for value in node.values for v in self.evaluate(value, context))
        if isinstance(node, ast.DictComp):
            scope = context.module.scopes.function_scope(
                node
            ) or context.module.scopes.build_nested(node, context.scope)
            return self.evaluate(node.value, context.at(scope))
        if isinstance(node, ast.Call):
            arguments, keywords = _arguments(node)
            results = [v for value in keywords.values() for v in self.evaluate(value, context)]
            for argument in arguments:
                for pair in self.iterate(self.evaluate(argument, context)):
                    results.extend(_item(pair, 1, self))
            return unique(results) or (UNKNOWN,)
        return (UNKNOWN,)

    def _mapping_item(self, value: Value, key: Value) -> Values:
        """``mapping[key]`` or ``module_dict.key``: the value under a constant key, else any."""
        if isinstance(value, Mapping):
            node, context = value.node, value.context
        elif isinstance(value, Instance) and value.call is not None and value.context is not None:
            arguments, keywords = _arguments(value.call)
            if not arguments:
                if isinstance(key, Constant) and key.value in keywords:
                    return self.evaluate(keywords[key.value], value.context)
                return self._container_values(value)
            mappings = self.evaluate(arguments[0], value.context)
            return unique(v for m in mappings for v in self._mapping_item(m, key)) or (UNKNOWN,)
        else:
            return (UNKNOWN,)
        if isinstance(key, Constant):
            if isinstance(node, ast.Dict):
                for item_key, item_value in zip(node.keys, node.values, strict=True):
                    if isinstance(item_key, ast.Constant) and item_key.value == key.value:
                        return self.evaluate(item_value, context)
            elif isinstance(node, ast.Call):
                _, keywords = _arguments(node)
                if key.value in keywords:
                    return self.evaluate(keywords[key.value], context)
        return self._mapping_values(node, context)

    def _subscript(self, node: ast.Subscript, context: Context) -> Iterator[Value]:
        containers = self.evaluate(node.value, context)
        index = node.slice
        key: Value = UNKNOWN
        if isinstance(index, ast.Constant):
            key = Constant(index.value)
        if isinstance(index, ast.Slice):  # a slice of a container holds the same kind
            yield from containers
            return
        if isinstance(key, Constant) and isinstance(key.value, str):
            if any(isinstance(c, (CallKeywords, Mapping)) for c in containers):
                state = held(self, node.value, context, key.value)
                if not may_lack(state, key.value):  # else a registry filled elsewhere
                    for flow in flows_of(state, key.value):
                        yield from self.evaluate(*flow)
                    return
        for container in containers:
            if isinstance(container, Mapping) or (
                isinstance(container, Instance)
                and isinstance(container.cls, External)
                and container.cls.name in MAPPING_CONTAINERS
            ):
                yield from self._mapping_item(container, key)
            elif isinstance(container, Sequence) and isinstance(key, Constant):
                yield from self._indexed(container, key.value)
            else:
                yield from self._elements(container)

    def _indexed(self, sequence: Sequence, index: object) -> Values:
        node = sequence.node
        if isinstance(node, (ast.List, ast.Tuple)) and isinstance(index, int):
            if not any(isinstance(e, ast.Starred) for e in node.elts) and -len(
                node.elts
            ) <= index < len(node.elts):
                return self.evaluate(node.elts[index], sequence.context)
        return self._elements(sequence)


def _argument_contexts(env: Environment) -> Iterator[tuple[ast.arg, Context]]:
    for parameter, argument in env:
        if argument.context is not None:
            yield parameter, argument.context
        for value in argument.values:
            for inner in held_contexts(value):
                yield parameter, inner


def _values_of(compute: Callable[..., Iterable[Value]], *args: object) -> Values:
    """A lookup's values: each once, in source order, at most MAX_VALUES (then UNKNOWN)."""
    values = unique(compute(*args))
    if not values:
        return _UNKNOWN
    if len(values) > MAX_VALUES:
        return (*values[:MAX_VALUES], UNKNOWN)
    return values


# What reads a mapping's key (see ``mappings``): their values come from what it holds there.
_KEY_READS = frozenset({"get", "pop", "setdefault"})
_MODULE_ITERATORS = frozenset({"children", "modules", "named_children", "named_modules"})
_ADDING_METHODS = {"append": False, "extend": True, "insert": False, "add_module": False}


def _added_expressions(
    statement: ast.stmt, origin: Binding, is_attribute: bool
) -> Iterator[tuple[ast.expr, bool]]:
    """Expressions a statement adds to the container named by ``origin`` (and whether they
    are spread: ``extend``, ``+=``)."""

    def names_origin(target: ast.expr) -> bool:
        if is_attribute:
            return isinstance(target, ast.Attribute) and target.attr == origin.name
        return isinstance(target, ast.Name) and target.id == origin.name

    for node in ast.walk(statement) if not isinstance(statement, DEFINITIONS) else ():
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _ADDING_METHODS
            and names_origin(node.func.value)
            and node.args
        ):
            yield node.args[-1], _ADDING_METHODS[node.func.attr]
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Subscript) and names_origin(target.value):
                    yield node.value, False
        elif isinstance(node, ast.AugAssign) and names_origin(node.target):
            yield node.value, True


def _module_level(name: ast.Name, context: Context) -> bool:
    """Whether ``name`` reads only module-level bindings (a function, a class, an import),
    whose values no caller's arguments change: one question whatever the activation."""
    bindings = context.scope.lookup(name.id, node_position(name))
    return bool(bindings) and all(b.scope.kind == "module" for b in bindings)


def only_spread(function: ast.FunctionDef | ast.AsyncFunctionDef, name: str) -> bool:
    """Whether ``function`` uses ``name`` only as ``**name`` in calls (kept, once per body)."""
    found = _ONLY_SPREAD.get(id(function))
    if found is not None and found[0] is function and name in found[1]:
        return found[1][name]
    loads = spreads = 0
    for node in ast.walk(function):
        if isinstance(node, ast.Name) and node.id == name:
            loads += 1
        elif isinstance(node, ast.keyword) and node.arg is None:
            spreads += isinstance(node.value, ast.Name) and node.value.id == name
    answer = loads == spreads
    names = found[1] if found is not None and found[0] is function else {}
    names[name] = answer
    _ONLY_SPREAD[id(function)] = (function, names)
    return answer


_ONLY_SPREAD: dict[int, tuple[ast.AST, dict[str, bool]]] = process_memo()


def passed_on(argument: Argument) -> Argument:
    """Where an argument that is itself a parameter passed on unchanged (``fn`` handed from
    wrapper to wrapper) was first written: followed in a loop, so a chain of any length
    costs no evaluation depth."""
    while isinstance(argument.expression, ast.Name) and argument.context is not None:
        name = argument.expression
        context = argument.context
        bindings = context.scope.lookup(name.id, node_position(name))
        if len(bindings) != 1 or not isinstance(bindings[0].node, ast.arg):
            break
        parameter = bindings[0].node
        outer = context.argument(parameter)
        if outer is None:
            if bindings[0].scope.bindings.get(name.id) == bindings:
                # Never rebound: every read of it is one expression, wherever written, so
                # calls handing it on alike bind alike.
                return replace(argument, expression=_read_of(parameter))
            break
        argument = outer
    return argument


def _canonical(flow: Flow) -> Flow:
    """A flow as ``passed_on`` leaves it where it names a parameter no call bound."""
    argument = passed_on(Argument(*flow))
    if argument.expression is None or argument.context is None:
        return flow
    return argument.expression, argument.context


def _read_of(parameter: ast.arg) -> ast.Name:
    """One ``Name`` reading ``parameter``, placed at the parameter (kept, once per node)."""
    found = _READS.get(id(parameter))
    if found is not None and found[0] is parameter:
        return found[1]
    read = ast.Name(parameter.arg, ast.Load())
    ast.copy_location(read, parameter)
    _READS[id(parameter)] = (parameter, read)
    return read


_READS: dict[int, tuple[ast.arg, ast.Name]] = process_memo()


def _made_for(values: Values, binding: Binding) -> Values:
    """Containers made by ``binding``'s own value remember the name they were made for."""
    node = binding.value
    return tuple(
        replace(value, origin=binding)
        if (isinstance(value, (Sequence, Mapping)) and value.node is node)
        or (isinstance(value, Instance) and value.call is node and isinstance(value.cls, External))
        else value
        for value in values
    )


def _item(value: Value, index: int, evaluator: Evaluator) -> Values:
    """Element ``index`` of a tuple value (a row of ``enumerate``/``zip``, a tuple literal)."""
    if isinstance(value, Row):
        return value.items[index] if index < len(value.items) else (UNKNOWN,)
    if isinstance(value, Sequence) and isinstance(value.node, ast.Tuple):
        return evaluator._indexed(value, index)
    return (UNKNOWN,)


def _bind_method(function: FunctionValue, instance: Instance | None, owner: ClassValue) -> Value:
    decorators = {_decorator_name(d) for d in function.node.decorator_list}  # type: ignore[union-attr]
    if "staticmethod" in decorators:
        return function
    if "classmethod" in decorators:
        return FunctionValue(function.node, function.context, (owner,))
    if instance is None:
        return function
    return FunctionValue(function.node, function.context, (instance,))


def _unwrap_descriptor(value: Value, instance: Instance | None) -> Value:
    """A function stored as a class attribute binds like a method (unless staticmethod)."""
    if isinstance(value, FunctionValue) and value.bound is None and instance is not None:
        if not isinstance(value.node, ast.Lambda) or value.node.args.args:
            return FunctionValue(value.node, value.context, (instance,))
    return value


def _decorator_name(decorator: ast.expr) -> str:
    while isinstance(decorator, ast.Call):
        decorator = decorator.func
    if isinstance(decorator, ast.Attribute):
        return decorator.attr
    return decorator.id if isinstance(decorator, ast.Name) else ""


def _base_name(base: ast.expr) -> str | None:
    if isinstance(base, ast.Name):
        return base.id
    return base.attr if isinstance(base, ast.Attribute) else None


def _is_first(parameter: ast.arg, function: ast.AST) -> bool:
    return first_parameter(function) is parameter


def _arguments(call: ast.Call) -> tuple[list[ast.expr], dict[str, ast.expr]]:
    return list(call.args), {k.arg: k.value for k in call.keywords if k.arg is not None}


# Functions that look at a function without calling it.
_INTROSPECTION = frozenset(
    {
        "inspect.signature",
        "inspect.getfullargspec",
        "inspect.getsource",
        "inspect.isfunction",
        "inspect.ismethod",
        "builtins.callable",
        "builtins.id",
        "builtins.isinstance",
        "builtins.repr",
    }
)


def _is_private(name: str) -> bool:
    """``_name``: by convention used in its own module only (dunder names are Python's)."""
    return name.startswith("_") and not name.endswith("__")


def _refers_to(node: ast.AST, name: str) -> TypeGuard[ast.Name | ast.Attribute]:
    return (isinstance(node, ast.Name) and node.id == name) or (
        isinstance(node, ast.Attribute) and node.attr == name
    )


def _statement_nodes(statement: ast.stmt) -> Iterator[ast.AST]:
    """A statement's own nodes, not those of the statements nested in it."""
    stack: list[ast.AST] = [statement]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, ast.stmt):
                stack.append(child)


def _accepts(function: FunctionValue, arguments: Arguments) -> bool:
    """Whether ``function`` can take ``arguments`` (a keyword it has no parameter for,
    without ``**kwargs``, or too many positionals, without ``*args``, is a TypeError)."""
    node = function.node.args
    positional = [*node.posonlyargs, *node.args]
    if function.bound is not None:
        positional = positional[1:]
    names = {p.arg for p in (*positional, *node.kwonlyargs)}
    if node.kwarg is None and any(name not in names for name in arguments.keywords):
        return False
    known_count = 0
    for flow in arguments.positional:
        if flow is None:
            break
        known_count += 1
    return node.vararg is not None or known_count <= len(positional)


def _names(values: Values) -> list[str]:
    return [v.name for v in values if isinstance(v, External)]


def _block_of(function: ast.FunctionDef | ast.AsyncFunctionDef, line: int) -> list[ast.stmt]:
    """The statement list of ``function`` that holds the statement at ``line``."""
    path = statements_at(function.body, line)
    return function.body if len(path) < 2 else body_containing(path[-2], line)


def _stores(statement: ast.stmt, self_name: str, attributes: frozenset[str]) -> bool:
    """``self.<one of attributes> = ...``."""
    return isinstance(statement, ast.Assign) and any(
        isinstance(t, ast.Attribute)
        and t.attr in attributes
        and isinstance(t.value, ast.Name)
        and t.value.id == self_name
        for t in statement.targets
    )


def _falsy(value: Value) -> bool:
    return isinstance(value, Constant) and not value.value


def _branch_taken(body: list[ast.stmt], orelse: list[ast.stmt], line: int) -> bool | None:
    """True when ``line`` lies in ``body``, False in ``orelse``, None in neither (the test)."""
    for statements, taken in ((body, True), (orelse, False)):
        if statements and statements[0].lineno <= line <= _last_line(statements):
            return taken
    return None


def _last_line(statements: list[ast.stmt]) -> int:
    return statements[-1].end_lineno or statements[-1].lineno


def _branches_around(statement: ast.stmt, node: ast.AST) -> Iterator[tuple[ast.expr, bool]]:
    """The ``x if test else y`` of a statement's own expressions that hold ``node``: each
    test, and whether ``node`` is on its true side."""
    start = node_position(node)
    for candidate in ast.walk(statement) if not isinstance(statement, DEFINITIONS) else ():
        if isinstance(candidate, ast.IfExp):
            for side, taken in ((candidate.body, True), (candidate.orelse, False)):
                end = (side.end_lineno or side.lineno, side.end_col_offset or 0)
                if node_position(side) <= start and start < end:
                    yield candidate.test, taken


def _mentions_a_version(test: ast.expr) -> bool:
    """Only tests naming a version are evaluated (``is_torch_version``, ``__version__``,
    ``is_torch_greater_or_equal_than_1_13``): others cannot decide a torch version."""
    for node in ast.walk(test):
        name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
        if isinstance(name, str) and ("version" in name or name.startswith("is_torch_")):
            return True
    return False


AUTOGRAD_FUNCTIONS = frozenset({"torch.autograd.Function", "torch.autograd.function.Function"})

_COMPARISONS: dict[type, str] = {
    ast.GtE: ">=",
    ast.Gt: ">",
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Eq: "==",
    ast.NotEq: "!=",
}
_MIRRORED = {">=": "<=", ">": "<", "<": ">", "<=": ">=", "==": "==", "!=": "!="}


def _is_torch_version(values: Values) -> bool:
    return bool(values) and all(
        isinstance(v, External) and names_torch_version(v.name) for v in values
    )


def _version_literal(values: Values) -> Version | None:
    """The one version ``values`` spell: ``"1.11"``, ``version.parse("1.11")``, ``(1, 11)``."""
    if len(values) != 1:
        return None
    value = values[0]
    if isinstance(value, Constant):
        return value.value if isinstance(value.value, Version) else parse_version(value.value)
    if isinstance(value, Sequence) and isinstance(value.node, ast.Tuple):
        return parse_version(tuple(_constant(e) for e in value.node.elts))
    return None


def _constant(node: ast.expr | None) -> object:
    return node.value if isinstance(node, ast.Constant) else None


def _called_name(callee: Value) -> str:
    """The last name of a callee (``is_torch_version``), for helpers known by name."""
    if isinstance(callee, External):
        return callee.name.rpartition(".")[2]
    if isinstance(callee, FunctionValue) and not isinstance(callee.node, ast.Lambda):
        return callee.node.name
    return ""
