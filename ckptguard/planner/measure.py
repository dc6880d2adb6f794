"""Measuring the unplanned model once: what it saves, where, and what the allocator saw.

One training step (forward, loss, backward) runs under the profiler with memory profiling, a
``saved_tensors_hooks`` pair that records every saved tensor, forward hooks on every submodule
(the call tree, each call's inputs and its range of autograd node numbers) and a dispatch mode
that records each op's FLOPs and the outputs selective recompute would keep. Storages are
identified by the allocation that created them (the allocator event for their address before
the moment they were seen), so an address reused after a free is a new storage. Storages
allocated before the step (parameters, buffers, the example inputs) are not activations.

A second measurement times each call's forward up to its last saved tensor (what a
non-reentrant recompute runs: it stops once the last saved tensor is rebuilt) without the
profiler, median of a few runs.

The step protocol is shared with :mod:`verify`: gradients pre-allocated (so the peak is the
activations' and not the parameter gradients'), RNG forked, buffers restored afterwards.
"""

from __future__ import annotations

import bisect
import contextlib
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ckptguard.planner import _torch
from ckptguard.planner.progress import progress
from ckptguard.planner.regions import must_save_ops
from ckptguard.pricing import storage_nbytes, tensor_leaves, unpack_saved

LossFn = Callable[[Any], torch.Tensor]
StorageRef = tuple[int | None, int]  # (storage id, bytes); id None: allocated before the step


@dataclass
class Call:
    """One module call of the measured step, in forward order."""

    index: int
    path: str
    parent: int | None
    start_ns: int
    seq_lo: int
    inputs: list = field(default_factory=list)  # StorageRef after resolution
    children: list[int] = field(default_factory=list)
    end_ns: int = 0
    seq_hi: int = 0


@dataclass
class Pack:
    """A tensor autograd saved, in the innermost call running then (None: outside the model)."""

    time_ns: int
    storage: Any
    nbytes: int
    call: int | None


@dataclass
class Op:
    time_ns: int
    call: int | None
    must_save: bool
    flops: int
    outputs: list = field(default_factory=list)  # StorageRef after resolution (must-save only)


@dataclass
class CallTiming:
    recompute_seconds: float  # up to the last saved tensor
    must_save_share: float  # share of that time spent in ops selective recompute keeps


@dataclass
class Trace:
    calls: list[Call]
    packs: list[Pack]
    ops: list[Op]
    memory_times: list[int]  # allocator events, ns
    memory_values: list[int]  # bytes above the step's start after each event
    backward: list[_torch.BackwardNode]
    step_end_ns: int
    timings: list[CallTiming]
    device: torch.device
    region_overhead_bytes: int  # what checkpoint stashes per region: the RNG states

    def peak_between(self, start_ns: int, end_ns: int) -> int:
        """Allocator's highest total in [start, end], counting what was live at ``start``."""
        lo = bisect.bisect_left(self.memory_times, start_ns)
        hi = bisect.bisect_right(self.memory_times, end_ns)
        values = self.memory_values
        before = values[lo - 1] if lo > 0 else 0
        return max([before, *values[lo:hi]])

    @property
    def peak(self) -> int:
        return max([0, *self.memory_values])


def default_loss(output: Any) -> torch.Tensor:
    """The model's own ``loss`` when it returns one (transformers with labels), else the sum of
    its floating-point outputs."""
    loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    leaves = [t for t in tensor_leaves(output) if t.is_floating_point() and t.requires_grad]
    if not leaves:
        raise ValueError("the model's output has no floating-point tensor that requires grad")
    return cast(torch.Tensor, sum(t.float().sum() for t in leaves))


def run_step(
    model: torch.nn.Module, args: Sequence[Any], kwargs: Mapping[str, Any], loss_fn: LossFn | None
) -> None:
    """Forward, loss and backward: the step whose activation memory is planned."""
    output = model(*args, **kwargs)
    loss = (loss_fn or default_loss)(output)
    del output
    loss.backward()


class StepState:
    """Makes repeated steps identical: same RNG state, same buffers, zeroed gradients."""

    def __init__(self, model: torch.nn.Module, device: torch.device) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.buffers = list(model.buffers())
        self._buffer_values = [b.detach().clone() for b in self.buffers]
        self._cpu_rng = torch.get_rng_state()
        self._cuda_rng = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
        self.device = device

    def reset(self) -> None:
        with torch.no_grad():
            for buffer, value in zip(self.buffers, self._buffer_values, strict=True):
                buffer.copy_(value)
            for param in self.params:
                cast(torch.Tensor, param.grad).zero_()  # the step gave each its gradient
        torch.set_rng_state(self._cpu_rng)
        if self._cuda_rng is not None:
            torch.cuda.set_rng_state(self._cuda_rng, self.device)


@contextlib.contextmanager
def isolated_steps(model: torch.nn.Module, device: torch.device) -> Iterator[StepState]:
    """Steps inside leave the model, its gradients and the RNG as they were."""
    params = [p for p in model.parameters() if p.requires_grad]
    previous = [p.grad for p in params]
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        for param in params:
            param.grad = torch.zeros_like(param)
        state = StepState(model, device)
        try:
            yield state
        finally:
            state.reset()
            for param, grad in zip(params, previous, strict=True):
                param.grad = grad


def model_device(model: torch.nn.Module, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    for tensor in (*model.parameters(), *tensor_leaves((args, kwargs))):
        return tensor.device
    return torch.device("cpu")


def rng_state_bytes(device: torch.device) -> int:
    """Bytes a checkpoint region keeps to replay its random numbers (preserve_rng_state)."""
    nbytes = torch.get_rng_state().nbytes
    if device.type == "cuda":
        nbytes += torch.cuda.get_rng_state(device).nbytes
    return nbytes


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(
    model: torch.nn.Module,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    loss_fn: LossFn | None,
    *,
    timing_repeats: int = 3,
) -> Trace:
    """Profile one unplanned step and time every call (the model is left as it was)."""
    device = model_device(model, args, kwargs)
    with isolated_steps(model, device) as state:
        progress("measure", "warm-up step")
        run_step(model, args, kwargs, loss_fn)  # warm-up: lazy init, allocator caches
        state.reset()
        progress("measure", "profiled step")
        trace = _profiled_step(model, args, kwargs, loss_fn, device)
        state.reset()
        trace.timings = _time_calls(model, args, kwargs, device, len(trace.calls), timing_repeats)
    return trace


class _Recorder:
    """Hooks shared by the profiled step and the timing runs: the call stack and its events."""

    def __init__(self, model: torch.nn.Module, device: torch.device, clock: Callable[[], int]):
        self.paths = {module: path for path, module in model.named_modules()}
        self.model = model
        self.device = device
        self.clock = clock
        self.calls: list[Call] = []
        self.stack: list[int] = []
        self.packs: list[Pack] = []
        self.last_pack: dict[int, int] = {}
        self.handles: list[Any] = []

    @contextlib.contextmanager
    def hooked(self) -> Iterator[_Recorder]:
        for module in self.paths:
            self.handles.append(module.register_forward_pre_hook(self._pre, with_kwargs=True))
            self.handles.append(module.register_forward_hook(self._post, with_kwargs=True))
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, unpack_saved):
                yield self
        finally:
            for handle in self.handles:
                handle.remove()
            self.handles.clear()

    def _pre(self, module: torch.nn.Module, args: Any, kwargs: Any) -> None:
        synchronize(self.device)
        parent = self.stack[-1] if self.stack else None
        call = Call(len(self.calls), self.paths[module], parent, self.clock(), _seq())
        call.inputs = [(_ptr(t), storage_nbytes(t)) for t in tensor_leaves((args, kwargs))]
        if parent is not None:
            self.calls[parent].children.append(call.index)
        self.calls.append(call)
        self.stack.append(call.index)

    def _post(self, module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        synchronize(self.device)
        call = self.calls[self.stack.pop()]
        call.end_ns = self.clock()
        call.seq_hi = _seq()

    def _pack(self, tensor: torch.Tensor) -> tuple[torch.Tensor, int]:
        if not isinstance(tensor, torch.nn.Parameter):
            synchronize(self.device)
            now = self.clock()
            call = self.stack[-1] if self.stack else None
            self.packs.append(Pack(now, _ptr(tensor), storage_nbytes(tensor), call))
            for index in self.stack:
                self.last_pack[index] = now
        return tensor.detach(), tensor._version


class _OpRecorder(TorchDispatchMode):
    """Each op's FLOPs (torch's flop formulas) and, for ops selective recompute keeps, outputs."""

    def __init__(self, recorder: _Recorder, timed: bool = False) -> None:
        super().__init__()
        self.recorder = recorder
        self.timed = timed
        self.ops: list[Op] = []
        self.seconds: list[float] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        start = time.perf_counter()
        out = func(*args, **kwargs)
        if self.timed:
            synchronize(self.recorder.device)
            self.seconds.append(time.perf_counter() - start)
        packet = func.overloadpacket
        must_save = packet in must_save_ops()
        recorder = self.recorder
        op = Op(
            recorder.clock(),
            recorder.stack[-1] if recorder.stack else None,
            must_save,
            _flops(packet, out, args, kwargs),
        )
        if must_save:
            op.outputs = [(_ptr(t), storage_nbytes(t)) for t in tensor_leaves(out)]
        self.ops.append(op)
        return out


def _flops(packet: Any, out: Any, args: Any, kwargs: Any) -> int:
    from torch.utils.flop_counter import flop_registry

    formula = flop_registry.get(packet)
    if formula is None:
        return 0
    try:
        return int(formula(*args, **kwargs, out_val=out))
    except Exception:  # a formula that cannot read these arguments: count nothing
        return 0


def _profiled_step(
    model: torch.nn.Module,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    loss_fn: LossFn | None,
    device: torch.device,
) -> Trace:
    from torch.profiler import ProfilerActivity

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    recorder = _Recorder(model, device, time.time_ns)  # the profiler's clock
    ops = _OpRecorder(recorder)
    with _torch.quiet_profile(activities=activities, profile_memory=True) as prof:
        with recorder.hooked():
            with ops:
                output = model(*args, **kwargs)
            loss = (loss_fn or default_loss)(output)
            del output
            loss.backward()
            del loss
        synchronize(device)
        step_end = time.time_ns()
    allocations, backward = _torch.profiler_events(prof, device)
    resolve = _StorageResolver(allocations)
    for call in recorder.calls:
        call.inputs = [resolve(ptr, nbytes, call.start_ns) for ptr, nbytes in call.inputs]
    for pack in recorder.packs:
        pack.storage, pack.nbytes = resolve(pack.storage, pack.nbytes, pack.time_ns)
    for op in ops.ops:
        op.outputs = [resolve(ptr, nbytes, op.time_ns) for ptr, nbytes in op.outputs]
    baseline = allocations[0].total - allocations[0].size if allocations else 0
    return Trace(
        calls=recorder.calls,
        packs=recorder.packs,
        ops=ops.ops,
        memory_times=[a.time_ns for a in allocations],
        memory_values=[a.total - baseline for a in allocations],
        backward=backward,
        step_end_ns=step_end,
        timings=[],
        device=device,
        region_overhead_bytes=rng_state_bytes(device),
    )


class _StorageResolver:
    """Maps (address, moment) to the allocation that created the storage then at that address."""

    def __init__(self, allocations: list[_torch.Allocation]) -> None:
        self.by_ptr: dict[int, tuple[list[int], list[int]]] = {}
        for index, allocation in enumerate(allocations):
            if allocation.size > 0:
                times, ids = self.by_ptr.setdefault(allocation.ptr, ([], []))
                times.append(allocation.time_ns)
                ids.append(index)

    def __call__(self, ptr: int, nbytes: int, time_ns: int) -> StorageRef:
        times, ids = self.by_ptr.get(ptr, ((), ()))
        position = bisect.bisect_right(times, time_ns) - 1
        return (ids[position] if position >= 0 else None), nbytes


def _time_calls(
    model: torch.nn.Module,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    device: torch.device,
    expected_calls: int,
    repeats: int,
) -> list[CallTiming]:
    """Per call: seconds up to its last saved tensor, and the share of kept ops in them."""
    recompute: list[list[float]] = [[] for _ in range(expected_calls)]
    for repeat in range(repeats):
        progress("measure", f"timing the {expected_calls} module calls", repeat + 1, repeats)
        recorder = _Recorder(model, device, time.perf_counter_ns)
        with recorder.hooked(), torch.enable_grad():
            model(*args, **kwargs)
        _check_same_calls(recorder.calls, expected_calls)
        for call in recorder.calls:
            last = recorder.last_pack.get(call.index)
            recompute[call.index].append(0.0 if last is None else (last - call.start_ns) / 1e9)
    shares = _must_save_shares(model, args, kwargs, device, expected_calls)
    return [CallTiming(statistics.median(r), s) for r, s in zip(recompute, shares, strict=True)]


def _must_save_shares(
    model: torch.nn.Module,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    device: torch.device,
    expected_calls: int,
) -> list[float]:
    """Per call, the share of op time (up to the last saved tensor) in ops selective keeps."""
    recorder = _Recorder(model, device, time.perf_counter_ns)
    ops = _OpRecorder(recorder, timed=True)
    with recorder.hooked(), torch.enable_grad(), ops:
        model(*args, **kwargs)
    _check_same_calls(recorder.calls, expected_calls)
    kept = [0.0] * expected_calls
    total = [0.0] * expected_calls
    ancestors = _ancestor_lists(recorder.calls)
    for op, seconds in zip(ops.ops, ops.seconds, strict=True):
        if op.call is None:
            continue
        for index in ancestors[op.call]:
            last = recorder.last_pack.get(index)
            if last is not None and op.time_ns <= last:
                total[index] += seconds
                if op.must_save:
                    kept[index] += seconds
    return [k / t if t else 0.0 for k, t in zip(kept, total, strict=True)]


def _ancestor_lists(calls: list[Call]) -> list[list[int]]:
    result: list[list[int]] = []
    for call in calls:
        chain = [call.index]
        if call.parent is not None:
            chain += result[call.parent]
        result.append(chain)
    return result


def _check_same_calls(calls: list[Call], expected: int) -> None:
    if len(calls) != expected:
        raise RuntimeError(
            f"the model made {len(calls)} module calls in one forward and {expected} in another "
            "on the same inputs; the planner needs the same calls in every step"
        )


def _seq() -> int:
    return _torch.autograd_sequence_nr()


def _ptr(tensor: torch.Tensor) -> int:
    try:
        return tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # tensor subclasses without a storage
        return id(tensor)
