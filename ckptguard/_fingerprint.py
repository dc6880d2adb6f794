"""Fingerprints of what a checkpointed region reads, taken after its forward.

Everything expensive (walking code objects, listing a module tree's parameters and plain
attributes) happens once per code object or module and is cached as a *plan*; a fingerprint
is then a flat list of cheap values read through the plan, so verifying it at recompute is a
single list comparison. Plans also carry one label per value, used only to explain a mismatch.
Fingerprints hold no strong reference to any tensor: tensors are recorded by ``id``, version
counter, data pointer, shape, dtype and device.
"""

from __future__ import annotations

import dis
import functools
import inspect
import os
import sys
import types
import weakref
from typing import Any, NamedTuple

import torch

_SCALAR_TYPES = frozenset({int, float, bool, str, bytes, complex, type(None)})
_SMALL_CONTAINER = 16
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_MODULE_INTERNALS = frozenset(torch.nn.Module().__dict__) | {"forward"}


class _Missing:
    """Placeholder for a name or attribute that does not exist when read."""

    def __repr__(self) -> str:
        return "<unset>"


MISSING = _Missing()


class Label(NamedTuple):
    """What one fingerprint value stands for: mismatch kind, name, and where it lives."""

    kind: str
    name: str
    where: str


class _Marker:
    """First element of a plain-tuple tensor fingerprint (tuples are cheaper than classes)."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


TENSOR = _Marker("tensor")
LOOSE_TENSOR = _Marker("loose tensor")


class TensorFP(NamedTuple):
    """Readable view of ``(TENSOR, id, version, data_ptr, dtype, device, shape)``."""

    ident: int
    version: int
    data_ptr: int
    dtype: torch.dtype
    device: torch.device
    shape: tuple


class LooseTensorFP(NamedTuple):
    """Readable view of ``(LOOSE_TENSOR, dtype, device, shape)``: for tensors whose object and
    storage change on purpose (FSDP2 parameters)."""

    dtype: torch.dtype
    device: torch.device
    shape: tuple


def tensor_fp(t: Any) -> Any:
    if t is None:
        return None
    try:
        ptr = t.data_ptr()
    except RuntimeError:  # wrapper subclasses (DTensor, fake devices) have no storage
        ptr = -1
    return (TENSOR, id(t), t._version, ptr, t.dtype, t.device, t.shape)


def tensor_fp_unversioned(t: Any) -> Any:
    """Buffers of training modules (running stats) are rewritten by every forward on purpose."""
    if t is None:
        return None
    return (TENSOR, id(t), -1, -1, t.dtype, t.device, t.shape)


def loose_tensor_fp(t: Any) -> Any:
    if t is None:
        return None
    return (LOOSE_TENSOR, t.dtype, t.device, t.shape)


def input_fp(t: Any) -> Any:
    """Recompute receives detached copies of inputs: compare storage and version, not object."""
    try:
        ptr = t.data_ptr()
    except RuntimeError:
        ptr = -1
    return (TENSOR, 0, t._version, ptr, t.dtype, t.device, t.shape)


def readable_tensor_fp(value: Any) -> TensorFP | LooseTensorFP | None:
    """The named view of a tensor fingerprint, or None if ``value`` is not one."""
    if type(value) is tuple and value:
        if value[0] is TENSOR:
            return TensorFP(*value[1:])
        if value[0] is LOOSE_TENSOR:
            return LooseTensorFP(*value[1:])
    return None


def _shallow_fp(value: Any) -> Any:
    if type(value) in _SCALAR_TYPES:
        return value
    if isinstance(value, torch.Tensor):
        return tensor_fp(value)
    return ("id", id(value), type(value).__qualname__)


def value_fp(value: Any) -> Any:
    """Scalars by value, tensors by metadata, small containers by shallow content, else identity."""
    kind = type(value)
    if kind in _SCALAR_TYPES:
        return value
    if isinstance(value, torch.Tensor):
        return tensor_fp(value)
    if kind in (list, tuple) and len(value) <= _SMALL_CONTAINER:
        return (kind, tuple([_shallow_fp(v) for v in value]))
    if kind is dict and len(value) <= _SMALL_CONTAINER:
        return (dict, tuple([(k, _shallow_fp(v)) for k, v in value.items()]))
    if kind in (set, frozenset) and len(value) <= _SMALL_CONTAINER:
        return (kind, frozenset([_shallow_fp(v) for v in value]))
    return ("id", id(value), type(value).__qualname__)


def is_torch_code(code: types.CodeType) -> bool:
    return code.co_filename.startswith(_TORCH_DIR)


def code_location(code: Any) -> str:
    if not isinstance(code, types.CodeType):
        return "<no Python code>"
    return f"{code.co_filename}:{code.co_firstlineno}"


def unwrap_function(func: Any) -> types.FunctionType | None:
    """The Python function under any ``functools.wraps`` decorators, or None if there is none."""
    try:
        func = inspect.unwrap(func)
    except ValueError:  # a __wrapped__ cycle
        pass
    return func if isinstance(func, types.FunctionType) else None


def function_name(func: Any) -> str:
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)


# ----------------------------------------------------------------------------- code plans


class CodePlan:
    """Globals a function's code (and same-module helpers it calls) may read, and attributes
    it assigns (``self.calls += 1``, ``self.last = out``): those are its outputs, not inputs."""

    __slots__ = ("code", "global_names", "stored_attributes")

    def __init__(self, func: types.FunctionType):
        self.code = func.__code__
        self.stored_attributes = _stored_attributes(self.code)
        self.global_names = (
            tuple(sorted(_global_names(func))) if not is_torch_code(self.code) else ()
        )


def _stored_attributes(code: types.CodeType) -> frozenset[str]:
    names = set()
    pending = [code]
    while pending:
        current = pending.pop()
        pending.extend(c for c in current.co_consts if isinstance(c, types.CodeType))
        names.update(i.argval for i in dis.get_instructions(current) if i.opname == "STORE_ATTR")
    return frozenset(names)


def _global_names(func: types.FunctionType) -> set[str]:
    namespace = func.__globals__
    names: set[str] = set()
    pending = [func.__code__]
    seen_codes: set[int] = set()
    while pending:
        code = pending.pop()
        if id(code) in seen_codes:
            continue
        seen_codes.add(id(code))
        pending.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
        for name in code.co_names:
            if name not in namespace:
                continue
            value = namespace[name]
            if isinstance(value, types.ModuleType):
                continue
            names.add(name)
            helper = value
            if (
                isinstance(helper, types.FunctionType)
                and helper.__globals__ is namespace
                and id(helper.__code__) not in seen_codes
            ):
                pending.append(helper.__code__)
    return names


_code_plans: dict[tuple[int, int], tuple[types.CodeType, CodePlan]] = {}


def code_plan(func: types.FunctionType) -> CodePlan:
    key = (id(func.__code__), id(func.__globals__))
    cached = _code_plans.get(key)
    if cached is not None and cached[0] is func.__code__:
        return cached[1]
    plan = CodePlan(func)
    _code_plans[key] = (func.__code__, plan)
    return plan


# --------------------------------------------------------------------------- module plans


def _is_fsdp2_module(module: torch.nn.Module) -> bool:
    return any(cls.__name__ == "FSDPModule" for cls in type(module).__mro__)


def _fsdp2_managed_modules() -> set[int]:
    """Modules whose parameters FSDP2 swaps between sharded and unsharded on purpose.

    A region may sit inside an FSDP unit without containing the ``FSDPModule`` itself, so ask
    FSDP2's own state registry which modules own the parameters it manages.
    """
    registry = sys.modules.get("torch.distributed._composable_state")
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


class _ModuleEntry(NamedTuple):
    module: torch.nn.Module
    attr_names: tuple
    param_names: tuple
    buffer_names: tuple
    loose_params: bool
    forward_source: types.FunctionType | None  # forward under its decorators
    forward_plan: CodePlan | None


class ModulePlan:
    """Flat list of a module tree's flags, forwards, plain attributes, params and buffers."""

    __slots__ = ("entries", "labels", "paths", "root_name", "__weakref__")

    def __init__(self, root: torch.nn.Module):
        self.root_name = type(root).__name__
        entries = []
        paths = []
        labels: list[Label] = []
        loose_prefixes: list[str] = []
        fsdp_managed = _fsdp2_managed_modules()
        for name, module in root.named_modules(remove_duplicate=True):
            if _is_fsdp2_module(module):
                loose_prefixes.append(name)
            loose = id(module) in fsdp_managed or any(
                p == "" or name == p or name.startswith(p + ".") for p in loose_prefixes
            )
            path = f"{self.root_name}.{name}" if name else self.root_name
            paths.append(path)
            cls = type(module).__name__
            forward = module.__dict__.get("forward") or type(module).forward
            source = unwrap_function(forward)
            forward_plan = code_plan(source) if source is not None else None
            written = forward_plan.stored_attributes if forward_plan is not None else ()
            attr_names = tuple(
                key
                for key, value in module.__dict__.items()
                if key not in _MODULE_INTERNALS
                and key not in written
                and _is_plain_attribute(value)
            )
            param_names = tuple(module._parameters)
            buffer_names = tuple(module._buffers)
            entries.append(
                _ModuleEntry(
                    module, attr_names, param_names, buffer_names, loose, source, forward_plan
                )
            )
            labels.append(Label("training", f"{path}.training", f"{cls} module"))
            labels.append(Label("function", f"{path}.forward", f"{cls} module"))
            labels.append(Label("function", f"{path}.forward.__code__", f"{cls} module"))
            labels.extend(Label("attribute", f"{path}.{a}", f"{cls} module") for a in attr_names)
            labels.extend(
                Label("tensor", f"{path}.{p}", f"parameter of {cls}") for p in param_names
            )
            labels.extend(Label("tensor", f"{path}.{b}", f"buffer of {cls}") for b in buffer_names)
            if forward_plan is not None:
                where = f"global of {source.__module__}, read by {function_name(source)}"
                labels.extend(Label("global", g, where) for g in forward_plan.global_names)
        self.entries = tuple(entries)
        self.paths = tuple(paths)
        self.labels = tuple(labels)

    def read(self) -> list:
        out: list = []
        add = out.append
        for entry in self.entries:
            module, attr_names, param_names, buffer_names, loose, source, forward_plan = entry
            state = module.__dict__
            training = module.training
            add(training)
            forward = state.get("forward") or type(module).forward
            add(forward)
            add(source.__code__ if source is not None else None)
            for name in attr_names:
                add(value_fp(state.get(name, MISSING)))
            params = state["_parameters"]
            fingerprint = loose_tensor_fp if loose else tensor_fp
            for name in param_names:
                add(fingerprint(params.get(name)))
            buffers = state["_buffers"]
            fingerprint = tensor_fp_unversioned if training else tensor_fp
            for name in buffer_names:
                add(fingerprint(buffers.get(name)))
            if forward_plan is not None:
                namespace = source.__globals__
                for name in forward_plan.global_names:
                    add(value_fp(namespace.get(name, MISSING)))
        return out


def _is_plain_attribute(value: Any) -> bool:
    if type(value) in _SCALAR_TYPES or isinstance(value, torch.Tensor):
        return True
    return type(value) in (tuple, list) and all(type(v) in _SCALAR_TYPES for v in value)


_module_plans: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def module_plan(module: torch.nn.Module) -> ModulePlan:
    plan = _module_plans.get(module)
    if plan is None:
        plan = _module_plans[module] = ModulePlan(module)
    return plan


def cache_sizes() -> dict[str, int]:
    """Sizes of the plan caches; bounded by the number of distinct codes and live modules."""
    return {"code_plans": len(_code_plans), "module_plans": len(_module_plans)}


# ------------------------------------------------------------------------ function segments


class FunctionSegment:
    """A Python function reached by the region: its code, globals it reads, its closure."""

    __slots__ = ("func", "plan", "labels")

    def __init__(self, func: types.FunctionType):
        self.func = func
        self.plan = code_plan(func)
        where = f"global of {func.__module__}, read by {function_name(func)}"
        labels = [
            Label("function", f"{function_name(func)}.__code__", code_location(func.__code__))
        ]
        labels.extend(Label("global", name, where) for name in self.plan.global_names)
        if func.__closure__:
            owner = f"closure of {function_name(func)}"
            labels.extend(Label("closure", name, owner) for name in func.__code__.co_freevars)
        self.labels = labels

    def read(self) -> list:
        func = self.func
        namespace = func.__globals__
        out = [func.__code__]
        out.extend([value_fp(namespace.get(name, MISSING)) for name in self.plan.global_names])
        for cell in func.__closure__ or ():
            try:
                out.append(value_fp(cell.cell_contents))
            except ValueError:  # empty cell
                out.append(MISSING)
        return out


class ModuleSegment:
    __slots__ = ("plan", "labels")

    def __init__(self, module: torch.nn.Module):
        self.plan = module_plan(module)
        self.labels = self.plan.labels

    def read(self) -> list:
        return self.plan.read()


class PartialSegment:
    """Arguments bound by ``functools.partial`` (e.g. ``partial(block, mask=mask)``)."""

    __slots__ = ("partial", "labels")

    def __init__(self, bound: functools.partial):
        self.partial = bound
        owner = f"functools.partial of {function_name(bound.func)}"
        labels = [Label("closure", f"partial argument {i}", owner) for i in range(len(bound.args))]
        labels.extend(Label("closure", f"partial keyword {k}", owner) for k in bound.keywords)
        self.labels = labels

    def read(self) -> list:
        out = [value_fp(v) for v in self.partial.args]
        out.extend([value_fp(v) for v in self.partial.keywords.values()])
        return out


def collect_segments(fn: Any) -> list:
    """Every function, module and bound argument the region's callable reaches."""
    segments: list = []
    seen: set[int] = set()
    _collect(fn, segments, seen)
    return segments


def _collect(fn: Any, segments: list, seen: set[int]) -> None:
    if id(fn) in seen:
        return
    kind = type(fn)
    if kind is not types.MethodType and isinstance(fn, torch.nn.Module):
        _collect_modules(fn, segments, seen)
        return
    seen.add(id(fn))
    if kind is types.FunctionType:
        segments.append(FunctionSegment(fn))
        wrapped = getattr(fn, "__wrapped__", None)
        if wrapped is not None:  # a decorated region: its real body reads the globals
            _collect(wrapped, segments, seen)
        for cell in fn.__closure__ or ():
            try:
                _collect_modules(cell.cell_contents, segments, seen)
            except ValueError:
                pass
    elif kind is types.MethodType:
        _collect_modules(fn.__self__, segments, seen)
        func = fn.__func__
        module_forward = isinstance(fn.__self__, torch.nn.Module) and func.__name__ == "forward"
        if (
            type(func) is types.FunctionType
            and not module_forward
            and not is_torch_code(func.__code__)
        ):
            _collect(func, segments, seen)
    elif kind is functools.partial:
        _collect(fn.func, segments, seen)
        if fn.args or fn.keywords:
            segments.append(PartialSegment(fn))
        for value in (*fn.args, *fn.keywords.values()):
            _collect_modules(value, segments, seen)


def _collect_modules(value: Any, segments: list, seen: set[int]) -> None:
    if isinstance(value, torch.nn.Module):
        if id(value) not in seen:
            seen.add(id(value))
            segments.append(ModuleSegment(value))
    elif type(value) in (list, tuple) and len(value) <= 256:
        for item in value:
            if isinstance(item, torch.nn.Module):
                _collect_modules(item, segments, seen)
