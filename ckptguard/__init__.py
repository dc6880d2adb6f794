"""ckptguard: runtime guard for torch.utils.checkpoint.

``ckptguard.enable()`` fingerprints every checkpointed region at its forward and verifies the
fingerprint when backward recomputes the region, raising ``CheckpointMismatchError`` that names
what changed. Importing ckptguard does not import torch; ``enable()`` does.
"""

from __future__ import annotations

import atexit
import contextlib
import sys
from collections.abc import Iterator
from typing import Any

from ckptguard.errors import (
    CheckpointGuardCompatibilityError,
    CheckpointGuardError,
    CheckpointGuardWarning,
    CheckpointMismatchError,
    CheckpointMismatchWarning,
    LostGradientsError,
    RecomputeSideEffectError,
)
from ckptguard.pricing import price

__all__ = [
    "CheckpointGuardCompatibilityError",
    "CheckpointGuardError",
    "CheckpointGuardWarning",
    "CheckpointMismatchError",
    "CheckpointMismatchWarning",
    "LostGradientsError",
    "RecomputeSideEffectError",
    "disable",
    "enable",
    "guard",
    "is_enabled",
    "plan",
    "Plan",
    "price",
    "profile",
    "region_report",
]

_ON_MISMATCH = ("raise", "warn")
_ON_LOST_GRADIENTS = ("warn", "raise")
_PLANNER_NAMES = ("plan", "Plan")


def __getattr__(name: str) -> Any:
    """``ckptguard.plan`` / ``ckptguard.Plan``, loaded on first use (import stays light)."""
    if name in _PLANNER_NAMES:
        from ckptguard import planner

        return getattr(planner, name)
    raise AttributeError(f"module 'ckptguard' has no attribute {name!r}")


def _load_intercept():
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            "ckptguard needs PyTorch >= 2.4; install it (pip install 'ckptlint[guard]')"
        ) from exc
    import ckptguard._intercept as intercept

    return intercept


def enable(
    *,
    strict: bool = False,
    on_mismatch: str = "raise",
    report: bool = False,
    on_lost_gradients: str = "warn",
) -> None:
    """Guard every checkpointed region in the process from now on; enabling twice is harmless.

    ``strict`` also compares the values backward uses (saved tensors, reentrant outputs) at
    recompute and makes a recompute's side effects an error; ``report`` collects per-region
    memory and recompute figures and prints them as a table when the process exits
    (``region_report()`` returns them as data); ``on_lost_gradients="raise"`` turns the warning
    about parameters a reentrant region leaves without gradient into ``LostGradientsError``.
    Raises ``CheckpointGuardCompatibilityError`` when this torch lacks a hook point.
    """
    if on_mismatch not in _ON_MISMATCH:
        raise ValueError(f"on_mismatch must be one of {_ON_MISMATCH}, got {on_mismatch!r}")
    if on_lost_gradients not in _ON_LOST_GRADIENTS:
        raise ValueError(
            f"on_lost_gradients must be one of {_ON_LOST_GRADIENTS}, got {on_lost_gradients!r}"
        )
    intercept = _load_intercept()
    options = intercept.Options(
        strict=strict, on_mismatch=on_mismatch, report=report, on_lost_gradients=on_lost_gradients
    )
    intercept.install(options)
    if report and not _exit_report_registered:
        _register_exit_report()


_exit_report_registered = False


def _register_exit_report() -> None:
    global _exit_report_registered
    _exit_report_registered = True

    def print_report() -> None:
        intercept = sys.modules.get("ckptguard._intercept")
        if intercept is not None and intercept.collector is not None:
            if intercept.collector.regions:
                print(intercept.collector.table(), file=sys.stderr)

    atexit.register(print_report)


def region_report() -> list[dict]:
    """Report mode's figures so far, one JSON-serialisable dict per region."""
    intercept = sys.modules.get("ckptguard._intercept")
    if intercept is None or intercept.collector is None:
        return []
    return intercept.collector.data()


def disable() -> None:
    """Restore torch.utils.checkpoint exactly as it was before ``enable()``."""
    intercept = sys.modules.get("ckptguard._intercept")
    if intercept is not None:
        intercept.uninstall()


def is_enabled() -> bool:
    intercept = sys.modules.get("ckptguard._intercept")
    return intercept is not None and intercept.current_options() is not None


@contextlib.contextmanager
def profile(
    *, print_table: bool = True, strict: bool = False, on_mismatch: str = "raise"
) -> Iterator[Any]:
    """Guard and measure the regions run inside the block; yields the collector.

    The collector's ``data()`` gives JSON-serialisable per-region figures and ``table()`` the
    text table, printed on exit unless ``print_table=False``.
    """
    intercept = _load_intercept()
    previous_options, previous_collector = intercept.current_options(), intercept.collector
    intercept.collector = collector = intercept.new_collector()
    enable(strict=strict, on_mismatch=on_mismatch, report=True)
    try:
        yield collector
    finally:
        if previous_options is None:
            disable()
        else:
            intercept.install(previous_options)
        intercept.collector = previous_collector
        if print_table:
            print(collector.table())


@contextlib.contextmanager
def guard(
    *,
    strict: bool = False,
    on_mismatch: str = "raise",
    report: bool = False,
    on_lost_gradients: str = "warn",
) -> Iterator[None]:
    """Enable the guard inside the block, then restore whatever was in force before."""
    intercept = _load_intercept()
    previous = intercept.current_options()
    enable(
        strict=strict,
        on_mismatch=on_mismatch,
        report=report,
        on_lost_gradients=on_lost_gradients,
    )
    try:
        yield
    finally:
        if previous is None:
            disable()
        else:
            intercept.install(previous)
