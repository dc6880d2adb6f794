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
from functools import cache
from typing import TYPE_CHECKING

from ckptlint.project.scopes import COMPREHENSIONS, FUNCTIONS, Scope, node_position
from ckptlint.regions.calls import calls_in_body
from ckptlint.regions.sources import RegionSource
from ckptlint.resolution.bodies import own_nodes
from ckptlint.resolution.calls import only_spread, passed_on
from ckptlint.resolution.solver import Fault
from ckptlint.resolution.values import (
    Argument,
    Arguments,
    CallKeywords,
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
# each summary keeps at most this many transfers (the first ones, in source order; paths
# that hand on alike count once), and says so where it cuts.
MAX_TRANSFERS = 64
TOO_MANY = f"more than {MAX_TRANSFERS} ways to hand a region on to a checkpoint"
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
    # How the last level's function is bound, in terms of this one's parameters (None: it
    # cannot be told without binding each level; see ``Shortcut``).
    shortcut: Shortcut | None = None

    @property
    def wrappers(self) -> tuple[FunctionValue, ...]:
        """The functions of the chain, outermost first."""
        return tuple(level.function for level in self.chain)

    @property
    def last(self) -> Transfer:
        for level in self.chain:
            last = level
        return last

    @property
    def chain(self) -> Iterator[Transfer]:
        """This transfer and the ones it continues with, outermost first."""
        transfer: Transfer | None = self
        while transfer is not None:
            yield transfer
            transfer = transfer.inner


Summary = tuple[Transfer, ...]


@dataclass(frozen=True)
class Shortcut:
    """A chain whose levels only hand on what they were given: the last level's function
    (``function``, as the level above calls it) bound in terms of the first level's
    parameters, so that a site binds two functions, not every level. Each of its parameters
    is bound to a parameter of the first function (handed on unchanged) or to an argument
    that depends on no caller (a default, a constant, a module-level name); its ``**kwargs``
    (``keywords``) to the first function's, less the names the levels between took as
    parameters of their own (``taken``). ``function`` None: the first level is the last."""

    function: FunctionValue | None = None
    bindings: tuple[tuple[ast.arg, ast.arg | Argument], ...] = ()
    keywords: ast.arg | None = None
    taken: frozenset[str] = frozenset()


_IDENTITY = Shortcut()


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
        first_taking: dict[tuple[Scope, Step], ast.Call] = {}
        written: set[tuple[Scope, Step, str]] = set()  # dumps: only of steps taken twice
        dump = cache(ast.dump)  # each call dumped once, and only if its step is taken twice
        alike: set[tuple[object, ...]] = set()
        for call, scope, steps in self.steps(function):
            for step in steps:
                # The same call written twice (in both branches of an ``if``) hands on alike.
                first = first_taking.setdefault((scope, step), call)
                if first is not call:
                    written.add((scope, step, dump(first)))
                    text = (scope, step, dump(call))
                    if text in written:
                        continue
                    written.add(text)
                for transfer in self._transfers(function, call, scope, step):
                    depends = self._depends(transfer, owners)
                    if not depends:
                        continue
                    shortcut = self._shortcut(transfer)
                    if shortcut is not None:
                        # Paths through other wrappers that bind the same source call to
                        # the same parameters (a diamond of wrappers) hand on alike.
                        last = transfer.last
                        key = (transfer.source, last.call, last.class_path, shortcut, depends)
                        if key in alike:
                            continue
                        alike.add(key)
                    if len(found) == MAX_TRANSFERS:
                        self.solver.note(
                            Fault(_where(function), f"{TOO_MANY}: the first {MAX_TRANSFERS} kept")
                        )
                        return tuple(found)
                    found.append(replace(transfer, depends=depends, shortcut=shortcut))
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

    def _shortcut(self, transfer: Transfer) -> Shortcut | None:
        """The transfer's ``Shortcut``, from the next level's (None where a level computes
        what it hands on, or edits the ``**kwargs`` it hands on)."""
        inner = transfer.inner
        if inner is None:
            return _IDENTITY if not isinstance(transfer.step.target, ClassValue) else None
        target = transfer.step.target
        below = inner.shortcut
        if below is None or not isinstance(target, FunctionValue):
            return None
        function = transfer.function
        node = function.node
        assert not isinstance(node, ast.Lambda)
        unbound = self.evaluator.bind(function, None).at(transfer.scope)
        arguments = _through_partials(transfer.step, Arguments.of(transfer.call, unbound))
        bound = self.evaluator.bind(target, arguments)  # the next level, as this one calls it
        if below.function is None:  # the next level is the last: its own parameters
            last = target
            bindings: list[tuple[ast.arg, ast.arg | Argument]] = [
                (parameter, parameter) for parameter in _parameters(target.node)
            ]
            keywords = target.node.args.kwarg if not isinstance(target.node, ast.Lambda) else None
            taken: frozenset[str] = frozenset()
        else:
            last, bindings = below.function, list(below.bindings)
            keywords, taken = below.keywords, below.taken
        composed: list[tuple[ast.arg, ast.arg | Argument]] = []
        for parameter, origin in bindings:
            if isinstance(origin, Argument):
                composed.append((parameter, origin))
                continue
            argument = bound.argument(origin)
            if argument is None:
                continue  # not bound there (a ``*args`` or ``**`` may carry it): not here either
            handed = self._handed_on(passed_on(argument), function)
            if handed is None:
                return None
            composed.append((parameter, handed))
        if keywords is not None:  # the last level's ``**kwargs``: this one's, handed on
            handed = self._keywords_handed_on(target, arguments, function)
            if handed is None:
                return None
            if below.function is not None:  # the next level took some as parameters
                taken = taken | {p.arg for p in _parameters(target.node)}
            keywords = handed
        return Shortcut(last, tuple(composed), keywords, taken)

    def _handed_on(self, argument: Argument, function: FunctionValue) -> ast.arg | Argument | None:
        """What ``argument`` (bound in ``function``'s unbound activation) is in terms of
        ``function``'s parameters: one of them read unchanged, or itself when no caller
        decides it; None when it is computed from what callers pass."""
        expression, context = argument.expression, argument.context
        if argument.default or expression is None or context is None:
            return argument
        if isinstance(expression, ast.Name):
            bindings = context.scope.lookup(expression.id, node_position(expression))
            if (
                len(bindings) == 1
                and isinstance(bindings[0].node, ast.arg)
                and bindings[0].scope.node is function.node
                and context.argument(bindings[0].node) is None
            ):
                return bindings[0].node
        return argument if _closed(expression, context) else None

    def _keywords_handed_on(
        self, target: FunctionValue, arguments: Arguments, function: FunctionValue
    ) -> ast.arg | None:
        """``function``'s ``**kwargs`` when the call hands it to ``target``'s ``**kwargs``
        unchanged and adds nothing to it (its other keywords name ``target``'s
        parameters); None otherwise."""
        node = function.node
        if (
            isinstance(node, ast.Lambda)
            or node.args.kwarg is None
            or isinstance(target.node, ast.Lambda)
        ):
            return None
        kwarg = node.args.kwarg
        named = {p.arg for p in _parameters(target.node)}
        if any(name not in named for name in arguments.keywords) or len(arguments.spread) != 1:
            return None
        expression, context = arguments.spread[0]
        if not isinstance(expression, ast.Name) or expression.id != kwarg.arg:
            return None
        bindings = context.scope.lookup(expression.id, node_position(expression))
        if len(bindings) != 1 or bindings[0].node is not kwarg or not only_spread(node, kwarg.arg):
            return None
        return kwarg

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

        if transfer.shortcut is not None and arguments is not None:
            return self._resolve_through(transfer, transfer.shortcut, arguments, callee)
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

    def _resolve_through(
        self,
        transfer: Transfer,
        shortcut: Shortcut,
        arguments: Arguments,
        callee: FunctionValue | None,
    ) -> list[SourceCall]:
        """``resolve`` with the transfer's ``Shortcut``: the first function bound to what the
        site passes, the last to what the first received, whatever the levels between."""
        from ckptlint.regions.sites import SourceCall

        first = self.evaluator.bind(callee or transfer.function, arguments)
        last = transfer.last
        function = shortcut.function
        if function is None:
            context = first
        else:
            env = list(function.context.env)
            for parameter, origin in shortcut.bindings:
                if isinstance(origin, Argument):
                    env.append((parameter, origin))
                    continue
                argument = first.argument(origin)
                if argument is not None:
                    env.append((parameter, passed_on(argument)))
            kwarg = None if isinstance(function.node, ast.Lambda) else function.node.args.kwarg
            held = first.argument(shortcut.keywords) if shortcut.keywords is not None else None
            if kwarg is not None and held is not None and len(held.values) == 1:
                (keywords,) = held.values
                if isinstance(keywords, CallKeywords):
                    less = _less(keywords, shortcut.taken, function.node)
                    env.append((kwarg, Argument(None, None, (less,))))
            scope = self.evaluator.scope_of(function)
            context = self.evaluator.context(function.module, scope, tuple(env))
        context = context.at(last.scope)
        current = _through_partials(last.step, Arguments.of(last.call, context))
        wrappers = transfer.wrappers
        partials = tuple(p for level in transfer.chain for p in level.step.partials)
        return [
            SourceCall(source, found, (*wrappers, *more), (*partials, *further))
            for source, found, more, further in self._source_calls(last, context, current)
        ]

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


def _less(keywords: CallKeywords, taken: frozenset[str], function: ast.AST) -> CallKeywords:
    """What ``function``'s ``**kwargs`` holds when it is handed ``keywords`` through levels
    that took ``taken`` as parameters of their own."""
    inner = keywords.arguments
    left = {k: v for k, v in inner.keywords.items() if k not in keywords.taken | taken}
    handed = Arguments((), left, inner.double_star, inner.calls, inner.spread)
    named = frozenset(p.arg for p in _parameters(function))
    return CallKeywords(handed, named, keywords.owner)


def _parameters(node: ast.AST) -> list[ast.arg]:
    """A function's named parameters (not ``*args`` or ``**kwargs``)."""
    if not isinstance(node, (*FUNCTIONS, ast.Lambda)):
        return []
    arguments = node.args
    return [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]


def _closed(expression: ast.expr, context: Context) -> bool:
    """Whether ``expression`` reads only what no caller binds: constants and names bound
    at module level (or builtins)."""
    for node in ast.walk(expression):
        if isinstance(node, (ast.Lambda, *COMPREHENSIONS, ast.NamedExpr)):
            return False
        if isinstance(node, ast.Name):
            bindings = context.scope.lookup(node.id, node_position(node))
            if any(b.scope.kind != "module" for b in bindings):
                return False
    return True


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
