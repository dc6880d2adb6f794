"""ckptguard: runtime guard for torch.utils.checkpoint.

``ckptguard.enable()`` fingerprints every checkpointed region at its forward and verifies the
fingerprint when backward recomputes the region, raising ``CheckpointMismatchError`` that names
what changed. Importing ckptguard does not import torch; ``enable()`` does.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

from ckptguard.errors import (
    CheckpointGuardWarning,
    CheckpointMismatchError,
    CheckpointMismatchWarning,
)

__all__ = [
    "CheckpointGuardWarning",
    "CheckpointMismatchError",
    "CheckpointMismatchWarning",
    "disable",
    "enable",
    "guard",
    "is_enabled",
]

_ON_MISMATCH = ("raise", "warn")


def _load_intercept():
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            "ckptguard needs PyTorch >= 2.4; install it (pip install 'ckptlint[guard]')"
        ) from exc
    import ckptguard._intercept as intercept

    return intercept


def enable(*, strict: bool = False, on_mismatch: str = "raise", report: bool = False) -> None:
    """Guard every checkpointed region in the process from now on; enabling twice is harmless."""
    if on_mismatch not in _ON_MISMATCH:
        raise ValueError(f"on_mismatch must be one of {_ON_MISMATCH}, got {on_mismatch!r}")
    intercept = _load_intercept()
    intercept.install(intercept.Options(strict=strict, on_mismatch=on_mismatch, report=report))


def disable() -> None:
    """Restore torch.utils.checkpoint exactly as it was before ``enable()``."""
    intercept = sys.modules.get("ckptguard._intercept")
    if intercept is not None:
        intercept.uninstall()


def is_enabled() -> bool:
    intercept = sys.modules.get("ckptguard._intercept")
    return intercept is not None and intercept.current_options() is not None


@contextlib.contextmanager
def guard(
    *, strict: bool = False, on_mismatch: str = "raise", report: bool = False
) -> Iterator[None]:
    """Enable the guard inside the block, then restore whatever was in force before."""
    intercept = _load_intercept()
    previous = intercept.current_options()
    enable(strict=strict, on_mismatch=on_mismatch, report=report)
    try:
        yield
    finally:
        if previous is None:
            disable()
        else:
            intercept.install(previous)
