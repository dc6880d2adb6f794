"""What reporting syntax errors in lazily parsed bodies costs, on transformers 4.34.1.

The lazy parser (ckptlint/lazy_tree.py) never builds the bodies no rule reads; since they
must still have their syntax errors reported, the engine checks them afterwards with one
``symtable`` pass (Python's parser without building AST objects). This compares, in one
process, interleaved, over the files a folder walk parses (those passing the prefilter):

- lazy + check: what ckptlint does;
- lazy, no check: the lazy parser alone (syntax errors in unread bodies missed);
- full parse: ``ast.parse`` of every file, no laziness.

Usage: python benchmarks/syntax_check_cost.py [--repeat N]
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


def lint_all(paths: list[str]) -> float:
    """One cold run over the tree, in one process."""
    start = time.perf_counter()
    for result in Engine(Settings(respect_gitignore=False), paths, jobs=1).lint(paths):
        assert result.internal_error is None, (result.path, result.internal_error)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    arguments = parser.parse_args()
    gc.set_threshold(100_000, 50, 100)  # as the CLI does

    source = trees.tree("transformers", "4.34.1")
    paths = sorted(str(path) for path in source.rglob("*.py"))
    prefilter = Prefilter(SourceTable.build().words)
    parsed = [p for p in paths if prefilter.passes(Path(p).read_bytes())]
    lines = sum(Path(p).read_bytes().count(b"\n") for p in parsed)
    print(f"tree: {len(paths)} files; {len(parsed)} pass the prefilter ({lines:,} lines)")

    check = ckptlint.analyser.check_unparsed_bodies

    def lazy_with_check() -> float:
        return lint_all(paths)

    def lazy_without_check() -> float:
        ckptlint.analyser.check_unparsed_bodies = lambda *arguments: None
        try:
            return lint_all(paths)
        finally:
            ckptlint.analyser.check_unparsed_bodies = check

    def full_parse() -> float:
        ckptlint.project.index.parse = lambda text, path, words=None: parse(text, path)
        try:
            return lint_all(paths)
        finally:
            ckptlint.project.index.parse = parse

    variants = {
        "lazy + check (ckptlint)": lazy_with_check,
        "lazy, no check": lazy_without_check,
        "full parse": full_parse,
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(arguments.repeat):
        for name, run in variants.items():
            times[name].append(run())
    medians = {name: statistics.median(values) for name, values in times.items()}
    base = medians["lazy, no check"]
    print(f"\n{'variant':<28}{'median s':>10}{'vs no check':>14}")
    for name, median in medians.items():
        print(f"{name:<28}{median:>10.2f}{median / base:>13.3f}x")


if __name__ == "__main__":
    main()
