"""Time and memory of the analysis on generated extremes, against CPython's own parser.

Two shapes of issue 32, each at a quarter, a half and the whole size, in a temporary
folder (nothing is written into the repository):

- **lines**: one module of ``from torch.utils.checkpoint import checkpoint`` and then
  1,000,000 lines ``y = 1`` (3,000,000 tokens, over the default token bound: the run here
  raises ``--max-file-size`` so that the file is analysed; by default it is CKP901 at once);
- **calls**: one function making 20,000 ``checkpoint`` calls in a row.

Then the shapes of ``tests/test_analysis_bounds.py``'s growth test (a module of N
definitions or statements of one kind, each shape once quadratic in N) at 1,000, 4,000
and 16,000: CPU seconds, and the growth from each size to the next (linear: x4).

Each row is one ``ckptlint --no-cache`` process (wall seconds, CPU seconds, its own peak
memory) beside a process that only runs ``ast.parse`` on the same file, so the ratio says
what the analysis adds to parsing. Medians of interleaved repetitions.

    python benchmarks/analysis_bounds.py [--repeat N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.test_analysis_bounds import GROWING_SHAPES, growing_module  # noqa: E402

CKPTLINT = [sys.executable, "-m", "ckptlint", "--no-cache", "--exit-zero", "-q"]
PARSE_ONLY = [sys.executable, "-c", "import ast, sys; ast.parse(open(sys.argv[1]).read())"]
RAISED = ["--max-file-size", "200000000"]


def lines_module(count: int) -> str:
    return "from torch.utils.checkpoint import checkpoint\n" + "y = 1\n" * count


def calls_module(count: int) -> str:
    call = "    x = checkpoint(block, x, use_reentrant=False)\n"
    head = "from torch.utils.checkpoint import checkpoint\n\n\ndef forward(block, x):\n"
    return head + call * count + "    return x\n"


def measure(command: list[str], cwd: Path) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds and peak memory (MiB) of one process of its own."""
    start = time.perf_counter()
    process = subprocess.Popen(
        command,
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    error = process.stderr.read().decode() if process.stderr else ""
    if os.waitstatus_to_exitcode(status) not in (0, 1):
        raise SystemExit(f"{command[2:4]} failed: {error[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    options = parser.parse_args()
    shapes = [("lines", lines_module, 1_000_000), ("calls", calls_module, 20_000)]
    with tempfile.TemporaryDirectory(prefix="ckptlint-bounds-") as folder:
        cases = []
        for name, make, whole in shapes:
            for fraction in (4, 2, 1):
                count = whole // fraction
                case = Path(folder) / f"{name}-{count}"
                case.mkdir()
                (case / "module.py").write_text(make(count))
                cases.append((name, count, case))
        runs: dict[tuple[str, int, str], list[tuple[float, float, float]]] = {}
        for _ in range(options.repeat):
            for name, count, case in cases:
                ckptlint = measure([*CKPTLINT, *RAISED, "."], case)
                parse = measure([*PARSE_ONLY, "module.py"], case)
                runs.setdefault((name, count, "ckptlint"), []).append(ckptlint)
                runs.setdefault((name, count, "parse"), []).append(parse)
        default = measure([*CKPTLINT, "."], cases[2][2])
        growth = _growth(Path(folder), options.repeat)
    print(f"{options.repeat} interleaved repetitions, medians; each row one process\n")
    print(
        "| file | ckptlint wall s | CPU s | peak MiB | ast.parse CPU s | peak MiB |"
        " CPU vs parse | memory vs parse |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, count, _ in cases:
        ours = [statistics.median(v) for v in zip(*runs[(name, count, "ckptlint")], strict=True)]
        floor = [statistics.median(v) for v in zip(*runs[(name, count, "parse")], strict=True)]
        print(
            f"| {name} {count:,} | {ours[0]:.2f} | {ours[1]:.2f} | {ours[2]:.0f} | {floor[1]:.2f}"
            f" | {floor[2]:.0f} | x{ours[1] / floor[1]:.2f} | x{ours[2] / floor[2]:.2f} |"
        )
    print(
        f"\nthe 1,000,000-line module with the default bounds (CKP901, not parsed): "
        f"{default[1]:.2f} s CPU, {default[2]:.0f} MiB"
    )
    print("\n| shape | " + " | ".join(f"{n:,} CPU s" for n in GROWTH_SIZES) + " | growth |")
    print("| --- | " + " | ".join("---" for _ in GROWTH_SIZES) + " | --- |")
    for shape, seconds in growth.items():
        steps = ", ".join(f"x{b / a:.1f}" for a, b in zip(seconds, seconds[1:], strict=False))
        print(f"| {shape} | " + " | ".join(f"{s:.2f}" for s in seconds) + f" | {steps} |")


GROWTH_SIZES = (1_000, 4_000, 16_000)


def _growth(folder: Path, repeat: int) -> dict[str, list[float]]:
    """Median CPU seconds of each growth shape at each size (interleaved repetitions)."""
    cases = []
    for shape in GROWING_SHAPES:
        for count in GROWTH_SIZES:
            case = folder / f"{shape}-{count}"
            case.mkdir()
            (case / "module.py").write_text(growing_module(shape, count))
            cases.append((shape, case))
    runs: dict[Path, list[float]] = {}
    for _ in range(repeat):
        for _, case in cases:
            runs.setdefault(case, []).append(measure([*CKPTLINT, "."], case)[1])
    found: dict[str, list[float]] = {}
    for shape, case in cases:
        found.setdefault(shape, []).append(statistics.median(runs[case]))
    return found


if __name__ == "__main__":
    main()
