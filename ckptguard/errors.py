"""Errors and warnings raised by ckptguard; importable without torch."""

from __future__ import annotations

from typing import Any

MISMATCH_KINDS = (
    "function",
    "global",
    "closure",
    "attribute",
    "training",
    "tensor",
    "placement",
    "rng_device",
    "values",
)


class CheckpointMismatchError(RuntimeError):
    """A checkpointed region's recompute would differ from its forward.

    ``kind`` is one of ``MISMATCH_KINDS``, ``region`` names the region's function and
    where it is defined, ``details`` holds the machine-readable facts (name, old, new, ...).
    """

    def __init__(self, message: str, *, kind: str, region: str, details: dict[str, Any]):
        super().__init__(message)
        self.kind = kind
        self.region = region
        self.details = details


class CheckpointMismatchWarning(UserWarning):
    """Issued instead of ``CheckpointMismatchError`` when ``on_mismatch="warn"``."""


class CheckpointGuardWarning(UserWarning):
    """A checkpoint call that works but will not do what its author likely wants."""


def abbreviate(value: Any, limit: int = 60) -> str:
    """Short repr for messages: long reprs are cut in the middle so both ends stay readable."""
    try:
        text = repr(value)
    except Exception:  # a broken __repr__ must not hide the real error
        text = f"<{type(value).__name__} object>"
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    keep = (limit - 5) // 2
    return f"{text[:keep]} ... {text[-keep:]}"
