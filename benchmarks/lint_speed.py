"""ckptlint against its peer (TorchFix) and a speed reference (ruff) on a real tree.

Downloads transformers 4.34.1's sources once (cached in benchmarks/.cache), then in one run:
- times `ckptlint --select CKP001`, `torchfix --select TOR003` and `ruff check --select E9`;
- compares the use_reentrant sites ckptlint and TorchFix report (both set differences);
- times plain `flake8 --select E9` in two virtualenvs, without and with ckptlint installed.

Usage: python benchmarks/lint_speed.py [--repeat N] [--skip-torchfix]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "benchmarks" / ".cache"
PACKAGE = "transformers==4.34.1"


def tree() -> Path:
    folder = CACHE / "transformers-4.34.1"
    if not folder.is_dir():
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
            + ["-d", str(CACHE), PACKAGE],
            check=True,
        )
        with tarfile.open(next(CACHE.glob("transformers-4.34.1.tar.gz"))) as archive:
            archive.extractall(CACHE, filter="data")
    return folder


def virtualenv(name: str, *packages: str) -> Path:
    """A cached virtualenv holding only flake8 (and what else is asked for)."""
    folder = CACHE / name
    python = folder / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *packages], check=True)
    return python


def timed(command: list[str], cwd: Path) -> tuple[float, str]:
    start = time.perf_counter()
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if result.returncode not in (0, 1):
        raise SystemExit(f"{command[0]} failed ({result.returncode}): {result.stderr[-2000:]}")
    return elapsed, result.stdout


def interleaved(commands: list[list[str]], cwd: Path, repeat: int) -> list[tuple[float, str]]:
    """Median time and last output of each command, run in turn so load hits all alike."""
    times: list[list[float]] = [[] for _ in commands]
    outputs = [""] * len(commands)
    for _ in range(repeat):
        for index, command in enumerate(commands):
            elapsed, outputs[index] = timed(command, cwd)
            times[index].append(elapsed)
    return [(statistics.median(t), o) for t, o in zip(times, outputs, strict=True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--skip-torchfix", action="store_true", help="(it takes ~13 minutes)")
    arguments = parser.parse_args()

    source = tree()
    files = sum(1 for _ in source.rglob("*.py"))
    lines = sum(p.read_bytes().count(b"\n") for p in source.rglob("*.py"))
    print(f"tree: {PACKAGE} sources, {files} .py files, {lines:,} lines")

    ckptlint = [sys.executable, "-m", "ckptlint", "--select", "CKP001", "--format", "json", "."]
    all_rules = [sys.executable, "-m", "ckptlint", "--format", "json", "."]
    ruff = ["ruff", "check", "--select", "E9", "--no-cache", "--quiet", "--exit-zero", "."]
    (ckptlint_time, report), (all_rules_time, all_report), (ruff_time, _) = interleaved(
        [ckptlint, all_rules, ruff], source, arguments.repeat
    )
    ours = {(item["path"], item["line"]) for item in json.loads(report)}

    rows = [
        ("ckptlint --select CKP001", ckptlint_time, len(ours)),
        ("ckptlint (all rules)", all_rules_time, len(json.loads(all_report))),
    ]
    if not arguments.skip_torchfix:
        torchfix = ["torchfix", "--select", "TOR003", "."]
        torchfix_time, output = timed(torchfix, source)
        pattern = re.compile(r"^(?:\./)?(.+?):(\d+):\d+: TOR003", re.MULTILINE)
        theirs = {(path, int(line)) for path, line in pattern.findall(output)}
        rows.append(("torchfix --select TOR003", torchfix_time, len(theirs)))
    rows.append(("ruff check --select E9 --no-cache", ruff_time, None))

    print(f"\n{'tool':<36}{'seconds':>10}{'sites':>8}")
    for name, seconds, sites in rows:
        print(f"{name:<36}{seconds:>10.2f}{'' if sites is None else sites:>8}")
    if not arguments.skip_torchfix:
        print(f"\nckptlint speed-up over TorchFix: {torchfix_time / ckptlint_time:.0f}x")
        missed = sorted(theirs - ours)
        extra = sorted(ours - theirs)
        print(f"TorchFix sites ckptlint misses: {len(missed)} {missed[:20]}")
        print(f"ckptlint sites TorchFix misses: {len(extra)}")
        for path, line in extra:
            text = (source / path).read_text().splitlines()[line - 1].strip()
            print(f"  {path}:{line}: {text}")
    print(f"ckptlint time / ruff time: {ckptlint_time / ruff_time:.2f}x (CKP001),", end=" ")
    print(f"{all_rules_time / ruff_time:.2f}x (all rules)")

    plain = virtualenv("venv-flake8", "flake8")
    with_plugin = virtualenv("venv-flake8-ckptlint", "flake8", str(ROOT))
    flake8 = ["-m", "flake8", "--select", "E9", "--exit-zero", "."]
    times: dict[str, list[float]] = {"without": [], "with": []}
    for _ in range(3):  # interleaved, so load changes hit both alike; ~1 min a run
        times["without"].append(timed([str(plain), *flake8], source)[0])
        times["with"].append(timed([str(with_plugin), *flake8], source)[0])
    without, with_ = statistics.median(times["without"]), statistics.median(times["with"])
    print(f"\nflake8 --select E9 without ckptlint: {without:.2f} s")
    print(f"flake8 --select E9 with ckptlint:    {with_:.2f} s  ({with_ / without:.3f}x)")


if __name__ == "__main__":
    main()
