"""Where ckptguard hooks into torch.utils.checkpoint, and the life of one region.

``checkpoint`` itself is never replaced (references bound earlier, e.g. ``partial(checkpoint,
...)`` or ``checkpoint_wrapper``, would escape, and torch.compile recognises it by identity).
Instead ckptguard wraps the two places every path goes through (resolved by ``_compat``):

* reentrant: ``CheckpointFunction.apply``. The user's function is handed to torch wrapped in a
  ``Region``, which torch calls for the forward and stores as ``ctx.run_function`` to recompute.
* non-reentrant: ``_checkpoint_without_reentrant_generator`` (``..._impl`` from 2.14, and the
  copy the composable ``checkpoint(module)`` API imported). Torch runs the forward itself and
  calls the generator's ``fn`` only to recompute, so the generator gets a ``Region``.

A region that calls a module reads that module's tree; for a region that is a function, a
global forward pre-hook (registered only while its forward runs, acting only on its own thread)
records the modules it runs. Right after the forward the region is fingerprinted
(``_verify.capture``), and the fingerprint is verified at the start of each recompute, before
any user code runs (an early-stopped recompute never reaches the end). After the recompute come
the side-effect check and, in strict mode, the comparison of what backward uses.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
import threading
import types
import weakref
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from ckptguard import (
    _compat,
    _ddp,
    _explain,
    _names,
    _report,
    _rng,
    _selective,
    _settings,
    _side_effects,
    _strict,
    _verify,
)
from ckptguard._fingerprint import nested_tensors
from ckptguard.errors import (
    CheckpointGuardError,
    CheckpointGuardWarning,
    CheckpointMismatchWarning,
)


@dataclass(frozen=True)
class Options:
    strict: bool = False
    on_mismatch: str = "raise"
    report: bool = False
    on_lost_gradients: str = "warn"


_options: Options | None = None
collector: _report.Collector | None = None  # report mode's figures, kept after disable()
_patches: list[tuple[Any, str, bool, Any]] = []  # (owner, attribute, owned it, original)
_local = threading.local()


_NO_MODULES: frozenset[int] = frozenset()
# where torch.compile's own regions come from (tag_activation_checkpoint): torch owns them
_COMPILER_DIRS = tuple(
    _compat.torch_dir() + name + "/"
    for name in ("_higher_order_ops", "_dynamo", "_functorch", "_inductor")
)


# ------------------------------------------------------------------ modules a forward runs


class _Observation:
    """Registers one global forward pre-hook while any region's forward runs, on any thread;
    the hook only feeds the observers of the thread that calls it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active = 0
        self.handle: Any = None
        self.own: frozenset = frozenset()

    def start(self, observer: Observer) -> None:
        stack = _local.__dict__.get("observers")
        if stack is None:
            stack = _local.observers = []
        stack.append(observer)
        observer.observing = True
        with self.lock:
            if self.active == 0:
                self.handle = _compat.resolve().register_forward_pre_hook(_observe)
                self.own = frozenset({self.handle.id})
            self.active += 1

    def stop(self, observer: Observer) -> None:
        if not observer.observing:
            return
        observer.observing = False
        stack = _local.observers
        stack.remove(observer)
        with self.lock:
            self.active -= 1
            if self.active == 0:
                self.handle.remove()
                self.handle = None


_observation = _Observation()


def _observe(module: torch.nn.Module, args: Any) -> None:
    for observer in _local.__dict__.get("observers", ()):
        observer.see(module)


class Observer:
    """The modules a region's forward runs, and their state before it first ran them (to tell
    the state the region itself updates, such as BatchNorm's running statistics)."""

    __slots__ = ("modules", "before", "observing", "failure")

    def __init__(self) -> None:
        self.modules: dict[int, torch.nn.Module] = {}
        self.before: dict[int, tuple] = {}
        self.observing = False
        self.failure: Exception | None = None

    def see(self, module: torch.nn.Module) -> None:
        key = id(module)
        if key in self.modules:
            return
        self.modules[key] = module
        if self.failure is not None:
            return
        try:
            before = _side_effects.state_before(module)
        except Exception as error:  # runs inside the user's forward: reported once it returns
            self.failure = error  # See NOTE [ The guard never stops training ]
            return
        if before is not None:
            self.before[key] = before


# ------------------------------------------------------------------------------- a region

# NOTE [ The guard never stops training ]
# The guard's own failure (a bug, or an object it cannot read: a proxy, a tensor subclass
# without storage) must not stop the user's training or change what it computes. Every stage of
# the guard's work on a region (prepare, fingerprint, verify, the torch-settings, strict,
# side-effect, DDP and selective-checkpointing checks, explaining, warning) runs inside one
# exception barrier, ``Region.guarded``: a failure there becomes one ``CheckpointGuardWarning``
# ``[internal]`` (``give_up``) and the region runs on unguarded, as torch alone runs it. The
# barrier never wraps the user's function, whose errors (torch's ``_StopRecomputationError``
# among them) pass through untouched, and it lets the guard's verdicts through: its errors, and
# its warnings where a filter makes them errors. Guard code that runs inside the user's
# function (the forward pre-hook that sees the modules a function region runs) must not raise
# there: it notes its failure, which the barrier reports once the function has returned.

_VERDICTS = (CheckpointGuardError, CheckpointGuardWarning, CheckpointMismatchWarning)
_T = TypeVar("_T")


class Region:
    """One checkpoint call: its forward's fingerprint, verified whenever torch recomputes it.

    Holds the user's function and the modules its fingerprint read, as torch's graph holds
    the region: it lives as long as that graph does. The model is only weakly referenced."""

    __slots__ = (
        "fn",
        "options",
        "reentrant",
        "preserve",
        "fingerprint",
        "observer",
        "modules",
        "watch",
        "root",
        "strict_forward",
        "last_strict",
        "random_ops",
        "rng_before",
        "target",
        "binding",
        "loose",
        "stats",
        "found",
        "forward_done",
        "unguarded",
        "context_fn",
        "scoped",
        "pending",
        "opened",
        "tree",
        "_name",
        "__weakref__",
    )
    # set by ``prepare``; a region whose preparation failed runs unguarded without them
    binding: _verify.Binding
    target: torch.nn.Module | None  # None: a function, whose forward is observed

    def __init__(self, fn: Any, options: Options, reentrant: bool):
        self.fn = fn
        self.options = options
        self.reentrant = reentrant
        self.preserve = True
        self.fingerprint: _verify.RegionFingerprint | None = None
        self.observer: Observer | None = None
        self.modules: list = []  # read by the fingerprint, alive while the region is
        self.watch: list[_side_effects.Watched] = []
        self.root: weakref.ref | None = None  # the model, found after the forward
        self.loose: AbstractSet[int] = _NO_MODULES
        self.strict_forward: _strict.StrictForward | None = None
        self.last_strict: _strict.StrictRecompute | None = None
        self.random_ops: _rng.RandomOps | None = None
        self.rng_before: dict[str, Any] | None = None
        self.stats: _report.RegionStats | None = None
        self.found: list = []
        self.forward_done = False
        self.unguarded = False  # the guard failed on this region: torch runs it plainly
        self.context_fn = False  # a user context_fn: its contexts may differ by design
        # strict mode's recompute pass is entered by a wrapped context_fn, under the user's
        # recompute context (whose dispatch mode must stay on top), not inside the function
        self.scoped = False
        self.pending: list | None = None  # the watched state, while a scoped recompute runs
        self.opened: list | None = None  # the guard's contexts open around the forward
        # a module region's reader, found before its forward, read through after it
        self.tree: _verify.RegionReader | None = None
        self._name: str | None = None

    def prepare(self, preserve: bool) -> None:
        """Before the forward: take the callable apart, note the RNG states (strict mode: the
        forward's records). Run inside the barrier."""
        self.preserve = preserve
        self.binding = binding = _verify.bind(self.fn)
        self.target = binding.module
        if self.options.strict:
            self.strict_forward = _strict.StrictForward(self.reentrant)
        if preserve:
            self.rng_before = _rng.snapshot()
        else:
            self.random_ops = _rng.RandomOps()

    # the barrier ------------------------------------------------------------------------

    def guarded(self, stage: str, work: Callable[..., _T], *args: Any) -> _T | None:
        """One stage of the guard's work on this region (never the user's function), inside
        the barrier: its result, or None where the guard failed and gave the region up.
        See NOTE [ The guard never stops training ]"""
        try:
            return work(*args)
        except _VERDICTS:
            raise
        except Exception as error:
            self.give_up(stage, error)
            return None

    def give_up(self, stage: str, error: Exception) -> None:
        """The region runs on unguarded: what the guard opened is closed, and one warning says
        so. See NOTE [ The guard never stops training ]"""
        first = not self.unguarded
        self.unguarded = self.forward_done = True
        self.random_ops = self.strict_forward = self.fingerprint = None
        observer, self.observer = self.observer, None
        if observer is not None:
            _observation.stop(observer)
        opened, self.opened = self.opened, None
        while opened:  # entered before the failure, around a forward still running
            with contextlib.suppress(Exception):  # the failure is being reported already
                opened.pop().__exit__(None, None, None)
        if first:
            _explain.internal_error(self._name_for_warning(), stage, error)

    def _name_for_warning(self) -> str:
        try:
            return self.name
        except Exception:  # naming reads the same state that just failed
            return _names.function_label(self.fn)

    # names ------------------------------------------------------------------------------

    def found_root(self) -> torch.nn.Module | None:
        """The model found on the stack at the forward, if it still lives."""
        return self.root() if self.root is not None else None

    def naming_root(self) -> torch.nn.Module | None:
        root = self.found_root()
        if root is not None:
            return root
        return self.modules[0] if self.modules else None

    def name_module(self, module: torch.nn.Module) -> str:
        root = self.naming_root()
        path = _names.module_path(root, module)
        if self.root is None and root is not None and path:
            return f"{_names.class_name(root)}.{path}"
        return path if path else _names.class_name(module)

    @property
    def name(self) -> str:
        if self._name is None:
            fingerprint = self.fingerprint
            # as it was at the forward
            code = fingerprint.code if fingerprint is not None else self.binding.code
            self._name = _names.region_name(self.fn, self.found_root(), self.modules, code)
        return self._name

    def location(self) -> tuple[str, int] | None:
        """Where the region's function is defined: a warning's place when no user frame is
        on the stack (a backward run by an accelerator's worker thread)."""
        function = self.binding.function
        if function is None:
            return None
        return function.__code__.co_filename, function.__code__.co_firstlineno

    # forward ----------------------------------------------------------------------------

    def enter_forward(self) -> None:
        """Before the forward, only what cannot wait: a function region watches which modules
        it runs; a module region notes the state of its modules that hold buffers or assign
        attributes (known from its tree's reader)."""
        if not self.unguarded:
            self.guarded("prepare", self._enter_forward)

    def _enter_forward(self) -> None:
        if _compat.fsdp2_in_use():
            self.loose = _compat.fsdp2_managed_modules()
        if self.target is None:
            observer = Observer()
            _observation.start(observer)
            self.observer = observer
        else:
            stateful, self.tree = _verify.stateful_modules(
                self.target, self.binding, self.reentrant, self.loose
            )
            if stateful:
                self.observer = observer = Observer()
                for module in stateful:
                    observer.see(module)
        if self.random_ops is not None or self.strict_forward is not None:
            self.opened = opened = []
            for context in (self.random_ops, self.strict_forward):
                if context is not None:
                    context.__enter__()
                    opened.append(context)

    def exit_forward(self, exc: tuple) -> None:
        # nothing to leave (no context opened, no observer): no stage to run
        if not self.unguarded and (self.opened or self.observer is not None):
            self.guarded("record the forward of", self._exit_forward, exc)

    def _exit_forward(self, exc: tuple) -> None:
        opened = self.opened
        while opened:  # each left once, even where leaving it fails
            opened.pop().__exit__(*exc)
        self.opened = None
        observer = self.observer
        if observer is not None:
            _observation.stop(observer)  # a function region observed since enter_forward
            if observer.failure is not None:
                raise observer.failure

    def _loose(self, modules: Any) -> AbstractSet[int]:
        """Modules whose parameters FSDP2 swaps on purpose (compared loosely)."""
        if not self.loose:
            return self.loose
        loose = set(self.loose)
        loose.update(id(m) for m in modules if _compat.is_fsdp2_module(m))
        return loose

    def finish_forward(self, args: tuple, kwargs: dict) -> None:
        """Right after the forward: fingerprint what it reached, check RNG, count it.
        See NOTE [ Read twice ]"""
        if not self.unguarded:
            self.guarded("fingerprint", self._finish_forward, args, kwargs)

    def _finish_forward(self, args: tuple, kwargs: dict) -> None:
        observer = self.observer
        self.observer = None
        observed = list(observer.modules.values()) if observer and self.target is None else []
        written = self._written(observer) if observer is not None else {}
        self.fingerprint = fingerprint = _verify.capture(
            self.fn,
            self.binding,
            observed,
            written,
            args,
            kwargs,
            self.reentrant,
            _observation.own,
            self._loose(observed) if self.loose else self.loose,
            self.tree,
        )
        self.tree = None
        self.modules = modules = fingerprint.modules
        self.root = _names.root_ref(modules[0]) if modules else None
        if fingerprint.iterators:  # the recompute will draw their next values
            advanced = _verify.advanced_iterators(fingerprint, self.name_module)
            _explain.advanced_iterators(self.name, advanced, self.location())
        if self.strict_forward is not None:
            state_ids: set[int] = set()
            for module in observed if observer is None else observer.modules.values():
                names = written.get(id(module), ())
                state_ids.update(id(module._buffers[n]) for n in names if n in module._buffers)
            self.strict_forward.mark_state(state_ids)
        self.forward_done = True
        if self.rng_before is not None or self.random_ops is not None:
            self._check_rng(args)  # else: no accelerator, and torch restores the CPU RNG
        if collector is not None and self.options.report and not _local.__dict__.get("depth"):
            # pricing runs the region again: keep its saved tensors out of an enclosing
            # region's checkpoint frame
            with torch.autograd.graph.saved_tensors_hooks(_same, _same):
                self.stats = collector.on_forward(self.name, self.fn, args, kwargs)

    def _written(self, observer: Observer) -> dict[int, frozenset]:
        """Module state the forward itself updated, now watched (see ``_side_effects``)."""
        written, watch = _side_effects.written_by_forward(
            observer.modules.values(), observer.before
        )
        self.watch += watch
        return written

    def _check_rng(self, args: tuple) -> None:
        if self.random_ops is not None and self.random_ops.failure is not None:
            raise self.random_ops.failure  # its dispatch mode's, noted inside the forward
        drawn = self.random_ops.devices if self.random_ops is not None else None
        devices = _rng.consumed_unstashed(self.rng_before, drawn, self.preserve, args)
        self.rng_before = None
        if devices:
            error = _explain.rng_device_error(self.name, devices, self.preserve)
            _explain.report(error, self.options.on_mismatch, self.location())

    def check_lost_gradients(self, args: tuple) -> None:
        """Reentrant only: with no positional tensor that requires grad, the region's output
        requires none, so its parameters and the tensors nested in its container arguments
        get no gradient. (With one, the recompute's own backward reaches nested tensors.)"""
        if self.unguarded or any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            return
        self.guarded("check the gradients of", self._check_lost_gradients, args)

    def _check_lost_gradients(self, args: tuple) -> None:
        parameters: list[str] = []
        for module in self.modules:
            owned = [n for n, p in module._parameters.items() if p is not None and p.requires_grad]
            if owned:
                prefix = self.name_module(module)
                parameters.extend(f"{prefix}.{n}" for n in owned)
        nested = [
            f"positional argument {index}{path}"
            for index, arg in enumerate(args)
            if not isinstance(arg, torch.Tensor)
            for path, tensor in nested_tensors(arg)
            if tensor.requires_grad
        ]
        if parameters or nested:
            inputs = [
                f"positional argument {i}: tensor {tuple(a.shape)} {a.dtype}"
                for i, a in enumerate(args)
                if isinstance(a, torch.Tensor)
            ]
            root = self.found_root()
            model_fix = (
                "enable_input_require_grads"
                if callable(getattr(root, "enable_input_require_grads", None))
                else None
            )
            _explain.lost_gradients(
                self.name,
                list(dict.fromkeys(parameters)),
                nested,
                inputs,
                model_fix,
                self.options.on_lost_gradients == "raise",
                self.location(),
            )

    def check_ddp(self, args: tuple) -> None:
        """Reentrant only: parameters whose gradient two backward passes of the running
        DistributedDataParallel step would produce (see ``_ddp``)."""
        if not self.unguarded:
            self.guarded("check the DistributedDataParallel step of", self._check_ddp, args)

    def _check_ddp(self, args: tuple) -> None:
        ddp = _compat.active_ddp()
        if ddp is not None:
            _ddp.reentrant_forward(self, ddp, args)

    # recompute --------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # a hook torch calls: pytest does not show it
        if self.unguarded:
            return self.fn(*args, **kwargs)
        if self.forward_done and _options is not None:
            try:
                return self._recompute(args, kwargs)
            except CheckpointGuardError as error:
                _explain.raised_at_hook(error)
                raise
        if self.reentrant and not self.forward_done and self.observer is None:
            self.enter_forward()  # torch runs the reentrant forward through us
            exc: tuple = (None, None, None)
            try:
                out = self.fn(*args, **kwargs)
            except BaseException:
                exc = sys.exc_info()
                raise
            finally:
                self.exit_forward(exc)
            if self.strict_forward is not None:
                self.guarded("record the forward of", self.strict_forward.record_outputs, out)
            return out
        return self.fn(*args, **kwargs)

    def _recompute(self, args: tuple, kwargs: dict) -> Any:
        # verified before any of the region's code runs. See NOTE [ Read twice ]
        verified = self.guarded("verify", self._verify, args, kwargs)
        if self.unguarded or verified is None:
            return self.fn(*args, **kwargs)
        settings, found = verified
        resolved = _compat.resolve()
        if found is not None:
            mismatch = self.guarded("explain what changed in", self._mismatch, found)
            if self.unguarded or mismatch is None:
                return self.fn(*args, **kwargs)
            if self.context_fn:
                return self._recompute_then_report(mismatch, args, kwargs, settings, resolved)
            self._report(mismatch)
        if not settings:  # the usual case: nothing to judge
            return self._recompute_body(args, kwargs, resolved)
        return self._recompute_judged(args, kwargs, settings, resolved)

    def _verify(self, args: tuple, kwargs: dict) -> tuple[list, _explain.Difference | None]:
        """(torch settings that changed, the first other difference)."""
        fingerprint = self.fingerprint
        assert fingerprint is not None, "a recompute follows its forward"
        try:
            settings = _verify.compare(
                fingerprint,
                self.binding,
                args,
                kwargs,
                _observation.own,
                self.name_module,
            )
        except _explain.Difference as difference:
            return [], difference
        return settings, None

    def _mismatch(self, found: _explain.Difference) -> CheckpointGuardError:
        return _explain.mismatch_error(
            self.name, found.kind, found.name, found.where, found.old, found.new
        )

    def _recompute_then_report(
        self, error: CheckpointGuardError, args: tuple, kwargs: dict, settings: list, resolved: Any
    ) -> Any:
        """A region given a ``context_fn``, whose forward context may set state the recompute
        context does not: the region's own exception, if its recompute raises one, is what the
        user sees (the guard's finding added as a note); one that runs through is reported."""
        stopped = None
        try:
            out = self._recompute_judged(args, kwargs, settings, resolved)
        except resolved.stop_recomputation_error as stop:
            stopped = stop
        except BaseException as own:
            if hasattr(own, "add_note"):  # Python 3.11+
                found = "\n".join(str(error).splitlines()[:2])
                own.add_note(f"ckptguard found before this recompute began:\n{found}")
            raise
        self._report(error)
        if stopped is not None:
            raise stopped
        return out

    def _recompute_judged(
        self, args: tuple, kwargs: dict, settings: list, resolved: _compat.Torch
    ) -> Any:
        """The recompute, under a watch of the torch settings that changed, if any."""
        if not settings:
            return self._recompute_body(args, kwargs, resolved)
        # only torch settings changed: judged by what the recompute runs
        watch = self.guarded("judge the torch settings of", _settings.SettingsWatch, settings)
        if watch is None:
            return self.fn(*args, **kwargs)
        try:
            with _Guarded(self, "judge the torch settings of", watch):
                out = self._recompute_body(args, kwargs, resolved)
        except resolved.stop_recomputation_error:
            self._judge_settings(watch)
            raise
        self._judge_settings(watch)
        return out

    def _judge_settings(self, watch: _settings.SettingsWatch) -> None:
        if not self.unguarded:
            self.guarded("judge the torch settings of", self._judge, watch)

    def _judge(self, watch: _settings.SettingsWatch) -> None:
        if watch.failure is not None:
            raise watch.failure  # its dispatch mode's, noted inside the recompute
        found = watch.verdict()
        if found is None:
            return
        name, old, new, evidence, certain = found
        error = _explain.torch_state_error(self.name, name, old, new, evidence, certain)
        if certain or self.options.strict:
            self._report(error)
        else:  # a verdict the guard is not sure of is a warning, unless strict was asked
            self.found.append((error.kind, error.details))
            _explain.report(error, "warn", self.location())

    def _recompute_body(self, args: tuple, kwargs: dict, resolved: _compat.Torch) -> Any:
        if self.watch or self.strict_forward is not None or self.stats is not None:
            return self._recompute_observed(args, kwargs, resolved)
        try:
            out = self._run(args, kwargs, resolved)
        except resolved.stop_recomputation_error:
            self._refresh_own_writes()
            raise
        fingerprint = self.fingerprint
        if fingerprint is not None and fingerprint.reader.self_written:
            self._refresh_own_writes()
        return out

    def _refresh_own_writes(self) -> None:
        """Containers the region's own code mutates (``calls[0] += 1``): the next recompute
        of the same graph (``retain_graph=True``) starts from what this one left there."""
        fingerprint = self.fingerprint
        if fingerprint is not None and fingerprint.reader.self_written:
            self.guarded("fingerprint", _verify.refresh_own_writes, fingerprint, _observation.own)

    def _report(self, error: CheckpointGuardError) -> None:
        """Raise (or warn) a recompute's error, kept to explain torch's own error after it."""
        self.found.append((error.kind, error.details))
        _explain.report(error, self.options.on_mismatch, self.location())

    def _recompute_observed(self, args: tuple, kwargs: dict, resolved: _compat.Torch) -> Any:
        """The recompute of a region with state it updates, strict mode or report figures."""
        watched = self.guarded(
            "watch the side effects of", _side_effects.state_before_recompute, self.watch
        )
        if watched is None:
            return self.fn(*args, **kwargs)
        if self.scoped and self.strict_forward is not None:
            # the strict pass is already running around this call (see StrictScope), which
            # checks the recompute once it ends
            self.pending = watched
            return self._run(args, kwargs, resolved)
        strict = None
        if self.strict_forward is not None:
            strict = self.guarded(
                "compare the values of", _strict.StrictRecompute, self.strict_forward
            )
            if strict is None:
                return self.fn(*args, **kwargs)
        self.last_strict = strict
        try:
            if strict is None:
                out = self._run(args, kwargs, resolved)
            else:
                with _Guarded(self, "compare the values of", strict):
                    out = self._run(args, kwargs, resolved)
                if self.reentrant and not self.unguarded:
                    self.guarded("compare the values of", strict.record_outputs, out)
        except resolved.stop_recomputation_error:
            self._after_recompute(watched, strict, stopped=True)
            raise
        self._after_recompute(watched, strict, stopped=False)
        return out

    def _run(self, args: tuple, kwargs: dict, resolved: _compat.Torch) -> Any:
        """The user's function, as the recompute runs it; torch's CheckpointError from inside
        (a nested region's) explained."""
        state = _local.__dict__
        state["depth"] = state.get("depth", 0) + 1
        try:
            if self.stats is None:
                return self.fn(*args, **kwargs)
            return _report.Collector.timed_recompute(self.stats, self.fn, args, kwargs)
        except resolved.checkpoint_error as error:
            explained = self.explained(error)
            if explained is error:
                raise
            raise explained from error
        finally:
            state["depth"] -= 1

    def _after_recompute(self, watched: list, strict: Any, stopped: bool) -> None:
        self._refresh_own_writes()
        if not self.unguarded:
            self.guarded("check the recompute of", self._check_recompute, watched, strict, stopped)

    def _check_recompute(self, watched: list, strict: Any, stopped: bool) -> None:
        changed, statistics_only = _side_effects.updated_again(watched, self.name_module)
        if strict is not None:  # wrong values first: a side effect may be their cause
            found = strict.difference(stopped)
            mutated = _selective.take_mutations(self) if self.scoped else None
            if mutated:  # selective checkpointing's saved outputs changed in place: measured
                what, difference = found if found is not None else (None, None)
                first_op = strict.first_diverging_op() if found is not None else None
                error = _explain.selective_cache_measured(
                    self.name, mutated, what, difference, first_op, self.location()
                )
                if error is not None:
                    self._report(error)
            elif found is not None:
                what, difference = found
                self._report(
                    _explain.values_error(self.name, what, difference, strict.first_diverging_op())
                )
        if changed:
            _explain.side_effect(self.name, changed, statistics_only, self.location())

    def explained(self, error: BaseException) -> BaseException:
        """torch's CheckpointError explained from what the guard saw; torch's own error where
        the guard gave the region up or fails to explain it."""
        if isinstance(error, CheckpointGuardError) or self.unguarded:
            return error  # the guard's own, from inside; or torch's, as torch alone raises it
        explained = self.guarded("explain torch's error in", self.explain, error)
        return error if explained is None else explained

    def explain(self, error: BaseException) -> BaseException:
        strict = self.last_strict
        first_op = strict.first_diverging_op() if strict is not None else None
        return _explain.checkpoint_error_explained(self.name, str(error), self.found, first_op)


def _same(tensor: Any) -> Any:
    return tensor


class _Guarded:
    """A context of the guard's (a dispatch mode, strict mode's pass) around the user's
    function, entered and left inside the barrier: its failure gives the region up, and never
    replaces what the function itself returned or raised."""

    __slots__ = ("region", "stage", "context", "entered")

    def __init__(self, region: Region, stage: str, context: Any) -> None:
        self.region, self.stage, self.context = region, stage, context
        self.entered = False

    def __enter__(self) -> None:
        region = self.region
        if not region.unguarded:
            region.guarded(self.stage, self.context.__enter__)
            self.entered = not region.unguarded

    def __exit__(self, *exc: Any) -> None:
        if self.entered:
            self.entered = False
            self.region.guarded(self.stage, self.context.__exit__, *exc)


class StrictScope:
    """Strict mode's recompute pass entered around the user's recompute context (from
    ``context_fn``), so that the user's dispatch mode, e.g. selective checkpointing's, stays
    the innermost one the region's code sees; checks the recompute when the pass ends."""

    def __init__(self, region: Region, recompute_context: Any) -> None:
        self.region = region
        self.context = recompute_context
        self.strict: _strict.StrictRecompute | None = None
        self.scope: _Guarded | None = None

    def __enter__(self) -> Any:
        region = self.region
        if region.strict_forward is not None and not region.unguarded and region.forward_done:
            stage = "compare the values of"
            strict = region.guarded(stage, _strict.StrictRecompute, region.strict_forward)
            if strict is not None:
                self.strict = region.last_strict = strict
                region.pending = None
                self.scope = _Guarded(region, stage, strict)
                self.scope.__enter__()
        try:
            return self.context.__enter__()
        except BaseException:
            scope, self.scope = self.scope, None
            if scope is not None:
                scope.__exit__(*sys.exc_info())
            raise

    def __exit__(self, *exc: Any) -> Any:
        __tracebackhide__ = True  # a hook torch calls: pytest does not show it
        try:
            suppressed = self.context.__exit__(*exc)
        finally:
            scope, self.scope = self.scope, None
            if scope is not None:
                scope.__exit__(*exc)
        region = self.region
        strict, self.strict = self.strict, None
        watched, region.pending = region.pending, None
        stopped = exc[0] is not None and issubclass(
            exc[0], _compat.resolve().stop_recomputation_error
        )
        if strict is not None and watched is not None and (exc[0] is None or stopped):
            try:
                region._after_recompute(watched, strict, stopped)
            except CheckpointGuardError as error:
                _explain.raised_at_hook(error)
                raise
        return suppressed


def _scoped_context_fn(region: Region, context_fn: Any) -> Any:
    def context() -> tuple[Any, Any]:
        forward_context, recompute_context = context_fn()
        return forward_context, StrictScope(region, recompute_context)

    return context


# ---------------------------------------------------------------------------- the patches


def _skip(fn: Any) -> bool:
    """Regions the guard leaves to torch: guard off, its own regions, no grad (torch runs the
    function plainly), torch.compile tracing and regions it emitted, report mode pricing."""
    return (
        _options is None
        or type(fn) is Region
        or not torch.is_grad_enabled()
        or _compat.resolve().is_compiling()
        or (type(fn) is types.FunctionType and fn.__code__.co_filename.startswith(_COMPILER_DIRS))
        or (collector is not None and collector.measuring)
    )


def _guard_reentrant(original_apply: Any) -> Any:
    def apply(run_function: Any, preserve_rng_state: bool, *args: Any) -> Any:
        __tracebackhide__ = True  # a hook torch calls: pytest does not show it
        options = _options
        if options is None or _skip(run_function):
            return original_apply(run_function, preserve_rng_state, *args)
        region = Region(run_function, options, reentrant=True)
        region.guarded("prepare", region.prepare, preserve_rng_state)
        if region.unguarded:
            return original_apply(run_function, preserve_rng_state, *args)
        outputs = original_apply(region, preserve_rng_state, *args)
        try:
            region.finish_forward(args, {})
            region.check_lost_gradients(args)
            region.check_ddp(args)
        except CheckpointGuardError as error:
            _explain.raised_at_hook(error)
            raise
        return outputs

    return staticmethod(apply)


def _generator_call_reader(original: Any) -> Any:
    """How a generator receives (preserve_rng_state, user args, user kwargs).

    Up to torch 2.13 the user's arguments trail the options as ``*args, **kwargs``; 2.14's
    ``_checkpoint_without_reentrant_generator_impl(fn, args, kwargs, *, preserve_rng_state, ...)``
    takes them packed, with keyword-only options.
    """
    signature = inspect.signature(original)
    parameters = list(signature.parameters.values())
    if signature.parameters["args"].kind is not inspect.Parameter.VAR_POSITIONAL:

        def read_packed(fn: Any, args: tuple, kwargs: dict) -> tuple[bool, tuple, dict]:
            bound = signature.bind(fn, *args, **kwargs).arguments
            return bound.get("preserve_rng_state", True), bound["args"], bound["kwargs"]

        return read_packed
    leading = sum(1 for p in parameters if p.kind is p.POSITIONAL_OR_KEYWORD)

    def read_trailing(fn: Any, args: tuple, kwargs: dict) -> tuple[bool, tuple, dict]:
        preserve = args[0] if args else kwargs.get("preserve_rng_state", True)
        return preserve, args[leading - 1 :], kwargs

    return read_trailing


def _guard_generator(original: Any) -> Any:
    read_call = _generator_call_reader(original)
    signature = inspect.signature(original)
    noop_context = signature.parameters["context_fn"].default
    context_argument = _selective.ContextArgument(original)

    def prepare(region: Region, args: tuple, kwargs: dict) -> tuple[tuple, dict, tuple, dict]:
        """(the user's arguments, the generator's arguments as the guard hands them on)."""
        preserve, user_args, user_kwargs = read_call(region.fn, args, kwargs)
        region.prepare(preserve)
        context_fn = context_argument.get(args, kwargs)
        if context_fn is not noop_context:  # selective checkpointing's policy is watched
            region.context_fn = True
            watched = _selective.watched(region, context_fn)
            args, kwargs = context_argument.replace(args, kwargs, watched)
        if region.options.strict:
            args, kwargs = _scope_strict_recompute(signature, noop_context, region, args, kwargs)
        return user_args, user_kwargs, args, kwargs

    def generator(fn: Any, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # a hook torch calls: pytest does not show it
        options = _options
        if options is None or _skip(fn):
            return (yield from original(fn, *args, **kwargs))
        region = Region(fn, options, reentrant=False)
        prepared = region.guarded("prepare", prepare, region, args, kwargs)
        if prepared is None:
            return (yield from original(fn, *args, **kwargs))
        user_args, user_kwargs, args, kwargs = prepared
        inner = original(region, *args, **kwargs)
        first = next(inner)
        region.enter_forward()
        try:
            yield first
        except BaseException as exc:  # the forward failed: let torch unwind its contexts
            region.exit_forward(sys.exc_info())
            try:
                inner.throw(exc)
            except StopIteration:
                return
            raise
        region.exit_forward((None, None, None))
        try:
            # still inside torch's forward context (context_fn's first), as the recompute
            # runs inside its recompute context: both fingerprints see the same state
            region.finish_forward(user_args, user_kwargs)
        except CheckpointGuardError as error:
            _explain.raised_at_hook(error)
            raise
        finally:
            yield from inner  # torch's post-forward logic; it yields nothing more

    setattr(generator, "__wrapped__", original)  # noqa: B010 (a function's attribute)
    return generator


def _scope_strict_recompute(
    signature: inspect.Signature, noop_context: Any, region: Region, args: tuple, kwargs: dict
) -> tuple[tuple, dict]:
    """The generator's arguments with a ``context_fn`` whose recompute context enters strict
    mode's pass first (see ``StrictScope``); unchanged without a user context_fn or with
    ``debug``, which torch only accepts with its own."""
    bound = signature.bind(None, *args, **kwargs)
    context_fn = bound.arguments.get("context_fn", noop_context)
    if context_fn is noop_context or bound.arguments.get("debug"):
        return args, kwargs
    bound.arguments["context_fn"] = _scoped_context_fn(region, context_fn)
    region.scoped = True
    return bound.args[1:], bound.kwargs


def _guard_saved_tensor_check(original: Any, checkpoint_error: type[Exception]) -> Any:
    """torch raises CheckpointError after the recompute returned; explain it there too."""

    def check_recomputed_tensors_match(frame: Any, gid: Any) -> None:
        __tracebackhide__ = True  # a hook torch calls: pytest does not show it
        try:
            return original(frame, gid)
        except checkpoint_error as error:
            region = _region_of(frame)
            explained = error if region is None else region.explained(error)
            if explained is error:
                raise
            raise explained from error

    return check_recomputed_tensors_match


def _region_of(frame: Any) -> Region | None:
    """The region whose recompute a checkpoint frame runs: torch's ``recompute_fn`` closes
    over the ``fn`` the guarded generator handed it."""
    for cell in getattr(frame.recompute_fn, "__closure__", None) or ():
        try:
            contents = cell.cell_contents
        except ValueError:
            continue
        if type(contents) is Region:
            return contents
    return None


def _patch(owner: Any, attribute: str, replacement: Any) -> None:
    owned = attribute in vars(owner)
    _patches.append((owner, attribute, owned, vars(owner).get(attribute)))
    setattr(owner, attribute, replacement)


def _install_patches(resolved: _compat.Torch) -> None:
    function = resolved.checkpoint_function
    _patch(function, "apply", _guard_reentrant(function.apply))
    _patch(function, "backward", _ddp.guard_backward(function.backward, Region))
    for owner, name, original in resolved.generators:
        _patch(owner, name, _guard_generator(original))
    frame = resolved.checkpoint_frame
    check = frame.check_recomputed_tensors_match
    _patch(
        frame,
        "check_recomputed_tensors_match",
        _guard_saved_tensor_check(check, resolved.checkpoint_error),
    )


def install(options: Options) -> None:
    global _options, collector
    resolved = _compat.resolve()
    if not _patches:
        _install_patches(resolved)
    if options.report and collector is None:
        collector = _report.Collector()
    _options = options


def uninstall() -> None:
    global _options
    _options = None
    while _patches:
        owner, attribute, owned, original = _patches.pop()
        if owned:
            setattr(owner, attribute, original)
        else:
            delattr(owner, attribute)


def new_collector() -> _report.Collector:
    return _report.Collector()


def current_options() -> Options | None:
    return _options
