"""ckptlint's speed against ruff (a speed reference) and flake8, and its peer TorchFix.

On the 15 pinned public trees of ``benchmarks/trees.py`` (fetched once into
benchmarks/.cache), in one run with interleaved repetitions and medians:

- **cold**: ``ckptlint --no-cache`` over all trees at once (every file read, candidates
  parsed and analysed, worker processes as the CLI chooses them);
- **warm**: ``ckptlint`` again, nothing changed (the results cache is reused);
- **ruff**: ``ruff check --select E9 --no-cache`` over the same trees;
- **parse floor**: CPython's ``ast.parse`` alone on the files that name a region source (the
  files any cold run must parse), spread over the cores: what no Python linter can go under;
- **flake8**: ``flake8 --select E9`` on transformers 4.34.1 in two virtualenvs, without and
  with ckptlint installed (flake8 runs every installed plugin on every file), wall and CPU
  time (CPU time is what a busy machine does not disturb);
- with ``--torchfix``: ``torchfix --select TOR003`` on transformers 4.34.1 (~13 minutes) and
  the use_reentrant sites both report, compared.

    python benchmarks/lint_speed.py [--repeat N] [--torchfix] [--skip-flake8]
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import trees  # noqa: E402

from ckptlint.regions.sources import SourceTable  # noqa: E402
from ckptlint.source import Prefilter  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "benchmarks" / ".cache"
# The cache folder of the timed runs (the trees live under a git-ignored folder of this
# repository, so configuration and .gitignore are left out: --isolated, no gitignore).
RESULTS_CACHE = CACHE / "lint-speed-results"
CKPTLINT = [sys.executable, "-m", "ckptlint", "--isolated", "--no-respect-gitignore"]
CKPTLINT += ["--exit-zero", "--quiet", "--cache-dir", str(RESULTS_CACHE)]
# Tools installed next to this interpreter (its virtualenv need not be on PATH).
BIN = str(Path(sys.executable).parent)
RUFF = shutil.which("ruff", path=BIN) or "ruff"
TORCHFIX = shutil.which("torchfix", path=BIN) or "torchfix"


def virtualenv(name: str, *packages: str) -> Path:
    """A cached virtualenv holding only flake8 (and what else is asked for)."""
    folder = CACHE / name
    python = folder / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *packages], check=True)
    return python


def timed(command: list[str], cwd: Path) -> tuple[float, str]:
    return timed_with_cpu(command, cwd)[::2]


def timed_with_cpu(command: list[str], cwd: Path) -> tuple[float, float, str]:
    """Wall seconds, CPU seconds (user + system, all its processes) and standard output."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode not in (0, 1):
        raise SystemExit(f"{command[:3]} failed ({result.returncode}): {result.stderr[-2000:]}")
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return elapsed, cpu, result.stdout


def interleaved(commands: dict[str, list[str]], cwd: Path, repeat: int) -> dict[str, float]:
    """Median seconds of each command, run in turn so load hits all alike."""
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(repeat):
        for name, command in commands.items():
            times[name].append(timed(command, cwd)[0])
    return {name: statistics.median(values) for name, values in times.items()}


def parse_floor(folders: list[Path]) -> tuple[int, float]:
    """Files naming a region source, and the seconds ``ast.parse`` takes on them, divided
    among the cores (the median of three passes)."""
    prefilter = Prefilter(SourceTable.build().words)
    texts = [
        data
        for folder in folders
        for path in folder.rglob("*.py")
        if prefilter.passes(data := path.read_bytes())
    ]
    passes = []
    for _ in range(3):
        start = time.perf_counter()
        for data in texts:
            try:
                ast.parse(data)
            except (SyntaxError, ValueError):
                pass
        passes.append(time.perf_counter() - start)
    return len(texts), statistics.median(passes) / (os.cpu_count() or 1)


def plugin_seconds(source: Path, files: list[str]) -> float:
    """CPU seconds the flake8 plugin spends on ``files`` (the median of three passes), on
    the trees and lines flake8 would hand it: its share of a flake8 run, free of the noise
    of two subprocesses' timings."""
    from ckptlint.flake8_plugin import CheckpointChecker

    inputs = []
    for name in files:
        text = (source / name).read_text(encoding="utf-8", errors="replace")
        inputs.append((ast.parse(text), text.splitlines(True), str(source / name)))
    passes = []
    for _ in range(3):
        start = time.process_time()
        for tree, lines, filename in inputs:
            list(CheckpointChecker(tree, lines, filename).run())
        passes.append(time.process_time() - start)
    return statistics.median(passes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--torchfix", action="store_true", help="(it takes ~13 minutes)")
    parser.add_argument("--skip-flake8", action="store_true")
    arguments = parser.parse_args()

    folders = trees.all_trees()
    names = [f.name for f in folders]
    files = sum(1 for f in folders for _ in f.rglob("*.py"))
    lines = sum(p.read_bytes().count(b"\n") for f in folders for p in f.rglob("*.py"))
    print(f"{len(folders)} trees, {files:,} .py files, {lines:,} lines: {', '.join(names)}")

    timed([*CKPTLINT, *names], CACHE)  # warm the OS file cache and the results cache alike
    medians = interleaved(
        {
            "cold": [*CKPTLINT, "--no-cache", *names],
            "warm": [*CKPTLINT, *names],
            "ruff": [RUFF, "check", "--select", "E9", "--no-cache", "--isolated", "--quiet"]
            + ["--exit-zero", *names],
        },
        CACHE,
        arguments.repeat,
    )
    print(f"\n{'run':<40}{'seconds':>10}{'vs ruff':>10}")
    labels = {
        "cold": "ckptlint, cold (--no-cache)",
        "warm": "ckptlint, warm (nothing changed)",
        "ruff": "ruff check --select E9 --no-cache",
    }
    for name, seconds in medians.items():
        print(f"{labels[name]:<40}{seconds:>10.2f}{seconds / medians['ruff']:>9.2f}x")
    count, floor = parse_floor(folders)
    label = f"parse floor ({count:,} files, {os.cpu_count()} cores)"
    print(f"{label:<40}{floor:>10.2f}{floor / medians['ruff']:>9.2f}x")

    source = trees.tree("transformers", "4.34.1")
    if arguments.torchfix:
        report = timed(
            [*CKPTLINT, "--no-cache", "--select", "CKP001", "--format", "json", "."], source
        )
        ours = {(item["path"], item["line"]) for item in json.loads(report[1])}
        torchfix_time, output = timed([TORCHFIX, "--select", "TOR003", "."], source)
        # TorchFix may end a message without a line break (its multi-line code excerpts):
        # a report starts at a path, wherever it stands on a line
        pattern = re.compile(r"(?:\./)?([^\s,]+?\.py):(\d+):\d+: TOR003")
        theirs = {(path, int(line)) for path, line in pattern.findall(output)}
        print(f"\ntorchfix --select TOR003 on transformers 4.34.1: {torchfix_time:.1f} s")
        print(f"use_reentrant sites: ckptlint {len(ours)}, TorchFix {len(theirs)}")
        print(f"TorchFix sites ckptlint misses: {sorted(theirs - ours)[:20]}")
        print(f"ckptlint sites TorchFix misses: {sorted(ours - theirs)[:20]}")

    if not arguments.skip_flake8:
        plain = virtualenv("venv-flake8", "flake8")
        with_plugin = virtualenv("venv-flake8-ckptlint", "flake8", str(ROOT))
        install = [str(with_plugin), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall"]
        subprocess.run([*install, str(ROOT)], check=True)  # this checkout, not an older one
        prefilter = Prefilter(SourceTable.build().words)
        every = sorted(str(p.relative_to(source)) for p in source.rglob("*.py"))
        unreachable = [p for p in every if not prefilter.passes((source / p).read_bytes())]
        for label, files in (
            (f"the {len(unreachable)} files that cannot reach a checkpoint", unreachable),
            (f"all {len(every)} files", ["."]),
        ):
            flake8 = ["-m", "flake8", "--isolated", "--select", "E9", "--exit-zero", *files]
            runs: dict[str, list[tuple[float, float, str]]] = {"without": [], "with": []}
            for _ in range(3):  # interleaved; up to a minute a run
                runs["without"].append(timed_with_cpu([str(plain), *flake8], source))
                runs["with"].append(timed_with_cpu([str(with_plugin), *flake8], source))
            wall = {k: statistics.median(r[0] for r in v) for k, v in runs.items()}
            cpu = {k: statistics.median(r[1] for r in v) for k, v in runs.items()}
            print(f"\nflake8 --select E9, transformers 4.34.1, {label}:")
            if files is unreachable:
                own = plugin_seconds(source, unreachable)
                share = own / cpu["without"]
                print(f"  the plugin's own work on them, in one process: {own:.2f} s ({share:.1%}")
                print("  of flake8's CPU time without it)")
            for kind, figures in (("wall", wall), ("CPU", cpu)):
                print(
                    f"  {kind}: without ckptlint {figures['without']:.2f} s, with ckptlint", end=""
                )
                print(f" {figures['with']:.2f} s ({figures['with'] / figures['without']:.3f}x)")


if __name__ == "__main__":
    main()
