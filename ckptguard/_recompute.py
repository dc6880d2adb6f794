"""One recompute of a region: verified before any of its code runs, watched while it runs,
judged once it ran.

Verification compares the region's fingerprint with what it reaches now (``_verify``); a
difference is a ``CheckpointMismatchError`` before the region's code runs (``_explain`` names
it), except for a region given a ``context_fn``, whose forward context may set state on
purpose: its difference is reported once the recompute ran through. Torch settings that
changed are judged by what the recompute computes (``_settings``); state the region's own
forward updated is watched for a second update (``_side_effects``); strict mode compares what
backward uses (``_strict``). The watches are contexts around the user's function, entered and
left inside the barrier (``_barrier``), never wrapping the function itself.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from ckptguard import _compat, _explain, _selective, _settings, _side_effects, _strict, _verify
from ckptguard._barrier import stage
from ckptguard._report import Collector
from ckptguard.errors import CheckpointGuardError

_depth = threading.local()  # regions recomputing on this thread, one inside another


def running() -> int:
    """How many recomputes run on this thread (report mode prices only outermost regions)."""
    return _depth.__dict__.get("count", 0)


def recompute(region: Any, args: tuple, kwargs: dict) -> Any:
    """The recompute torch asked for, verified first. See NOTE [ Read twice ] in ``_verify``"""
    comparison = verify(region, args, kwargs)
    if comparison is None:  # the guard gave the region up
        return region.fn(*args, **kwargs)
    deferred = None
    if comparison.found is not None:
        error = region.mismatch(comparison.found, args, kwargs)
        if error is not None and region.context_fn:
            deferred = error
        elif error is not None:
            region.report(error)
    if (
        deferred is None
        and not comparison.settings
        and not region.watch
        and region.strict_forward is None
        and region.stats is None
    ):
        return _unwatched(region, args, kwargs)  # the usual case: nothing to watch
    watch = _watch(region, comparison.settings)
    if watch is None:
        return region.fn(*args, **kwargs)
    if deferred is not None:
        return _run_then_report(region, watch, deferred, args, kwargs)
    return watch.run(args, kwargs)


def _unwatched(region: Any, args: tuple, kwargs: dict) -> Any:
    try:
        out = call(region, args, kwargs)
    except _compat.resolve().stop_recomputation_error:
        refresh_own_writes(region)
        raise
    if region.fingerprint.reader.self_written:
        refresh_own_writes(region)
    return out


@stage("verify")
def verify(region: Any, args: tuple, kwargs: dict) -> _verify.Comparison:
    fingerprint = region.fingerprint
    assert fingerprint is not None, "a recompute follows its forward"
    own = region.own_hooks()
    return _verify.compare(fingerprint, region.binding, args, kwargs, own)


def _run_then_report(
    region: Any, watch: Watch, error: CheckpointGuardError, args: tuple, kwargs: dict
) -> Any:
    """A region given a ``context_fn``, whose forward context may set state the recompute
    context does not: the region's own exception, if its recompute raises one, is what the
    user sees (the guard's finding added as a note); one that runs through is reported."""
    stopped = None
    try:
        out = watch.run(args, kwargs)
    except _compat.resolve().stop_recomputation_error as stop:
        stopped = stop
    except BaseException as own:
        if hasattr(own, "add_note"):  # Python 3.11+
            found = "\n".join(str(error).splitlines()[:2])
            own.add_note(f"ckptguard found before this recompute began:\n{found}")
        raise
    region.report(error)
    if stopped is not None:
        raise stopped
    return out


class Watch:
    """What one recompute runs under: the watch of the torch settings that changed, the state
    the region's forward updated as it was before the recompute, strict mode's pass."""

    __slots__ = ("region", "settings", "before", "state", "strict")

    def __init__(
        self,
        region: Any,
        settings: _settings.SettingsWatch | None,
        before: list | None,
        state: _side_effects.StateReads | None,
        strict: _strict.StrictRecompute | None,
    ) -> None:
        self.region, self.settings, self.before = region, settings, before
        self.state, self.strict = state, strict

    def run(self, args: tuple, kwargs: dict) -> Any:
        region = self.region
        contexts = [c for c in (self.settings, self.state, self.strict) if c is not None]
        mark = _open(region, contexts) if contexts else len(region.opened or ())
        if mark is None:
            return region.fn(*args, **kwargs)
        stop = _compat.resolve().stop_recomputation_error
        try:
            out = call(region, args, kwargs)
        except stop:
            _close(region, mark, sys.exc_info())
            self.finish(None, stopped=True)
            raise
        except BaseException:
            _close(region, mark, sys.exc_info())
            raise
        _close(region, mark, (None, None, None))
        self.finish(out, stopped=False)
        return out

    def finish(self, out: Any, stopped: bool) -> None:
        """After the recompute (or torch's early stop): the verdicts, in the order the user
        needs them (wrong values first: a side effect may be their cause)."""
        region, strict = self.region, self.strict
        if strict is not None and region.reentrant and not stopped:
            _record_outputs(region, strict, out)
        refresh_own_writes(region)
        if strict is not None or self.before is not None:
            check(region, self.before, strict, stopped, self.state)
        if self.settings is not None:
            _judge_settings(region, self.settings)


@stage("watch the recompute of")
def _watch(region: Any, changes: list) -> Watch:
    settings = _settings.SettingsWatch(changes) if changes else None
    before = state = None
    if region.watch:
        before = _side_effects.state_before_recompute(region.watch)
        state = _side_effects.state_reads(region.watch, region.name_module)
    strict = None
    if region.strict_forward is not None:
        if region.scoped:  # strict mode's pass runs around this call already (StrictScope)
            region.pending = before if before is not None else []
            before = None
        else:
            strict = region.last_strict = _strict.StrictRecompute(
                region.strict_forward, region.fingerprint.reader.torch_compiled
            )
    return Watch(region, settings, before, state, strict)


@stage("watch the recompute of")
def _open(region: Any, contexts: list) -> int:
    """Enter the guard's contexts around the user's function, noted in ``region.opened``
    (``give_up`` closes them): how many were open before, to close down to."""
    if region.opened is None:
        region.opened = []
    opened = region.opened
    mark = len(opened)
    for context in contexts:
        context.__enter__()
        opened.append(context)
    return mark


@stage("watch the recompute of")
def _close(region: Any, mark: int, exc: tuple) -> None:
    opened = region.opened
    while opened is not None and len(opened) > mark:  # each left once, even where one fails
        opened.pop().__exit__(*exc)


@stage("compare the values of")
def _record_outputs(region: Any, strict: _strict.StrictRecompute, out: Any) -> None:
    strict.record_outputs(out)


def call(region: Any, args: tuple, kwargs: dict) -> Any:
    """The user's function, as the recompute runs it; torch's CheckpointError from inside
    (a nested region's) explained."""
    state = _depth.__dict__
    state["count"] = state.get("count", 0) + 1
    try:
        if region.stats is None:
            return region.fn(*args, **kwargs)
        return Collector.timed_recompute(region.stats, region.fn, args, kwargs)
    except _compat.resolve().checkpoint_error as error:
        explained_error = explained(region, error)
        if explained_error is error:
            raise
        raise explained_error from error
    finally:
        state["count"] -= 1


@stage("fingerprint")
def refresh_own_writes(region: Any) -> None:
    """Containers the region's own code mutates (``calls[0] += 1``): the next recompute of
    the same graph (``retain_graph=True``) starts from what this one left there."""
    fingerprint = region.fingerprint
    if fingerprint is not None and fingerprint.reader.self_written:
        _verify.refresh_own_writes(fingerprint, region.own_hooks())


@stage("check the recompute of")
def check(
    region: Any,
    before: list | None,
    strict: _strict.StrictRecompute | None,
    stopped: bool,
    state: _side_effects.StateReads | None = None,
) -> None:
    changed, statistics_only = (
        _side_effects.updated_again(before, region.name_module) if before else ([], True)
    )
    found_state = state.verdict() if state is not None else None
    if found_state is not None:  # the cause, where strict mode would see only its effect
        name, evidence, certain = found_state
        error = _explain.worded(
            _explain.state_read_error, region.name, "tensor", name, name, evidence, certain
        )
        if certain:
            region.report(error)
        elif strict is None:  # a 'may': strict mode measures the values backward uses instead
            region.found.append((error.kind, error.details))
            _explain.report(error, "warn", region.location())
    if strict is not None:  # wrong values first: a side effect may be their cause
        found = strict.difference(stopped)
        mutated = _selective.take_mutations(region) if region.scoped else None
        name = region.name
        if mutated:  # selective checkpointing's saved outputs changed in place: measured
            what, difference = found if found is not None else (None, None)
            first_op = strict.first_diverging_op() if found is not None else None
            measured = _explain.selective_cache_measured(
                name, mutated, what, difference, first_op, region.location()
            )
            if measured is not None:
                region.report(measured)
        elif found is not None:
            what, difference = found
            region.report(
                _explain.worded(
                    lambda name: _explain.values_error(
                        name, what, difference, strict.first_diverging_op()
                    ),
                    name,
                    "values",
                    what,
                )
            )
    if changed:
        _explain.side_effect(region.name, changed, statistics_only, region.location())


@stage("judge the torch settings of")
def _judge_settings(region: Any, watch: _settings.SettingsWatch) -> None:
    if watch.failure is not None:
        raise watch.failure  # its dispatch mode's, noted inside the recompute
    found = watch.verdict()
    if found is None:  # no result it changed reached backward; torch's own check may differ
        region.found += [
            ("torch_state", _explain.setting_changed(name, old, new))
            for name, old, new in watch.changes
        ]
        return
    name, old, new, evidence, certain = found
    error = _explain.worded(
        _explain.torch_state_error,
        region.name,
        "torch_state",
        name,
        name,
        old,
        new,
        evidence,
        certain,
    )
    if certain or region.options.strict:
        region.report(error)
    else:  # a verdict the guard is not sure of is a warning, unless strict was asked
        region.found.append((error.kind, error.details))
        _explain.report(error, "warn", region.location())


def explained(region: Any, error: BaseException) -> BaseException:
    """torch's CheckpointError explained from what the guard saw; torch's own error where
    the guard gave the region up or fails to explain it."""
    if isinstance(error, CheckpointGuardError) or region.unguarded:
        return error  # the guard's own, from inside; or torch's, as torch alone raises it
    found = _explained(region, error)
    return error if found is None else found


@stage("explain torch's error in")
def _explained(region: Any, error: BaseException) -> BaseException:
    strict = region.last_strict
    first_op = strict.first_diverging_op() if strict is not None else None
    return _explain.checkpoint_error_explained(region.name, str(error), region.found, first_op)


# ------------------------------------------------------------ strict mode under context_fn


class StrictScope:
    """Strict mode's recompute pass entered around the user's recompute context (from
    ``context_fn``), so that the user's dispatch mode, e.g. selective checkpointing's, stays
    the innermost one the region's code sees; checks the recompute when the pass ends."""

    def __init__(self, region: Any, recompute_context: Any) -> None:
        self.region = region
        self.context = recompute_context
        self.strict: _strict.StrictRecompute | None = None
        self.mark: int | None = None

    def __enter__(self) -> Any:
        region = self.region
        if region.strict_forward is not None and region.forward_done:
            strict = _start_scoped(region)
            if strict is not None:
                self.mark = _open(region, [strict])
                self.strict = strict if self.mark is not None else None
        try:
            return self.context.__enter__()
        except BaseException:
            self._leave(sys.exc_info())
            raise

    def _leave(self, exc: tuple) -> None:
        mark, self.mark = self.mark, None
        if mark is not None:
            _close(self.region, mark, exc)

    def __exit__(self, *exc: Any) -> Any:
        __tracebackhide__ = True  # a hook torch calls: pytest does not show it
        try:
            suppressed = self.context.__exit__(*exc)
        finally:
            self._leave(exc)
        region = self.region
        strict, self.strict = self.strict, None
        before, region.pending = region.pending, None
        stopped = exc[0] is not None and issubclass(
            exc[0], _compat.resolve().stop_recomputation_error
        )
        if strict is not None and before is not None and (exc[0] is None or stopped):
            try:
                refresh_own_writes(region)
                check(region, before, strict, stopped)
            except CheckpointGuardError as error:
                _explain.raised_at_hook(error)
                raise
        return suppressed


@stage("compare the values of")
def _start_scoped(region: Any) -> _strict.StrictRecompute:
    fingerprint = region.fingerprint
    compiled = fingerprint is not None and fingerprint.reader.torch_compiled
    strict = region.last_strict = _strict.StrictRecompute(region.strict_forward, compiled)
    region.pending = None
    return strict


def scoped_context_fn(region: Any, context_fn: Any) -> Any:
    def context() -> tuple[Any, Any]:
        forward_context, recompute_context = context_fn()
        return forward_context, StrictScope(region, recompute_context)

    return context
