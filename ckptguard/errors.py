"""Errors and warnings raised by ckptguard; importable without torch."""

from __future__ import annotations

import re
from typing import Any

MISMATCH_KINDS = (
    "function",
    "global",
    "closure",
    "attribute",
    "hook",
    "training",
    "tensor",
    "argument",
    "placement",
    "torch_state",
    "rng_device",
    "values",
    "saved_tensors",
    "selective_policy",
    "selective_cache",
)
GUARD_KINDS = ("side_effect", "lost_gradients", "ddp_reentrant", "iterator")


class CheckpointGuardError(RuntimeError):
    """Base of ckptguard's errors: ``kind`` names what was found, ``region`` the checkpointed
    region (its module path and function), ``details`` holds the machine-readable facts."""

    def __init__(self, message: str, *, kind: str, region: str, details: dict[str, Any]):
        super().__init__(message)
        self.kind = kind
        self.region = region
        self.details = details


class CheckpointMismatchError(CheckpointGuardError):
    """A checkpointed region's recompute differs (or would differ) from its forward.

    ``kind`` is one of ``MISMATCH_KINDS``. Once the guard is enabled this class is also a
    subclass of torch's ``torch.utils.checkpoint.CheckpointError`` (added by
    ``derive_from_checkpoint_error``: importing ckptguard does not import torch), so
    ``except CheckpointError`` keeps matching where the guard explains torch's error.
    """


def derive_from_checkpoint_error(checkpoint_error: type) -> None:
    """Make ``CheckpointMismatchError`` a subclass of torch's ``CheckpointError`` (a plain
    ``RuntimeError`` subclass, so the two bases share one layout)."""
    if not issubclass(CheckpointMismatchError, checkpoint_error):
        CheckpointMismatchError.__bases__ = (CheckpointGuardError, checkpoint_error)


class RecomputeSideEffectError(CheckpointGuardError):
    """Kept so that code catching it still imports: the guard no longer raises it. A
    recompute's second update of module state is a ``CheckpointGuardWarning`` in every mode
    (strict mode raises only where the tensors backward uses differ, kind ``values``)."""


class LostGradientsError(CheckpointGuardError):
    """``on_lost_gradients="raise"``: parameters of a reentrant region get no gradient
    (kind ``lost_gradients``)."""


class ReentrantDDPError(CheckpointGuardError):
    """A parameter of a ``use_reentrant=True`` region would get (or got) its gradient in two
    backward passes of one ``DistributedDataParallel`` step (kind ``ddp_reentrant``): raised
    at the forward where DDP would average it wrongly without a word, and in place of DDP's
    "Expected to mark a variable ready only once" (kept as ``__cause__``)."""


class CheckpointGuardCompatibilityError(RuntimeError):
    """This torch lacks a hook point the guard needs; nothing would be guarded."""


def compatibility_error(
    version: str, missing: str, floor: str
) -> CheckpointGuardCompatibilityError:
    """This torch (``version``) lacks ``missing``; the guard supports torch >= ``floor``."""
    return CheckpointGuardCompatibilityError(
        f"ckptguard cannot guard checkpoints on torch {version}: it needs {missing}, which this "
        f"version lacks. Regions would run unguarded, so enable() refuses. ckptguard supports "
        f"torch>={floor}; please report this torch version."
    )


class CheckpointMismatchWarning(UserWarning):
    """Issued instead of ``CheckpointMismatchError`` when ``on_mismatch="warn"``."""


class CheckpointGuardWarning(UserWarning):
    """A checkpoint call that works but will not do what its author likely wants: parameters
    that will get no gradient, or a recompute that updates module state a second time."""


_ADDRESS = re.compile(r" (?:object )?at 0x[0-9a-fA-F]+")


def without_addresses(text: str) -> str:
    """``<Config object at 0x7f...>`` as ``<Config object>``: an address tells the user
    nothing, and differs between runs."""
    return _ADDRESS.sub(lambda found: " object" if "object" in found.group() else "", text)


def abbreviate(value: Any, limit: int = 60) -> str:
    """Short repr for messages, without memory addresses: long reprs are cut in the middle so
    both ends stay readable."""
    try:
        text = repr(value)
    except Exception:  # a broken __repr__ must not hide the real error
        text = f"<{type(value).__name__} object>"
    text = " ".join(without_addresses(text).split())
    if len(text) <= limit:
        return text
    keep = (limit - 5) // 2
    return f"{text[:keep]} ... {text[-keep:]}"
