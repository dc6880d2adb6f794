"""Run PyTorch's own checkpoint test files under the guard and compare every outcome with
plain torch's.

    python benchmarks/torch_checkpoint_tests.py FOLDER [-k EXPRESSION]

FOLDER holds test files read from the public PyTorch repository at the installed version
(test/test_utils.py's TestCheckpoint, test/test_autograd.py, test/distributed/_composable/
test_checkpoint.py, test/distributed/fsdp/test_checkpoint_wrapper.py; keep them in a
git-ignored folder such as benchmarks/.torch-tests/, never commit them). They need the
``expecttest`` package, which torch's testing helpers import.

Each file runs three times in its own pytest process: plain torch, the guard in default mode
and in strict mode, enabled around every test's call. A test's outcome is passed, failed,
error or skipped (a failed subtest fails its test); the table counts the tests whose outcome
under the guard is the plain one and lists those that changed, with the guard's message, and
the guard warnings each mode issued. A changed outcome in default mode is a false alarm or a
breakage; in strict mode a change is right only where plain torch computes wrong gradients.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
from typing import Any

MODES = ("plain", "default", "strict")
_SEVERITY = {"passed": 0, "skipped": 0, "failed": 2, "error": 3}


class GuardPlugin:
    """A pytest plugin: the guard around each test's call, every outcome and guard warning
    recorded by test id."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.outcomes: dict[str, str] = {}
        self.messages: dict[str, str] = {}
        self.warnings: dict[str, list[str]] = {}

    def pytest_runtest_call(self, item: Any) -> Any:
        import ckptguard

        if self.mode == "plain":
            return None
        ckptguard.enable(strict=self.mode == "strict")
        return None

    def pytest_runtest_teardown(self, item: Any) -> None:
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
        if _SEVERITY.get(outcome, 0) >= _SEVERITY.get(previous, 0) or test not in self.outcomes:
            self.outcomes[test] = outcome
        if outcome in ("failed", "error") and test not in self.messages:
            self.messages[test] = _first_line(report)

    def pytest_warning_recorded(self, warning_message: Any, when: str, nodeid: str) -> None:
        category = warning_message.category.__name__
        if category.startswith("Checkpoint") and "ckptguard" in str(warning_message.message):
            text = str(warning_message.message).splitlines()[0]
            self.warnings.setdefault(nodeid, []).append(text[:160])


def _first_line(report: Any) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    return " ".join(text.split())[:200]


def _run_one(mode: str, test_file: str, output: str, keyword: str | None) -> None:
    """In a child process: one pytest run of one file, its outcomes written as JSON."""
    import pytest

    plugin = GuardPlugin(mode)
    arguments = [test_file, "-q", "-p", "no:cacheprovider", "-W", "default"]
    if keyword:
        arguments += ["-k", keyword]
    pytest.main(arguments, plugins=[plugin])
    with open(output, "w") as handle:
        json.dump(
            {"outcomes": plugin.outcomes, "messages": plugin.messages, "warnings": plugin.warnings},
            handle,
        )


def _run(mode: str, test_file: pathlib.Path, keyword: str | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        output = os.path.join(folder, "outcomes.json")
        command = [sys.executable, __file__, "--child", mode, str(test_file), output]
        if keyword:
            command += ["-k", keyword]
        subprocess.run(command, capture_output=True, text=True, timeout=3600)
        if not os.path.exists(output):
            return {"outcomes": {}, "messages": {}, "warnings": {}, "crashed": True}
        with open(output) as handle:
            return json.load(handle)


def compare(folder: pathlib.Path, keyword: str | None) -> list[dict[str, Any]]:
    rows = []
    for test_file in sorted(folder.rglob("test_*.py")):
        runs = {mode: _run(mode, test_file, keyword) for mode in MODES}
        plain = runs["plain"]["outcomes"]
        for mode in MODES[1:]:
            run = runs[mode]
            changed = [
                (test, plain[test], run["outcomes"].get(test, "missing"), run["messages"].get(test))
                for test in plain
                if run["outcomes"].get(test, "missing") != plain[test]
            ]
            rows.append(
                {
                    "file": str(test_file.relative_to(folder)),
                    "mode": mode,
                    "tests": len(plain),
                    "identical": len(plain) - len(changed),
                    "changed": changed,
                    "warnings": run["warnings"],
                }
            )
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    width = max([len("file"), *(len(r["file"]) for r in rows)])
    print(f"{'file':<{width}}  {'mode':<8} {'tests':>6} {'identical':>9} {'changed':>7} warned")
    print("-" * (width + 42))
    for mode in MODES[1:]:
        for row in (r for r in rows if r["mode"] == mode):
            print(
                f"{row['file']:<{width}}  {mode:<8} {row['tests']:>6} {row['identical']:>9} "
                f"{len(row['changed']):>7} {len(row['warnings']):>6}"
            )
        total = [r for r in rows if r["mode"] == mode]
        print(
            f"{'all files':<{width}}  {mode:<8} {sum(r['tests'] for r in total):>6} "
            f"{sum(r['identical'] for r in total):>9} "
            f"{sum(len(r['changed']) for r in total):>7} "
            f"{sum(len(r['warnings']) for r in total):>6}"
        )
    for row in rows:
        for test, before, after, message in row["changed"]:
            print(f"\n[{row['mode']}] {test}: {before} -> {after}")
            if message:
                print(f"    {message}")
        for test, texts in row["warnings"].items():
            for text in dict.fromkeys(texts):
                print(f"\n[{row['mode']}] {test} warned: {text}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        keyword = sys.argv[6] if len(sys.argv) > 6 else None
        _run_one(sys.argv[2], sys.argv[3], sys.argv[4], keyword)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=pathlib.Path, help="folder holding torch's test files")
    parser.add_argument("-k", dest="keyword", help="pytest -k expression to select tests")
    args = parser.parse_args()
    if not args.folder.is_dir():
        parser.error(f"{args.folder} is not a folder")
    import torch

    print(f"torch {torch.__version__}; test files under {args.folder}")
    print_table(compare(args.folder, args.keyword))


if __name__ == "__main__":
    main()
