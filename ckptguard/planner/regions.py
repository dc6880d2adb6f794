"""Turning chosen modules into checkpoint regions, and back.

A region is made by giving the module an instance attribute ``forward`` that runs the class's
forward under ``torch.utils.checkpoint.checkpoint(use_reentrant=False)``. Hooks, the module's
type, its state_dict and its parameters stay exactly as they were (hooks run outside the region,
so a recompute does not run them again); ``remove`` deletes the attribute, which leaves the
module identical to before. Selective regions pass torch's public selective checkpoint contexts
(``create_selective_checkpoint_contexts``) with :func:`selective_policy`: outputs of matmul,
convolution and attention are kept, everything else (norms, activations, dropout, elementwise)
is recomputed.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from ckptguard.planner.memory_model import FULL, SELECTIVE

# Expensive ops whose outputs selective recompute keeps (looked up by name: some exist only on
# some builds or versions).
MUST_SAVE_OP_NAMES = (
    "mm",
    "addmm",
    "bmm",
    "baddbmm",
    "_scaled_mm",
    "convolution",
    "_convolution",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_flash_attention_forward",
    "_efficient_attention_forward",
)


@functools.cache
def must_save_ops() -> frozenset:
    """The overload packets of :data:`MUST_SAVE_OP_NAMES` this torch has."""
    return frozenset(
        getattr(torch.ops.aten, name)
        for name in MUST_SAVE_OP_NAMES
        if hasattr(torch.ops.aten, name)
    )


def selective_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    """Keep matmul / conv / attention outputs, recompute the cheap ops around them."""
    if op.overloadpacket in must_save_ops():
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def _selective_contexts() -> Any:
    return create_selective_checkpoint_contexts(selective_policy)


class CheckpointedForward:
    """The instance ``forward`` of a planned module: its own forward, run as a region."""

    def __init__(self, module: torch.nn.Module, kind: str, previous: Any) -> None:
        self.kind = kind
        self.previous = previous  # an instance ``forward`` that was there before, or None
        self._forward = previous if previous is not None else type(module).forward.__get__(module)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return self._forward(*args, **kwargs)
        if self.kind == SELECTIVE:
            return checkpoint(
                self._forward,
                *args,
                use_reentrant=False,
                context_fn=_selective_contexts,
                **kwargs,
            )
        return checkpoint(self._forward, *args, use_reentrant=False, **kwargs)


def apply_regions(model: torch.nn.Module, choices: Mapping[str, str]) -> dict[str, Any]:
    """Make each chosen module a region; returns what :func:`remove_regions` needs to undo it."""
    modules = _resolve(model, choices)
    for path, module in modules.items():
        if isinstance(module.__dict__.get("forward"), CheckpointedForward):
            raise RuntimeError(f"{path or 'the model'} is already a checkpoint region of a plan")
    undo = _transformers_off(model)
    if undo["flags"]:
        warnings.warn(
            "ckptguard.plan: transformers gradient checkpointing was on; it is switched off "
            "while the plan is applied (plan.remove() switches it back on)",
            stacklevel=3,
        )
    for path, module in modules.items():
        module.forward = CheckpointedForward(module, choices[path], module.__dict__.get("forward"))
    return undo


def remove_regions(
    model: torch.nn.Module, choices: Mapping[str, str], undo: Mapping[str, Any] | None
) -> None:
    """Undo :func:`apply_regions`: the model is left as it was before."""
    for module in _resolve(model, choices).values():
        current = module.__dict__.get("forward")
        if not isinstance(current, CheckpointedForward):
            continue
        if current.previous is None:
            del module.forward
        else:
            module.forward = current.previous
    if undo:
        _transformers_restore(model, undo)


@contextlib.contextmanager
def transformers_as_planned(model: torch.nn.Module) -> Iterator[None]:
    """The model as a plan runs it: transformers' own checkpointing and KV cache off."""
    undo = _transformers_off(model)
    try:
        yield
    finally:
        _transformers_restore(model, undo)


def _transformers_off(model: torch.nn.Module) -> dict[str, Any]:
    """transformers' own gradient checkpointing (the ``gradient_checkpointing`` flags of its
    layers) would nest a second checkpoint in each region: switched off. So is its KV cache
    (``config.use_cache``), as transformers does itself when it checkpoints: a recompute would
    append to the cache again."""
    undo: dict[str, Any] = {"flags": [], "use_cache": False}
    for path, module in model.named_modules():
        if getattr(module, "gradient_checkpointing", False) is True:
            undo["flags"].append(path)
            module.gradient_checkpointing = False
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "use_cache", False) is True:
        undo["use_cache"] = True
        config.use_cache = False
    return undo


def _transformers_restore(model: torch.nn.Module, undo: Mapping[str, Any]) -> None:
    for path in undo["flags"]:
        layer: Any = model.get_submodule(path)  # a transformers layer: a plain attribute
        layer.gradient_checkpointing = True
    if undo["use_cache"]:
        config: Any = model.config
        config.use_cache = True


def is_region(module: torch.nn.Module) -> bool:
    return isinstance(module.__dict__.get("forward"), CheckpointedForward)


def _resolve(model: torch.nn.Module, choices: Mapping[str, str]) -> dict[str, torch.nn.Module]:
    modules = {}
    for path, kind in choices.items():
        if kind not in (FULL, SELECTIVE):
            raise ValueError(f"unknown region kind {kind!r} for {path!r}")
        try:
            modules[path] = model.get_submodule(path)
        except AttributeError as exc:
            raise ValueError(f"the model has no submodule {path!r} named in the plan") from exc
    return modules
