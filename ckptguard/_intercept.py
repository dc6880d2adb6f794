"""Where ckptguard hooks into torch.utils.checkpoint.

``checkpoint`` itself is never replaced (references bound earlier, e.g. ``partial(checkpoint,
...)`` or ``checkpoint_wrapper``, would escape, and torch.compile recognises it by identity).
Instead ckptguard wraps the two places every path goes through:

* reentrant: ``CheckpointFunction.apply`` (outer grad mode is still visible there; inside
  ``forward`` it is always off). The user's function is handed to torch wrapped in a
  ``RegionGuard``, which torch stores as ``ctx.run_function`` and calls again to recompute.
* non-reentrant: ``_checkpoint_without_reentrant_generator`` (``..._impl`` from 2.14, and
  the copy the composable ``checkpoint(module)`` API imported). Torch runs the forward itself
  and calls the generator's ``fn`` only to recompute, so the generator gets a ``RegionGuard``.

The fingerprint is taken right after the forward and verified at the start of each recompute,
before any user code runs (an early-stopped recompute never reaches the function's end).
"""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
import warnings
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import checkpoint as torch_checkpoint

from ckptguard import _report, _rng, _strict
from ckptguard._fingerprint import Label, ModuleSegment, collect_segments, input_fp
from ckptguard._verify import build_error, describe_region, first_difference, report
from ckptguard.errors import CheckpointGuardWarning, CheckpointMismatchError

_GENERATOR_NAMES = (
    "_checkpoint_without_reentrant_generator",
    "_checkpoint_without_reentrant_generator_impl",
)
_COMPOSABLE_MODULE = "torch.distributed._composable.checkpoint_activation"


@dataclass(frozen=True)
class Options:
    strict: bool = False
    on_mismatch: str = "raise"
    report: bool = False


_options: Options | None = None
collector: _report.Collector | None = None  # report mode's figures, kept after disable()
_patches: list[tuple[Any, str, bool, Any]] = []  # (owner, attribute, owned it, original)


_COMPILER_DIRS = tuple(
    os.path.join(os.path.dirname(torch.__file__), name) + os.sep
    for name in ("_higher_order_ops", "_dynamo", "_functorch", "_inductor")
)


def _is_compiling() -> bool:
    compiler = getattr(torch, "compiler", None)
    return bool(compiler is not None and compiler.is_compiling())


def _measuring() -> bool:
    return collector is not None and collector.measuring


def _is_compiled_region(fn: Any) -> bool:
    """A region torch.compile emitted (tag_activation_checkpoint): torch owns its RNG handling."""
    code = getattr(fn, "__code__", None)
    return code is not None and code.co_filename.startswith(_COMPILER_DIRS)


class RegionGuard:
    """One checkpoint call: its forward fingerprint, verified whenever torch recomputes it."""

    __slots__ = (
        "fn",
        "segments",
        "values",
        "inputs",
        "on_mismatch",
        "strict",
        "signatures",
        "stats",
        "__weakref__",
    )

    def __init__(self, fn: Any, options: Options):
        self.fn = fn
        self.segments = collect_segments(fn)
        self.values: list | None = None
        self.inputs: list = []
        self.on_mismatch = options.on_mismatch
        self.strict = options.strict
        self.signatures: list | None = None  # strict mode: per-op signatures of the forward
        self.stats: _report.RegionStats | None = None  # report mode: this region's figures

    def capture(self, args: tuple) -> None:
        self.values = [segment.read() for segment in self.segments]
        self.inputs = [(weakref.ref(a), input_fp(a)) for a in args if isinstance(a, torch.Tensor)]

    def verify(self, args: tuple) -> None:
        for segment, old in zip(self.segments, self.values, strict=True):
            new = segment.read()
            if new != old:
                index = first_difference(old, new)
                label = segment.labels[min(index, len(segment.labels) - 1)]
                old_value = old[index] if index < len(old) else None
                new_value = new[index] if index < len(new) else None
                self._mismatch(label, old_value, new_value)
                return
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        for index, (tensor, (ref, old)) in enumerate(zip(tensors, self.inputs, strict=False)):
            # nested and reentrant recomputes get new input objects: only the same object
            # is comparable, and torch checks versions of the tensors it saved itself
            if ref() is tensor and input_fp(tensor) != old:
                label = Label("tensor", f"input tensor #{index}", "argument of the region")
                self._mismatch(label, old, input_fp(tensor))
                return

    def _mismatch(self, label: Label, old: Any, new: Any) -> None:
        report(build_error(describe_region(self.fn), label, old, new), self.on_mismatch)

    def parameters_without_gradients(self) -> list[str]:
        names = []
        for segment in self.segments:
            if isinstance(segment, ModuleSegment):
                plan = segment.plan
                for path, entry in zip(plan.paths, plan.entries, strict=True):
                    for name, param in entry.module._parameters.items():
                        if param is not None and param.requires_grad:
                            names.append(f"{path}.{name}")
        return names

    def recorder(self) -> Any:
        """Context that records the forward's op signatures in strict mode (else a no-op)."""
        if not self.strict:
            return contextlib.nullcontext()
        recorder = _strict.ForwardRecorder()
        self.signatures = recorder.signatures
        return recorder

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.values is None:  # the reentrant forward (torch calls run_function first)
            with self.recorder():
                return self.fn(*args, **kwargs)
        if _options is None:
            return self.fn(*args, **kwargs)
        self.verify(args)
        if self.signatures is None:
            return self._recompute(args, kwargs)
        checker = _strict.RecomputeChecker(
            self.signatures, describe_region(self.fn), self.on_mismatch
        )
        with checker:
            return self._recompute(args, kwargs)

    def _recompute(self, args: tuple, kwargs: dict) -> Any:
        if self.stats is None:
            return self.fn(*args, **kwargs)
        return _report.Collector.timed_recompute(self.stats, self.fn, args, kwargs)

    def count_forward(self, args: tuple, kwargs: dict) -> None:
        """Report mode: count this call and price its region the first time it is seen."""
        if collector is not None and _options is not None and _options.report:
            self.stats = collector.on_forward(describe_region(self.fn), self.fn, args, kwargs)


def _check_rng(region: RegionGuard, before: Any, preserve: bool, args: tuple) -> None:
    devices = _rng.consumed_unstashed(before, preserve, args)
    if not devices:
        return
    where = ", ".join(devices)
    reason = (
        "preserve_rng_state=False, so torch restores no RNG state"
        if not preserve
        else "torch stashes the RNG state only for CPU and for the devices of tensor positional "
        "arguments"
    )
    error = CheckpointMismatchError(
        f"ckptguard [rng_device]: checkpointed region {describe_region(region.fn)} drew random "
        f"numbers on {where} during its forward, but {reason}; the recompute will draw different "
        f"numbers there and its gradients will not match the forward.\n"
        f"  how to fix: pass a tensor on each of these devices as a positional argument of "
        f"checkpoint, keep preserve_rng_state=True, or draw the random numbers outside the "
        f"region and pass them in.",
        kind="rng_device",
        region=describe_region(region.fn),
        details={"devices": devices, "preserve_rng_state": preserve},
    )
    report(error, region.on_mismatch)


def _guard_reentrant(original_apply: Any) -> Any:
    def apply(run_function: Any, preserve_rng_state: bool, *args: Any) -> Any:
        options = _options
        if (
            options is None
            or not torch.is_grad_enabled()
            or isinstance(run_function, RegionGuard)
            or _is_compiling()
            or _measuring()
        ):
            return original_apply(run_function, preserve_rng_state, *args)
        region = RegionGuard(run_function, options)
        region.count_forward(args, {})
        if not any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            _warn_no_input_requires_grad(region)
        before = _rng.snapshot(preserve_rng_state)
        outputs = original_apply(region, preserve_rng_state, *args)
        region.capture(args)
        _check_rng(region, before, preserve_rng_state, args)
        return outputs

    return staticmethod(apply)


def _warn_no_input_requires_grad(region: RegionGuard) -> None:
    names = region.parameters_without_gradients()
    if not names:
        return
    shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
    warnings.warn(
        f"ckptguard: checkpoint(use_reentrant=True) region {describe_region(region.fn)} has no "
        f"input that requires grad, so these parameters will get no gradient: {shown}. Use "
        f"use_reentrant=False, or pass an input that requires grad.",
        CheckpointGuardWarning,
        stacklevel=4,
    )


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

    def generator(fn: Any, *args: Any, **kwargs: Any) -> Any:
        options = _options
        if (
            options is None
            or isinstance(fn, RegionGuard)
            or not torch.is_grad_enabled()
            or _is_compiling()
            or _is_compiled_region(fn)
            or _measuring()
        ):
            return (yield from original(fn, *args, **kwargs))
        preserve, user_args, user_kwargs = read_call(fn, args, kwargs)
        region = RegionGuard(fn, options)
        region.count_forward(user_args, user_kwargs)
        before = _rng.snapshot(preserve)
        inner = original(region, *args, **kwargs)
        first = next(inner)
        try:
            with region.recorder():
                yield first
        except BaseException as exc:  # the forward failed: let torch unwind its contexts
            try:
                inner.throw(exc)
            except StopIteration:
                return
            raise
        yield from inner  # torch's post-forward logic; it yields nothing more
        region.capture(user_args)
        _check_rng(region, before, preserve, user_args)

    generator.__wrapped__ = original
    return generator


def _patch(owner: Any, attribute: str, replacement: Any) -> None:
    owned = attribute in vars(owner)
    _patches.append((owner, attribute, owned, vars(owner).get(attribute)))
    setattr(owner, attribute, replacement)


def _install_patches() -> None:
    _patch(
        torch_checkpoint.CheckpointFunction,
        "apply",
        _guard_reentrant(torch_checkpoint.CheckpointFunction.apply),
    )
    for name in _GENERATOR_NAMES:
        original = getattr(torch_checkpoint, name, None)
        if original is not None:
            _patch(torch_checkpoint, name, _guard_generator(original))
    if torch.distributed.is_available():
        try:
            __import__(_COMPOSABLE_MODULE)
        except ImportError:
            return
        composable = sys.modules[_COMPOSABLE_MODULE]
        for name in _GENERATOR_NAMES:
            original = getattr(composable, name, None)
            if original is not None:
                _patch(composable, name, _guard_generator(original))


def install(options: Options) -> None:
    global _options, collector
    if not _patches:
        _install_patches()
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
