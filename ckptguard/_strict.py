"""Strict mode: per-op value signatures at forward, compared op by op during recompute.

Fingerprints see what a region *reads* by name; strict mode sees what it *computes*, so it also
catches state no fingerprint can name (an attribute of an arbitrary object, an explicit
``torch.Generator``, a nondeterministic kernel). A signature is the op name, each output's shape
and dtype, and for plain dense tensors a checksum: the sum and the sum of squares (a dot
product), both exact-compared, since a faithful recompute repeats the same kernels on the same
inputs bit for bit. View ops (including the detaches torch's own checkpoint hooks issue during
recompute) alias their input and are left out on both sides.
"""

from __future__ import annotations

import math
import os
import sys
import warnings
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ckptguard.errors import CheckpointMismatchError, CheckpointMismatchWarning, abbreviate

_PLAIN_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)
_SKIPPED_DIRS = (
    os.path.dirname(torch.__file__) + os.sep,
    os.path.dirname(os.path.abspath(__file__)) + os.sep,
)


def _checksum(tensor: torch.Tensor) -> tuple:
    if type(tensor) not in _PLAIN_TENSOR_TYPES or tensor.is_sparse or tensor.device.type == "meta":
        return ()
    with torch.no_grad():
        flat = tensor.detach().reshape(-1)
        if flat.is_floating_point():
            if flat.dtype not in (torch.float32, torch.float64):
                flat = flat.float()
            return (flat.sum().item(), torch.dot(flat, flat).item())
        if flat.is_complex():
            return ()
        return (flat.sum(dtype=torch.int64).item(),)


_UNINITIALISED_OPS = frozenset(
    {"empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided", "empty_permuted"}
)
_op_facts: dict[Any, tuple[bool, bool]] = {}
_compared_ops: dict[Any, bool] = {}


def _compared(func: Any) -> bool:
    """Only aten compute ops: views alias their input, and other namespaces (profiler ranges,
    FSDP's all-gather copy-in, c10d collectives) belong to framework hooks that run
    differently in a recompute on purpose."""
    compared = _compared_ops.get(func)
    if compared is None:
        compared = _compared_ops[func] = func.namespace == "aten" and not func.is_view
    return compared


def _facts(func: Any) -> tuple[bool, bool]:
    """(values are meaningful, writes into an input) for an op, cached per op overload."""
    facts = _op_facts.get(func)
    if facts is None:
        uninitialised = func._schema.name.split("::")[-1] in _UNINITIALISED_OPS
        writes = any(
            arg.alias_info is not None and arg.alias_info.is_write for arg in func._schema.arguments
        )
        # an op writing into an input also writes state that outlives the region (BatchNorm's
        # num_batches_tracked.add_(1) runs again in the recompute): compare its shapes only;
        # the ops that read what it wrote still compare their values
        facts = _op_facts[func] = (not uninitialised and not writes, writes)
    return facts


def op_signature(func: Any, out: Any) -> tuple:
    """(op name, ((shape, dtype) or value per output...), checksums, writes into an input)."""
    with_values, writes = _facts(func)
    outputs = []
    sums: list = []
    for leaf in tree_leaves(out):
        if isinstance(leaf, torch.Tensor):
            outputs.append((tuple(leaf.shape), leaf.dtype))
            if with_values:
                sums.extend(_checksum(leaf))
        elif leaf is None or isinstance(leaf, (bool, int, float, str)):
            outputs.append(leaf)
        else:
            outputs.append(type(leaf).__name__)
    return (str(func), tuple(outputs), tuple(sums), writes)


def _same(expected: tuple, actual: tuple) -> bool:
    """Equality that treats NaN checksums as equal to NaN."""
    if expected == actual:
        return True
    if (
        expected[:2] != actual[:2]
        or len(expected[2]) != len(actual[2])
        or expected[3:] != actual[3:]
    ):
        return False
    return all(
        a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b))
        for a, b in zip(expected[2], actual[2], strict=True)
    )


_DISTRIBUTED_DIR = os.path.join(os.path.dirname(torch.__file__), "distributed") + os.sep


def _called_by_framework() -> bool:
    """Whether the op comes from torch.distributed's own hooks (FSDP's all-gather buffers,
    casts and frees run in the forward but not in the recompute), not from the region's code.

    Walks up from the op past torch and ckptguard frames: a torch.distributed frame met before
    any user frame means a framework hook issued the op.
    """
    frame = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith(_DISTRIBUTED_DIR):
            return True
        if not filename.startswith(_SKIPPED_DIRS):
            return False
        frame = frame.f_back
    return False


def _user_frame() -> str:
    """file:line of the innermost caller outside torch and ckptguard, when there is one."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(_SKIPPED_DIRS) and not filename.startswith("<"):
            return f"{filename}:{frame.f_lineno}"
        frame = frame.f_back
    return "<unknown>"


def _describe(signature: tuple | None) -> str:
    if signature is None:
        return "<no such op>"
    name, outputs, sums, _ = signature
    shown = ", ".join(
        f"{list(o[0])} {str(o[1]).replace('torch.', '')}" if isinstance(o, tuple) else abbreviate(o)
        for o in outputs
    )
    checksum = f" sum={sums[0]!r} sumsq={sums[1]!r}" if len(sums) >= 2 else ""
    return f"{name} -> ({shown}){checksum}"


class ForwardRecorder(TorchDispatchMode):
    """Records the signature of every op the region's forward runs."""

    def __init__(self) -> None:
        super().__init__()
        self.signatures: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if _compared(func) and not _called_by_framework():
            self.signatures.append(op_signature(func, out))
        return out


class RecomputeChecker(TorchDispatchMode):
    """Compares each recomputed op with the forward's; raises at the first difference.

    An early-stopped recompute simply runs fewer ops: only the prefix that ran is compared.
    """

    def __init__(self, expected: list[tuple], region: str, on_mismatch: str) -> None:
        super().__init__()
        self.expected = expected
        self.region = region
        self.on_mismatch = on_mismatch
        self.index = 0
        self.active = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.active and _compared(func) and not _called_by_framework():
            index = self.index
            self.index += 1
            actual = op_signature(func, out)
            expected = self.expected[index] if index < len(self.expected) else None
            if expected is None or not _same(expected, actual):
                self.active = False
                self._mismatch(index, expected, actual)
        return out

    def __exit__(self, exc_type, exc_value, traceback):
        super().__exit__(exc_type, exc_value, traceback)
        stopped_early = exc_type is not None and exc_type.__name__ == "_StopRecomputationError"
        if stopped_early and self.active and self.index < len(self.expected):
            pending = self.expected[self.index]
            if pending[3]:
                # torch stopped while the autograd kernel of this op saved its inputs, before
                # the op ran; the op writes into one of them, so the saved tensor misses it
                self.active = False
                self._mismatch(
                    self.index,
                    pending,
                    None,
                    reason=(
                        "the recompute stopped early (all saved tensors were recomputed) "
                        "while this op was saving its inputs, before it ran; the op writes into "
                        "one of its inputs, so the tensor backward uses misses that write"
                    ),
                    frame="",
                )
        return False

    def _mismatch(
        self,
        index: int,
        expected: tuple | None,
        actual: tuple | None,
        reason: str = "",
        frame: str | None = None,
    ) -> None:
        frame = _user_frame() if frame is None else frame
        op = (actual or expected)[0]
        where = f"called at {frame}" if frame else "(not run by the recompute)"
        because = f"  why: {reason}\n" if reason else ""
        message = (
            f"ckptguard [values]: checkpointed region {self.region} computed different values "
            f"during its recompute.\n"
            f"  first differing op: #{index} {op} {where}\n"
            f"  forward:   {_describe(expected)}\n"
            f"  recompute: {_describe(actual)}\n"
            f"{because}"
            f"  effect: the tensors backward uses differ from the ones the forward computed, so "
            f"the gradients are wrong.\n"
            f"  how to fix: make the region a pure function of its inputs and parameters: no "
            f"state that changes between forward and backward (object attributes, explicit "
            f"torch.Generator, nondeterministic kernels, ops like F.rrelu in training mode)."
        )
        details = {
            "op": op,
            "index": index,
            "frame": frame,
            "forward": _describe(expected),
            "recompute": _describe(actual),
        }
        error = CheckpointMismatchError(message, kind="values", region=self.region, details=details)
        if self.on_mismatch == "warn":
            warnings.warn(message, CheckpointMismatchWarning, stacklevel=2)
        else:
            raise error
