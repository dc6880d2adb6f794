"""Run checkpoint test suites (PyTorch's own, transformers' gradient checkpointing) under the
guard and compare every outcome with plain torch's.

    python benchmarks/torch_checkpoint_tests.py PATH [PATH ...] [-k EXPRESSION]
        [--rootdir DIR] [--pythonpath DIR ...]

Each PATH is a test file or a folder (its ``test_*.py`` files, recursively). The files are
read from public repositories at the installed versions and kept in a git-ignored folder
such as benchmarks/.torch-tests/, never committed (see docs/guard.md, "PyTorch's own
checkpoint tests under the guard"). PyTorch's test files need the ``expecttest`` package,
which torch's testing helpers import.

Each file runs three times, each in its own pytest process: plain torch, the guard in
default mode and in strict mode, enabled around every test's call. A test's outcome is
passed, failed, error or skipped (a failed subtest fails its test). The table gives, per
file and mode, the seconds (wall and CPU) and the outcome counts; then the tests whose
outcome under the guard is not the plain one, with the message they failed with, and the
guard warnings each mode issued. A changed outcome in default mode is a false alarm or a
breakage; in strict mode a change is right only where plain torch computes wrong gradients.
It is a benchmark, not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import subprocess
import sys
import tempfile
import time
from typing import Any

MODES = ("plain", "default", "strict")
OUTCOMES = ("passed", "failed", "error", "skipped")
_SEVERITY = {"passed": 0, "skipped": 0, "failed": 2, "error": 3}


class GuardPlugin:
    """A pytest plugin: the guard around each test's call, every outcome and guard warning
    recorded by test id."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.outcomes: dict[str, str] = {}
        self.messages: dict[str, str] = {}
        self.warnings: dict[str, list[str]] = {}

    def pytest_runtest_call(self, item: Any) -> None:
        if self.mode != "plain":
            import ckptguard

            ckptguard.enable(strict=self.mode == "strict")

    def pytest_runtest_teardown(self, item: Any) -> None:
        if self.mode != "plain":
            import ckptguard

            ckptguard.disable()

    def pytest_runtest_logreport(self, report: Any) -> None:
        test = report.nodeid
        outcome = report.outcome
        if report.when != "call" and outcome == "failed":
            outcome = "error"
        if report.when != "call" and outcome == "passed":
            self.outcomes.setdefault(test, "passed")
            return
        previous = self.outcomes.get(test, "passed")
        if test not in self.outcomes or _SEVERITY[outcome] >= _SEVERITY[previous]:
            self.outcomes[test] = outcome
        if outcome in ("failed", "error") and test not in self.messages:
            self.messages[test] = _first_line(report)

    def pytest_warning_recorded(self, warning_message: Any, when: str, nodeid: str) -> None:
        text = str(warning_message.message)
        if warning_message.category.__name__.startswith("Checkpoint") and "ckptguard" in text:
            self.warnings.setdefault(nodeid, []).append(_summary(text))


def _first_line(report: Any) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    return _summary(crash.message if crash is not None else str(report.longrepr))


def _summary(text: str) -> str:
    """A message's headline and, for the guard's, its why/measured lines (the cause), paths
    relative to the working directory."""
    text = text.replace(os.getcwd() + os.sep, "")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    kept = lines[:1] + [line for line in lines[1:] if line.startswith(("why:", "measured:"))]
    return " | ".join(" ".join(line.split())[:320] for line in kept)


def _run_child(mode: str, output: str, arguments: list[str], pythonpath: list[str]) -> None:
    """In the child process: one pytest run, its outcomes written as JSON."""
    sys.path[:0] = pythonpath
    import pytest

    plugin = GuardPlugin(mode)
    pytest.main(arguments, plugins=[plugin])
    with open(output, "w") as handle:
        json.dump(vars(plugin), handle)


def _run(
    mode: str, test_file: pathlib.Path, args: argparse.Namespace
) -> tuple[dict[str, Any], float, float]:
    """One file in one mode, in a fresh process: (what the plugin recorded, wall s, CPU s)."""
    # The project's own pytest options (addopts, markers) are not these suites'.
    arguments = [str(test_file), "-q", "-p", "no:cacheprovider", "-W", "default"]
    arguments += ["-o", "addopts=", "--rootdir", str(args.rootdir or test_file.parent)]
    if args.keyword:
        arguments += ["-k", args.keyword]
    pythonpath = [str(p.resolve()) for p in args.pythonpath]
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(
        [*pythonpath, *filter(None, [environment.get("PYTHONPATH")])]
    )
    with tempfile.TemporaryDirectory() as folder:
        output = os.path.join(folder, "outcomes.json")
        child = [__file__, "--child", mode, output, json.dumps(arguments), json.dumps(pythonpath)]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, *child], capture_output=True, text=True, env=environment
        )
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        if not os.path.exists(output):
            tail = " ".join(done.stderr.split()[-40:]) or f"exit status {done.returncode}"
            return {"outcomes": {}, "messages": {}, "warnings": {}, "crashed": tail}, wall, cpu
        with open(output) as handle:
            return json.load(handle), wall, cpu


def find_test_files(paths: list[pathlib.Path]) -> list[pathlib.Path]:
    found: dict[pathlib.Path, None] = {}
    for path in paths:
        for test_file in sorted(path.rglob("test_*.py")) if path.is_dir() else [path]:
            found[test_file.resolve()] = None
    return list(found)


def compare(files: list[pathlib.Path], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every file in every mode, one after the other (never in parallel: the timings are
    read from a shared machine)."""
    rows = []
    for test_file in files:
        plain: dict[str, str] = {}
        for mode in MODES:
            run, wall, cpu = _run(mode, test_file, args)
            outcomes = run["outcomes"]
            if mode == "plain":
                plain = outcomes
            changed = [
                (test, plain[test], outcomes.get(test, "missing"), run["messages"].get(test))
                for test in plain
                if outcomes.get(test, "missing") != plain[test]
            ]
            changed += [  # tests the plain run did not have (a crash cut it short)
                (test, "missing", outcome, run["messages"].get(test))
                for test, outcome in outcomes.items()
                if test not in plain
            ]
            counts = {o: sum(1 for v in outcomes.values() if v == o) for o in OUTCOMES}
            rows.append(
                {
                    "file": _shown(test_file, args.rootdir),
                    "mode": mode,
                    "wall": wall,
                    "cpu": cpu,
                    "tests": len(outcomes),
                    **counts,
                    "changed": changed if mode != "plain" else [],
                    "warnings": run["warnings"],
                    "crashed": run.get("crashed"),
                }
            )
    return rows


def _shown(test_file: pathlib.Path, rootdir: pathlib.Path | None) -> str:
    """The file relative to the rootdir, else to the working directory, where it is below."""
    for base in (rootdir.resolve() if rootdir else None, pathlib.Path.cwd()):
        if base is not None and test_file.is_relative_to(base):
            return str(test_file.relative_to(base))
    return str(test_file)


def print_table(rows: list[dict[str, Any]]) -> None:
    width = max(len("all files"), *(len(r["file"]) for r in rows))
    header = (
        f"{'file':<{width}}  {'mode':<7} {'wall s':>7} {'cpu s':>7} {'tests':>5} {'passed':>6} "
        f"{'failed':>6} {'error':>5} {'skipped':>7} {'changed':>7} {'warned':>6}"
    )
    print(header)
    print("-" * len(header))

    def line(name: str, mode: str, chosen: list[dict[str, Any]]) -> None:
        total = {k: sum(r[k] for r in chosen) for k in ("wall", "cpu", "tests", *OUTCOMES)}
        changed = sum(len(r["changed"]) for r in chosen)
        warned = sum(len(r["warnings"]) for r in chosen)
        print(
            f"{name:<{width}}  {mode:<7} {total['wall']:>7.1f} {total['cpu']:>7.1f} "
            f"{total['tests']:>5} {total['passed']:>6} {total['failed']:>6} "
            f"{total['error']:>5} {total['skipped']:>7} "
            f"{'-' if mode == 'plain' else changed:>7} {warned:>6}"
        )

    files = list(dict.fromkeys(r["file"] for r in rows))
    for name in files:
        for mode in MODES:
            line(name, mode, [r for r in rows if r["file"] == name and r["mode"] == mode])
    if len(files) > 1:
        for mode in MODES:
            line("all files", mode, [r for r in rows if r["mode"] == mode])

    print("\n'changed': tests whose outcome differs from the plain run; 'warned': tests with")
    print("at least one ckptguard warning.")
    for row in rows:
        if row["crashed"]:
            print(f"\n[{row['mode']}] {row['file']}: pytest wrote no outcomes: {row['crashed']}")
    print("\nOutcomes changed against plain torch:" if any(r["changed"] for r in rows) else "")
    for row in rows:
        for test, before, after, message in row["changed"]:
            print(f"[{row['mode']}] {test}: {before} -> {after}")
            if message:
                print(f"    {message}")
    print("\nGuard warnings:" if any(r["warnings"] for r in rows) else "\nGuard warnings: none")
    for row in rows:
        for test, texts in row["warnings"].items():
            for text, count in _counted(texts):
                print(f"[{row['mode']}] {test}{f' (x{count})' if count > 1 else ''}: {text}")


def _counted(texts: list[str]) -> list[tuple[str, int]]:
    counts: dict[str, int] = {}
    for text in texts:
        counts[text] = counts.get(text, 0) + 1
    return list(counts.items())


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        mode, output, arguments, pythonpath = sys.argv[2:6]
        _run_child(mode, output, json.loads(arguments), json.loads(pythonpath))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=pathlib.Path, help="test files or folders")
    parser.add_argument("-k", dest="keyword", help="pytest -k expression to select tests")
    parser.add_argument(
        "--rootdir", type=pathlib.Path, help="pytest's rootdir (default: each file's folder)"
    )
    parser.add_argument(
        "--pythonpath",
        type=pathlib.Path,
        action="append",
        default=[],
        help="a folder put first on sys.path of the pytest processes (repeatable)",
    )
    args = parser.parse_args()
    missing = [str(p) for p in args.paths if not p.exists()]
    if missing:
        parser.error(f"no such file or folder: {', '.join(missing)}")
    files = find_test_files(args.paths)
    if not files:
        parser.error("no test_*.py file found")
    import torch

    versions = f"torch {torch.__version__}"
    try:
        import transformers

        versions += f", transformers {transformers.__version__}"
    except ImportError:
        pass
    print(f"{versions}, python {sys.version.split()[0]}; {len(files)} file(s)")
    print_table(compare(files, args))


if __name__ == "__main__":
    main()
