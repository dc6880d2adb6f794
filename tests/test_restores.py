"""Which writes a function puts back (``effects.restores``), each form with its twin that
leaves a net change, and the extent each restore lasts for (the ``try``, or the caller's
``with`` block for a ``@contextmanager``)."""

from __future__ import annotations

import ast
import textwrap

import pytest

from ckptlint.effects.restores import restored
from tests.conftest import hang_guard


def restored_lines(source: str) -> dict[int, str]:
    """The line of each write statement or call of the first function that it restores,
    with its extent: ``"try"`` or ``"with"``."""
    function = ast.parse(textwrap.dedent(source)).body[0]
    found: dict[int, str] = {}
    for node in ast.walk(function):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete, ast.Call)):
            extent = restored(function, node)
            if extent is not None:
                found[node.lineno] = "try" if isinstance(extent, ast.Try) else "with"
    return found


CASES = {
    "global saved and assigned back in finally": (
        """
        def run():
            global FAST
            previous = FAST
            FAST = True
            try:
                step()
            finally:
                FAST = previous
        """,
        {5: "try", 9: "try"},
    ),
    "counter increased and decreased": (
        """
        def run():
            global DEPTH
            DEPTH += 1
            try:
                step()
            finally:
                DEPTH -= 1
        """,
        {4: "try", 8: "try"},
    ),
    "counter increased twice, decreased by a multiplication": (
        """
        def run():
            global DEPTH
            DEPTH += 1
            try:
                step()
            finally:
                DEPTH *= 1
        """,
        {},
    ),
    "item written and deleted": (
        """
        def run(key):
            TABLE[key] = 1
            try:
                step()
            finally:
                del TABLE[key]
        """,
        {3: "try", 7: "try"},
    ),
    "item written and popped": (
        """
        def run(key):
            TABLE[key] = 1
            try:
                step()
            finally:
                TABLE.pop(key)
        """,
        {3: "try", 7: "try"},
    ),
    "another item popped": (
        """
        def run(key, other):
            TABLE[key] = 1
            try:
                step()
            finally:
                TABLE.pop(other)
        """,
        {},
    ),
    "pushed and popped": (
        """
        def run(x):
            STACK.append(x)
            try:
                step()
            finally:
                STACK.pop()
        """,
        {3: "try", 7: "try"},
    ),
    "pushed and read in finally": (
        """
        def run(x):
            STACK.append(x)
            try:
                step()
            finally:
                print(STACK[-1])
        """,
        {},
    ),
    "set after a finally that writes first": (
        """
        def run():
            global FAST
            try:
                step()
            finally:
                FAST = False
            FAST = True
        """,
        {},
    ),
    "context manager restoring in finally around its yield": (
        """
        @contextlib.contextmanager
        def fast_path():
            global FAST
            old, FAST = FAST, True
            try:
                yield
            finally:
                FAST = old
        """,
        {5: "with", 9: "with"},
    ),
    "context manager restoring after its yield": (
        """
        @contextmanager
        def scaled(value):
            cfg.SCALE = value
            yield
            cfg.SCALE = 1.0
        """,
        {4: "with", 6: "with"},
    ),
    "a generator that is no context manager": (
        """
        def scaled(value):
            cfg.SCALE = value
            yield
            cfg.SCALE = 1.0
        """,
        {},
    ),
}


@pytest.mark.parametrize(("source", "expected"), CASES.values(), ids=CASES.keys())
def test_restored_writes(source: str, expected: dict[int, str]) -> None:
    assert restored_lines(source) == expected


def test_thousands_of_writes_and_restores_are_matched_in_one_pass() -> None:
    """2,000 ``try``/``finally`` restores of one global, each after its own write, and one
    ``finally`` restoring 2,000 items: each write is matched with the nearest restore after
    it, without comparing every write with every restore."""
    pairs = "".join(
        f"    FAST = {i}\n    try:\n        step()\n    finally:\n        FAST = previous\n"
        for i in range(2000)
    )
    items = "".join(f"    TABLE[{i}] = 1\n" for i in range(2000))
    dropped = "".join(f"        del TABLE[{i}]\n" for i in range(2000))
    source = (
        f"def run(previous):\n    global FAST\n{pairs}"
        f"{items}    try:\n        step()\n    finally:\n{dropped}"
    )
    with hang_guard(60, "matching restores"):
        found = restored_lines(source)
    assert len(found) == 4 * 2000
    assert set(found.values()) == {"try"}
