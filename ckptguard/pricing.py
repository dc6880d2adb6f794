"""Price a checkpoint region: activation memory it frees versus the recompute it adds.

Checkpointing a region drops the tensors autograd saves inside it and keeps only the region's
inputs; backward then runs the region's forward a second time. Whether that trade pays depends on
the region: a transformer block frees many times its input for one extra forward, while a lone
activation frees nothing at all (it saves a tensor the size of its input, and checkpoint keeps the
input instead). :func:`price` measures both sides on example inputs.

The measuring helpers (:class:`SavedBytesCounter`, :func:`measure_saved_bytes`,
:func:`count_flops`, :func:`count_recompute_flops`, :func:`time_call`, :func:`storage_bytes`,
:func:`storage_nbytes`) and the verdict arithmetic (:func:`judge`) are public so that report mode
and the planner can reuse them. torch is imported lazily: importing this module does not need it.
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

MIB = 1024 * 1024
GFLOP = 1e9

StorageKey = tuple[Any, ...]


@dataclass(frozen=True)
class PricingPolicy:
    """Thresholds that turn measured figures into a verdict.

    ``min_saved_per_input_byte``: checkpoint keeps the inputs alive, so it must free at least that
    many bytes of other activations per input byte to be a saving at all (a lone activation, norm
    or dropout frees 0 or less). ``min_mib_saved_per_gflop``: when the region does matmul, conv or
    attention work, the MiB freed per GFLOP of recompute must reach this. The ratio falls as the
    hidden size grows (bytes scale with d, FLOPs with d^2): a transformer block measures 8.6
    MiB/GFLOP at d=512 fp32, which scales to ~0.27 at d=8192 bf16; both are clearly worth it, so
    the default sits below both.
    """

    min_saved_per_input_byte: float = 1.0
    min_mib_saved_per_gflop: float = 0.1


DEFAULT_POLICY = PricingPolicy()


@dataclass(frozen=True)
class RegionPrice:
    """Measured cost and benefit of checkpointing one region, with the verdict and its basis."""

    name: str
    bytes_without_checkpoint: int
    bytes_with_checkpoint: int
    bytes_saved: int
    recompute_flops: int
    forward_flops: int
    recompute_seconds: float
    mib_saved_per_gflop: float | None
    saved_per_input_byte: float | None
    worth_it: bool
    rule: str
    ratio: float | None
    threshold: float
    policy: PricingPolicy = field(default=DEFAULT_POLICY)

    @property
    def verdict(self) -> str:
        return "worth it" if self.worth_it else "not worth it"

    @property
    def reason(self) -> str:
        """One sentence naming the ratio that decided and the threshold it was compared with."""
        shown = "undefined" if self.ratio is None else f"{self.ratio:.3g}"
        relation = ">=" if self.worth_it else "<"
        return f"{self.rule} {shown} {relation} {self.threshold:g}"

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable data (no infinities: undefined ratios are ``None``)."""
        data = asdict(self)
        data["verdict"] = self.verdict
        data["reason"] = self.reason
        return data


def price(fn_or_module: Callable[..., Any], *example_inputs: Any, **kwargs: Any) -> RegionPrice:
    """Price checkpointing ``fn_or_module(*example_inputs, **kwargs)`` with the default policy.

    Floating-point tensor inputs are made to require grad (as activations inside a network do);
    keyword arguments are passed to the region. Use :func:`price_call` for other settings.
    """
    return price_call(fn_or_module, example_inputs, kwargs)


def price_call(
    fn: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any] | None = None,
    *,
    name: str | None = None,
    policy: PricingPolicy = DEFAULT_POLICY,
    inputs_require_grad: bool = True,
    timing_repeats: int = 5,
) -> RegionPrice:
    """Measure a region on one set of inputs and judge it with ``policy``.

    Tensor inputs are detached first (sharing storage), so no graph upstream of them runs.
    The region runs about a dozen times; the RNG state and the buffers of the modules it reaches
    (BatchNorm running statistics) are restored afterwards, and no ``.grad`` is touched.
    """
    import torch

    args = [_isolated_input(a, inputs_require_grad) for a in args]
    kwargs = {k: _isolated_input(v, inputs_require_grad) for k, v in (kwargs or {}).items()}
    persistent = module_state_tensors(fn)
    with torch.random.fork_rng(), _buffers_restored(fn):
        bytes_without = measure_saved_bytes(fn, args, kwargs, exclude=persistent)
        recompute_flops = count_recompute_flops(fn, args, kwargs)
        forward_flops = count_flops(fn, args, kwargs)
        seconds = time_call(fn, args, kwargs, repeats=timing_repeats)
    bytes_with = storage_bytes(tensor_leaves((args, kwargs)))
    return judge(
        name or region_name(fn),
        bytes_without=bytes_without,
        bytes_with=bytes_with,
        recompute_flops=recompute_flops,
        forward_flops=forward_flops,
        recompute_seconds=seconds,
        policy=policy,
    )


def judge(
    name: str,
    *,
    bytes_without: int,
    bytes_with: int,
    recompute_flops: int,
    recompute_seconds: float,
    forward_flops: int | None = None,
    policy: PricingPolicy = DEFAULT_POLICY,
) -> RegionPrice:
    """Turn measured figures into a :class:`RegionPrice` (pure arithmetic, no torch needed).

    First the region must free at least ``min_saved_per_input_byte`` per input byte kept; a region
    that passes and does FLOP-counted work must then free ``min_mib_saved_per_gflop``.
    ``forward_flops`` defaults to ``recompute_flops`` (they differ when recompute stops early).
    """
    saved = bytes_without - bytes_with
    per_input = saved / bytes_with if bytes_with else None
    per_gflop = (saved / MIB) / (recompute_flops / GFLOP) if recompute_flops else None
    frees_enough = (
        per_input >= policy.min_saved_per_input_byte if per_input is not None else saved > 0
    )
    if not frees_enough or per_gflop is None:
        rule, ratio, threshold = (
            "saved_per_input_byte",
            per_input,
            policy.min_saved_per_input_byte,
        )
        worth_it = frees_enough
    else:
        rule, ratio, threshold = "mib_saved_per_gflop", per_gflop, policy.min_mib_saved_per_gflop
        worth_it = per_gflop >= threshold
    return RegionPrice(
        name=name,
        bytes_without_checkpoint=bytes_without,
        bytes_with_checkpoint=bytes_with,
        bytes_saved=saved,
        recompute_flops=recompute_flops,
        forward_flops=recompute_flops if forward_flops is None else forward_flops,
        recompute_seconds=recompute_seconds,
        mib_saved_per_gflop=per_gflop,
        saved_per_input_byte=per_input,
        worth_it=worth_it,
        rule=rule,
        ratio=ratio,
        threshold=threshold,
        policy=policy,
    )


class SavedBytesCounter:
    """Context manager counting the bytes autograd saves for backward, once per storage.

    Views of one storage (a Linear's reshaped input, a ReLU output saved by the next Linear too)
    count once. Parameters, and any tensor in ``exclude`` (module buffers, say), are not counted:
    they live whether or not the region is checkpointed. Only the innermost
    ``saved_tensors_hooks`` apply, so a checkpoint nested inside the region hides its own saves,
    which is right: those are not kept either. Saved tensors are stored detached (a reference
    to the output in its own node would be a cycle) with their version, so backward still fails,
    as autograd does, when one was modified in place.
    """

    def __init__(self, exclude: Iterable[torch.Tensor] = ()) -> None:
        self._excluded: set[StorageKey] = {storage_key(t) for t in exclude}
        self._counted: dict[StorageKey, int] = {}
        self._hooks: Any = None

    @property
    def bytes(self) -> int:
        return sum(self._counted.values())

    def _pack(self, tensor: torch.Tensor) -> tuple[torch.Tensor, int]:
        import torch

        base = tensor if tensor._base is None else tensor._base
        key = storage_key(tensor)
        if not isinstance(base, torch.nn.Parameter) and key not in self._excluded:
            self._counted.setdefault(key, storage_nbytes(tensor))
        return tensor.detach(), tensor._version

    @staticmethod
    def _unpack(packed: tuple[torch.Tensor, int]) -> torch.Tensor:
        return unpack_saved(packed)

    def __enter__(self) -> SavedBytesCounter:
        import torch

        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._hooks.__exit__(*exc_info)
        self._hooks = None


def unpack_saved(packed: tuple[torch.Tensor, int]) -> torch.Tensor:
    """A tensor packed with its version, as autograd's own check would hand it back: an
    in-place change since it was saved is the error autograd raises."""
    tensor, version = packed
    if tensor._version != version:
        raise RuntimeError(
            "one of the variables needed for gradient computation has been modified by an "
            f"inplace operation: saved at version {version}, now at {tensor._version}"
        )
    return tensor


def measure_saved_bytes(
    fn: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any] | None = None,
    *,
    exclude: Iterable[torch.Tensor] = (),
) -> int:
    """Bytes of activations autograd keeps for backward when ``fn`` runs unchecked."""
    import torch

    with torch.enable_grad(), SavedBytesCounter(exclude) as counter:
        fn(*args, **(kwargs or {}))
    return counter.bytes


def count_flops(
    fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any] | None = None
) -> int:
    """FLOPs of one forward of ``fn``: what backward recomputes under checkpoint.

    ``FlopCounterMode`` counts matmul, convolution and attention only; elementwise ops are 0.
    """
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    with torch.enable_grad(), FlopCounterMode(display=False) as counter:
        fn(*args, **(kwargs or {}))
    return counter.get_total_flops()


def count_recompute_flops(
    fn: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any] | None = None,
) -> int:
    """FLOPs that checkpoint (``use_reentrant=False``) adds to backward.

    Counted as backward-with-checkpoint minus backward-without. Usually the forward's FLOPs, but
    non-reentrant recompute stops once the last saved tensor is rebuilt, so a trailing op that
    saves nothing (the last Linear of an MLP, whose saved input is rebuilt before it runs) is
    not recomputed. The ``.grad`` of inputs and parameters is left as it was.
    """
    from torch.utils.checkpoint import checkpoint

    kwargs = dict(kwargs or {})
    wrt = [t for t in tensor_leaves((args, kwargs)) if t.requires_grad]
    wrt += [t for t in module_state_tensors(fn) if t.requires_grad]

    def checkpointed(*a: Any, **k: Any) -> Any:
        return checkpoint(fn, *a, use_reentrant=False, **k)

    return _backward_flops(checkpointed, args, kwargs, wrt) - _backward_flops(fn, args, kwargs, wrt)


def _backward_flops(
    call: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    wrt: list[torch.Tensor],
) -> int:
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    with torch.enable_grad():
        outputs = [t for t in tensor_leaves(call(*args, **kwargs)) if t.requires_grad]
    if not outputs or not wrt:
        return 0
    # torch.autograd.grad fails here (FlopCounterMode's module tracker hooks recomputed leaves),
    # so run backward into ``wrt`` only and give those tensors their gradients back.
    previous_grads = [t.grad for t in wrt]
    try:
        with FlopCounterMode(display=False) as counter:
            torch.autograd.backward(outputs, [torch.ones_like(t) for t in outputs], inputs=wrt)
    finally:
        for tensor, grad in zip(wrt, previous_grads, strict=True):
            tensor.grad = grad
    return counter.get_total_flops()


def time_call(
    fn: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any] | None = None,
    *,
    repeats: int = 5,
    warmup: int = 1,
) -> float:
    """Median wall seconds of ``fn`` with grad enabled, as the recompute runs it."""
    import torch

    kwargs = kwargs or {}
    durations = []
    with torch.enable_grad():
        for run in range(warmup + repeats):
            start = time.perf_counter()
            fn(*args, **kwargs)
            if run >= warmup:
                durations.append(time.perf_counter() - start)
    return statistics.median(durations)


def storage_key(tensor: torch.Tensor) -> StorageKey:
    """Identity of the memory a tensor lives in, shared by all its views."""
    try:
        return ("storage", tensor.device, tensor.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError):  # tensor subclasses without a storage
        return ("tensor", id(tensor))


def storage_nbytes(tensor: torch.Tensor) -> int:
    """Bytes of the whole storage behind ``tensor`` (a view holds all of it alive)."""
    try:
        return tensor.untyped_storage().nbytes()
    except (RuntimeError, NotImplementedError):
        return tensor.numel() * tensor.element_size()


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Total bytes of the distinct storages behind ``tensors``."""
    sizes = {storage_key(t): storage_nbytes(t) for t in tensors}
    return sum(sizes.values())


def tensor_leaves(obj: Any) -> Iterator[torch.Tensor]:
    """Tensors inside nested tuples, lists and dict values, as checkpoint keeps them alive."""
    import torch

    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for item in obj:
            yield from tensor_leaves(item)
    elif isinstance(obj, Mapping):
        for item in obj.values():
            yield from tensor_leaves(item)


def module_state_tensors(fn: Callable[..., Any]) -> list[torch.Tensor]:
    """Parameters and buffers of the modules ``fn`` is, is bound to, closes over, reads as globals.

    Deliberately shallow: a module reached only through another object is not found, and its
    buffers then count as activations (its parameters never do, see :class:`SavedBytesCounter`).
    """
    return [
        tensor
        for module in _modules_reached(fn)
        for tensor in (*module.parameters(), *module.buffers())
    ]


@contextlib.contextmanager
def _buffers_restored(fn: Callable[..., Any]) -> Iterator[None]:
    import torch

    buffers = [b for module in _modules_reached(fn) for b in module.buffers()]
    saved = [b.detach().clone() for b in buffers]
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, value in zip(buffers, saved, strict=True):
                buffer.copy_(value)


def _modules_reached(fn: Any) -> list[torch.nn.Module]:
    import torch

    candidates = [fn, getattr(fn, "__self__", None)]
    if isinstance(fn, functools.partial):
        candidates += [fn.func, *fn.args, *fn.keywords.values()]
    candidates += [cell.cell_contents for cell in getattr(fn, "__closure__", None) or ()]
    code, module_globals = getattr(fn, "__code__", None), getattr(fn, "__globals__", {})
    candidates += [module_globals.get(name) for name in (code.co_names if code else ())]
    return [c for c in candidates if isinstance(c, torch.nn.Module)]


def region_name(fn: Any) -> str:
    """A readable name: the module's class, or the function's qualified name."""
    import torch

    if isinstance(fn, torch.nn.Module):
        return type(fn).__name__
    if isinstance(fn, functools.partial):
        return region_name(fn.func)
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def _isolated_input(value: Any, require_grad: bool) -> Any:
    """``value`` with its tensors detached (sharing storage), so pricing never reaches the graph
    that produced them; floating ones require grad if they did or ``require_grad`` asks."""
    import torch

    if isinstance(value, torch.Tensor):
        wants_grad = value.is_floating_point() and (value.requires_grad or require_grad)
        return value.detach().requires_grad_(wants_grad)
    if isinstance(value, (tuple, list)):
        return type(value)(_isolated_input(v, require_grad) for v in value)
    if isinstance(value, dict):
        return {k: _isolated_input(v, require_grad) for k, v in value.items()}
    return value


def format_price_table(prices: Sequence[RegionPrice]) -> str:
    """A fixed-width text table, one region a row.

    Columns: activation bytes kept without and with checkpoint, bytes saved, GFLOP that
    checkpoint adds to backward, median forward time (what one recompute costs), MiB saved per
    recompute GFLOP, and the verdict with the rule that decided it.
    """
    header = (
        f"{'region':<28} {'kept w/o':>10} {'kept with':>10} {'saved':>10} "
        f"{'re-GFLOP':>8} {'fwd ms':>8} {'MiB/GFLOP':>10}  verdict"
    )
    rows = [header, "-" * len(header)]
    for p in prices:
        per_gflop = "-" if p.mib_saved_per_gflop is None else f"{p.mib_saved_per_gflop:.2f}"
        rows.append(
            f"{p.name[:28]:<28} {format_bytes(p.bytes_without_checkpoint):>10} "
            f"{format_bytes(p.bytes_with_checkpoint):>10} {format_bytes(p.bytes_saved):>10} "
            f"{p.recompute_flops / GFLOP:>8.3f} {p.recompute_seconds * 1e3:>8.2f} "
            f"{per_gflop:>10}  {p.verdict} ({p.reason})"
        )
    return "\n".join(rows)


def format_bytes(nbytes: int) -> str:
    """Bytes in binary units, sign kept (a region can cost memory under checkpoint)."""
    units = ("B", "KiB", "MiB", "GiB")
    size, exponent = float(abs(nbytes)), 0
    while size >= 1024 and exponent < len(units) - 1:
        size, exponent = size / 1024, exponent + 1
    sign = "-" if nbytes < 0 else ""
    return f"{sign}{size:.0f} B" if exponent == 0 else f"{sign}{size:.1f} {units[exponent]}"
