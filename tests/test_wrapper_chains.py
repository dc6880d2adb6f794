"""Wrappers handing ``use_reentrant`` on, at any depth (issue 36): each function is summarised
once and a chain of them is composed level by level, so the call that leaves the keyword
unset has its CKP001 whatever the chain's length or shape, the call that passes it none, and
no limit cuts in (no CKP901).

Chains are generated: 1 to 200 wrappers forwarding ``**kwargs`` straight, each level calling
the next from two places, diamonds (each level calling the next two), and ``use_reentrant``
passed by name; in one module or one module per wrapper (relative imports). A wrapper that
decides the keyword itself (``kwargs.setdefault``) leaves its callers silent. The analysis's
work is bounded without a clock: the answers computed grow linearly with the chain.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptlint.config import Settings
from ckptlint.engine import Engine
from tests.conftest import hang_guard

KINDS = ("straight", "twice", "diamond", "named")
# Only a hang outlives this: a chain of 200 takes a few seconds.
HANG_SECONDS = 300


@dataclass(frozen=True)
class Chain:
    files: dict[str, str]
    caller: str  # the file of ``go``
    line: int  # the line of ``return w0(f, x), w0(f, x, <keyword>=False)``


def chain(kind: str, length: int, *, split: bool, decided_at: int | None = None) -> Chain:
    """``length`` wrappers ``w0``...: ``w{i}`` calls ``w{i+1}`` (and ``w{i+2}`` in a diamond,
    ``w{i+1}`` twice in ``twice``), the last one torch's ``checkpoint``; ``decided_at``: the
    wrapper that sets ``use_reentrant`` itself. ``split``: one module per wrapper."""
    named = kind == "named"
    parameters = "f, x, reentrant=None" if named else "f, x, **kw"

    def call(target: int) -> str:
        if target == length:
            given = "use_reentrant=reentrant" if named else "**kw"
            return f"checkpoint(f, x, {given})"
        return f"w{target}(f, x, {'reentrant=reentrant' if named else '**kw'})"

    bodies = []
    for index in range(length):
        lines = [f"def w{index}({parameters}):"]
        if index == decided_at:
            lines.append(
                "    reentrant = False" if named else '    kw.setdefault("use_reentrant", False)'
            )
        inner = call(index + 1)
        if kind == "twice" and index + 1 < length:
            lines += ["    if FLAG:", f"        return {inner}", f"    return {inner}"]
        elif kind == "diamond" and index + 2 <= length:
            lines += ["    if FLAG:", f"        return {inner}", f"    return {call(index + 2)}"]
        else:
            lines.append(f"    return {inner}")
        bodies.append(lines)
    keyword = "reentrant" if named else "use_reentrant"
    go = ["def go(f, x):", f"    return w0(f, x), w0(f, x, {keyword}=False)"]
    header = ["from torch.utils.checkpoint import checkpoint", "", "FLAG = True", ""]
    called = lambda index: [t for t in (index + 1, index + 2) if t < length]  # noqa: E731
    return written("w", header, bodies, go, called, split=split)


def written(
    name: str,
    header: list[str],
    bodies: list[list[str]],
    go: list[str],
    called: Callable[[int], list[int]],
    *,
    split: bool,
) -> Chain:
    """The definitions ``{name}0``... in one module, or one module each (``pkg/m{i}.py``,
    importing the definitions ``called(i)`` names), and ``go`` last."""
    if not split:
        text = [*header]
        for lines in bodies:
            text += [*lines, ""]
        text += go
        return Chain({"chain.py": "\n".join(text) + "\n"}, "chain.py", len(text))
    files = {"pkg/__init__.py": ""}
    for index, lines in enumerate(bodies):
        imports = [f"from .m{t} import {name}{t}" for t in called(index)]
        files[f"pkg/m{index}.py"] = "\n".join([*header, *imports, "", *lines]) + "\n"
    caller = [*header, f"from .m0 import {name}0", "", *go]
    files["pkg/go.py"] = "\n".join(caller) + "\n"
    return Chain(files, "pkg/go.py", len(caller))


def lint(files: dict[str, str]) -> tuple[dict[str, list[tuple[int, int, str]]], int]:
    """Every file's findings (line, column, code), and the answers the analysis computed."""
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / ".git").mkdir()
        for relative, text in files.items():
            path = root / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        paths = sorted(str(root / relative) for relative in files)
        saved = os.getcwd()
        os.chdir(root)
        try:
            with hang_guard(HANG_SECONDS, "a wrapper chain"):
                engine = Engine(Settings(root=root), paths, jobs=1)
                results = engine.lint(paths)
        finally:
            os.chdir(saved)
        found = {}
        for result in results:
            assert result.internal_error is None, result.internal_error
            relative = os.path.relpath(result.path, root)
            found[relative] = [(f.line, f.column, f.code) for f in result.findings]
        return found, engine.work


def expected(generated: Chain) -> dict[str, list[tuple[int, int, str]]]:
    found: dict[str, list[tuple[int, int, str]]] = {path: [] for path in generated.files}
    found[generated.caller] = [(generated.line, 12, "CKP001")]  # ``w0(f, x)``: nothing passes it
    return found


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    kind=st.sampled_from(KINDS),
    length=st.one_of(st.integers(1, 12), st.integers(1, 200)),
    split=st.booleans(),
)
def test_the_call_that_leaves_it_unset_is_reported_at_any_depth(
    kind: str, length: int, split: bool
) -> None:
    generated = chain(kind, length, split=split)
    found, _ = lint(generated.files)
    assert found == expected(generated)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("length", [200])
def test_two_hundred_wrappers(kind: str, length: int) -> None:
    generated = chain(kind, length, split=False)
    found, _ = lint(generated.files)
    assert found == expected(generated)


@pytest.mark.parametrize("kind", ["straight", "twice", "named"])
def test_a_wrapper_that_decides_it_leaves_its_callers_silent(kind: str) -> None:
    """Wrapper 30 of 60 sets ``use_reentrant`` itself: nothing to report anywhere (the
    source call below it is reached only through that decision; in a diamond a path
    around it leaves the keyword unset, so that shape is not one of these)."""
    generated = chain(kind, 60, split=False, decided_at=30)
    found, _ = lint(generated.files)
    assert found == {path: [] for path in generated.files}


@pytest.mark.parametrize("kind", KINDS)
def test_work_grows_linearly_with_the_chain(kind: str) -> None:
    """Answers computed, no clock: doubling the chain at most doubles and a half the work
    (quadratic growth would quadruple it; the chains of 933a637 grew 1.6-1.8x per level)."""
    _, small = lint(chain(kind, 50, split=False).files)
    _, large = lint(chain(kind, 100, split=False).files)
    assert large <= 2.5 * small, (small, large)


def factories(length: int, last: str, *, split: bool = False) -> Chain:
    """``m0``...: each factory returns what the next one returns, the last one ``last`` (a
    source, or a partial of it); ``go`` calls what ``m0()`` gives."""
    header = ["import functools", "from torch.utils.checkpoint import checkpoint", ""]
    bodies = [[f"def m{i}():", f"    return m{i + 1}()"] for i in range(length)]
    bodies.append([f"def m{length}():", f"    return {last}"])
    go = ["def go(f, x):", "    ck = m0()", "    return ck(f, x)"]
    called = lambda index: [index + 1] if index < length else []  # noqa: E731
    return written("m", header, bodies, go, called, split=split)


@pytest.mark.parametrize("length", [1, 20, 400, 1005])
def test_a_chain_of_factories_hands_the_source_on_at_any_length(length: int) -> None:
    """``return m1()`` ... ``return checkpoint``: each factory answered once, deepest first
    (933a637 followed the rest of the chain from every factory, and cut it at 1,000 with
    no note: the CKP001 disappeared)."""
    generated = factories(length, "checkpoint")
    found, _ = lint(generated.files)
    assert found == expected(generated)
    silent = factories(length, "functools.partial(checkpoint, use_reentrant=False)")
    found, _ = lint(silent.files)
    assert found == {path: [] for path in silent.files}


def test_a_chain_of_factories_across_modules() -> None:
    generated = factories(40, "checkpoint", split=True)
    found, _ = lint(generated.files)
    assert found == expected(generated)


def test_work_grows_linearly_with_a_chain_of_factories() -> None:
    _, small = lint(factories(200, "checkpoint").files)
    _, large = lint(factories(400, "checkpoint").files)
    assert large <= 2.5 * small, (small, large)


def test_factories_calling_each_other() -> None:
    """Mutual tail calls: what either returns is the other's returns and its own; a cycle
    that returns nothing else gives nothing (no finding, no note)."""
    text = (
        "from torch.utils.checkpoint import checkpoint\n"
        "\n"
        "def a(flag):\n"
        "    if flag:\n"
        "        return b(flag)\n"
        "    return checkpoint\n"
        "\n"
        "def b(flag):\n"
        "    return a(not flag)\n"
        "\n"
        "def c():\n"
        "    return d()\n"
        "\n"
        "def d():\n"
        "    return c()\n"
        "\n"
        "def go(f, x):\n"
        "    ck = b(True)\n"
        "    other = c()\n"
        "    return ck(f, x), other(f, x)\n"
    )
    found, _ = lint({"cycle.py": text})
    assert found == {"cycle.py": [(20, 12, "CKP001")]}
