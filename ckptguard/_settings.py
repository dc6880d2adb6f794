"""Whether a recompute depends on a process-wide torch setting that changed since its forward.

torch's checkpoint does not restore settings such as the default dtype for the recompute, but
a changed setting only matters if the recompute runs something that reads it. A dispatch mode
watches the recompute (only when a setting changed, so a clean step pays nothing) for:

* the default dtype: an op that makes a floating-point tensor of the new default dtype with
  no floating-point tensor among its inputs and no explicit dtype (``torch.randn(n)``,
  ``torch.linspace``, ``torch.tensor(0.5)``, an integer tensor divided): its result follows
  the setting, so the recompute computes differently (certain);
* any other setting: an op of the family it can steer (matmul and convolution kernels for
  matmul precision, TF32, oneDNN and cuDNN flags; attention kernels for the SDPA backends;
  factories for the default device; any op for the determinism flags): whether its result
  changes depends on the backend and the kernel chosen, so the gradients may change.

Nothing of either kind: the recompute computes what the forward did, and nothing is reported.
"""

from __future__ import annotations

from typing import Any

import torch

from ckptguard._compat import TorchDispatchMode, tree_leaves
from ckptguard._strict import _user_frame

_MATMUL_OPS = ("mm", "matmul", "linear", "conv", "dot", "mv", "baddbmm", "addbmm", "einsum")
_ATTENTION_OPS = ("scaled_dot_product", "flash_attention", "efficient_attention", "cudnn_attn")
# the op family each setting steers (matched against the op's name), None: every op
_FAMILIES: dict[str, tuple[str, ...] | None] = {
    "torch.get_float32_matmul_precision()": _MATMUL_OPS,
    "torch.backends.mkldnn.enabled": _MATMUL_OPS + ("mkldnn", "batch_norm", "pool"),
    "torch.backends.cuda.matmul.allow_tf32": _MATMUL_OPS,
    "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction": _MATMUL_OPS,
    "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction": _MATMUL_OPS,
    "torch.backends.cudnn.enabled": _MATMUL_OPS + ("cudnn", "batch_norm", "rnn", "lstm", "gru"),
    "torch.backends.cudnn.deterministic": _MATMUL_OPS + ("cudnn",),
    "torch.backends.cudnn.benchmark": _MATMUL_OPS + ("cudnn",),
    "torch.backends.cudnn.allow_tf32": _MATMUL_OPS + ("cudnn",),
    "torch.backends.cuda.flash_sdp_enabled()": _ATTENTION_OPS,
    "torch.backends.cuda.mem_efficient_sdp_enabled()": _ATTENTION_OPS,
    "torch.backends.cuda.math_sdp_enabled()": _ATTENTION_OPS,
    "torch.backends.cuda.cudnn_sdp_enabled()": _ATTENTION_OPS,
    "torch.utils.deterministic.fill_uninitialized_memory": ("empty",),
}
DEFAULT_DTYPE = "torch.get_default_dtype()"
DEFAULT_DEVICE = "torch.get_default_device()"


def _floating_input(args: Any, kwargs: Any) -> bool:
    return any(
        isinstance(leaf, torch.Tensor) and leaf.is_floating_point()
        for leaf in tree_leaves((args, kwargs))
    )


class SettingsWatch(TorchDispatchMode):
    """Watches a recompute for ops that depend on the settings that changed; ``verdict``
    gives the first setting the recompute depends on (certainly, else possibly)."""

    def __init__(self, changes: list[tuple[str, Any, Any]]) -> None:
        super().__init__()
        self.changes = changes
        self.certain: tuple[str, str] | None = None  # (setting, evidence)
        self.possible: tuple[str, str] | None = None
        self.default_dtype = torch.get_default_dtype()
        self.failure: Exception | None = None  # reported by the region once the recompute ran

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.certain is None and self.failure is None:
            try:
                self._look(func, args, kwargs, out)
            except Exception as error:  # inside the user's function: must not raise there
                self.failure = error  # See NOTE [ The guard never stops training ]
        return out

    def _look(self, func: Any, args: Any, kwargs: Any, out: Any) -> None:
        name = func._schema.name.split("::")[-1]
        for setting, _, _ in self.changes:
            if setting == DEFAULT_DTYPE:
                made = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
                fresh = name.startswith("lift_fresh")  # torch.tensor(0.5): made from data
                if (
                    kwargs.get("dtype") is None
                    and any(t.dtype is self.default_dtype for t in made)
                    and (fresh or not _floating_input(args, kwargs))
                ):
                    what = f"{func} {_where()}, which made a {self.default_dtype} tensor from "
                    self.certain = (setting, what + "the default dtype")
                    return
            elif self.possible is None and self._in_family(setting, name, args):
                self.possible = (setting, f"{func} {_where()}")

    @staticmethod
    def _in_family(setting: str, name: str, args: Any) -> bool:
        if setting == DEFAULT_DEVICE:  # a factory: no tensor among its inputs
            return not any(isinstance(a, torch.Tensor) for a in tree_leaves(args))
        family = _FAMILIES.get(setting)
        return family is None or any(part in name for part in family)

    def verdict(self) -> tuple[str, Any, Any, str, bool] | None:
        """(setting, forward's value, now, evidence, certain) or None."""
        found = self.certain or self.possible
        if found is None:
            return None
        setting, evidence = found
        old, new = next((o, n) for s, o, n in self.changes if s == setting)
        return setting, old, new, evidence, found is self.certain


def _where() -> str:
    frame = _user_frame()
    return f"(called at {frame[0]}:{frame[1]})" if frame is not None else "(in library code)"
