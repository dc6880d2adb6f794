"""A cold run of the 15 pinned trees by this checkout and by another one (an earlier commit,
checked out with ``git worktree add``), interleaved, medians of wall seconds: the
before/after of a change on the same machine in the same minutes. (Not CPU seconds: a
checkout whose worker processes are not waited for reports none of their time.)

    git worktree add /tmp/before <commit>
    python benchmarks/compare_checkouts.py /tmp/before [--repeat N]

Each checkout's package is imported through PYTHONPATH; the trees are the hard-linked copies
``lint_speed.py`` makes (each tree its own project).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import trees  # noqa: E402
from lint_speed import ROOT, WORK, linked_trees, timed  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("other", type=Path, help="the other checkout's root")
    parser.add_argument("--repeat", type=int, default=3)
    arguments = parser.parse_args()
    names = [folder.name for folder in linked_trees(trees.all_trees())]
    checkouts = {"this checkout": ROOT, f"{arguments.other}": arguments.other.resolve()}
    command = [sys.executable, "-m", "ckptlint", "--no-respect-gitignore", "--exit-zero"]
    command += ["--no-cache", "--format", "json", *names]
    runs: dict[str, list[float]] = {label: [] for label in checkouts}
    findings: dict[str, int] = {}
    for _ in range(arguments.repeat):
        for label, root in checkouts.items():
            os.environ["PYTHONPATH"] = str(root)
            wall, _, _, output = timed(command, WORK)
            runs[label].append(wall)
            findings[label] = len(json.loads(output))
    mine = "this checkout"
    wall = {label: statistics.median(values) for label, values in runs.items()}
    print(f"cold run of {len(names)} trees, {arguments.repeat} interleaved rounds, medians")
    print("| checkout | wall s | vs this checkout | findings |")
    print("| --- | --- | --- | --- |")
    for label in checkouts:
        ratio = wall[label] / wall[mine]
        print(f"| {label} | {wall[label]:.2f} | x{ratio:.2f} | {findings[label]} |")


if __name__ == "__main__":
    main()
