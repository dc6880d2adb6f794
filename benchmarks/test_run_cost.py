"""CPU and wall seconds of the default test run (issue 39: at most half the CPU of 933a637's).

Runs ``python -m pytest -q -p no:cacheprovider`` in this checkout and, with ``--against``, in
another one (its own tests, its own code first on ``PYTHONPATH``), one after the other in
alternating order for ``--repeat`` rounds, and prints the medians. The CPU time is the
finished pytest process's and every process it started and waited for (subprocess tests,
torchrun ranks), from ``getrusage(RUSAGE_CHILDREN)``. ``--busy`` runs the two at the same time
beside a process spinning on a core, as a loaded CI runner would, and reports each.

    python benchmarks/test_run_cost.py [--against CHECKOUT] [--repeat N] [--busy]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMAND = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]


def _environment(checkout: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(checkout)}


def _summary(output: str) -> str:
    lines = [line for line in output.splitlines() if " passed" in line or " failed" in line]
    return lines[-1].strip("= ") if lines else "(no summary)"


def run_once(checkout: Path) -> tuple[float, float, str]:
    """Wall and CPU seconds of one test run in ``checkout``, and pytest's last line."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        COMMAND, cwd=checkout, env=_environment(checkout), capture_output=True, text=True
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, _summary(done.stdout)


def run_together(checkouts: list[Path]) -> list[tuple[float, float, str]]:
    """Every checkout's run at once, beside a spinning process; each run's wall and CPU
    seconds (``wait4`` gives each process's own children's usage)."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        with tempfile.TemporaryDirectory() as folder:
            started = {}
            for index, checkout in enumerate(checkouts):
                log = open(Path(folder) / f"{index}.log", "w+")  # noqa: SIM115
                process = subprocess.Popen(
                    COMMAND,
                    cwd=checkout,
                    env=_environment(checkout),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
                started[process.pid] = (checkout, log, time.perf_counter())
            results: dict[Path, tuple[float, float, str]] = {}
            while len(results) < len(started):
                pid, _, usage = os.wait4(-1, 0)
                if pid not in started:
                    continue
                checkout, log, start = started[pid]
                wall = time.perf_counter() - start
                log.seek(0)
                results[checkout] = (wall, usage.ru_utime + usage.ru_stime, _summary(log.read()))
                log.close()
        return [results[checkout] for checkout in checkouts]
    finally:
        spinner.kill()
        spinner.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", type=Path, help="another checkout's root")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--busy", action="store_true")
    arguments = parser.parse_args()
    checkouts = [ROOT] + ([arguments.against.resolve()] if arguments.against else [])
    runs: dict[Path, list[tuple[float, float, str]]] = {c: [] for c in checkouts}
    for index in range(arguments.repeat):
        if arguments.busy:
            for checkout, result in zip(checkouts, run_together(checkouts), strict=True):
                runs[checkout].append(result)
            continue
        order = checkouts if index % 2 == 0 else list(reversed(checkouts))
        for checkout in order:
            runs[checkout].append(run_once(checkout))
    how = "at the same time beside a spinning process" if arguments.busy else "one at a time"
    print(f"default test run, {arguments.repeat} round(s), {how}, medians")
    print("| checkout | wall s | CPU s | CPU vs this | last line |")
    print("| --- | --- | --- | --- | --- |")
    ours = statistics.median(cpu for _, cpu, _ in runs[ROOT])
    for checkout in checkouts:
        wall = statistics.median(w for w, _, _ in runs[checkout])
        cpu = statistics.median(c for _, c, _ in runs[checkout])
        last = runs[checkout][-1][2]
        print(f"| {checkout} | {wall:.1f} | {cpu:.1f} | x{cpu / ours:.2f} | {last} |")


if __name__ == "__main__":
    main()
