"""Hand-on summaries: how a function hands the region its caller gives it on to a source.

A project's wrappers are found, not configured: a function hands a region on when one of
its calls reaches a region source (directly, through ``functools.partial``, through another
wrapper or a wrapper class) with a region that comes from the function's own parameters
(or from those of the functions around it). Each function is summarised once per run, as a
tuple of ``Transfer`` records, one per way its body reaches a source:

- a transfer of ``f`` is its call that reaches the source, and, when that call goes through
  another wrapper ``g``, the transfer of ``g`` it continues with (``inner``): a chain of
  wrappers is a chain of transfers, each made once and shared by every caller;
- ``depends`` names the parameters the region comes from, so that whether a caller of ``f``
  hands a region on too is decided by what it passes for those alone.

Summaries are made bottom-up: before ``f`` is summarised, the wrappers it calls are (an
iterative walk of the call graph in post-order, ``_bottom_up``), so that summarising a chain
of any length costs one summary application per level and never a deeper stack. A call back
into a function still being summarised (recursion between wrappers) contributes nothing: a
transfer never passes through the same wrapper twice, which is the fixed point of the
recursive component over simple paths (see docs/analysis-semantics.md).

At a call site, ``resolve`` applies a transfer to the arguments the call passes: each
wrapper's parameters bound to what its caller passes (a parameter handed on unchanged to
where it was first written, ``**kwargs`` handed on unchanged to the call that wrote them),
level after level, to the arguments the source finally receives.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ckptlint.project.scopes import FUNCTIONS, Scope
from ckptlint.regions.calls import calls_in_body
from ckptlint.regions.sources import RegionSource
from ckptlint.resolution.evaluator import own_nodes
from ckptlint.resolution.values import (
    Arguments,
    ClassValue,
    Context,
    FunctionValue,
    Instance,
    Parameter,
    PartialValue,
    Value,
    Values,
    known,
)

if TYPE_CHECKING:
    from ckptlint.regions.sites import SiteFinder, SourceCall

# A wrapper that branches at every level of a chain reaches exponentially many source calls;
# each summary keeps at most this many transfers (the first ones, in source order).
MAX_TRANSFERS = 64
# ``partial(partial(...))`` is followed this deep.
_MAX_PARTIALS = 8
# A closure handed as the region is looked into for the parameters it calls this deep.
_MAX_CLOSURES = 4


@dataclass(frozen=True)
class Step:
    """What one call reaches through one of its callee's values: the partials passed
    through (outermost first), then a wrapper function or class (``target``), or the
    source itself (``target`` None, ``source`` set)."""

    partials: tuple[PartialValue, ...]
    target: FunctionValue | ClassValue | None
    source: RegionSource | None


@dataclass(frozen=True, eq=False)
class Transfer:
    """One way ``function``'s body reaches a region source (see the module docstring)."""

    function: FunctionValue
    call: ast.Call  # the call in ``function``'s body
    scope: Scope  # where that call is evaluated
    step: Step
    source: RegionSource
    inner: Transfer | None = None  # the transfer of the wrapper ``step.target``
    depends: tuple[ast.arg, ...] = ()  # the parameters the region comes from
    class_path: int = 0  # for a wrapper class: which of the paths its ``forward`` makes

    @property
    def chain(self) -> Iterator[Transfer]:
        """This transfer and the ones it continues with, outermost first."""
        transfer: Transfer | None = self
        while transfer is not None:
            yield transfer
            transfer = transfer.inner


Summary = tuple[Transfer, ...]


class HandOn:
    """The hand-on summaries of one analysis (asked of its solver: memoised, bounded)."""

    def __init__(self, finder: SiteFinder) -> None:
        self.finder = finder
        self.evaluator = finder.evaluator
        self.solver = finder.evaluator.solver
        self._resolved: dict[tuple[Transfer, Context], tuple[_Resolved, ...]] = {}

    # -- summaries ---------------------------------------------------------------------------
    def summary(self, function: FunctionValue) -> Summary:
        """How ``function`` hands a region on (empty: it is no wrapper). One summary per
        definition, whatever activation made it: what it closes over and the instance it
        is bound to are read as its parameters are, unbound (a site binds them)."""
        if isinstance(function.node, ast.Lambda):
            return ()
        function = canonical(function)
        key = ("summary", function)
        if not self.solver.settled(key):
            for callee in self._bottom_up(function):
                self._ask(callee)
        return self._ask(function)

    def _ask(self, function: FunctionValue) -> Summary:
        return self.solver.ask(
            ("summary", function),
            self._summarise,
            function,
            fallback=(),
            where=lambda: _where(function),
            flat=True,
        )

    def _bottom_up(self, function: FunctionValue) -> list[FunctionValue]:
        """The wrappers ``function`` may call, at any depth, not summarised yet: each after
        those it calls (post-order), ``function`` itself left out. Iterative, so a chain of
        any length costs no stack."""
        order: list[FunctionValue] = []
        seen = {function}
        stack: list[tuple[FunctionValue, Iterator[FunctionValue]]] = [
            (function, self._callees(function))
        ]
        while stack:
            current, callees = stack[-1]
            for callee in callees:
                if callee not in seen and not self.solver.settled(("summary", callee)):
                    seen.add(callee)
                    stack.append((callee, self._callees(callee)))
                    break
            else:
                stack.pop()
                if current is not function:
                    order.append(current)
        return order

    def _callees(self, function: FunctionValue) -> Iterator[FunctionValue]:
        for _, _, steps in self.steps(function):
            for step in steps:
                if isinstance(step.target, FunctionValue):
                    yield canonical(step.target)

    def steps(self, function: FunctionValue) -> list[tuple[ast.Call, Scope, tuple[Step, ...]]]:
        """The calls ``function`` runs itself that may reach a source, with what each
        reaches (evaluated once a run, with the function's parameters unbound)."""
        key = ("steps", function)
        return self.solver.ask(key, self._steps_of, function, fallback=[])

    def _steps_of(self, function: FunctionValue) -> list[tuple[ast.Call, Scope, tuple[Step, ...]]]:
        node = function.node
        if isinstance(node, ast.Lambda):
            return []
        unbound = self.evaluator.bind(function, None)
        found = []
        for call, scope in calls_in_body(node.body, unbound.scope, function.module):
            context = unbound.at(scope)
            steps = self.call_steps(self.evaluator.evaluate(call.func, context), call.func)
            if steps:
                found.append((call, scope, steps))
        return found

    def call_steps(self, callee: Values, func: ast.expr | None) -> tuple[Step, ...]:
        """What calling any of ``callee`` may reach (a call written as ``func``)."""
        found: list[Step] = []
        for value in callee:
            found.extend(self._value_steps(value, (), 0))
        attribute = func.attr if isinstance(func, ast.Attribute) else None
        by_attribute = self.finder.table.by_attribute
        if attribute in by_attribute:
            source = by_attribute[attribute]
            if not any(step.source is source for step in found):
                found.append(Step((), None, source))
        return tuple(dict.fromkeys(found))

    def _value_steps(
        self, value: Value, partials: tuple[PartialValue, ...], depth: int
    ) -> Iterator[Step]:
        source = self.finder.source_of(value)
        if source is not None and not (isinstance(value, FunctionValue) and source.configured):
            yield Step(partials, None, source)
        elif isinstance(value, PartialValue) and depth < _MAX_PARTIALS:
            for inner in value.inner:
                yield from self._value_steps(inner, (*partials, value), depth + 1)
        elif isinstance(value, FunctionValue):
            yield Step(partials, value, source)  # a configured function: its body first
        elif isinstance(value, ClassValue) and not partials:
            if self.finder.wrapper_class_calls(value):
                yield Step((), value, None)

    def _summarise(self, function: FunctionValue) -> Summary:
        owners = enclosing_functions(self.evaluator.scope_of(function))
        found: list[Transfer] = []
        written: set[tuple[str, Scope, Step]] = set()
        for call, scope, steps in self.steps(function):
            # The same call written twice (in both branches of an ``if``) hands on alike.
            text = ast.dump(call)
            for step in steps:
                if (text, scope, step) in written:
                    continue
                written.add((text, scope, step))
                for transfer in self._transfers(function, call, scope, step):
                    depends = self._depends(transfer, owners)
                    if depends:
                        found.append(replace(transfer, depends=depends))
                if len(found) >= MAX_TRANSFERS:
                    return tuple(found[:MAX_TRANSFERS])
        return tuple(found)

    def _transfers(
        self, function: FunctionValue, call: ast.Call, scope: Scope, step: Step
    ) -> Iterator[Transfer]:
        target = step.target
        if target is None:
            assert step.source is not None
            yield Transfer(function, call, scope, step, step.source)
        elif isinstance(target, FunctionValue):
            inner = self.summary(target)
            for transfer in inner:
                yield Transfer(function, call, scope, step, transfer.source, transfer)
            if not inner and step.source is not None:  # a configured function, taken as declared
                yield Transfer(function, call, scope, step, step.source)
        else:
            context = self.evaluator.bind(function, None).at(scope)
            paths = self.finder.class_paths(target, Instance(target, call, context))
            for index, path in enumerate(paths):
                yield Transfer(function, call, scope, step, path.source, class_path=index)

    def _depends(self, transfer: Transfer, owners: list[ast.AST]) -> tuple[ast.arg, ...]:
        """The parameters of ``owners`` (the summarised function and those around it) the
        transfer's region comes from, its parameters unbound."""
        if transfer.inner is None:
            found: list[ast.arg] = []
            for path in self.resolve(transfer, None):
                flow = path.region_flow()
                if flow is not None:
                    found.extend(self.parameters_in(self.evaluator.evaluate(*flow), owners))
            return tuple(dict.fromkeys(found))
        inner = transfer.inner
        context = self.evaluator.bind(transfer.function, None).at(transfer.scope)
        arguments = _through_partials(transfer.step, Arguments.of(transfer.call, context))
        target = transfer.step.target
        bound = self.evaluator.bind(
            target if isinstance(target, FunctionValue) else inner.function, arguments
        )
        found = []
        for parameter in inner.depends:
            argument = bound.argument(parameter)
            if argument is None:
                continue
            values = self.evaluator.argument_values(argument)
            found.extend(self.parameters_in(values, owners))
        return tuple(dict.fromkeys(found))

    def parameters_in(self, values: Values, owners: list[ast.AST]) -> list[ast.arg]:
        """The parameters of ``owners`` among ``values``: passed as they are, through a
        partial, or called by a closure (its own parameters are its caller's business)."""
        found: list[ast.arg] = []
        stack = list(values)
        closures = 0
        while stack:
            value = stack.pop()
            if isinstance(value, Parameter) and value.function in owners:
                found.append(value.node)
            elif isinstance(value, PartialValue):
                stack.extend(value.inner)
            elif isinstance(value, FunctionValue) and closures < _MAX_CLOSURES:
                closures += 1
                stack.extend(self._called_values(value))
        return found

    def _called_values(self, function: FunctionValue) -> Iterator[Value]:
        context = self.evaluator.bind(function, None)
        for node in own_nodes(function.node.body):
            if isinstance(node, ast.Call):
                yield from known(self.evaluator.evaluate(node.func, context))

    # -- applying a summary ------------------------------------------------------------------
    def resolve(
        self,
        transfer: Transfer,
        arguments: Arguments | None,
        callee: FunctionValue | None = None,
    ) -> list[SourceCall]:
        """The source call ``transfer`` makes when its function, as ``callee`` (with what it
        closes over and is bound to), receives ``arguments`` (None: a call the analysis does
        not see, parameters unbound), level after level.

        What a level makes depends only on its transfer and the context its function runs
        in; transfers are shared by every caller of their function and contexts are one
        object per binding, so paths that meet again (a wrapper reached along several
        branches) are resolved below the meeting once. (Kept outside the solver: all it
        reads of the project, the summaries of the chain read first.)"""
        from ckptlint.regions.sites import SourceCall

        climbed: list[tuple[Transfer, tuple[Transfer, Context]]] = []
        current = arguments
        found: tuple[_Resolved, ...] | None = None
        function = callee or transfer.function
        for level in transfer.chain:
            context = self.evaluator.bind(function, current).at(level.scope)
            key = (level, context)
            found = self._resolved.get(key)
            if found is not None:
                break
            climbed.append((level, key))
            current = _through_partials(level.step, Arguments.of(level.call, context))
            if level.inner is None:
                found = self._source_calls(level, context, current)
            elif isinstance(level.step.target, FunctionValue):
                function = level.step.target  # as the level's body calls it
        assert found is not None
        for level, key in reversed(climbed):
            found = tuple(
                (source, arguments_, (level.function, *wrappers), (*level.step.partials, *partials))
                for source, arguments_, wrappers, partials in found
            )
            self._resolved[key] = found
        return [SourceCall(*item) for item in found]

    def _source_calls(
        self, level: Transfer, context: Context, arguments: Arguments
    ) -> tuple[_Resolved, ...]:
        """What the last level's call reaches: the source, or the paths of a wrapper class."""
        target = level.step.target
        if isinstance(target, ClassValue):
            paths = self.finder.class_paths(target, Instance(target, level.call, context))
            if level.class_path >= len(paths):
                return ()
            path = paths[level.class_path]
            return ((path.source, path.arguments, path.wrappers, path.partials),)
        source = level.source
        if isinstance(target, FunctionValue) and source.configured:
            source = as_defined(source, target)
        return ((source, arguments, (), ()),)


_Resolved = tuple[RegionSource, Arguments, tuple[FunctionValue, ...], tuple[PartialValue, ...]]


def canonical(function: FunctionValue) -> FunctionValue:
    """The definition ``function`` is, in the scope it is written in, unbound."""
    context = function.context
    if not context.env and function.bound is None:
        return function
    return FunctionValue(function.node, Context(context.module, context.scope))


def _through_partials(step: Step, arguments: Arguments) -> Arguments:
    """What the callee behind ``step``'s partials receives: each partial's own arguments
    before the call's (outermost partial first)."""
    for partial in step.partials:
        merged = Arguments((), {}, False, ()).then(partial.call, partial.context, skip=1)
        arguments = Arguments(
            (*merged.positional, *arguments.positional),
            {**merged.keywords, **arguments.keywords},
            merged.double_star or arguments.double_star,
            arguments.calls,
        )
    return arguments


def as_defined(source: RegionSource, function: FunctionValue) -> RegionSource:
    """A configured row for a function whose definition the project holds: CKP001 applies
    only if its signature can take ``use_reentrant`` (by name, or in ``**kwargs``)."""
    node = function.node
    if isinstance(node, ast.Lambda):
        return source
    arguments = node.args
    names = {a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)}
    if source.reentrant is None or "use_reentrant" in names or arguments.kwarg is not None:
        return source
    return replace(source, reentrant=None)


def enclosing_functions(scope: Scope | None) -> list[ast.AST]:
    owners: list[ast.AST] = []
    while scope is not None:
        if isinstance(scope.node, FUNCTIONS):
            owners.append(scope.node)
        scope = scope.parent
    return owners


def _where(function: FunctionValue) -> str:
    return f"{function.module.path}:{getattr(function.node, 'lineno', 0)}"
