"""CPU seconds of a cold run on a chain of N wrappers handing ``use_reentrant`` on (issue 36).

Each chain is a module of its own project (a temporary folder): ``w0`` ... ``w{N-1}``, each
calling the next (``straight``), the next from two places (``twice``), the next two
(``diamond``), all forwarding ``**kwargs`` to torch's ``checkpoint``, or passing
``use_reentrant`` by name (``named``), and a function calling ``w0`` with and without the
keyword; or N factories each returning the next one's result, the last one torch's
``checkpoint``, and a function calling what ``m0()`` gives (``factories``). Every run is
``python -m ckptlint --no-cache``, its CPU time (user + system) taken from the finished
child process; rounds are interleaved and the medians printed, beside whether the run
reported exactly the one CKP001 it should (goal: linear, 200 under 2 s).

    python benchmarks/wrapper_chains.py [--repeat N] [--lengths 25,50,100,200]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.test_wrapper_chains import KINDS, Chain, chain, factories  # noqa: E402

SHAPES = (*KINDS, "factories")


def generate(kind: str, length: int) -> Chain:
    if kind == "factories":
        return factories(length, "checkpoint")
    return chain(kind, length, split=False)


def run_once(kind: str, length: int) -> tuple[float, bool]:
    """CPU seconds of one cold run, and whether its findings were the expected ones."""
    generated = generate(kind, length)
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / ".git").mkdir()
        for relative, text in generated.files.items():
            (root / relative).write_text(text)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run(
            [sys.executable, "-m", "ckptlint", "--no-cache", "--output-format", "json", "."],
            cwd=root,
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    found = [(f["line"], f["column"], f["code"]) for f in json.loads(done.stdout or "[]")]
    return cpu, found == [(generated.line, 12, "CKP001")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--lengths", default="25,50,100,200")
    arguments = parser.parse_args()
    lengths = [int(n) for n in arguments.lengths.split(",")]
    runs: dict[tuple[str, int], list[float]] = {}
    right: dict[tuple[str, int], bool] = {}
    for _ in range(arguments.repeat):
        for length in lengths:
            for kind in SHAPES:
                cpu, ok = run_once(kind, length)
                runs.setdefault((kind, length), []).append(cpu)
                right[kind, length] = right.get((kind, length), True) and ok
    print(
        f"cold runs, {arguments.repeat} interleaved rounds, median CPU seconds (start-up included)"
    )
    print("| wrappers | " + " | ".join(SHAPES) + " |")
    print("| --- |" + " --- |" * len(SHAPES))
    for length in lengths:
        cells = []
        for kind in SHAPES:
            mark = "" if right[kind, length] else " (wrong findings)"
            cells.append(f"{statistics.median(runs[kind, length]):.2f}{mark}")
        print(f"| {length} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
