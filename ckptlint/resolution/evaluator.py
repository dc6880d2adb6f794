"""One evaluator for the whole project: the possible values of an expression.

``Evaluator`` is the entry point every other layer asks (``evaluate``, ``member``,
``iterate``, ``bind``...), and evaluates expressions, names and what their bindings hold
itself; the rest it hands to one part per concern, each holding a reference back to it:

- ``calls``: what a call gives, the context a called function runs in, what it returns;
- ``members``: attributes of classes, instances, modules and external values; ``classes``:
  MROs, subclasses, what methods store in ``self``;
- ``callers``: the calls of a private function, what they pass its parameters;
- ``containers``: elements of literals and torch's containers, mappings, subscripts;
- ``modules``: imports followed into the project's modules, module members, star imports;
- ``version_tests``: the torch versions a branch runs on.

Every lookup is bounded (depth, cycles) and memoised per expression and context through the
run's ``Solver``, so the cost does not grow with how deeply the input nests. Whatever
cannot be seen is ``UNKNOWN``.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass
from operator import attrgetter
from typing import TypeVar

from packaging.version import Version

from ckptlint.project.index import Module, Project
from ckptlint.project.scopes import FUNCTIONS, Binding, Scope, node_position
from ckptlint.resolution.bodies import first_parameter
from ckptlint.resolution.callers import Callers, PrivateCallers
from ckptlint.resolution.calls import Calls, passed_on
from ckptlint.resolution.classes import Classes
from ckptlint.resolution.containers import Containers, made_for
from ckptlint.resolution.members import Members
from ckptlint.resolution.modules import Modules
from ckptlint.resolution.solver import Solver
from ckptlint.resolution.values import (
    CONTEXT_DEPTH,
    UNKNOWN,
    Argument,
    Arguments,
    ClassValue,
    Constant,
    Context,
    Environment,
    External,
    FunctionValue,
    Instance,
    Mapping,
    Parameter,
    Sequence,
    Value,
    Values,
    activations,
    held_contexts,
    known,
    limit_context,
    unique,
)
from ckptlint.resolution.version_tests import VersionTests
from ckptlint.resolution.versions import VersionRange

T = TypeVar("T")
# At most this many values per expression (in source order), then UNKNOWN: a name bound in
# thousands of branches, or a container of thousands of elements, costs no more than that.
MAX_VALUES = 64
_UNKNOWN: Values = (UNKNOWN,)
# Past this many bindings a use may see, made outside functions, their values are asked of
# the solver once for all the uses that see the same ones.
_MANY_BINDINGS = 16


class Evaluator:
    """``duck_typing``: an unannotated parameter's attributes are looked up in the classes
    its module defines or imports (see ``Members``); used only for regions, where guessing
    what ``model.transformer.h`` holds is worth its cost and its risk.

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
        self.solver = solver if solver is not None else Solver(place=place_of)
        self._kind = "duck" if duck_typing else "exact"  # keys differ between the two views
        # The oldest torch the project runs on (None: not known, no branch is decided).
        self.target_torch = target_torch
        self._contexts: dict[Context, Context] = {}
        self.calls = Calls(self)
        self.classes = Classes(self)
        self.members = Members(self)
        self.private_callers = PrivateCallers(self)
        self.containers = Containers(self)
        self.modules = Modules(self)
        self.version_tests = VersionTests(self)
        self._binding_lists: dict[tuple[Binding, ...], _SeenBindings] = {}

    # -- questions to the solver -------------------------------------------------------------
    def guarded(
        self, key: Hashable, compute: Callable[..., Iterable[Value]], *args: object
    ) -> Values:
        """Values asked of the solver: memoised, bounded, UNKNOWN where cut or failed."""
        return self.solver.ask((self._kind, key), _values_of, compute, *args, fallback=_UNKNOWN)

    def ask(
        self,
        key: Hashable,
        compute: Callable[..., T],
        *args: object,
        fallback: T,
        flat: bool = False,
    ) -> T:
        """Any other question, asked of the solver (keys differ between the two views);
        ``flat`` as ``Solver.ask`` says."""
        return self.solver.ask((self._kind, key), compute, *args, fallback=fallback, flat=flat)

    def settled(self, key: Hashable) -> bool:
        """Whether the question ``key`` has an answer kept for the run."""
        return self.solver.settled((self._kind, key))

    # -- entry points ----------------------------------------------------------------------
    def module_context(self, module: Module) -> Context:
        return Context(module, module.scopes.module)

    def evaluate(self, expression: ast.expr, context: Context) -> Values:
        if context.env and isinstance(expression, ast.Name) and _module_level(expression, context):
            context = Context(context.module, context.scope)  # what it names binds nothing
        return self.guarded((expression, context), self._evaluate, expression, context)

    def member(self, values: Values, attribute: str) -> Values:
        member_of = self.members.member_of
        return (
            unique(
                v
                for value in values
                for v in self.guarded(("member", value, attribute), member_of, value, attribute)
            )
            or _UNKNOWN
        )

    def iterate(self, values: Values) -> Values:
        """What iterating over any of ``values`` yields."""
        elements = self.containers.elements
        return (
            unique(v for value in values for v in self.guarded(("iterate", value), elements, value))
            or _UNKNOWN
        )

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

    # -- the parts' entry points -------------------------------------------------------------
    def call_result(self, callee: Values, call: ast.Call, context: Context) -> Values:
        return self.calls.call_result(callee, call, context)

    def bind(self, function: FunctionValue, arguments: Arguments | None) -> Context:
        """The context ``function``'s body runs in when it receives ``arguments`` (None: a
        call the analysis does not see, parameters unbound)."""
        return self.calls.bind(function, arguments)

    def returned(self, function: FunctionValue, arguments: Arguments | None) -> Values:
        """What calling ``function`` returns (union over its ``return`` statements)."""
        return self.calls.returned(function, arguments)

    def mro(self, cls: ClassValue) -> list[ClassValue | External]:
        """The class and its bases, left to right, each once (see ``Classes.mro``)."""
        return self.classes.mro(cls)

    def instance_assignments(self, cls: ClassValue, attribute: str) -> list[Binding]:
        """``self.<attribute> = ...`` in the methods of ``cls``."""
        return self.classes.instance_assignments(cls, attribute)

    def visible_classes(self, module: Module) -> list[ClassValue]:
        """Classes a module binds at its top level under a capitalised name."""
        return self.classes.visible_classes(module)

    def member_under(self, values: Values, attribute: str, flags: frozenset[str]) -> Values:
        """``x.attribute`` read where ``x.<flag>`` is true for each of ``flags`` (see
        ``Members.member_under``)."""
        return self.members.member_under(values, attribute, flags)

    def callers(self, function: FunctionValue) -> Callers | None:
        """The calls of a private function, when all can be seen (see ``PrivateCallers``)."""
        return self.private_callers.callers(function)

    def added_to(self, origin: Binding, context: Context) -> Values:
        """Values added to a container through the name it was made for."""
        return self.containers.added_to(origin, context)

    def module_value(self, name: str) -> Value:
        return self.modules.module_value(name)

    def versions_at(self, module: Module, node: ast.AST) -> VersionRange:
        """The torch versions ``node`` runs on (see ``VersionTests.versions_at``)."""
        return self.version_tests.versions_at(module, node)

    def test_versions(self, test: ast.expr, context: Context) -> tuple[VersionRange, VersionRange]:
        """The torch versions on which ``test`` may be true, and those on which it may be
        false."""
        return self.version_tests.test_versions(test, context)

    # -- expressions -----------------------------------------------------------------------
    def _evaluate(self, node: ast.expr, context: Context) -> Iterator[Value]:
        if isinstance(node, ast.Name):
            yield from self._name(node, context)
        elif isinstance(node, ast.Attribute):
            yield from self.member(self.evaluate(node.value, context), node.attr)
        elif isinstance(node, ast.Call):
            yield from self.calls.call_expression(node, context)
        elif isinstance(node, ast.Subscript):
            yield from self.containers.subscript(node, context)
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
            yield self.version_tests.comparison(node, context)
        else:
            yield UNKNOWN

    # -- names and what their bindings hold ------------------------------------------------
    def _name(self, node: ast.Name, context: Context) -> Iterator[Value]:
        bindings = context.scope.lookup(node.id, node_position(node))
        bindings = self.version_tests.live(bindings, context.module)
        if not bindings:
            yield from self.modules.unbound_name(node.id, context.module)
            return
        if len(bindings) > _MANY_BINDINGS:
            # What they hold is the same for every use that sees them all (a function's
            # every use of a name the module rebinds in each of a thousand branches).
            seen = tuple(bindings)
            key = ("bindings", self._binding_lists.setdefault(seen, _SeenBindings(seen)))
            if self.settled(key) or not _may_run_in_a_function(bindings):
                module = self.module_context(context.module)
                yield from self.guarded(key, self._bindings_values, bindings, module)
                return
        yield from self._bindings_values(bindings, context)

    def _bindings_values(self, bindings: list[Binding], context: Context) -> Iterator[Value]:
        for binding in bindings:
            yield from self.binding_values(binding, context)

    def binding_values(self, binding: Binding, context: Context) -> Values:
        node = binding.node
        runs_in = binding.runs_in or binding.scope  # a global rebound in a function: there
        if binding.imported is not None:  # imports chain through modules: bounded
            key = (binding, self.module_context(context.module))
            return self.guarded(key, self.modules.imported, binding, context.module)
        if isinstance(node, FUNCTIONS):
            function = FunctionValue(node, context.at(runs_in))
            if node.decorator_list and binding.scope.kind != "class":
                return self.ask(
                    ("decorated", function), self._decorated, function, fallback=(function,)
                )
            return (function,)
        if isinstance(node, ast.ClassDef):
            return (ClassValue(node, context.at(runs_in)),)
        if isinstance(node, ast.arg):
            return self.parameter_values(node, binding, context)
        if binding.value is None:
            return (UNKNOWN,)
        values = self.evaluate(binding.value, context.at(runs_in))
        if not binding.iterated and not binding.path:
            values = made_for(values, binding)
        if binding.iterated:
            values = self.iterate(values)
        item = self.containers.item
        for index in binding.path:
            values = unique(v for value in values for v in item(value, index)) or (UNKNOWN,)
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
        returned = self.calls.returned_in(decorator, inner)
        return known(returned) or decorated

    def argument_values(self, argument: Argument) -> Values:
        """What a parameter bound to ``argument`` holds (followed to where it was written)."""
        argument = passed_on(argument)
        if argument.expression is None:
            return argument.values
        return self.evaluate(argument.expression, argument.context)  # type: ignore[arg-type]

    def parameter_values(self, node: ast.arg, binding: Binding, context: Context) -> Values:
        """What parameter ``node`` holds: its argument where ``context`` binds it, else the
        instance for a method's ``self``, else what callers pass and its annotation says."""
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
            passed = self.guarded(key, self.private_callers.passed_by_callers, function, node)
            if passed == (UNKNOWN,):  # callers the analysis cannot all see
                passed = self.evaluate(binding.value, context.at(scope.parent))  # type: ignore[arg-type]
            values.extend(passed)
        if node.annotation is not None and not isinstance(node.annotation, ast.Constant):
            for annotated in self.evaluate(node.annotation, context.at(scope.parent)):  # type: ignore[arg-type]
                if isinstance(annotated, ClassValue):
                    values.append(Instance(annotated, exact=False))
        return tuple(values)


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


@dataclass(frozen=True, eq=False)
class _SeenBindings:
    """The bindings a use sees, one object for each list met: the solver hashes a key
    often, and a tuple of thousands of bindings costs their number at each hash."""

    bindings: tuple[Binding, ...]


def _may_run_in_a_function(bindings: list[Binding]) -> bool:
    """Whether what one of the bindings holds may depend on a function's activation (one
    pass in C: a use may see thousands of them)."""
    if any(map(_RUNS_IN, bindings)):  # a global a function rebinds
        return True
    return any(scope.kind == "function" for scope in set(map(_SCOPE, bindings)))


_RUNS_IN, _SCOPE = attrgetter("runs_in"), attrgetter("scope")


def _module_level(name: ast.Name, context: Context) -> bool:
    """Whether ``name`` reads only module-level bindings (a function, a class, an import),
    whose values no caller's arguments change: one question whatever the activation."""
    bindings = context.scope.lookup(name.id, node_position(name))
    return bool(bindings) and all(b.scope.kind == "module" for b in bindings)


def _is_first(parameter: ast.arg, function: ast.AST) -> bool:
    return first_parameter(function) is parameter


def place_of(key: Hashable) -> str | None:
    """Where the code a question is about lies (``path:line``): the expression it evaluates
    in a context, or the function it asks about; None for other questions. The solver names
    it in the note of a chain too deep to follow."""
    parts: list[object] = [key]
    while parts:  # a key is a few tuples nested, searched breadth first
        part = parts.pop(0)
        if isinstance(part, FunctionValue):
            return f"{part.module.path}:{part.node.lineno}"
        if isinstance(part, tuple):
            contexts = [p for p in part if isinstance(p, Context)]
            lines = [p.lineno for p in part if isinstance(p, ast.expr)]
            if contexts and lines:
                return f"{contexts[0].module.path}:{lines[0]}"
            parts.extend(part)
    return None
