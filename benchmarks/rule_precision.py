"""Every semantic finding (CKP1xx/2xx/3xx) on real model trees, and what those rules cost.

Runs ``ckptlint`` on transformers 4.34.1 and 5.24.0, diffusers and timm, prints each
finding for review, then times ``--select CKP001`` against all rules on transformers
4.34.1 (same process count, median of several runs) and prints the ratio.

Trees are taken from ``/tmp/trees`` when present, else downloaded as source distributions
with ``pip download --no-deps --no-binary :all:`` into ``benchmarks/.cache`` and extracted.

    python benchmarks/rule_precision.py [--runs 5] [--jobs 2]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

PACKAGES = {
    "transformers-4.34.1": "transformers==4.34.1",
    "transformers-5.24.0": "transformers==5.24.0",
    "diffusers-0.42.1": "diffusers==0.42.1",
    "timm-1.0.31": "timm==1.0.31",
}
TIMED_TREE = "transformers-4.34.1"
PREINSTALLED = Path("/tmp/trees")
CACHE = Path(__file__).resolve().parent / ".cache"
SEMANTIC_CODES = "CKP1,CKP2,CKP3"


def tree(name: str) -> Path:
    """The extracted source tree of a package, downloading it on first use."""
    for folder in (PREINSTALLED / name, CACHE / name):
        if folder.is_dir():
            return folder
    CACHE.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
        + ["--dest", str(CACHE), PACKAGES[name]],
        check=True,
    )
    archive = next(CACHE.glob(f"{name}.tar.gz"))
    with tarfile.open(archive) as opened:
        if hasattr(tarfile, "data_filter"):  # Python 3.10.12+: refuse paths leaving CACHE
            opened.extractall(CACHE, filter="data")
        else:
            opened.extractall(CACHE)  # an sdist from the package index
    return CACHE / name


def ckptlint(path: Path, select: str, jobs: int, output_format: str = "text") -> str:
    command = [sys.executable, "-m", "ckptlint", str(path), "--select", select]
    command += ["--jobs", str(jobs), "--exit-zero", "--format", output_format]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout


def seconds(path: Path, select: str, jobs: int) -> tuple[float, float]:
    """Wall time and CPU time (user + system, all processes) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    ckptlint(path, select, jobs)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=2)
    arguments = parser.parse_args()

    total = 0
    for name in PACKAGES:
        root = tree(name)
        findings = json.loads(ckptlint(root, SEMANTIC_CODES, arguments.jobs, "json"))
        total += len(findings)
        print(f"== {name}: {len(findings)} semantic findings")
        for finding in findings:
            relative = Path(finding["path"]).relative_to(root)
            print(f"{relative}:{finding['line']}:{finding['column']}: {finding['code']}")
            print(f"    {finding['message']}")
    print(f"== {total} semantic findings in all")

    timed = tree(TIMED_TREE)
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
