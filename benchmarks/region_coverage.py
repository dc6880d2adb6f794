"""How much of real code's recompute regions ckptlint sees, and what it reports there.

For each tree of ``benchmarks/trees.py`` (15 public model trees, pinned versions; with
``--set new`` issue 37's 16 held-out trees, ``--set all`` both):

- **scan**: checkpoint call sites a lexical scan finds: a call (outside strings and
  comments) of a name of the ecosystem's checkpoint APIs (``checkpoint``,
  ``checkpoint_sequential``, ``checkpoint_wrapper``, ``apply_activation_checkpointing``,
  ``checkpoint_seq``, ``_gradient_checkpointing_func``, ``te_checkpoint``, the class
  ``CheckpointWrapper``, names ending in
  ``checkpoint_fn``/``_func``/``_function``/``_forward``...), plus classes naming
  ``GradientCheckpointingLayer`` among their bases.
- **recognised**: scan sites where ckptlint finds a region source (a site on that line).
- **resolved**: recognised sites whose region ckptlint evaluated to code (a function,
  module or partial), **delegated**: sites inside a project wrapper whose region is the
  wrapper's argument (resolved at the wrapper's call sites, which are sites themselves),
  **followed**: resolved sites whose analysis entered the region's code (at least one
  ``def`` body, e.g. a layer's ``forward``).
- **+found**: sites ckptlint finds that the scan does not (calls of project wrappers,
  subclasses of subclasses of ``GradientCheckpointingLayer``).
- findings per rule, from a full run (``--show-findings`` prints them for review).

    python benchmarks/region_coverage.py [--set pinned|new|all] [--show-findings]
        [--show-unresolved N] [TREE ...]
"""

from __future__ import annotations

import argparse
import collections
import io
import os
import re
import sys
import time
import tokenize
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import trees  # noqa: E402

from ckptlint.analyser import analyze  # noqa: E402
from ckptlint.config import Settings  # noqa: E402
from ckptlint.discovery import discover  # noqa: E402
from ckptlint.engine import Engine  # noqa: E402
from ckptlint.resolution.values import known  # noqa: E402

SCANNED_NAMES = frozenset(
    "checkpoint checkpoint_sequential checkpoint_wrapper apply_activation_checkpointing"
    " checkpoint_seq checkpoint_module _gradient_checkpointing_func te_checkpoint"
    " ptd_checkpoint_wrapper CheckpointWrapper".split()
)
SCANNED_SUFFIX = re.compile(r"checkpoint(?:ing)?_(?:fn|func|function|forward)$")
LAYER_BASE = re.compile(r"^[ \t]*class[ \t]+\w+[ \t]*\([^)]*\bGradientCheckpointingLayer\b", re.M)
RULES = ("CKP001", "CKP101", "CKP201", "CKP202", "CKP203", "CKP301")


def scan(path: str) -> list[int]:
    """Lines with a checkpoint-like call or a GradientCheckpointingLayer subclass."""
    data = Path(path).read_bytes()
    if b"heckpoint" not in data:
        return []
    text = data.decode("utf-8", "replace")
    lines = {text.count("\n", 0, m.start()) + 1 for m in LAYER_BASE.finditer(text)}
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return sorted(lines)
    for index, token in enumerate(tokens[:-1]):
        following = tokens[index + 1]
        if token.type != tokenize.NAME or following.string != "(":
            continue
        previous = tokens[index - 1].string if index else ""
        if previous in ("def", "class"):
            continue
        if token.string in SCANNED_NAMES or SCANNED_SUFFIX.search(token.string):
            lines.add(token.start[0])
    return sorted(lines)


def measure(tree: Path, show_unresolved: int) -> tuple[collections.Counter, list[str]]:
    settings = Settings(root=tree, respect_gitignore=False)
    files = [f for f in discover([str(tree)], settings) if f.error is None]
    engine = Engine(settings, [f.path for f in files], jobs=1)
    owned, analysis = engine.analysis()
    counts: collections.Counter = collections.Counter()
    unresolved: list[str] = []
    sites_at: dict[tuple[str, int], list] = collections.defaultdict(list)
    for path in owned:
        module = analysis.project.module_at(path)
        if module is None:
            continue
        for site in analysis.sites(module):
            node = site.layer.node if site.layer is not None else site.node
            for line in range(node.lineno, (node.end_lineno or node.lineno) + 1):
                sites_at[(path, line)].append(site)
                if site.layer is not None:
                    break
    matched: set[int] = set()
    for file in files:
        for line in scan(file.path):
            counts["scan"] += 1
            sites = sites_at.get((os.path.abspath(file.path), line), [])
            if not sites:
                unresolved.append(f"not recognised  {file.path}:{line}")
                continue
            counts["recognised"] += 1
            matched.update(id(s) for s in sites)
            site = sites[0]
            if site.delegates:
                counts["delegated"] += 1
            elif known(analysis.region(site)):
                counts["resolved"] += 1
                if analysis.reach(site).functions:
                    counts["followed"] += 1
            else:
                unresolved.append(f"unresolved      {file.path}:{line}")
    every_site = {id(s): s for group in sites_at.values() for s in group}
    counts["+found"] = sum(1 for key in every_site if key not in matched)
    for path in owned:
        module = analysis.project.module_at(path)
        if module is not None:
            for finding in analyze(module, analysis):
                counts[finding.code] += 1
    return counts, unresolved[:show_unresolved]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="*", help="tree folder names (default: all)")
    parser.add_argument("--show-unresolved", type=int, default=0, metavar="N")
    parser.add_argument("--show-findings", action="store_true")
    parser.add_argument("--set", choices=("pinned", "new", "all"), default="pinned")
    arguments = parser.parse_args()
    groups = [
        (label, fetch())
        for label, fetch in (("pinned trees", trees.all_trees), ("new trees", trees.new_trees))
        if arguments.set in ("all", label.split()[0])
    ]
    if arguments.trees:
        groups = [
            (label, [f for f in folders if any(name in f.name for name in arguments.trees)])
            for label, folders in groups
        ]
    header = ["tree", "scan", "recognised", "resolved", "delegated", "followed", "+found"]
    print(" ".join(f"{h:>11}" if i else f"{h:42}" for i, h in enumerate(header + list(RULES))))
    totals: list[tuple[str, collections.Counter]] = []
    for label, folders in groups:
        total: collections.Counter = collections.Counter()
        for folder in folders:
            start = time.perf_counter()
            counts, unresolved = measure(folder, arguments.show_unresolved)
            total.update(counts)
            cells = [counts[h] for h in header[1:]] + [counts[code] for code in RULES]
            row = f"{folder.name[:42]:42}" + "".join(f"{c:>12}" for c in cells)
            print(f"{row}   ({time.perf_counter() - start:.1f} s)", flush=True)
            for entry in unresolved:
                print(f"    {entry}")
            if arguments.show_findings:
                show_findings(folder)
        cells = [total[h] for h in header[1:]] + [total[code] for code in RULES]
        print(f"{label:42}" + "".join(f"{c:>12}" for c in cells))
        totals.append((label, total))
    print()
    for label, total in totals:
        seen = total["resolved"] + total["delegated"]
        scanned = max(total["scan"], 1)
        print(
            f"{label}: recognised {total['recognised']}/{total['scan']}"
            f" ({100 * total['recognised'] / scanned:.1f} %); recognised and resolved (or"
            f" delegated to resolved call sites) {seen}/{total['scan']}"
            f" ({100 * seen / scanned:.1f} %); followed into model code {total['followed']};"
            f" more sites found than the scan sees {total['+found']}"
        )


def show_findings(folder: Path) -> None:
    """Every finding but CKP001's of a full run on the tree, for review."""
    settings = Settings(root=folder, respect_gitignore=False)
    paths = [f.path for f in discover([str(folder)], settings) if f.error is None]
    for result in Engine(settings, paths).lint(paths):
        for finding in result.findings:
            if finding.code != "CKP001":
                where = f"{result.path}:{finding.line}:{finding.column}"
                print(f"    {where}: {finding.code} {finding.message}")


if __name__ == "__main__":
    main()
