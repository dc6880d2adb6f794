"""Strict mode: compare what backward uses, and name the first op that diverged.

Backward uses the tensors the region saves for backward (non-reentrant: torch pairs the
forward's saved tensors with the recompute's by position) and, for the reentrant variant, the
region's outputs (its forward runs without grad and saves nothing). Strict mode takes a value
signature of each (a weighted sum with fixed weights in memory order, which sees sign flips and
permutations, and the sum of squares; a tensor saved twice is checksummed once) at forward and
at recompute and compares them with a tolerance scaled by the tensor's norm. Paths that
compute the same values differently (a fused kernel in forward, a composite one in the
recompute; autocast's cast cache) differ at most by rounding and do not alarm; a larger
difference raises ``values`` with its size. Shape, dtype or count differences are left to
torch's own check, which ``_intercept`` explains.

A per-op log (op name, output shapes, which op made each tensor) names the first op that
diverged: the first whose outputs differ in kind, else the first whose values differ. For
values, a non-reentrant region's saved tensors are the evidence (the op that made a differing
one, or saved it when it is a parameter or input), so no tensor is checksummed twice; a
reentrant region's forward saves nothing, so it, and any region for the ops of regions nested
in it, logs a signature (sum, sum of squares) per op output. Checksums run on
detached views with Python dispatch switched off, so autograd records nothing and nested
regions' logs never see each other's checksum ops, and are read back once per pass, not per
op. Saved tensors that are module state the region itself updates (BatchNorm running
statistics) are compared by shape only: their change is the ``side_effect`` kind, not a
gradient error.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import types
import weakref
from itertools import repeat
from typing import Any

import torch

from ckptguard import _compat
from ckptguard._compat import TorchDispatchMode, tree_leaves
from ckptguard.errors import abbreviate

_PLAIN_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)
_UNINITIALISED_OPS = frozenset(
    {"empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided", "empty_permuted"}
)
# relative difference (to the tensor's L1 / L2 norm) that rounding can explain, per dtype
_TOLERANCE = {torch.float64: 1e-10, torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}
_DEFAULT_TOLERANCE = 2e-5
_DISTRIBUTED_DIR = os.path.join(_compat.torch_dir(), "distributed") + os.sep
_SKIPPED_DIRS = (_compat.torch_dir(), os.path.dirname(os.path.abspath(__file__)) + os.sep)


def _device_compared(tensor: torch.Tensor) -> str | None:
    """The device type of a tensor whose values are compared, else None."""
    if type(tensor) not in _PLAIN_TENSOR_TYPES or tensor.is_sparse or tensor.is_complex():
        return None
    device = tensor.device.type
    return None if device == "meta" or tensor.numel() == 0 else device


def checksums(tensor: torch.Tensor, saved: bool) -> tuple | None:
    """Of an op's output: (sum, sum of squares). Of a saved tensor: (weighted sum, sum of
    squares, layout). Each sum is a list of partial sums over chunks (see ``_chunks``),
    computed now in the tensor's precision (float32 for lower ones; a faithful recompute
    repeats the same kernels bit for bit) and read back and added up with one ``.tolist()`` per
    region, not per op. Computed on a detached view, so autograd records nothing, and with
    Python dispatch off, so no mode sees them. The weights follow the elements' order in
    memory (no copy of a transposed tensor), so the weighted sum sees a sign flip and a
    permutation; ``layout`` (the strides, None when contiguous) says which order that was."""
    device = _device_compared(tensor)
    if device is None:
        return None
    with _compat.no_python_dispatch():
        flat, layout = _in_memory_order(tensor.detach())
        on_cpu = device == "cpu"
        count = flat.shape[0]
        if count <= ONE_THREAD or not on_cpu:
            chunks: Any = (flat if flat.dtype in _SUMMED_DTYPES else flat.float(),)
        else:
            chunks = _chunks(flat)
        # BLAS (a dot) only where it cannot use threads: torch on one thread sets MKL's too
        blas = not on_cpu or torch.get_num_threads() == 1
        if blas:
            squares: list = [torch.dot(c, c) for c in chunks]
        else:
            squares = _Norms([torch.linalg.vector_norm(c) for c in chunks])
        if not saved:
            return ([c.sum() for c in chunks], squares)
        weights = _weights_for(chunks[0].dtype, flat.device, count)
        weighted = []
        start = 0
        for chunk in chunks:
            stop = start + chunk.shape[0]
            part = _weight_slice(weights, start, stop)
            weighted.append(torch.dot(chunk, part) if blas else torch.mul(chunk, part).sum())
            start = stop if stop < _PERIOD else 0
        return (weighted, squares, layout)


class _Norms(list):
    """Partial L2 norms standing for partial sums of squares (their squares add up)."""

    __slots__ = ()


# Elements per reduction on the CPU, at most: torch runs an elementwise op or a reduction on
# one thread up to this many (its GRAIN_SIZE). With torch on several threads a BLAS dot may
# use them at any size (on a loaded 2-core machine, waiting for the other thread cost a dot of
# 22k to 88k elements up to 18 ms, its median 4 us), so checksums use torch's own kernels
# there; ``torch.set_num_threads`` is no way out: it is process-wide, and in torch's OpenMP
# build it also resizes the thread pool and clears oneDNN's primitive cache.
ONE_THREAD = 32768


def _chunks(flat: torch.Tensor) -> tuple | list:
    """``flat`` (a CPU tensor of more than ``ONE_THREAD`` elements, converted to float32 if
    of lower precision) in views of at most ``ONE_THREAD`` elements, each converted on its own
    (a copy of more would use threads)."""
    parts = torch.split(flat, ONE_THREAD)
    if flat.dtype in _SUMMED_DTYPES:
        return parts
    return [part.float() for part in parts]


_SUMMED_DTYPES = (torch.float32, torch.float64)
_PERIOD = 1 << 20  # weights repeat after this many elements: at most 8 MiB of them
_weights: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}
# (weights' id, start, stop) -> (weights, the view of them): chunks of the same sizes recur
_weight_slices: dict[tuple[int, int, int], tuple[torch.Tensor, torch.Tensor]] = {}


def _weights_for(dtype: torch.dtype, device: torch.device, count: int) -> torch.Tensor:
    """Fixed weights in [-0.5, 0.5), one per position (the golden-ratio sequence: no random
    numbers drawn), per dtype and device, grown on demand up to ``_PERIOD``."""
    key = (dtype, device)
    weights = _weights.get(key)
    size = min(count, _PERIOD)
    if weights is None or weights.shape[0] < size:
        grown = 2 * weights.shape[0] if weights is not None else 0
        size = min(max(size, grown), _PERIOD)
        positions = torch.arange(size, dtype=torch.float64, device=device)
        weights = _weights[key] = (torch.frac(positions * _GOLDEN) - 0.5).to(dtype)
    return weights


def _weight_slice(weights: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    key = (id(weights), start, stop)
    found = _weight_slices.get(key)
    if found is None or found[0] is not weights:
        if len(_weight_slices) >= 4096:  # sizes of generated models: keep it bounded
            _weight_slices.clear()
        found = _weight_slices[key] = (weights, weights[start:stop])
    return found[1]


_GOLDEN = (math.sqrt(5) - 1) / 2


def _in_memory_order(tensor: torch.Tensor) -> tuple[torch.Tensor, tuple | None]:
    """``tensor`` flattened, as a view where its elements fill their memory densely in some
    order (a transpose, a permutation), else copied in logical order."""
    if tensor.is_contiguous():
        return tensor.view(-1), None
    permuted = tensor.permute(sorted(range(tensor.dim()), key=tensor.stride, reverse=True))
    if permuted.is_contiguous():
        return permuted.view(-1), tensor.stride()
    return tensor.reshape(-1), None


def resolve_checksums(metas: list[tuple], sums: list) -> list[tuple]:
    """Signatures (shape, dtype, device[, checksums...]) with one read-back; a checksum tuple
    shared by several positions (one tensor saved twice) is read once, and each sum is its
    partial sums added in order."""
    unique = {id(s): s for s in sums if s is not None}
    present = [
        partial for s in unique.values() for part in s if isinstance(part, list) for partial in part
    ]
    if not present:
        return list(metas)
    with _compat.no_python_dispatch():
        try:  # stack promotes float32 and float64 sums alike
            values = iter(torch.stack(present).tolist())
        except RuntimeError:  # sums on several devices
            values = iter(torch.stack([p.double().cpu() for p in present]).tolist())
    read = {key: tuple(map(_added, s, repeat(values))) for key, s in unique.items()}
    return [m if s is None else m + read[id(s)] for m, s in zip(metas, sums, strict=True)]


def _added(part: Any, values: Any) -> Any:
    """A checksum's partial sums, read in order from ``values``, added up (norms squared)."""
    kind = type(part)
    if kind is list:
        return sum(next(values) for _ in part)
    if kind is _Norms:
        return sum(next(values) ** 2 for _ in part)
    return part


def signatures(tensors: list) -> list[tuple]:
    metas = [(tuple(t.shape), t.dtype, t.device.type) for t in tensors]
    return resolve_checksums(metas, [checksums(t, saved=True) for t in tensors])


def compare_signatures(old: tuple, new: tuple) -> dict[str, Any] | None:
    """None when equal up to rounding; else the size of the difference."""
    if old[:3] != new[:3]:
        return {
            "summary": f"{_meta(old)} at forward, {_meta(new)} at recompute",
            "relative": math.inf,
        }
    if len(old) == 3 or len(new) == 3:
        return None
    tolerance = _TOLERANCE.get(old[1], _DEFAULT_TOLERANCE)
    (old_sum, old_squares), (new_sum, new_squares) = old[3:5], new[3:5]
    if not all(map(math.isfinite, (old_sum, old_squares, new_sum, new_squares))):
        # a tensor holding inf, nan or values near its dtype's largest overflows its
        # checksums, and where it overflows depends on the order of the additions (threads):
        # no evidence either way, so it is compared by shape, dtype and device only
        return None
    old_l2, new_l2 = math.sqrt(max(old_squares, 0.0)), math.sqrt(max(new_squares, 0.0))
    count = math.prod(old[0]) or 1
    # |weighted sum difference| <= L1 of the difference <= sqrt(n) * its L2 (|weight| < 1):
    # scale sums by sqrt(n) * L2
    scale = max(old_l2, new_l2, 1e-300)
    spread = scale * math.sqrt(count)
    differences = [abs(old_l2 - new_l2) / scale]
    if old[5] == new[5]:  # weighted sums taken in the same memory order
        differences.append(abs(old_sum - new_sum) / spread)
    relative = max(differences)
    if relative <= tolerance:
        return None
    return {
        "summary": (
            f"weighted sum {old_sum:.6g} -> {new_sum:.6g}, L2 norm {old_l2:.6g} -> "
            f"{new_l2:.6g}: a relative difference of {relative:.3g} (rounding alone stays below "
            f"{tolerance:g} for {str(old[1]).replace('torch.', '')})"
        ),
        "relative": relative,
    }


def _meta(signature: tuple) -> str:
    shape, dtype, device = signature[:3]
    return f"{list(shape)} {str(dtype).replace('torch.', '')} on {device}"


def _called_by_framework() -> bool:
    """Whether the op comes from torch.distributed's own hooks (FSDP's all-gather buffers,
    casts and frees run in the forward but not in the recompute), not from the region's code.
    Only looked for once FSDP2 is in use."""
    frame: types.FrameType | None = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith(_DISTRIBUTED_DIR):
            return True
        if not filename.startswith(_SKIPPED_DIRS):
            return False
        frame = frame.f_back
    return False


def _user_frame() -> tuple[str, int] | None:
    """(file, line) of the innermost caller outside torch and ckptguard, when there is one."""
    frame: types.FrameType | None = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(_SKIPPED_DIRS) and not filename.startswith("<"):
            return filename, frame.f_lineno
        frame = frame.f_back
    return None


def _frame_text(frame: tuple[str, int] | None) -> str:
    return f"called at {frame[0]}:{frame[1]}" if frame is not None else ""


_passes = threading.local()  # depth: strict passes (forwards, recomputes) running on a thread
_op_facts: dict[Any, tuple[str, bool, bool, bool]] = {}


def _facts(func: Any) -> tuple[str, bool, bool, bool]:
    """(name, compared at all, values meaningful, writes into an input), cached per op
    overload.

    Only aten compute ops: views alias their input, other namespaces (profiler ranges, FSDP's
    copy-in, c10d collectives) belong to framework hooks that differ in a recompute on purpose.
    """
    facts = _op_facts.get(func)
    if facts is None:
        compared = func.namespace == "aten" and not func.is_view
        uninitialised = func._schema.name.split("::")[-1] in _UNINITIALISED_OPS
        writes = any(
            arg.alias_info is not None and arg.alias_info.is_write for arg in func._schema.arguments
        )
        facts = _op_facts[func] = (str(func), compared, not uninitialised, writes)
    return facts


class OpLog(TorchDispatchMode):
    """Records each op (name, output shapes and, with ``op_values``, sum and sum of squares of
    each output), which op made each tensor and which tensors hold uninitialised memory;
    values are read back once, by ``finish``."""

    def __init__(self, op_values: bool, keep_frames: bool, level: int) -> None:
        super().__init__()
        self.ops: list[tuple] = []
        self.frames: list[tuple[str, int] | None] = []
        self.uninitialised: dict[int, int] = {}  # id(tensor) -> version when created
        self.producers: dict[int, int | None] = {}  # id(tensor) -> index of the op that made it
        self.op_values = op_values
        self.keep_frames = keep_frames
        self.framework = _compat.fsdp2_in_use()  # FSDP's own ops are looked for only then
        self.level = level  # how many strict passes run on this thread, this one included
        self._sums: list = []  # per op: a checksum tensor per output (None: shape only)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name, compared, with_values, writes = _op_facts.get(func) or _facts(func)
        if not compared or (self.framework and _called_by_framework()):
            if type(out) is torch.Tensor:  # a view is made by what made its base
                source = args[0] if args and func.is_view else None
                self.producers[id(out)] = self.producers.get(id(source))
                if self.uninitialised:
                    self.uninitialised.pop(id(out), None)
            return out
        index = len(self.ops)
        # values of an op inside a nested region are this log's only evidence of them: that
        # region's checkpoint, not this one, keeps what backward uses there
        values = with_values and not writes and (self.op_values or _passes.depth > self.level)
        outputs: list[Any] = []
        sums = []
        for leaf in (out,) if type(out) is torch.Tensor else tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self.producers[id(leaf)] = index
                if not with_values:
                    self.uninitialised[id(leaf)] = leaf._version
                elif self.uninitialised:  # an id reused after an uninitialised tensor died
                    self.uninitialised.pop(id(leaf), None)
                outputs.append((leaf.shape, leaf.dtype))
                sums.append(checksums(leaf, False) if values else None)
            else:
                outputs.append(abbreviate(leaf, 40))
        self.ops.append((name, tuple(outputs), writes))
        self._sums.append(sums)
        if self.keep_frames:
            self.frames.append(_user_frame())
        return out

    def finish(self) -> None:
        if not any(s is not None for sums in self._sums for s in sums):
            self._sums = []
            return
        metas = [output for op in self.ops for output in op[1] if isinstance(output, tuple)]
        flat_sums = [s for sums in self._sums for s in sums]
        resolved = iter(resolve_checksums(metas, flat_sums))
        ops = []
        for name, outputs, writes in self.ops:
            shown = tuple(next(resolved) if isinstance(o, tuple) else o for o in outputs)
            ops.append((name, shown, writes))
        self.ops = ops
        self._sums = []


class SavedTensors:
    """Wraps the innermost saved-tensor hooks (torch's checkpoint hooks) to checksum each
    tensor saved for backward, then hands it on unchanged. With a log (a recompute), it also
    notes which op made each one, and the tensors it saved while they held uninitialised
    memory."""

    def __init__(self, log: OpLog | None) -> None:
        self.log = log
        self.signatures: list[tuple] = []
        self.ids: list[int] = []
        self.producers: list[int] = []  # per saved tensor: the op that made or saved it
        # position -> (weak reference, version, op that made it) of a tensor saved unfilled
        self.unfilled: dict[int, tuple[weakref.ref, int, int]] = {}
        self.stop_frame: tuple[str, int] | None = None  # where torch stopped the recompute
        self._metas: list[tuple] = []
        self._sums: list = []
        self._hooks: Any = None

    def __enter__(self) -> SavedTensors:
        top = _compat.resolve().top_saved_tensors_hooks()
        if top is None:
            pack_inner, unpack = (lambda x: x), (lambda x: x)
        else:
            pack_inner, unpack = top

        log, metas, sums, ids = self.log, self._metas, self._sums, self.ids
        producers, unfilled = self.producers, self.unfilled
        uninitialised = log.uninitialised if log is not None else {}
        made_by = log.producers if log is not None else {}
        stop = _compat.resolve().stop_recomputation_error

        checked: dict[int, tuple] = {}  # id -> (weak reference, version, its checksums)

        def pack(tensor: torch.Tensor) -> Any:
            ident = id(tensor)
            version = tensor._version
            metas.append((tensor.shape, tensor.dtype, tensor.device.type))
            known = checked.get(ident)
            if known is not None and known[0]() is tensor and known[1] == version:
                sums.append(known[2])  # saved again (a Linear's input for q, k and v)
            else:
                garbage = uninitialised.get(ident, -1) == version
                found = None if garbage else checksums(tensor, saved=True)
                checked[ident] = (weakref.ref(tensor), version, found)
                sums.append(found)
                made = made_by[ident] if garbage and tensor.numel() else None
                if made is not None:
                    unfilled[len(ids)] = (checked[ident][0], version, made)
            ids.append(ident)
            if log is not None:
                # a tensor made before this pass (parameter, input) is saved by the op about
                # to run: if it differs, that op is the first whose output does
                made = made_by.get(ident)
                producers.append(made if made is not None else len(log.ops))
            try:
                return pack_inner(tensor)
            except stop:
                self.stop_frame = _user_frame()
                raise

        self._hooks = torch.autograd.graph.saved_tensors_hooks(pack, unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._hooks.__exit__(*exc)
        self._hooks = None  # torch's hooks close over its checkpoint frame: do not keep them

    def finish(self) -> None:
        self.signatures = resolve_checksums(self._metas, self._sums)
        self._metas.clear()
        self._sums.clear()


class _StrictPass:
    """What strict mode records during one pass over a region (its forward or a recompute):
    the ops it ran (``logged``), the tensors it saved for backward (non-reentrant) and its
    outputs."""

    def __init__(self, reentrant: bool, keep_frames: bool, logged: bool) -> None:
        self.reentrant = reentrant
        self.keep_frames = keep_frames
        self.logged = logged
        self.log: OpLog | None = None
        self.saved = SavedTensors(None)
        self.outputs: list[tuple] = []

    def __enter__(self) -> _StrictPass:
        level = _passes.depth = _passes.__dict__.get("depth", 0) + 1
        logging = False
        try:
            if self.logged:
                self.log = OpLog(self.reentrant, self.keep_frames, level)
                self.saved.log = self.log
                self.log.__enter__()
                logging = True
            if not self.reentrant:
                self.saved.__enter__()
        except BaseException:  # leave nothing entered. See NOTE [ The guard never stops training ]
            if logging:
                self.ops_log.__exit__(None, None, None)
            _passes.depth -= 1
            raise
        return self

    @property
    def ops_log(self) -> OpLog:
        """The log of a logged pass (strict mode's passes are logged)."""
        assert self.log is not None, "a logged pass"
        return self.log

    def __exit__(self, *exc: Any) -> None:
        if not self.reentrant:
            self.saved.__exit__(*exc)
        if self.log is not None:
            self.log.__exit__(*exc)
        _passes.depth -= 1
        self.saved.finish()
        if self.log is not None:
            self.log.finish()

    def record_outputs(self, out: Any) -> None:
        self.outputs = signatures([t for t in tree_leaves(out) if isinstance(t, torch.Tensor)])


class StrictForward(_StrictPass):
    """Everything strict mode records while the region's forward runs. A non-reentrant
    forward logs no ops: the tensors it saves are the evidence, and the recompute's log
    names the ops that made them (a per-op log of the forward would double strict mode's
    cost)."""

    def __init__(self, reentrant: bool, compiled: bool) -> None:
        super().__init__(reentrant, keep_frames=False, logged=reentrant and not compiled)
        self.compiled = compiled  # runs torch.compile's code: no op is logged in either pass
        self.state_positions: set[int] = set()  # saved tensors that are updated module state

    def mark_state(self, state_ids: set[int]) -> None:
        """Saved tensors that are buffers the region writes: compared by shape only."""
        self.state_positions = {i for i, k in enumerate(self.saved.ids) if k in state_ids}


class StrictRecompute(_StrictPass):
    """The recompute's side: the same records, compared with the forward's at the end."""

    def __init__(self, forward: StrictForward, compiled: bool) -> None:
        """``compiled``: the region runs code torch.compile made (known once its forward ran);
        a reentrant recompute logs as its forward did, so both run the same kernels."""
        logged = forward.logged if forward.reentrant else not (compiled or forward.compiled)
        super().__init__(forward.reentrant, keep_frames=True, logged=logged)
        self.forward = forward

    def difference(self, stopped_early: bool) -> tuple[str, dict[str, Any]] | None:
        """(what differs, how much) for the first tensor backward uses that differs."""
        forward = self.forward
        if forward.reentrant:
            pairs = list(zip(forward.outputs, self.outputs, strict=False))
            label = "output"
        else:
            pairs = list(zip(forward.saved.signatures, self.saved.signatures, strict=False))
            label = "tensor saved for backward"
        for index, (old, new) in enumerate(pairs):
            if old[:3] != new[:3] and not forward.reentrant:
                return None  # shape, dtype or device: torch's own check raises, we explain it
            if index in forward.state_positions:
                old, new = old[:3], new[:3]
            found = compare_signatures(old, new)
            if found is not None:
                return f"{label} #{index} of the region", found
        if stopped_early:
            pending = self._pending_write()
            if pending is not None:
                return pending
        return None

    def _unfilled(self) -> tuple[int, int] | None:
        """(position, op that made it) of a tensor the early-stopped recompute saved while it
        held uninitialised memory and that nothing wrote before torch stopped: the op that
        saved it fills it after saving (RReLU's noise) and never ran, so backward reads the
        tensor unfilled."""
        for position, (ref, version, made) in sorted(self.saved.unfilled.items()):
            tensor = ref()
            if tensor is not None and tensor._version == version:
                return position, made
        return None

    def _pending_write(self) -> tuple[str, dict[str, Any]] | None:
        found = self._unfilled()
        if found is None:
            return None
        position, made = found
        summary = (
            f"torch stopped the recompute early (once every saved tensor was recomputed) while "
            f"an op was saving this tensor, which {self.ops_log.ops[made][0]} (op #{made}) made "
            f"uninitialised and nothing had filled yet: the op that saves it fills it afterwards "
            f"(as RReLU fills its noise), which the forward did and the recompute never reached, "
            f"so backward reads it unfilled"
        )
        what = f"tensor saved for backward #{position} of the region"
        return what, {"summary": summary, "relative": math.inf}

    def first_diverging_op(self) -> dict[str, Any] | None:
        if self.log is None:  # compiled code ran: no op was logged
            return None
        if self.forward.log is None:  # non-reentrant: the saved tensors are the evidence
            unfilled = self._unfilled()
            if unfilled is None:
                return self._first_differing_saved()
            name = self.ops_log.ops[unfilled[1]][0]
            return {
                "index": unfilled[1],
                "op": name,
                "frame": _frame_text(self.saved.stop_frame),
                "forward": f"{name} -> a tensor an op saved for backward, then filled",
                "recompute": f"{name} -> the same tensor, saved unfilled: torch stopped before "
                "the op that fills it ran",
            }
        old_ops, new_ops = self.forward.ops_log.ops, self.ops_log.ops
        for index in range(max(len(old_ops), len(new_ops))):
            old = old_ops[index] if index < len(old_ops) else None
            new = new_ops[index] if index < len(new_ops) else None
            if new is None:  # the recompute stopped early, or ran fewer ops
                if old is not None and old[2]:
                    frame = "(not run by the recompute)"
                    return _op_entry(index, old, None, frame)
                break
            if old is None or not _same_op(old, new):
                return _op_entry(index, old, new, self._frame(index))
        return None

    def _frame(self, index: int) -> str:
        return _frame_text(self.ops_log.frames[index] if index < len(self.ops_log.frames) else None)

    def _first_differing_saved(self) -> dict[str, Any] | None:
        """The earliest op with a saved tensor that differs in value: the op that made it, or
        for a parameter or input, the op that saved it (its output is the first to differ);
        shown with the saved tensor's signatures."""
        forward = self.forward
        found = None
        pairs = zip(forward.saved.signatures, self.saved.signatures, strict=False)
        for position, (old, new) in enumerate(pairs):
            index = self.saved.producers[position]
            if position in forward.state_positions:
                continue
            if (found is None or index < found[0]) and compare_signatures(old, new) is not None:
                found = (index, old, new)
        if found is None or found[0] >= len(self.ops_log.ops):
            return None
        index, old, new = found
        name = self.ops_log.ops[index][0]
        return {
            "index": index,
            "op": name,
            "frame": self._frame(index),
            "forward": f"{name} saved for backward {_signature_text(old)}",
            "recompute": f"{name} saved for backward {_signature_text(new)}",
        }


def _signature_text(signature: tuple) -> str:
    shape, dtype = signature[:2]
    text = f"{list(shape)} {str(dtype).replace('torch.', '')}"
    if len(signature) > 3:
        text += f" weighted sum={signature[3]!r} sum of squares={signature[4]!r}"
    return text


def _same_op(old: tuple, new: tuple) -> bool:
    if old[0] != new[0] or len(old[1]) != len(new[1]):
        return False
    for a, b in zip(old[1], new[1], strict=True):
        if not isinstance(a, tuple) or not isinstance(b, tuple):
            if a != b:
                return False
            continue
        if a[:2] != b[:2]:
            return False
        if len(a) == 4 and len(b) == 4 and all(map(math.isfinite, (*a[2:], *b[2:]))):
            # (shape, dtype, sum, sum of squares); overflowed sums are no evidence
            tolerance = _TOLERANCE.get(a[1], _DEFAULT_TOLERANCE)
            squares = max(a[3], b[3], 1e-300)
            spread = math.sqrt(squares * (math.prod(a[0]) or 1))
            if abs(a[2] - b[2]) / spread > tolerance or abs(a[3] - b[3]) / squares > tolerance:
                return False
    return True


def _describe_op(op: tuple | None) -> str:
    """An op and its outputs, with their signatures where logged: (sum, sum of squares)."""
    if op is None:
        return "<no such op>"
    name, outputs, _ = op
    shown = []
    for output in outputs:
        if isinstance(output, tuple):
            text = f"{list(output[0])} {str(output[1]).replace('torch.', '')}"
            if len(output) == 4:
                text += f" sum={output[2]!r} sum of squares={output[3]!r}"
            shown.append(text)
        else:
            shown.append(str(output))
    return f"{name} -> ({', '.join(shown)})"


def _op_entry(index: int, old: tuple | None, new: tuple | None, frame: str) -> dict[str, Any]:
    return {
        "index": index,
        "op": (new or old or ("<no such op>",))[0],
        "frame": frame,
        "forward": _describe_op(old),
        "recompute": _describe_op(new),
    }
