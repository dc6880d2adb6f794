"""Memos the analysis keeps for the life of the process, registered in one place.

Each memo keeps the parsed bodies its entries were computed from (so that their ids are
never reused while an entry lives), and through them the whole project they belong to. A
command-line run ends with its process, but a long-lived one does not: the language server
after each run, and the test run after each test, drop them with ``clear_memos``, or every
project ever linted would stay in memory.
"""

from __future__ import annotations

from typing import Any

_MEMOS: list[dict[Any, Any]] = []


def process_memo() -> dict[Any, Any]:
    """A new memo, emptied by ``clear_memos``."""
    memo: dict[Any, Any] = {}
    _MEMOS.append(memo)
    return memo


def clear_memos() -> None:
    """Empty every memo: what they hold is computed again when asked for."""
    for memo in _MEMOS:
        memo.clear()
