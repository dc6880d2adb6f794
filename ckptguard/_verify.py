"""Compare a region's forward fingerprint with what it would read now, and explain the change."""

from __future__ import annotations

import functools
import types
import warnings
from typing import Any

import torch

from ckptguard._fingerprint import (
    Label,
    LooseTensorFP,
    TensorFP,
    code_location,
    function_name,
    readable_tensor_fp,
    unwrap_function,
)
from ckptguard.errors import CheckpointMismatchError, CheckpointMismatchWarning, abbreviate

_FIXES = {
    "function": (
        "patch or replace code (forward, __code__, monkeypatches) before the forward pass or "
        "after backward, never between them"
    ),
    "global": (
        "do not rebind or mutate this global between forward and backward; pass the value to "
        "the region as an argument, or read it once outside the region"
    ),
    "closure": (
        "the region closes over a variable that was rebound after the forward (often a loop "
        "variable: late binding); bind the value now with functools.partial(fn, name=value) "
        "or a default argument"
    ),
    "attribute": (
        "change module attributes only after backward (e.g. after optimizer.step()), or pass "
        "the value to the region as an input"
    ),
    "training": (
        "switch train()/eval() only between steps, not between forward and backward; run "
        "evaluation passes under torch.no_grad()"
    ),
    "tensor": (
        "update parameters, buffers and inputs (optimizer.step(), load_state_dict, in-place "
        "writes, assignment) only after backward"
    ),
    "placement": "move or cast the model (.to(), .double(), .half()) only between steps",
}


def describe_region(fn: Any) -> str:
    """Qualified name and file:line of the function a checkpoint region runs."""
    target = fn
    while isinstance(target, functools.partial):
        target = target.func
    if isinstance(target, torch.nn.Module):
        forward = target.__dict__.get("forward") or type(target).forward
        source = unwrap_function(forward) or forward
        return f"{type(target).__qualname__}.forward ({code_location(source.__code__)})"
    if isinstance(target, types.MethodType):
        owner = target.__self__
        if isinstance(owner, torch.nn.Module) and target.__func__.__name__ in (
            "__call__",
            "_wrapped_call_impl",
        ):
            return describe_region(owner)
        target = target.__func__
    target = unwrap_function(target) or target
    code = getattr(target, "__code__", None)
    return f"{function_name(target)} ({code_location(code)})"


def _describe_value(value: Any) -> str:
    value = readable_tensor_fp(value) or value
    if isinstance(value, TensorFP):
        return (
            f"tensor {tuple(value.shape)} {value.dtype} on {value.device} (version {value.version})"
        )
    if isinstance(value, LooseTensorFP):
        return f"tensor {tuple(value.shape)} {value.dtype} on {value.device}"
    if isinstance(value, types.CodeType):
        name = getattr(value, "co_qualname", value.co_name)
        return f"code of {name} ({code_location(value)})"
    if isinstance(value, types.FunctionType):
        return f"function {function_name(value)} ({code_location(value.__code__)})"
    if isinstance(value, tuple) and len(value) == 3 and value[0] == "id":
        return f"{value[2]} object at {value[1]:#x}"
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], type):
        return f"{value[0].__name__} with shallow content {abbreviate(value[1])}"
    return abbreviate(value)


def _tensor_change(old: Any, new: Any) -> tuple[str, str]:
    """Refine a tensor mismatch into (kind, what happened)."""
    if old is None or new is None or type(old) is not type(new):
        return "tensor", "set, removed or replaced"
    if old.dtype != new.dtype or old.device != new.device:
        return "placement", (
            f"moved or cast from {old.dtype} on {old.device} to {new.dtype} on {new.device}"
        )
    if isinstance(old, LooseTensorFP):
        return "tensor", f"reshaped from {tuple(old.shape)} to {tuple(new.shape)}"
    if old.ident != new.ident:
        return "tensor", "replaced by a different tensor object"
    if old.shape != new.shape:
        return "tensor", f"resized from {tuple(old.shape)} to {tuple(new.shape)}"
    if old.version != new.version:
        return "tensor", (
            f"modified in place (version counter {old.version} -> {new.version}, e.g. an "
            "optimizer step or a .copy_/.add_)"
        )
    return "tensor", "its storage was swapped (.data = ... or set_())"


def build_error(
    region: str, label: Label, old: Any, new: Any, extra: str = ""
) -> CheckpointMismatchError:
    kind = label.kind
    old_tensor, new_tensor = readable_tensor_fp(old), readable_tensor_fp(new)
    if old_tensor is not None or new_tensor is not None:
        kind, change = _tensor_change(old_tensor, new_tensor)
        what = f"{label.name} ({label.where}) was {change}"
    else:
        what = f"{label.name} ({label.where}) changed"
    old_text, new_text = _describe_value(old), _describe_value(new)
    message = (
        f"ckptguard [{kind}]: checkpointed region {region} would be recomputed differently "
        f"from its forward pass.\n"
        f"  what changed: {what}{extra}\n"
        f"  forward saw:  {old_text}\n"
        f"  now:          {new_text}\n"
        f"  effect: backward reruns the region with the new state, so its gradients belong to a "
        f"different computation than the forward's output; plain PyTorch does not notice.\n"
        f"  how to fix: {_FIXES[kind]}."
    )
    details = {"name": label.name, "where": label.where, "old": old_text, "new": new_text}
    return CheckpointMismatchError(message, kind=kind, region=region, details=details)


def report(error: CheckpointMismatchError, on_mismatch: str) -> None:
    if on_mismatch == "warn":
        warnings.warn(str(error), CheckpointMismatchWarning, stacklevel=3)
    else:
        raise error


def first_difference(old: list, new: list) -> int:
    for index, (a, b) in enumerate(zip(old, new, strict=False)):
        if a is not b and a != b:
            return index
    return min(len(old), len(new))
