"""Progress of a plan or a verify (stage and step) on a terminal; quiet elsewhere.

On a terminal (stderr is a tty) one line is rewritten in place, then cleared when the work
ends; elsewhere (CI logs, notebooks' captured streams, files) the same lines go to the
``ckptguard.planner`` logger at DEBUG, which prints nothing unless asked to.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator

logger = logging.getLogger("ckptguard.planner")
_state = {"active": False, "width": 0}


def _terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def progress(stage: str, what: str, step: int | None = None, of: int | None = None) -> None:
    """Report that ``stage`` is doing ``what`` (``step`` of ``of``)."""
    text = f"ckptguard {stage}: {what}" + (f" ({step}/{of})" if step is not None else "")
    logger.debug(text)
    if _state["active"] and _terminal():
        padded = text.ljust(_state["width"])
        _state["width"] = len(text)
        sys.stderr.write("\r" + padded)
        sys.stderr.flush()


@contextlib.contextmanager
def shown() -> Iterator[None]:
    """Progress lines are drawn while inside (nested uses draw one line), then cleared."""
    if _state["active"]:
        yield
        return
    _state["active"], _state["width"] = True, 0
    try:
        yield
    finally:
        if _terminal() and _state["width"]:
            sys.stderr.write("\r" + " " * _state["width"] + "\r")
            sys.stderr.flush()
        _state["active"] = False
