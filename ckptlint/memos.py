"""Memos the analysis keeps for the life of the process, registered in one place.

Each memo keeps the parsed bodies its entries were computed from (so that their ids are
never reused while an entry lives), and through them the whole project they belong to. A
command-line run ends with its process, but a long-lived one does not: the language server
after each run, and the test run after each test, drop them with ``clear_memos``, or every
project ever linted would stay in memory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

_CLEARS: list[Callable[[], None]] = []
Cached = TypeVar("Cached", bound=Callable[..., Any])


def process_memo() -> dict[Any, Any]:
    """A new memo, emptied by ``clear_memos``."""
    memo: dict[Any, Any] = {}
    _CLEARS.append(memo.clear)
    return memo


def process_cache(function: Cached) -> Cached:
    """A ``functools.lru_cache`` function, its cache emptied by ``clear_memos`` (bounded, but
    by entries that can each hold a file's text or 10,000 compiled patterns)."""
    _CLEARS.append(function.cache_clear)  # type: ignore[attr-defined]
    return function


def clear_memos() -> None:
    """Empty every memo and cache: what they hold is computed again when asked for."""
    for clear in _CLEARS:
        clear()
