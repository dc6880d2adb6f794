"""Every semantic finding (CKP1xx/2xx/3xx) on the 15 pinned trees, and what those rules cost.

Runs ``ckptlint`` on each tree of ``benchmarks/trees.py`` (hard-linked outside the
git-ignored cache, as lint_speed.py does), prints each finding for review, then times
``--select CKP001`` against all rules on transformers 4.34.1 (same process count, median
of several interleaved runs) and prints the ratio.

``--against CHECKOUT`` also runs another checkout's ckptlint (an earlier commit in a ``git
worktree``, or an extracted ``git archive``) on the same trees and prints, per tree, the
findings only one of them reports: what a change to the rules added and removed.

    python benchmarks/rule_precision.py [--runs 5] [--jobs 2] [--against CHECKOUT]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import trees  # noqa: E402
from lint_speed import linked_trees  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TIMED_TREE = "transformers-4.34.1"
SEMANTIC_CODES = "CKP1,CKP2,CKP3"


def ckptlint(
    path: Path, select: str, jobs: int, output_format: str = "text", checkout: Path = ROOT
) -> str:
    command = [sys.executable, "-m", "ckptlint", path.name, "--select", select, "--no-cache"]
    command += ["--jobs", str(jobs), "--exit-zero", "--format", output_format]
    environment = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run(
        command, cwd=path.parent, env=environment, capture_output=True, text=True, check=True
    )
    return done.stdout


def seconds(path: Path, select: str, jobs: int) -> tuple[float, float]:
    """Wall time and CPU time (user + system, all processes) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    ckptlint(path, select, jobs)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return wall, cpu


Key = tuple[str, int, int, str, str]


def keyed(findings: list[dict], root: Path) -> dict[Key, dict]:
    return {
        (
            str(Path(f["path"]).relative_to(root.name)),
            f["line"],
            f["column"],
            f["code"],
            f["message"],
        ): f
        for f in findings
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--against", type=Path, help="another checkout to compare findings with")
    arguments = parser.parse_args()

    folders = linked_trees(trees.all_trees())
    total = 0
    for root in folders:
        output = ckptlint(root, SEMANTIC_CODES, arguments.jobs, "json")
        findings = keyed(json.loads(output), root)
        total += len(findings)
        counts = {}
        for key in findings:
            counts[key[3]] = counts.get(key[3], 0) + 1
        summary = ", ".join(f"{code} {n}" for code, n in sorted(counts.items()))
        print(f"== {root.name}: {len(findings)} semantic findings ({summary or 'none'})")
        for path, line, column, code, message in findings:
            print(f"{path}:{line}:{column}: {code}\n    {message}")
        if arguments.against is not None:
            output = ckptlint(root, SEMANTIC_CODES, arguments.jobs, "json", arguments.against)
            other = keyed(json.loads(output), root)
            for sign, keys in (("+", findings.keys() - other), ("-", other.keys() - findings)):
                for path, line, column, code, message in sorted(keys):
                    print(f"{sign} {path}:{line}:{column}: {code}\n    {message}")
    print(f"== {total} semantic findings in all")

    timed = next(root for root in folders if root.name == TIMED_TREE)
    ckptlint(timed, "CKP", arguments.jobs)  # warm the file cache
    runs: dict[str, list[tuple[float, float]]] = {"CKP001": [], "CKP": []}
    for _ in range(arguments.runs):  # interleaved, so that machine noise hits both alike
        for select, timings in runs.items():
            timings.append(seconds(timed, select, arguments.jobs))
    print(f"== {TIMED_TREE}, {arguments.jobs} processes, median of {arguments.runs} runs:")
    for index, kind in enumerate(("wall", "CPU")):
        alone = statistics.median(t[index] for t in runs["CKP001"])
        everything = statistics.median(t[index] for t in runs["CKP"])
        print(
            f"   {kind}: CKP001 alone {alone:.2f} s, all rules {everything:.2f} s,"
            f" ratio {everything / alone:.2f}x"
        )


if __name__ == "__main__":
    main()
