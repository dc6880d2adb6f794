"""Shared helpers for the linter tests."""

from __future__ import annotations

import importlib.util
import io
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

# Before torch starts (tests/guard imports it, and the subprocesses inherit this): the
# tests' models are tiny, and on a machine shared with other jobs a second intra-op thread
# mostly spins waiting for a core (tests/guard/test_example.py beside two busy processes:
# 26 -> 12 s of CPU). A test that needs threads sets them (test_alarms' two_threads).
os.environ.setdefault("OMP_NUM_THREADS", "1")

from ckptlint.cli import main  # noqa: E402
from ckptlint.config import Settings
from ckptlint.core import Finding
from ckptlint.engine import Engine
from ckptlint.memos import clear_memos


def lint(source: str, **settings: object) -> list[Finding]:
    """Findings the CLI would report for ``source`` as the only file of a project (noqa and
    selection applied)."""
    engine = Engine(Settings(**settings), ["example.py"])  # type: ignore[arg-type]
    (result,) = engine.lint(["example.py"], {"example.py": source.encode()})
    assert result.internal_error is None, result.internal_error
    return result.findings


def codes(source: str, **settings: object) -> list[str]:
    return [finding.code for finding in lint(source, **settings)]


# How long a test waits for a program it starts before calling it hung: not a timing (the
# figures are in benchmarks/), and long, because at load 13 to 18 on 2 cores a torch start
# took 116 s against the 120 s this used to be.
SUBPROCESS_TIMEOUT = 900


def run_ckptlint(*arguments: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ckptlint", *arguments],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
    )


@contextmanager
def hang_guard(seconds: int, what: str) -> Iterator[None]:
    """Fail (rather than block the test run) if the block runs for ``seconds``: ``what`` did
    not end (a loop, or a wait on a FIFO or a device)."""

    def hung(*_: object) -> None:
        raise AssertionError(f"{what} did not end within {seconds} s")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@dataclass(frozen=True)
class CliRun:
    returncode: int
    stdout: str
    stderr: str
    stdout_bytes: bytes


def run_cli(*arguments: str, cwd: Path, stdin: bytes = b"") -> CliRun:
    """``ckptlint ARGUMENTS`` in this process (no interpreter start-up), run in ``cwd``."""
    stdout, stderr = io.BytesIO(), io.BytesIO()
    streams = (
        io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"),
        io.TextIOWrapper(stdout, encoding="utf-8", write_through=True),
        io.TextIOWrapper(stderr, encoding="utf-8", write_through=True),
    )
    saved = sys.stdin, sys.stdout, sys.stderr, os.getcwd()
    sys.stdin, sys.stdout, sys.stderr = streams
    try:
        os.chdir(cwd)
        try:
            code = main(list(arguments))
        except SystemExit as exit:  # argparse: --help, --version, usage errors
            code = exit.code if isinstance(exit.code, int) else 2
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved[:3]
        os.chdir(saved[3])
        for stream in streams:
            stream.flush()
            stream.detach()  # keep the buffers open for reading
    out = stdout.getvalue()
    return CliRun(code, out.decode("utf-8", "replace"), stderr.getvalue().decode(), out)


@pytest.fixture(autouse=True, scope="session")
def _user_cache_key(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The cache key of the tests' user lives in a folder of the test session (the cache
    authenticates its entries with it): no test reads or writes the real one."""
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("user-cache"))


GUARD_TESTS = Path(__file__).resolve().parent / "guard"


def _torch_installed() -> bool:
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """``python -m pytest -m "not torch"`` is the linter's own run: it needs no torch and
    does not even collect the guard's tests (their modules import torch); nor does a run
    where torch is not installed."""
    if collection_path == GUARD_TESTS:
        if "not torch" in (config.getoption("markexpr") or "") or not _torch_installed():
            return True
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if GUARD_TESTS in item.path.parents:
            item.add_marker(pytest.mark.torch)


@pytest.fixture(autouse=True)
def _nothing_analysed_outlives_its_test() -> Iterator[None]:
    """Drop what the analysis keeps for the life of a process (the memos, the flake8
    plugin's engines): kept from test to test, every project linted stayed in memory, 8
    million objects that pytest's five final garbage collections (its unraisable-exception
    check) walked for half a minute after the summary, and every collection in between."""
    yield
    clear_memos()
    plugin = sys.modules.get("ckptlint.flake8_plugin")
    if plugin is not None:
        plugin.CheckpointChecker._engines = {}
        plugin.CheckpointChecker._roots = {}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """An empty project folder (the tests write files and a pyproject.toml into it)."""
    return tmp_path


def lint_tree(
    root: Path, files: dict[str, str], **settings: object
) -> list[tuple[str, int, int, str]]:
    """Write a multi-file project under ``root``, lint the whole folder in-process as the CLI
    does, and return ``(relative path, line, column, code)`` of every finding."""
    import textwrap

    from ckptlint.discovery import discover

    for relative, source in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    config = Settings(root=root, **settings)  # type: ignore[arg-type]
    paths = [f.path for f in discover([str(root)], config)]
    found = []
    for result in Engine(config, paths, jobs=1).lint(paths):
        relative = Path(result.path).resolve().relative_to(root.resolve()).as_posix()
        found.extend((relative, f.line, f.column, f.code) for f in result.findings)
    return sorted(found)


def messages_of(root: Path, files: dict[str, str], **settings: object) -> list[str]:
    """The messages of every finding of a project written as ``lint_tree`` does."""
    from ckptlint.discovery import discover

    lint_tree(root, files, **settings)
    config = Settings(root=root, **settings)  # type: ignore[arg-type]
    paths = [f.path for f in discover([str(root)], config)]
    return [f.message for r in Engine(config, paths, jobs=1).lint(paths) for f in r.findings]
