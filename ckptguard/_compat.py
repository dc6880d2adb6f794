"""Every private (or version-dependent) torch symbol the guard uses, resolved in one place.

``resolve()`` runs at ``enable()``: it checks the torch release against ``MINIMUM_TORCH`` (the
floor of the ``guard`` extra) and looks up each hook point; a missing one raises
``CheckpointGuardCompatibilityError`` naming it, instead of leaving regions silently unguarded.
The other layers read these symbols from the returned ``Torch`` object and never reach into
torch's private namespaces themselves.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.modules.module as module_internals
from torch.overrides import TorchFunctionMode
from torch.utils import checkpoint as torch_checkpoint
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_leaves, tree_map

from ckptguard.errors import compatibility_error, derive_from_checkpoint_error

# torch 2.8 is the first with _top_saved_tensors_default_hooks (strict mode wraps the checkpoint
# hooks it returns), so 2.4 to 2.7 fail the guard's tests (benchmarks/torch_versions.py). The
# guard extra in pyproject.toml states the same floor; a test keeps the two equal.
MINIMUM_TORCH = (2, 8)
GENERATOR_NAMES = (
    "_checkpoint_without_reentrant_generator",
    "_checkpoint_without_reentrant_generator_impl",
)
COMPOSABLE_MODULE = "torch.distributed._composable.checkpoint_activation"
GLOBAL_HOOK_DICTS = (
    "_global_forward_pre_hooks",
    "_global_forward_hooks",
    "_global_backward_pre_hooks",
    "_global_backward_hooks",
)
MODULE_HOOK_DICTS = (
    "_forward_pre_hooks",
    "_forward_hooks",
    "_backward_pre_hooks",
    "_backward_hooks",
)
TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
# normalisation layers with running statistics (BatchNorm, SyncBatchNorm, InstanceNorm and
# their lazy forms): the base class torch gives them all
NORMS_WITH_STATISTICS: tuple[type, ...] = tuple(
    filter(None, [getattr(torch.nn.modules.batchnorm, "_NormBase", None)])
) or (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.BatchNorm3d, torch.nn.SyncBatchNorm)
FSDP_STATE_MODULE = "torch.distributed._composable_state"


def _segment_code() -> Any:
    """The code of the closure ``checkpoint_sequential`` checkpoints for each segment (its
    ``run_function``'s ``forward``), found among the constants of its code; None if absent."""
    pending = [torch_checkpoint.checkpoint_sequential.__code__]
    while pending:
        code = pending.pop()
        for const in code.co_consts:
            if inspect.iscode(const):
                if const.co_name == "forward" and code.co_name == "run_function":
                    return const
                pending.append(const)
    return None


# a method patched on torch.Tensor lands in its own dict (its C methods live in TensorBase)
TENSOR_METHOD: Callable[[str], Any] = torch.Tensor.__dict__.get

# checkpoint_sequential's segment closure, and where its list and bounds are in its closure:
# an item of a plain list replaced after the forward is what the recompute runs
SEGMENT_CODE: Any = _segment_code()
SEGMENT_CELLS: tuple[int, ...] = (
    tuple(SEGMENT_CODE.co_freevars.index(n) for n in ("functions", "start", "end"))
    if SEGMENT_CODE is not None and {"functions", "start", "end"} <= set(SEGMENT_CODE.co_freevars)
    else ()
)

# private helpers the dispatch-mode layers subclass or call, re-exported from here only
__all__ = [
    "TorchDispatchMode",
    "TorchFunctionMode",
    "disable_dispatch_modes",
    "no_python_dispatch",
    "tree_leaves",
    "tree_map",
]
disable_dispatch_modes = _disable_current_modes
# a C++ guard: no Python dispatch (modes, subclasses) inside it; cheaper than popping modes
no_python_dispatch = torch._C._DisableTorchDispatch


# Flags of torch's backend modules that steer what an op computes, each with whether only
# CUDA ops consult it.
_BACKEND_FLAGS = (
    ("torch.backends.mkldnn", "enabled", False),
    ("torch.backends.cuda.matmul", "allow_tf32", True),
    ("torch.backends.cuda.matmul", "allow_fp16_reduced_precision_reduction", True),
    ("torch.backends.cuda.matmul", "allow_bf16_reduced_precision_reduction", True),
    ("torch.backends.cudnn", "enabled", True),
    ("torch.backends.cudnn", "deterministic", True),
    ("torch.backends.cudnn", "benchmark", True),
    ("torch.backends.cudnn", "allow_tf32", True),
    ("torch.utils.deterministic", "fill_uninitialized_memory", False),
)


# Settings read and written only through torch._C: label -> (getter, setter, CUDA only)
SDP_PRIORITY = "SDPA backend priority (sdpa_kernel(..., set_priority=True))"
SDP_OVERRIDEABLE = "SDPA overrideable backend enabled"
SDP_FA3 = "SDPA FlashAttention-3 backend enabled"
MATH_SDP_REDUCTION = "torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed()"
CPU_FP16_REDUCTION = "CPU fp16 reduced-precision reduction"
MKLDNN_DETERMINISTIC = "torch.backends.mkldnn.deterministic"
NNPACK = "torch.backends.nnpack.enabled"
C_SETTINGS = {
    SDP_PRIORITY: ("_get_sdp_priority_order", "_set_sdp_priority_order", False),
    SDP_OVERRIDEABLE: ("_get_overrideable_sdp_enabled", "_set_sdp_use_overrideable", False),
    SDP_FA3: ("_get_fa3_sdp_enabled", "_set_sdp_use_fa3", True),
    MATH_SDP_REDUCTION: (
        "_get_math_sdp_allow_fp16_bf16_reduction",
        "_set_math_sdp_allow_fp16_bf16_reduction",
        False,
    ),
    CPU_FP16_REDUCTION: (
        "_get_cpu_allow_fp16_reduced_precision_reduction",
        "_set_cpu_allow_fp16_reduced_precision_reduction",
        False,
    ),
    MKLDNN_DETERMINISTIC: ("_get_mkldnn_deterministic", "_set_mkldnn_deterministic", False),
    NNPACK: ("_get_nnpack_enabled", "_set_nnpack_enabled", False),
}


def _backend_flags(cuda: bool) -> Iterator[tuple[str, Any, str]]:
    """(label, owner, attribute) of each backend flag this torch has; the CUDA-only ones
    with ``cuda``."""
    for owner_name, attribute, cuda_only in _BACKEND_FLAGS:
        if cuda_only and not cuda:
            continue
        owner: Any = torch
        for part in owner_name.split(".")[1:]:
            owner = getattr(owner, part, None)
        if owner is not None and hasattr(owner, attribute):
            yield f"{owner_name}.{attribute}", owner, attribute


def _backend_flag(owner: Any, name: str) -> Callable[[], Any]:
    return lambda: getattr(owner, name)


def _torch_state_getters() -> list[tuple[str, Callable[[], Any]]]:
    """Process-wide settings that change what an op computes and that torch's checkpoint does
    not restore for the recompute (it restores RNG, autocast, the device context and grad mode).
    Settings whose effect is only rounding order (thread count, einsum path) are left out."""
    backends = torch.backends
    candidates: list[tuple[str, Any]] = [
        ("torch.get_default_dtype()", getattr(torch, "get_default_dtype", None)),
        ("torch.get_float32_matmul_precision()", _float32_matmul_precision),
        (
            "torch.are_deterministic_algorithms_enabled()",
            getattr(torch, "are_deterministic_algorithms_enabled", None),
        ),
        (
            "torch.is_deterministic_algorithms_warn_only_enabled()",
            getattr(torch, "is_deterministic_algorithms_warn_only_enabled", None),
        ),
        (
            "torch.backends.cuda.flash_sdp_enabled()",
            getattr(backends.cuda, "flash_sdp_enabled", None),
        ),
        (
            "torch.backends.cuda.mem_efficient_sdp_enabled()",
            getattr(backends.cuda, "mem_efficient_sdp_enabled", None),
        ),
        (
            "torch.backends.cuda.math_sdp_enabled()",
            getattr(backends.cuda, "math_sdp_enabled", None),
        ),
        (
            "torch.backends.cuda.cudnn_sdp_enabled()",
            getattr(backends.cuda, "cudnn_sdp_enabled", None),
        ),
    ]
    # cuBLAS and cuDNN settings change nothing a CPU op computes
    cuda = torch.cuda.is_available()
    for label, owner, attribute in _backend_flags(cuda=cuda):
        candidates.append((label, _backend_flag(owner, attribute)))
    # flags read only through torch._C (sdpa_kernel sets every backend's flag, and with
    # set_priority=True their order), each with whether only CUDA ops consult it
    for label, (getter, _, cuda_only) in C_SETTINGS.items():
        if cuda or not cuda_only:
            candidates.append((label, getattr(torch._C, getter, None)))
    getters = []
    for label, getter in candidates:
        if getter is None:
            continue
        try:
            value = getter()
        except Exception:  # a setting this build cannot read is one it cannot change either
            continue
        direct = getattr(torch._C, _DIRECT_GETTERS.get(label, ""), None)
        if direct is not None and direct() == value:
            getter = direct
        getters.append((label, getter))
    return getters


_precision: _Precision | None = None


def _float32_matmul_precision() -> Any:
    """The legacy level, or the per-backend precisions where torch's getter raises because
    they were set through both APIs (a program may do that; the guard must still read it)."""
    global _precision
    try:
        return torch._C._get_float32_matmul_precision()
    except RuntimeError:
        if _precision is None:
            _precision = _Precision()
        return _precision.per_backend()


# the C functions behind the public getters: every region reads each setting twice a step,
# and a call straight into C costs a fraction of the Python wrapper or property around it
_DIRECT_GETTERS = {
    "torch.are_deterministic_algorithms_enabled()": "_get_deterministic_algorithms",
    "torch.is_deterministic_algorithms_warn_only_enabled()": (
        "_get_deterministic_algorithms_warn_only"
    ),
    "torch.backends.cuda.flash_sdp_enabled()": "_get_flash_sdp_enabled",
    "torch.backends.cuda.mem_efficient_sdp_enabled()": "_get_mem_efficient_sdp_enabled",
    "torch.backends.cuda.math_sdp_enabled()": "_get_math_sdp_enabled",
    "torch.backends.cuda.cudnn_sdp_enabled()": "_get_cudnn_sdp_enabled",
    "torch.backends.mkldnn.enabled": "_get_mkldnn_enabled",
    "torch.backends.cuda.matmul.allow_tf32": "_get_cublas_allow_tf32",
    "torch.backends.cudnn.enabled": "_get_cudnn_enabled",
    "torch.backends.cudnn.deterministic": "_get_cudnn_deterministic",
    "torch.backends.cudnn.benchmark": "_get_cudnn_benchmark",
    "torch.backends.cudnn.allow_tf32": "_get_cudnn_allow_tf32",
    "torch.utils.deterministic.fill_uninitialized_memory": (
        "_get_deterministic_fill_uninitialized_memory"
    ),
}


def _deterministic(enabled: bool) -> None:
    torch.use_deterministic_algorithms(
        enabled, warn_only=torch.is_deterministic_algorithms_warn_only_enabled()
    )


def _deterministic_warn_only(warn_only: bool) -> None:
    torch.use_deterministic_algorithms(
        torch.are_deterministic_algorithms_enabled(), warn_only=warn_only
    )


class Switch:
    """A setting as the guard sets it to run an op again under the forward's value: ``put``
    a value its getter returned, ``state`` and ``restore`` what it is now, exactly."""

    def __init__(self, get: Callable[[], Any], put: Callable[[Any], None]) -> None:
        self.get, self.put = get, put

    def state(self) -> Any:
        return self.get()

    def restore(self, state: Any) -> None:
        self.put(state)


# (backend, op) pairs of torch's per-backend float32 precision (torch.backends.*.fp32_precision)
_PRECISION_SLOTS = tuple(
    (backend, op)
    for backend in ("generic", "cuda", "cudnn", "mkldnn")
    for op in ("all", "matmul", "conv", "rnn")
)


def _precision_slots() -> list[tuple[str, str]]:
    getter = getattr(torch._C, "_get_fp32_precision_getter", None)
    if getter is None:
        return []
    found = []
    for backend, op in _PRECISION_SLOTS:
        try:
            getter(backend, op)
        except RuntimeError:  # a backend this build does not have
            continue
        found.append((backend, op))
    return found


class _Precision(Switch):
    """The float32 matmul precision: torch keeps the legacy level and a precision per backend
    (setting one through the other's API leaves them mixed, when the legacy getter raises).
    Its value is the legacy level, or the per-backend precisions while they are mixed; its
    state is both, restored legacy level first (which resets the backends), then backends."""

    def __init__(self) -> None:
        self.slots = _precision_slots()
        super().__init__(self.value, self.put_value)

    def per_backend(self) -> tuple:
        getter = torch._C._get_fp32_precision_getter
        return tuple(getter(backend, op) for backend, op in self.slots)

    def value(self) -> Any:
        try:
            return torch._C._get_float32_matmul_precision()
        except RuntimeError:  # mixed legacy and per-backend settings
            return self.per_backend()

    def put_value(self, value: Any) -> None:
        if isinstance(value, str):
            torch.set_float32_matmul_precision(value)
        else:
            self._put_backends(value)

    def state(self) -> Any:
        legacy = self.value()
        return (legacy if isinstance(legacy, str) else None, self.per_backend())

    def restore(self, state: Any) -> None:
        legacy, backends = state
        if legacy is not None:
            torch._C._set_float32_matmul_precision(legacy)
        self._put_backends(backends)

    def _put_backends(self, values: tuple) -> None:
        setter = torch._C._set_fp32_precision_setter
        for (backend, op), value in zip(self.slots, values, strict=True):
            setter(backend, op, value)


def _flag(owner: Any, name: str) -> Switch:
    return Switch(lambda: getattr(owner, name), lambda value: setattr(owner, name, value))


def setting_switches() -> dict[str, Switch]:
    """How to put a setting (named as in ``_torch_state_getters``) back to a value, to run an
    op again under the forward's settings; the default dtype and device are judged otherwise."""
    backends = torch.backends
    cuda = backends.cuda
    switches: dict[str, Switch] = {
        "torch.get_float32_matmul_precision()": _Precision(),
        "torch.are_deterministic_algorithms_enabled()": Switch(
            torch.are_deterministic_algorithms_enabled, _deterministic
        ),
        "torch.is_deterministic_algorithms_warn_only_enabled()": Switch(
            torch.is_deterministic_algorithms_warn_only_enabled, _deterministic_warn_only
        ),
        "torch.backends.cuda.flash_sdp_enabled()": Switch(
            cuda.flash_sdp_enabled, cuda.enable_flash_sdp
        ),
        "torch.backends.cuda.mem_efficient_sdp_enabled()": Switch(
            cuda.mem_efficient_sdp_enabled, cuda.enable_mem_efficient_sdp
        ),
        "torch.backends.cuda.math_sdp_enabled()": Switch(
            cuda.math_sdp_enabled, cuda.enable_math_sdp
        ),
    }
    if hasattr(cuda, "enable_cudnn_sdp"):
        switches["torch.backends.cuda.cudnn_sdp_enabled()"] = Switch(
            cuda.cudnn_sdp_enabled, cuda.enable_cudnn_sdp
        )
    for label, owner, attribute in _backend_flags(cuda=True):
        switches[label] = _flag(owner, attribute)
    for label, (getter, setter, _) in C_SETTINGS.items():
        get, put = getattr(torch._C, getter, None), getattr(torch._C, setter, None)
        if get is not None and put is not None:
            switches[label] = Switch(get, put)
    return switches


@dataclass(frozen=True)
class Torch:
    """The resolved hook points and facts of the running torch."""

    checkpoint_function: Any  # torch.utils.checkpoint.CheckpointFunction (reentrant)
    generators: tuple[tuple[Any, str, Any], ...]  # (owner module, name, generator) to wrap
    checkpoint_error: type[Exception]  # torch.utils.checkpoint.CheckpointError
    stop_recomputation_error: type[Exception]  # raised by an early-stopped non-reentrant recompute
    checkpoint_frame: Any  # _CheckpointFrame, whose saved-tensor check we explain
    infer_device_type: Callable[..., str]
    top_saved_tensors_hooks: Callable[[], Any]
    global_hook_dicts: tuple[tuple[str, dict], ...]
    register_forward_pre_hook: Callable[..., Any]
    torch_state: tuple[tuple[str, Callable[[], Any]], ...]
    default_device: Callable[[], Any] | None
    privateuse1_name: Callable[[], str]
    is_compiling: Callable[[], bool]
    module_call_codes: tuple  # code of nn.Module's __call__ path, found on the stack
    graph_task_id: Callable[[], int]  # the running backward pass on this thread, -1 if none


_resolved: Torch | None = None


def _version() -> tuple[int, int]:
    release = torch.__version__.split("+")[0].split(".")
    try:
        return int(release[0]), int(release[1])
    except (IndexError, ValueError):
        return MINIMUM_TORCH


def _floor() -> str:
    return ".".join(map(str, MINIMUM_TORCH))


def _require(owner: Any, name: str, where: str) -> Any:
    value = getattr(owner, name, None)
    if value is None:
        raise compatibility_error(torch.__version__, f"{where}.{name}", _floor())
    return value


def _generators() -> tuple[tuple[Any, str, Any], ...]:
    found = [
        (torch_checkpoint, name, getattr(torch_checkpoint, name))
        for name in GENERATOR_NAMES
        if getattr(torch_checkpoint, name, None) is not None
    ]
    if not found:
        raise compatibility_error(
            torch.__version__,
            "torch.utils.checkpoint._checkpoint_without_reentrant_generator",
            _floor(),
        )
    for _, name, original in found:
        if "args" not in inspect.signature(original).parameters:
            raise compatibility_error(
                torch.__version__, f"torch.utils.checkpoint.{name}(fn, ..., args, ...)", _floor()
            )
    if torch.distributed.is_available():
        try:
            __import__(COMPOSABLE_MODULE)
        except ImportError:
            pass
        else:
            composable = sys.modules[COMPOSABLE_MODULE]
            found += [
                (composable, name, getattr(composable, name))
                for name in GENERATOR_NAMES
                if getattr(composable, name, None) is not None
            ]
    return tuple(found)


def require_release() -> None:
    """Refuse a torch below the floor, before the guard's layers import what older torch lacks
    (torch 2.4 has no ``CheckpointPolicy``: importing them would raise a bare ImportError)."""
    if _version() < MINIMUM_TORCH:
        raise compatibility_error(torch.__version__, f"torch>={_floor()}", _floor())


def resolve() -> Torch:
    """Look up every hook point once; raise a clear error if this torch lacks one."""
    global _resolved
    if _resolved is not None:
        return _resolved
    require_release()
    where = "torch.utils.checkpoint"
    autograd = torch._C._autograd
    compiler = getattr(torch, "compiler", None)
    is_compiling = getattr(compiler, "is_compiling", None) or (lambda: False)
    _resolved = Torch(
        checkpoint_function=_require(torch_checkpoint, "CheckpointFunction", where),
        generators=_generators(),
        checkpoint_error=_require(torch_checkpoint, "CheckpointError", where),
        stop_recomputation_error=_require(torch_checkpoint, "_StopRecomputationError", where),
        checkpoint_frame=_require(torch_checkpoint, "_CheckpointFrame", where),
        infer_device_type=_require(torch_checkpoint, "_infer_device_type", where),
        top_saved_tensors_hooks=functools.partial(
            _require(autograd, "_top_saved_tensors_default_hooks", "torch._C._autograd"), False
        ),
        global_hook_dicts=tuple(
            (name, _require(module_internals, name, "torch.nn.modules.module"))
            for name in GLOBAL_HOOK_DICTS
        ),
        register_forward_pre_hook=_require(
            module_internals, "register_module_forward_pre_hook", "torch.nn.modules.module"
        ),
        torch_state=tuple(_torch_state_getters()),
        default_device=getattr(torch, "get_default_device", None),
        privateuse1_name=_require(torch._C, "_get_privateuse1_backend_name", "torch._C"),
        is_compiling=is_compiling,
        module_call_codes=tuple(
            _require(torch.nn.Module, name, "torch.nn.Module").__code__
            for name in ("_call_impl", "_wrapped_call_impl")
        ),
        graph_task_id=_require(torch._C, "_current_graph_task_id", "torch._C"),
    )
    _require(
        _resolved.checkpoint_frame, "check_recomputed_tensors_match", f"{where}._CheckpointFrame"
    )
    derive_from_checkpoint_error(_resolved.checkpoint_error)
    return _resolved


def torch_dir() -> str:
    return TORCH_DIR


# the global forward pre-hooks and forward hooks (dicts torch never replaces); resolve()
# checks that they exist
GLOBAL_FORWARD_HOOKS: tuple[dict, dict] = (
    getattr(module_internals, GLOBAL_HOOK_DICTS[0], {}),
    getattr(module_internals, GLOBAL_HOOK_DICTS[1], {}),
)


def hook_handles_made() -> int:
    """How many hook handles torch has made in this process (its counter of handle ids)."""
    return torch.utils.hooks.RemovableHandle.next_id


def compiled_by_dynamo(value: Any) -> bool:
    """Whether ``torch.compile`` made ``value``: an ``OptimizedModule`` (``torch.compile(m)``),
    a module compiled in place (``m.compile()``), or a compiled function. A dispatch mode makes
    compiled code fall back to eager kernels (other ops, saved in another order), so strict
    mode logs no ops where a region runs it. Read from the object's own dict, running none of
    its code."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    if eval_frame is None:  # never imported: nothing was compiled
        return False
    optimized = getattr(eval_frame, "OptimizedModule", None)
    if optimized is not None and issubclass(type(value), optimized):
        return True
    try:
        state = object.__getattribute__(value, "__dict__")
    except Exception:
        return False
    if type(state) is not dict:
        return False
    return state.get("_compiled_call_impl") is not None or "_torchdynamo_orig_callable" in state


def is_fsdp2_module(module: torch.nn.Module) -> bool:
    return any(cls.__name__ == "FSDPModule" for cls in type(module).__mro__)


def fsdp2_in_use() -> bool:
    """Whether any module was handed to FSDP2 (or another composable API) in this process."""
    registry = sys.modules.get(FSDP_STATE_MODULE)
    return bool(registry is not None and getattr(registry, "_module_state_mapping", None))


def fsdp2_managed_modules() -> set[int]:
    """ids of modules whose parameters FSDP2 swaps between sharded and unsharded on purpose,
    from FSDP2's own state registry (empty when FSDP2 was never imported)."""
    registry = sys.modules.get(FSDP_STATE_MODULE)
    if registry is None:
        return set()
    managed: set[int] = set()
    for entry in list(getattr(registry, "_module_state_mapping", {}).values()):
        state = entry() if isinstance(entry, weakref.ref) else entry
        group = getattr(state, "_fsdp_param_group", None)
        for fsdp_param in getattr(group, "fsdp_params", ()):
            info = getattr(fsdp_param, "_module_info", None)
            if info is not None:
                managed.add(id(info.module))
                managed.update(id(m) for m in getattr(info, "shared_modules", ()))
    return managed


# ------------------------------------- DDP and selective checkpointing (issue 20), optional

_DDP_CLASS: Any = getattr(getattr(torch.nn, "parallel", None), "DistributedDataParallel", None)
# set by DistributedDataParallel around its module's forward (for TorchDynamo); a torch without
# it runs no DDP check (nothing else tells a region that it runs inside a DDP step)
_TRACKS_ACTIVE_DDP = _DDP_CLASS is not None and hasattr(_DDP_CLASS, "_active_ddp_module")


def active_ddp() -> Any:
    """The ``DistributedDataParallel`` whose forward is running on this process, or None."""
    return _DDP_CLASS._active_ddp_module if _TRACKS_ACTIVE_DDP else None


@dataclass(frozen=True)
class SelectiveModes:
    """Selective checkpointing's two dispatch modes, as ``create_selective_checkpoint_contexts``
    makes them: the forward's calls the policy and fills ``storage`` (op -> call index ->
    ``_VersionWrapper`` of the saved output, or a marker to recompute; a list per op up to
    2.12); the recompute's takes the saved outputs (and, up to 2.12, calls the policy again:
    it then has a ``policy_fn``)."""

    caching: type[Any]  # _CachingTorchDispatchMode
    cached: type[Any]  # _CachedTorchDispatchMode
    version_wrapper: type  # _VersionWrapper: .val, and .version as it was when saved


_SELECTIVE_NAMES = ("_CachingTorchDispatchMode", "_CachedTorchDispatchMode", "_VersionWrapper")
_selective_found: list[Any] = [getattr(torch_checkpoint, name, None) for name in _SELECTIVE_NAMES]
_SELECTIVE = SelectiveModes(*_selective_found) if all(_selective_found) else None


# The ops torch's selective-checkpoint modes run without asking the policy (detach and the
# size, stride and device queries): a policy that names one never saves anything by it.
SAC_IGNORED_OPS: frozenset = frozenset(getattr(torch_checkpoint, "SAC_IGNORED_OPS", ()))


def selective_modes() -> SelectiveModes | None:
    """None on a torch without them: its selective-checkpoint regions get no policy checks."""
    return _SELECTIVE


def reentrant_backward_node() -> type:
    """The autograd node type of a reentrant region (``CheckpointFunction``'s backward)."""
    return resolve().checkpoint_function._backward_cls


# the op objects torch hands a selective-checkpoint policy, and the namespaces that build them
OP_OVERLOAD_TYPES = (torch._ops.OpOverload, torch._ops.HigherOrderOperator)
OP_PACKET_TYPE = torch._ops.OpOverloadPacket
OP_NAMESPACE_TYPES = (torch._ops._Ops, torch._ops._OpNamespace, torch._ops.OpOverloadPacket)
