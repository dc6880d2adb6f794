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
(``_verify.capture``); each recompute is verified, watched and judged by ``_recompute``.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
import threading
import types
import weakref
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

import torch

from ckptguard import (
    _compat,
    _ddp,
    _explain,
    _hooks,
    _names,
    _readplan,
    _recompute,
    _report,
    _rng,
    _selective,
    _side_effects,
    _strict,
    _verify,
)
from ckptguard._barrier import stage
from ckptguard._fingerprint import nested_tensors
from ckptguard.errors import CheckpointGuardError


@dataclass(frozen=True)
class Options:
    strict: bool = False
    on_mismatch: str = "raise"
    report: bool = False
    on_lost_gradients: str = "warn"


_options: Options | None = None
collector: _report.Collector | None = None  # report mode's figures, kept after disable()
_patches: list[tuple[Any, str, bool, Any]] = []  # (owner, attribute, owned it, original)
_local = threading.local()  # the observers of a function region's forward, per thread


_NO_MODULES: frozenset[int] = frozenset()
_NO_HOOKS: frozenset = frozenset()
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

    __slots__ = ("modules", "before", "observing", "failure", "hooks")

    def __init__(self, hooks: _hooks.HookWatch | None = None) -> None:
        self.modules: dict[int, torch.nn.Module] = {}
        self.before: dict[int, tuple] = {}
        self.observing = False
        self.failure: Exception | None = None
        self.hooks = hooks  # a function region's: the forward hooks of the modules it runs

    def see(self, module: torch.nn.Module) -> None:
        key = id(module)
        if key in self.modules:
            return
        self.modules[key] = module
        if self.failure is not None:
            return
        try:
            before = _side_effects.state_before(module)
            if self.hooks is not None and _hooks.has_forward_hooks(module):
                self.hooks.watch_module(module, pre_hooks=False)  # torch has read those
        except Exception as error:  # runs inside the user's forward: reported once it returns
            self.failure = error  # See NOTE [ The guard never stops training ]
            return
        if before is not None:
            self.before[key] = before


# ------------------------------------------------------------------------------- a region


class Region:
    """One checkpoint call: its forward's fingerprint, verified whenever torch recomputes it.

    Holds the user's function and the modules its fingerprint read, as torch's graph holds
    the region: it lives as long as that graph does. The model is only weakly referenced.
    Each stage of the guard's work on it runs inside the barrier (``_barrier.stage``)."""

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
        "hooks",
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
        self.opened: list | None = None  # the guard's contexts open around the user's code
        # a module region's reader, found before its forward, read through after it
        self.tree: _verify.RegionReader | None = None
        self.hooks: _hooks.HookWatch | None = None  # the forward's hooks, while it runs
        self._name: str | None = None

    @stage("prepare")
    def prepare(self, preserve: bool) -> None:
        """Before the forward: take the callable apart, note the RNG states."""
        self.preserve = preserve
        self.binding = binding = _verify.bind(self.fn)
        self.target = binding.module
        if preserve:
            self.rng_before = _rng.snapshot()
        else:
            self.random_ops = _rng.RandomOps()

    def give_up(self, stage: str, error: Exception) -> None:
        """The region runs on unguarded: what the guard opened is closed, and one warning says
        so. See NOTE [ The guard never stops training ] in ``_barrier``"""
        first = not self.unguarded
        self.unguarded = self.forward_done = True
        self.random_ops = self.strict_forward = self.fingerprint = None
        observer, self.observer = self.observer, None
        if observer is not None:
            _observation.stop(observer)
        opened, self.opened = self.opened, None
        while opened:  # entered before the failure, around user code still running
            with contextlib.suppress(Exception):  # the failure is being reported already
                opened.pop().__exit__(None, None, None)
        if first:
            _explain.internal_error(self.name, stage, error)

    def report(self, error: CheckpointGuardError) -> None:
        """Raise (or warn) a recompute's error, kept to explain torch's own error after it."""
        self.found.append((error.kind, error.details))
        _explain.report(error, self.options.on_mismatch, self.location())

    def mismatch(
        self, found: _verify.Found, args: tuple, kwargs: dict
    ) -> CheckpointGuardError | None:
        """The error for what a recompute's comparison found (None: nothing its code reads)."""
        fingerprint = self.fingerprint
        assert fingerprint is not None, "compared with the forward's fingerprint"
        return _explain.mismatch(
            self.name, found, fingerprint, self.binding, args, kwargs, self.name_module
        )

    @staticmethod
    def own_hooks() -> frozenset:
        """The global hooks that are the guard's own (a function region's observer)."""
        return _observation.own

    # names ------------------------------------------------------------------------------

    def found_root(self) -> torch.nn.Module | None:
        """The model found on the stack at the forward, if it still lives."""
        return self.root() if self.root is not None else None

    def name_module(self, module: torch.nn.Module) -> str:
        root = self.found_root()
        if root is None and self.modules:
            root = self.modules[0]
        path = _names.module_path(root, module)
        if self.root is None and root is not None and path:
            return f"{_names.class_name(root)}.{path}"
        return path if path else _names.class_name(module)

    @property
    def name(self) -> str:
        """The region as messages name it; its function alone where naming reads state that
        fails (a message must not fail)."""
        if self._name is None:
            fingerprint = self.fingerprint
            try:  # the code as it was at the forward
                code = fingerprint.code if fingerprint is not None else self.binding.code
                self._name = _names.region_name(self.fn, self.found_root(), self.modules, code)
            except Exception:
                return _names.function_label(self.fn)
        return self._name

    def location(self) -> tuple[str, int] | None:
        """Where the region's function is defined: a warning's place when no user frame is
        on the stack (a backward run by an accelerator's worker thread)."""
        function = self.binding.function
        if function is None:
            return None
        return function.__code__.co_filename, function.__code__.co_firstlineno

    # forward ----------------------------------------------------------------------------

    @stage("prepare")
    def enter_forward(self) -> None:
        """Before the forward, only what cannot wait: a function region watches which modules
        it runs; a module region notes the state of its modules that hold buffers or assign
        attributes (known from its tree's reader); the forward hooks that can run are watched
        (``_hooks``); strict mode starts its record of the forward."""
        if _compat.fsdp2_in_use():
            self.loose = _compat.fsdp2_managed_modules()
        # what is entered here is left by exit_forward, or by give_up should a stage fail
        opened = self.opened = []
        if self.target is None:
            self.hooks = _hooks.HookWatch()
            opened.append(self.hooks)
            observer = Observer(self.hooks)
            _observation.start(observer)
            self.observer = observer
        else:
            stateful, self.tree = _verify.stateful_modules(
                self.target, self.binding, self.reentrant, self.loose
            )
            hooked = _hooks.hooked_modules(self.tree)
            if hooked:
                self.hooks = _hooks.HookWatch()
                opened.append(self.hooks)
                for module in hooked:
                    self.hooks.watch_module(module)
            if stateful:
                self.observer = observer = Observer()
                for module in stateful:
                    observer.see(module)
        own = _observation.own
        if _hooks.has_global_forward_hooks(own):
            if self.hooks is None:
                self.hooks = _hooks.HookWatch()
                opened.append(self.hooks)
            self.hooks.watch_globals(own)
        if self.options.strict:
            compiled = self.binding.torch_compiled or bool(self.tree and self.tree.torch_compiled)
            self.strict_forward = _strict.StrictForward(self.reentrant, compiled)
        for context in (self.random_ops, self.strict_forward):
            if context is not None:
                context.__enter__()
                opened.append(context)

    @stage("record the forward of")
    def exit_forward(self, exc: tuple) -> None:
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

    @stage("fingerprint")
    def finish_forward(self, args: tuple, kwargs: dict) -> None:
        """Right after the forward: fingerprint what it reached, check RNG, count it.
        See NOTE [ Read twice ] in ``_verify``"""
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
            self.hooks.inert() if self.hooks is not None else _NO_HOOKS,
            self.tree,
        )
        self.tree = self.hooks = None
        self.modules = modules = fingerprint.modules
        self.root = _names.root_ref(modules[0]) if modules else None
        if fingerprint.iterators:  # the recompute will draw their next values
            advanced = _explain.advanced_iterators_of(fingerprint, self.name_module)
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
        if collector is not None and self.options.report and not _recompute.running():
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

    @stage("check the gradients of")
    def check_lost_gradients(self, args: tuple) -> None:
        """Reentrant only: with no positional tensor that requires grad, the region's output
        requires none, so its parameters and the tensors nested in its container arguments
        get no gradient. (With one, the recompute's own backward reaches nested tensors.)"""
        if any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            return
        parameters = [
            f"{self.name_module(module)}.{name}"
            for module in self.modules
            for name, p in module._parameters.items()
            if p is not None and p.requires_grad
        ]
        nested = [
            f"positional argument {index}{path}"
            for index, arg in enumerate(args)
            if not isinstance(arg, torch.Tensor)
            for path, tensor in nested_tensors(arg)
            if tensor.requires_grad
        ]
        if parameters or nested:
            root = self.found_root()
            fix = "enable_input_require_grads"  # transformers' and PEFT's models have it
            found = _readplan.attribute_of(root, fix) if root is not None else None
            model_fix = fix if callable(found) else None
            _explain.lost_gradients(
                self.name,
                list(dict.fromkeys(parameters)),
                nested,
                args,
                model_fix,
                self.options.on_lost_gradients == "raise",
                self.location(),
            )

    @stage("check the DistributedDataParallel step of")
    def check_ddp(self, args: tuple) -> None:
        """Reentrant only: parameters whose gradient two backward passes of the running
        DistributedDataParallel step would produce (see ``_ddp``)."""
        ddp = _compat.active_ddp()
        if ddp is not None:
            _ddp.reentrant_forward(self, ddp, args)

    @stage("record the forward of")
    def _record_outputs(self, out: Any) -> None:
        assert self.strict_forward is not None, "strict mode"
        self.strict_forward.record_outputs(out)

    # the calls torch makes ----------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # a hook torch calls: pytest does not show it
        if self.unguarded:
            return self.fn(*args, **kwargs)
        if self.forward_done and _options is not None:
            try:
                return _recompute.recompute(self, args, kwargs)
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
                self._record_outputs(out)
            return out
        return self.fn(*args, **kwargs)


def _same(tensor: Any) -> Any:
    return tensor


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
        region.prepare(preserve_rng_state)
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

    @stage("prepare")
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
        prepared = prepare(region, args, kwargs)
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
    mode's pass first (see ``_recompute.StrictScope``); unchanged without a user context_fn or with
    ``debug``, which torch only accepts with its own."""
    bound = signature.bind(None, *args, **kwargs)
    context_fn = bound.arguments.get("context_fn", noop_context)
    if context_fn is noop_context or bound.arguments.get("debug"):
        return args, kwargs
    bound.arguments["context_fn"] = _recompute.scoped_context_fn(region, context_fn)
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
            explained = error if region is None else _recompute.explained(region, error)
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
