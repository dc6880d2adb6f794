"""What a hostile repository's configuration costs a run (issue 27).

A project of 200 small files (each with a CKP001 finding) is linted with ``--no-cache``:
plainly, then with lists at the bound a configuration may hold (10,000 ``exclude``
patterns, short or of 901 characters each (``*a*a...``: stars with a letter between, which
none of the paths matches), ``extend-checkpoint-functions`` names, ``per-file-ignores``
entries), with lists
over it (200,000 ``exclude`` patterns, 100,000 names, 50,000 ``per-file-ignores``: a
configuration error), with a list nested 100,000 deep (a configuration error), and with the
backtracking pattern ``*a*a*...*c`` in ``.gitignore`` and in ``exclude`` beside a file of a
60-character name. Wall and CPU seconds of the child process, interleaved repetitions,
medians.

    python benchmarks/hostile_config.py [--repeat N]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MISSING = "import torch.utils.checkpoint as cp\n\n\ndef f(x):\n    return cp.checkpoint(g, x)\n"
BACKTRACKING = "*a*a*a*a*a*a*a*a*a*a*a*a*a*a*c"


def long_pattern(index: int) -> str:
    """901 characters: the index, then stars with an ``a`` between (no path matches)."""
    return (f"{index:x}" + "*a" * 450)[:901].ljust(901, "*")


def quoted(items: list[str]) -> str:
    return "[" + ", ".join(f'"{item}"' for item in items) + "]"


CASES = {
    "plain": "",
    "10,000 exclude patterns": (
        f"exclude = {quoted([f'dir{i}/sub*/m{i}.py' for i in range(10_000)])}\n"
    ),
    # Issue 39: 9 MB of pyproject inside every bound (more than 300 s before the fix).
    "10,000 exclude patterns of 901 characters": (
        f"exclude = {quoted([long_pattern(i) for i in range(10_000)])}\n"
    ),
    "10,000 extend-checkpoint-functions": (
        f"extend-checkpoint-functions = {quoted([f'mylib.m{i}.wrap{i}' for i in range(10_000)])}\n"
    ),
    "10,000 per-file-ignores": "[tool.ckptlint.per-file-ignores]\n"
    + "".join(f'"dir{i}/*.py" = ["CKP001"]\n' for i in range(10_000)),
    "200,000 exclude patterns (error)": (
        f"exclude = {quoted([f'd{i}/m.py' for i in range(200_000)])}\n"
    ),
    "100,000 extend-checkpoint-functions (error)": (
        f"extend-checkpoint-functions = {quoted([f'm{i}.w' for i in range(100_000)])}\n"
    ),
    "50,000 per-file-ignores (error)": "[tool.ckptlint.per-file-ignores]\n"
    + "".join(f'"dir{i}/*.py" = ["CKP001"]\n' for i in range(50_000)),
    "a list nested 100,000 deep (error)": "exclude = " + "[" * 100_000 + "]" * 100_000 + "\n",
    "backtracking pattern in exclude": f'exclude = ["{BACKTRACKING}"]\n',
    "backtracking pattern in .gitignore": "",
}


def project(folder: Path, name: str, table: str) -> None:
    folder.mkdir()
    (folder / ".git").mkdir()
    for index in range(200):
        package = folder / f"pkg{index % 10}"
        package.mkdir(exist_ok=True)
        (package / f"m{index}.py").write_text(MISSING)
    (folder / ("a" * 57 + ".py")).write_text(MISSING)
    if "gitignore" in name:
        (folder / ".gitignore").write_text(BACKTRACKING + "\n")
    (folder / "pyproject.toml").write_text(
        table if table.startswith("[tool") else "[tool.ckptlint]\n" + table
    )


def timed(folder: Path) -> tuple[float, float, int]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "ckptlint", "--no-cache", "--quiet", "."],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=600,
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, cpu, result.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory() as temporary:
        folders = {}
        for index, (name, table) in enumerate(CASES.items()):
            folders[name] = Path(temporary) / f"case{index}"
            project(folders[name], name, table)
        runs: dict[str, list[tuple[float, float, int]]] = {name: [] for name in CASES}
        for _ in range(arguments.repeat):
            for name, folder in folders.items():
                runs[name].append(timed(folder))
    print("| configuration (200 files) | exit | wall s | CPU s |")
    print("| --- | --- | --- | --- |")
    for name, results in runs.items():
        wall = statistics.median(r[0] for r in results)
        cpu = statistics.median(r[1] for r in results)
        print(f"| {name} | {results[0][2]} | {wall:.2f} | {cpu:.2f} |")
    print(f"[{arguments.repeat} interleaved rounds, medians]")


if __name__ == "__main__":
    main()
