"""Whether a recompute computes differently because a process-wide torch setting changed.

torch's checkpoint does not restore settings such as the default dtype or the float32 matmul
precision for the recompute, but a changed setting only matters where the recompute runs an op
that consults it on the region's devices, and where that op's result then differs: on a CPU,
``set_float32_matmul_precision("medium")`` changes a large float32 matmul (oneDNN computes it
in bfloat16 where the CPU has AMX) but not a 4x6 one, and no CUDA flag changes a CPU op
(``benchmarks/torch_settings.py`` measures each setting on this machine's devices). So the
recompute is watched (only when a setting changed, so a clean step pays nothing) and each op a
setting can steer is judged by evidence:

* the default dtype: an op that makes a floating-point tensor of the new default dtype with
  no floating-point tensor among its inputs and no explicit dtype (``torch.randn(n)``,
  ``torch.linspace``, ``torch.tensor(0.5)``, an integer tensor divided): its result follows
  the setting, so the recompute computes differently (certain);
* a setting read inside an op's kernel (matmul precision, TF32, oneDNN and cuDNN flags,
  deterministic algorithms): the op is run again, twice, on the same inputs with the settings
  put back as the forward had them, and its result compared bitwise (two runs that differ from
  each other show a nondeterministic kernel: no evidence). An op that cannot be run again
  without changing something (an in-place op, one drawing random numbers) gives no evidence
  either way: the recompute *may* differ; an op returning memory it did not write (``empty``)
  is judged only against ``fill_uninitialized_memory`` (may);
* the scaled-dot-product-attention backends, chosen before any op runs: the attention call is
  run again, without gradients, under the forward's backend flags and under the current ones
  (with dropout it may differ);
* the default device of a reentrant region: a factory with no tensor among its inputs may
  have made its tensor elsewhere.

A result that differs is certain evidence only where backward uses it (``_divergence``: a
Linear's backward uses its input and weight, not its output, so a recomputed Linear output that
differs leaves the gradients as they are). Nothing found: the recompute gives backward what the
forward did, and nothing is reported. A verdict of *may* is a warning unless strict mode was
asked for (``_recompute``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from ckptguard._compat import (
    CPU_FP16_REDUCTION,
    MATH_SDP_REDUCTION,
    MKLDNN_DETERMINISTIC,
    NNPACK,
    SDP_FA3,
    SDP_OVERRIDEABLE,
    SDP_PRIORITY,
    TorchFunctionMode,
    setting_switches,
    tree_leaves,
)
from ckptguard._divergence import Cause, Divergence, OpJudge, draws_random_numbers, same
from ckptguard._strict import _user_frame

_MATMUL_OPS = ("mm", "matmul", "linear", "conv", "dot", "mv", "baddbmm", "addbmm", "einsum")
# the op family each setting steers inside a kernel (matched against the op's name), None:
# every op; () for a setting no op's result depends on (warn_only only turns an error about a
# nondeterministic op into a warning)
_FAMILIES: dict[str, tuple[str, ...] | None] = {
    "torch.get_float32_matmul_precision()": _MATMUL_OPS + ("scaled_dot_product",),
    "torch.backends.mkldnn.enabled": _MATMUL_OPS + ("mkldnn", "batch_norm", "pool"),
    "torch.backends.cuda.matmul.allow_tf32": _MATMUL_OPS,
    "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction": _MATMUL_OPS,
    "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction": _MATMUL_OPS,
    "torch.backends.cudnn.enabled": _MATMUL_OPS + ("cudnn", "batch_norm", "rnn", "lstm", "gru"),
    "torch.backends.cudnn.deterministic": _MATMUL_OPS + ("cudnn",),
    "torch.backends.cudnn.benchmark": _MATMUL_OPS + ("cudnn",),
    "torch.backends.cudnn.allow_tf32": _MATMUL_OPS + ("cudnn",),
    "torch.are_deterministic_algorithms_enabled()": None,
    "torch.is_deterministic_algorithms_warn_only_enabled()": (),
    "torch.utils.deterministic.fill_uninitialized_memory": ("empty",),
    CPU_FP16_REDUCTION: _MATMUL_OPS,
    MKLDNN_DETERMINISTIC: _MATMUL_OPS + ("mkldnn",),
    NNPACK: ("conv",),
}
# settings that choose the attention backend before any op runs (judged by the call)
_ATTENTION_BACKENDS = frozenset(
    {
        "torch.backends.cuda.flash_sdp_enabled()",
        "torch.backends.cuda.mem_efficient_sdp_enabled()",
        "torch.backends.cuda.math_sdp_enabled()",
        "torch.backends.cuda.cudnn_sdp_enabled()",
        SDP_PRIORITY,
        SDP_OVERRIDEABLE,
        SDP_FA3,
        MATH_SDP_REDUCTION,
    }
)
_FILL = "torch.utils.deterministic.fill_uninitialized_memory"
# ops that return memory they did not write (what fill_uninitialized_memory fills)
_UNINITIALISED = frozenset(
    {"empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided", "empty_permuted"}
)
DEFAULT_DTYPE = "torch.get_default_dtype()"
DEFAULT_DEVICE = "torch.get_default_device()"
_ATTENTION = torch.nn.functional.scaled_dot_product_attention


def _floating_input(args: Any, kwargs: Any) -> bool:
    return any(
        isinstance(leaf, torch.Tensor) and leaf.is_floating_point()
        for leaf in tree_leaves((args, kwargs))
    )


class _Verdicts:
    """The first setting the recompute certainly depends on, else the first it may."""

    def __init__(self) -> None:
        self.certain: tuple[str, str] | None = None  # (setting, evidence)
        self.possible: tuple[str, str] | None = None

    def found(self, setting: str, evidence: str, certain: bool) -> None:
        if certain:
            if self.certain is None:
                self.certain = (setting, evidence)
        elif self.possible is None:
            self.possible = (setting, evidence)


class SettingsWatch:
    """Watches a recompute for ops whose result depends on the settings that changed (a
    dispatch mode for ops, a function mode for the attention backend's choice); ``verdict``
    gives the first setting the recompute depends on (certainly, else possibly)."""

    def __init__(self, changes: list[tuple[str, Any, Any]]) -> None:
        self.changes = changes
        self.verdicts = _Verdicts()
        self.default_dtype = torch.get_default_dtype()
        switches = setting_switches()
        names = [name for name, _, _ in changes]
        # settings an op's kernel reads, put back as the forward had them to run it again
        self.in_kernels = [
            (name, old, switches.get(name))
            for name, old, _ in changes
            if name not in _ATTENTION_BACKENDS and name not in (DEFAULT_DTYPE, DEFAULT_DEVICE)
        ]
        self.backends = [
            (name, old, switches.get(name))
            for name, old, _ in changes
            if name in _ATTENTION_BACKENDS
        ]
        self.watches_dtype = DEFAULT_DTYPE in names
        self.watches_device = DEFAULT_DEVICE in names
        self.ops = OpJudge(self)
        self.calls = _CallWatch(self) if self.backends else None
        self.rerunning = False  # ops of a run made to compare are not the recompute's
        self.divergence = Divergence(self._saved)  # what a changed setting made differ
        self.failure: Exception | None = None  # reported by the region once the recompute ran

    def _saved(self, cause: Cause) -> None:
        setting, evidence, _ = cause
        self.verdicts.found(setting, f"{evidence}, and backward uses it", True)

    def __enter__(self) -> SettingsWatch:
        self.divergence.__enter__()
        if self.calls is not None:
            self.calls.__enter__()
        self.ops.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.ops.__exit__(*exc)
        if self.calls is not None:
            self.calls.__exit__(*exc)
        self.divergence.__exit__(*exc)

    def look(self, func: Any, args: Any, kwargs: Any, out: Any) -> None:
        """One op the recompute ran, judged against the settings read inside kernels."""
        watch = self
        inherited = watch.divergence.consumed(args, kwargs)
        if inherited is not None:  # computed from a tensor that differs: differs too
            watch.divergence.differs(out, inherited)
            return
        name = func._schema.name.split("::")[-1]
        if watch.watches_dtype:
            made = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
            fresh = name.startswith("lift_fresh")  # torch.tensor(0.5): made from data
            if (
                kwargs.get("dtype") is None
                and any(t.dtype is watch.default_dtype for t in made)
                and (fresh or not _floating_input(args, kwargs))
            ):
                what = f"{func} {_where()}, which made a {watch.default_dtype} tensor from "
                watch.differs(out, DEFAULT_DTYPE, what + "the default dtype")
                return
        if watch.watches_device and not any(
            isinstance(a, torch.Tensor) for a in tree_leaves(args)
        ):  # a factory: the default device may have placed it
            watch.verdicts.found(DEFAULT_DEVICE, f"{func} {_where()}", False)
        steered = [s for s in watch.in_kernels if _in_family(s[0], name)]
        if not steered:
            return
        if name in _UNINITIALISED:  # its contents are unspecified under any setting
            if any(setting == _FILL for setting, _, _ in steered):
                watch.verdicts.found(_FILL, f"{func} {_where()}", False)
            return
        if any(switch is None for _, _, switch in steered) or not _runs_again(func, args, kwargs):
            watch.verdicts.found(steered[0][0], f"{func} {_where()}", False)
            return
        try:
            with watch.as_forward(steered):
                again, twice = func(*args, **kwargs), func(*args, **kwargs)
        except RuntimeError:  # e.g. no deterministic implementation under the other flag
            watch.verdicts.found(steered[0][0], f"{func} {_where()}", False)
            return
        if not same(again, twice):  # a nondeterministic kernel: no evidence either way
            watch.verdicts.found(steered[0][0], f"{func} {_where()}", False)
        elif not same(out, again):
            setting = _culprit(watch, steered, func, args, kwargs, out)
            evidence = f"{func} {_where()}, whose result under the forward's setting differs"
            watch.differs(out, setting, evidence)

    def decided(self) -> bool:
        """Whether a certain verdict was reached: no op needs judging any more."""
        return self.verdicts.certain is not None

    def differs(self, out: Any, setting: str, evidence: str) -> None:
        """``out`` differs from what the forward computed, because of ``setting``."""
        self.divergence.differs(out, (setting, evidence, True))

    @contextlib.contextmanager
    def as_forward(self, settings: list[tuple[str, Any, Any]]) -> Iterator[None]:
        """The given settings put back to the forward's values, then restored."""
        current = [(switch, switch.state()) for _, _, switch in settings]
        self.rerunning = True
        try:
            for _, old, switch in settings:
                switch.put(old)
            yield
        finally:
            for switch, state in reversed(current):
                switch.restore(state)
            self.rerunning = False

    def verdict(self) -> tuple[str, Any, Any, str, bool] | None:
        """(setting, forward's value, now, evidence, certain) or None."""
        found = self.verdicts.certain or self.verdicts.possible
        if found is None:
            return None
        setting, evidence = found
        old, new = next((o, n) for s, o, n in self.changes if s == setting)
        return setting, old, new, evidence, found is self.verdicts.certain


def _culprit(
    watch: SettingsWatch, steered: list, func: Any, args: Any, kwargs: Any, out: Any
) -> str:
    """Of the changed settings, the first that alone changes the op's result."""
    if len(steered) == 1:
        return steered[0][0]
    for setting in steered:
        with watch.as_forward([setting]):
            if not same(out, func(*args, **kwargs)):
                return setting[0]
    return steered[0][0]


def _in_family(setting: str, name: str) -> bool:
    family = _FAMILIES.get(setting)
    return family is None or any(part in name for part in family)


def _runs_again(func: Any, args: tuple, kwargs: dict) -> bool:
    """Whether running the op once more changes nothing: no input written, no random
    numbers drawn."""
    return not func._schema.is_mutable and not draws_random_numbers(func, args, kwargs)


class _CallWatch(TorchFunctionMode):
    """Attention calls, whose backend is chosen before any op runs: run again without
    gradients under the forward's backend flags and under the current ones."""

    def __init__(self, watch: SettingsWatch) -> None:
        super().__init__()
        self.watch = watch

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        watch = self.watch
        differs = None
        if (
            func is _ATTENTION
            and not watch.rerunning
            and watch.verdicts.certain is None
            and watch.failure is None
        ):
            try:
                differs = self._judge(args, kwargs)
            except Exception as error:  # inside the user's function: must not raise there
                watch.failure = error  # See NOTE [ The guard never stops training ]
        out = func(*args, **kwargs)
        if differs is not None:
            watch.differs(out, *differs)
        return out

    def _judge(self, args: Any, kwargs: Any) -> tuple[str, str] | None:
        """(setting, evidence) where the call's result differs under the forward's flags."""
        watch = self.watch
        setting = watch.backends[0][0]
        dropout = kwargs.get("dropout_p", args[4] if len(args) > 4 else 0.0)
        if dropout or any(switch is None for _, _, switch in watch.backends):
            watch.verdicts.found(setting, f"{_ATTENTION.__name__} {_where()}", False)
            return None
        with torch.no_grad():
            watch.rerunning = True
            try:
                now = _ATTENTION(*args, **kwargs)
            finally:
                watch.rerunning = False
            with watch.as_forward(watch.backends):
                then = _ATTENTION(*args, **kwargs)
        if same(now, then):
            return None
        where = f"{_ATTENTION.__name__} {_where()}"
        return setting, f"{where}, whose result under the forward's attention backends differs"


def _where() -> str:
    frame = _user_frame()
    return f"(called at {frame[0]}:{frame[1]})" if frame is not None else "(in library code)"
