"""Progress of a plan or a verify, wherever its output goes.

While ``shown`` is in force, a plan or a verify announces each stage it enters
(``progress``). On a terminal (stderr is a tty) they draw one progress bar, tqdm's where tqdm
is installed (it is optional), else one line rewritten in place; the bar is cleared when the
work ends. Anywhere else (a log file, CI, a notebook's captured stderr) each stage is one line
on stderr: ``ckptguard measure: profiled step``. ``quiet=True`` shows nothing.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterator
from typing import Any


class _Shown:
    """What one plan or verify draws: a tqdm bar, a line rewritten in place (``width``: the
    longest drawn so far), or a line per stage (``last``: the stage announced last)."""

    __slots__ = ("quiet", "terminal", "tqdm", "bar", "width", "last")

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.terminal = not quiet and _terminal()
        self.tqdm: Any = _tqdm() if self.terminal else None
        self.bar: Any = None
        self.width = 0
        self.last: tuple[str, str] | None = None

    def show(self, stage: str, what: str, step: int | None, of: int | None) -> None:
        text = f"ckptguard {stage}: {what}"
        if self.quiet:
            return
        if self.tqdm is not None:
            self._draw_bar(text, step, of)
        elif self.terminal:
            text += f" ({step}/{of})" if step is not None else ""
            sys.stderr.write("\r" + text.ljust(self.width))
            sys.stderr.flush()
            self.width = max(self.width, len(text))
        elif (stage, what) != self.last:
            self.last = (stage, what)
            times = f", {of} time{'s' if of != 1 else ''}" if of is not None else ""
            sys.stderr.write(f"{text}{times}\n")
            sys.stderr.flush()

    def _draw_bar(self, text: str, step: int | None, of: int | None) -> None:
        """The stage as the bar's description; its steps (``step`` of ``of``) as the bar,
        else the time spent in the stage."""
        shape = _STEPS if of is not None else _STAGE
        bar = self.bar
        if bar is None:
            self.bar = bar = self.tqdm(
                desc=text, total=of, bar_format=shape, file=sys.stderr, leave=False
            )
        elif text != bar.desc:
            bar.set_description_str(text, refresh=False)
            bar.bar_format = shape
            bar.reset(total=of)
        if step is not None:
            bar.n = step
            bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()  # leave=False: the bar is cleared
        elif self.terminal and self.width:
            sys.stderr.write("\r" + " " * self.width + "\r")
            sys.stderr.flush()


_STEPS = "{desc} |{bar}| {n_fmt}/{total_fmt} [{elapsed}]"
_STAGE = "{desc}"
_current: _Shown | None = None


def _terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def _tqdm() -> Any:
    """tqdm's bar class where tqdm is installed (an optional dependency), else None."""
    try:
        return importlib.import_module("tqdm").tqdm
    except ImportError:
        return None


def progress(stage: str, what: str, step: int | None = None, of: int | None = None) -> None:
    """Report that ``stage`` is doing ``what`` (``step`` of ``of``); nothing outside a plan or
    a verify."""
    if _current is not None:
        _current.show(stage, what, step, of)


@contextlib.contextmanager
def shown(quiet: bool = False) -> Iterator[None]:
    """Progress is drawn while inside (a nested use draws into the outer one's), then the bar
    is cleared; ``quiet`` draws nothing."""
    global _current
    if _current is not None:
        yield
        return
    _current = current = _Shown(quiet)
    try:
        yield
    finally:
        _current = None
        current.close()
