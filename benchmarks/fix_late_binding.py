"""The CKP202 fix applied to every CKP202 finding of the pinned trees.

For each tree of ``benchmarks/trees.py`` (or those named): a copy in a temporary folder
(never the cached tree itself: the fix writes files), then

1. ``ckptlint --select CKP202 --format json``: the findings, and which carry a fix;
2. ``ckptlint --select CKP202 --fix --unsafe-fixes``: the fix;
3. every file that had a finding must compile, and every line it changed must be a line of
   a ``def`` or ``lambda`` header (the rest of the file kept as it was);
4. ``ckptlint --select CKP202 --format json`` again: no CKP202 left where a fix was offered.

Prints one line per tree and each finding left without a fix, with the reason its message
gives. Exits 1 when a fixed file does not compile, a line outside a header changed, or a
fixed finding is reported again.

    python benchmarks/fix_late_binding.py [TREE ...] [--jobs 2]
"""

from __future__ import annotations

import argparse
import ast
import difflib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import trees  # noqa: E402


def findings(root: Path, jobs: int) -> list[dict]:
    command = [sys.executable, "-m", "ckptlint", ".", "--select", "CKP202", "--exit-zero"]
    command += ["--jobs", str(jobs), "--format", "json", "--no-respect-gitignore"]
    done = subprocess.run(command, cwd=root, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def fix(root: Path, jobs: int) -> str:
    command = [sys.executable, "-m", "ckptlint", ".", "--select", "CKP202", "--exit-zero"]
    command += ["--jobs", str(jobs), "--fix", "--unsafe-fixes", "--no-respect-gitignore"]
    done = subprocess.run(command, cwd=root, capture_output=True, text=True)
    if done.returncode not in (0, 1):
        raise SystemExit(f"ckptlint --fix failed in {root}: {done.stderr[-2000:]}")
    return done.stdout + done.stderr


def header_lines(source: str) -> set[int]:
    """Lines of every ``def`` header (up to its body) and every ``lambda``."""
    lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines.update(range(node.lineno, node.body[0].lineno))
        elif isinstance(node, ast.Lambda):
            lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return lines


def changed_outside_headers(before: str, after: str) -> list[int]:
    """Lines of ``before`` changed or removed outside every header, and the lines after
    which lines were inserted outside every header."""
    headers = header_lines(before)
    outside = []
    matcher = difflib.SequenceMatcher(None, before.splitlines(), after.splitlines(), False)
    for tag, start, end, _, _ in matcher.get_opcodes():
        if tag == "equal":
            continue
        touched = range(start + 1, end + 1) if end > start else range(start, start + 1)
        outside.extend(line for line in touched if line not in headers)
    return outside


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="*", help="tree folder names (default: all 15)")
    parser.add_argument("--jobs", type=int, default=2)
    arguments = parser.parse_args()
    failures = 0
    totals = [0, 0, 0, 0]
    with tempfile.TemporaryDirectory(prefix="ckptlint-fix-late-binding-") as scratch:
        for path in trees.all_trees():
            if arguments.trees and path.name not in arguments.trees:
                continue
            root = Path(scratch) / path.name
            shutil.copytree(path, root, symlinks=True)
            before = findings(root, arguments.jobs)
            texts = {f["path"]: (root / f["path"]).read_text() for f in before}
            fixable = [f for f in before if f["fixable"]]
            fix(root, arguments.jobs)
            broken, stray = [], []
            for relative, text in texts.items():
                fixed = (root / relative).read_text()
                try:
                    compile(fixed, relative, "exec")
                except SyntaxError as error:
                    broken.append(f"{relative}: {error}")
                    continue
                stray.extend(f"{relative}:{n}" for n in changed_outside_headers(text, fixed))
            after = findings(root, arguments.jobs)
            fixed_places = {(f["path"], f["line"]) for f in fixable}
            again = [f for f in after if f["path"] in texts]
            print(
                f"{path.name:26} CKP202 {len(before):3}  fix offered {len(fixable):3}"
                f"  files {len(texts):3}  compile failures {len(broken)}"
                f"  lines changed outside headers {len(stray)}  CKP202 after {len(again):3}"
            )
            for finding in before:
                if not finding["fixable"]:
                    print(f"    no fix: {finding['path']}:{finding['line']}: {finding['message']}")
            for line in broken + stray:
                print(f"    FAILED: {line}")
            reported_again = [f for f in again if (f["path"], f["line"]) in fixed_places]
            for finding in reported_again:
                print(f"    FAILED, reported again: {finding['path']}:{finding['line']}")
            failures += len(broken) + len(stray) + len(reported_again)
            totals = [
                totals[0] + len(before),
                totals[1] + len(fixable),
                totals[2] + len(again),
                totals[3] + len(texts),
            ]
    print(
        f"== {totals[0]} CKP202 findings in {totals[3]} files, {totals[1]} with a fix;"
        f" after fixing: {totals[2]} CKP202 left in those files; {failures} failures"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
