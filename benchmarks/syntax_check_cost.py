"""What reporting syntax errors in lazily parsed bodies costs (transformers 4.34.1 or 5.24.0).

The lazy parser (ckptlint/lazy_tree.py) never builds the bodies no rule reads; since they
must still have their syntax errors reported, the engine checks them afterwards with one
``symtable`` pass (Python's parser without building AST objects). This compares, in one
process, interleaved, over the files a folder walk parses (those passing the prefilter):

- lazy + check: what ckptlint does;
- lazy, no check: the lazy parser alone (syntax errors in unread bodies missed);
- full parse: ``ast.parse`` of every file, no laziness.

CPU seconds beside wall seconds (one process, no workers).

Usage: python benchmarks/syntax_check_cost.py [--repeat N] [--version 4.34.1|5.24.0]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

import ckptlint.analyser
import ckptlint.project.index
from ckptlint.config import Settings
from ckptlint.engine import Engine
from ckptlint.regions.sources import SourceTable
from ckptlint.source import Prefilter, parse

sys.path.insert(0, str(Path(__file__).resolve().parent))
import trees  # noqa: E402


def lint_all(paths: list[str]) -> tuple[float, float]:
    """One cold run over the tree, in one process: its wall and CPU seconds."""
    start, cpu = time.perf_counter(), time.process_time()
    for result in Engine(Settings(respect_gitignore=False), paths, jobs=1).lint(paths):
        assert result.internal_error is None, (result.path, result.internal_error)
    return time.perf_counter() - start, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--version", default="4.34.1", choices=["4.34.1", "5.24.0"])
    arguments = parser.parse_args()
    gc.disable()  # as the CLI does

    source = trees.tree("transformers", arguments.version)
    paths = sorted(str(path) for path in source.rglob("*.py"))
    prefilter = Prefilter(SourceTable.build().words)
    parsed = [p for p in paths if prefilter.passes(Path(p).read_bytes())]
    lines = sum(Path(p).read_bytes().count(b"\n") for p in parsed)
    print(f"tree: {len(paths)} files; {len(parsed)} pass the prefilter ({lines:,} lines)")

    check = ckptlint.analyser.check_unparsed_bodies

    def lazy_with_check() -> tuple[float, float]:
        return lint_all(paths)

    def lazy_without_check() -> tuple[float, float]:
        ckptlint.analyser.check_unparsed_bodies = lambda *arguments: None
        try:
            return lint_all(paths)
        finally:
            ckptlint.analyser.check_unparsed_bodies = check

    def full_parse() -> tuple[float, float]:
        ckptlint.project.index.parse = lambda text, path, words, tokens: parse(
            text, path, None, tokens
        )
        try:
            return lint_all(paths)
        finally:
            ckptlint.project.index.parse = parse

    variants = {
        "lazy + check (ckptlint)": lazy_with_check,
        "lazy, no check": lazy_without_check,
        "full parse": full_parse,
    }
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    for _ in range(arguments.repeat):
        for name, run in variants.items():
            times[name].append(run())
    wall = {name: statistics.median(t[0] for t in values) for name, values in times.items()}
    cpu = {name: statistics.median(t[1] for t in values) for name, values in times.items()}
    base = "lazy, no check"
    print(f"\n{'variant':<28}{'wall s':>9}{'CPU s':>9}{'CPU vs no check':>17}")
    for name in variants:
        print(f"{name:<28}{wall[name]:>9.2f}{cpu[name]:>9.2f}{cpu[name] / cpu[base]:>16.3f}x")
    print(f"[{arguments.repeat} interleaved rounds, medians]")


if __name__ == "__main__":
    main()
