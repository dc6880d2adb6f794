"""ckptguard: runtime guard for torch.utils.checkpoint.

``ckptguard.enable()`` fingerprints every checkpointed region at its forward and verifies the
fingerprint when backward recomputes the region, raising ``CheckpointMismatchError`` that names
what changed. Importing ckptguard does not import torch; ``enable()`` does.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
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
    ReentrantDDPError,
)
from ckptguard.pricing import price

__all__ = [
    "CheckpointGuardCompatibilityError",
    "CheckpointGuardError",
    "CheckpointGuardWarning",
    "CheckpointMismatchError",
    "CheckpointMismatchWarning",
    "LostGradientsError",
    "PlanInfeasibleError",
    "RecomputeSideEffectError",
    "ReentrantDDPError",
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

logger = logging.getLogger("ckptguard")
_ON_MISMATCH = ("raise", "warn")
_ON_LOST_GRADIENTS = ("warn", "raise")
_PLANNER_NAMES = ("plan", "Plan")


def __getattr__(name: str) -> Any:
    """``ckptguard.plan`` / ``ckptguard.Plan``, loaded on first use (import stays light), and
    ``ckptguard.PlanInfeasibleError``, which ``plan()`` raises when no plan fits the budget
    (from the solver, which needs no torch: ``except`` clauses name it before any plan)."""
    if name in _PLANNER_NAMES:
        from ckptguard import planner

        return getattr(planner, name)
    if name == "PlanInfeasibleError":
        from ckptguard.planner.solver import PlanInfeasibleError

        return PlanInfeasibleError
    raise AttributeError(f"module 'ckptguard' has no attribute {name!r}")


def _load_intercept():
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            "ckptguard needs PyTorch >= 2.8: pip install torch (or, from a clone of ckptlint, "
            "pip install -e '.[guard]')"
        ) from exc
    from ckptguard import _compat

    _compat.require_release()
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
    _announce(options)


_announced: set = set()


def _announce(options: Any) -> None:
    """Say once per process and set of options what is guarded and how, through
    ``logging``: the ``ckptguard`` logger at INFO, shown on stderr unless the program
    configured logging (enabling again, or after ``disable()``, says nothing new)."""
    if options in _announced:
        return
    _announced.add(options)
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    mode = (
        "strict mode (fingerprints, and the values backward uses)"
        if options.strict
        else ("default mode (fingerprints of what each region reads)")
    )
    action = "raise CheckpointMismatchError" if options.on_mismatch == "raise" else "warn"
    logger.info(
        "guarding every torch.utils.checkpoint region in this process (use_reentrant=True and "
        "False, checkpoint_sequential, checkpoint_wrapper, composable checkpoint) in %s; "
        "mismatches %s%s",
        mode,
        action,
        "; report mode collects per-region figures" if options.report else "",
    )


ENVIRONMENT = "CKPTGUARD"
_ENVIRONMENT_MODES: dict[str, dict[str, Any]] = {
    "1": {},
    "default": {},
    "strict": {"strict": True},
    "warn": {"on_mismatch": "warn"},
    "report": {"report": True},
}


def options_from_environment(value: str | None = None) -> dict[str, Any] | None:
    """``enable()``'s keywords from ``CKPTGUARD`` (``1``, ``strict``, ``warn``, ``report``,
    or several joined by commas); None when it is unset, empty or ``0``."""
    value = os.environ.get(ENVIRONMENT, "") if value is None else value
    words = [w.strip().lower() for w in value.split(",") if w.strip()]
    if not words or words == ["0"]:
        return None
    options: dict[str, Any] = {}
    for word in words:
        if word not in _ENVIRONMENT_MODES:
            raise ValueError(
                f"{ENVIRONMENT}={value!r}: use 1, strict, warn or report (comma-separated)"
            )
        options.update(_ENVIRONMENT_MODES[word])
    return options


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


def _enable_from_environment() -> None:
    """``CKPTGUARD=1`` (``strict``, ``warn``, ``report``): guard a program that imports
    ckptguard without a change to its code; ``python -m ckptguard script.py`` covers one that
    does not import it."""
    try:
        options = options_from_environment()
    except ValueError as error:
        import warnings

        warnings.warn(f"ckptguard: {error}; the guard stays off", stacklevel=3)
        return
    if options is not None:
        enable(**options)


_enable_from_environment()
