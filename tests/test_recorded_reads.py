"""What a file's results are recorded to read never depends on what was asked before them.

The cache keeps a file's findings and exports while what they read of each module still
holds: its skeleton, the bodies read, where a searched name lies (``project.facts``). One
analysis serves every file of a run, and its memos answer later files from bodies that an
earlier file read: each such answer must still record that body, or an edit to it would
leave the later file's stored results in place. So for every file, a run that analysed the
other files first records at least what a fresh analysis of that file alone records, and
gives the same answer: on the multi-file fixture packages, on generated packages, and on a
package built to reach each memo that answers from a body (a class's attributes, a project
``autograd.Function``, a function with a ``try``/``finally``, a wrapper spreading
``**kwargs``, a body read while its module loads).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptlint.analyser import Analyser
from ckptlint.config import Settings
from ckptlint.core import Finding
from ckptlint.engine import Engine
from ckptlint.memos import clear_memos
from ckptlint.project.dependencies import Dependencies
from ckptlint.project.stored import Analysed, Exported, Words
from tests.generated_projects import hypothesis_chooser, project

FIXTURES = Path(__file__).parent / "fixtures" / "rules"
PACKAGES = sorted(p for p in FIXTURES.glob("*/*") if p.is_dir())

SHARED = {
    "shared/__init__.py": "",
    "shared/blocks.py": (
        "import torch\n"
        "import torch.nn as nn\n"
        "from torch.utils.checkpoint import checkpoint\n\n"
        "SCALE = 1.0\n\n\n"
        "class Block(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.inner = nn.Linear(4, 4)\n\n"
        "    def forward(self, x):\n"
        "        return self.inner(x).relu()\n\n\n"
        "class Recompute(torch.autograd.Function):\n"
        "    @staticmethod\n"
        "    def forward(ctx, run, x):\n"
        "        ctx.run = run\n"
        "        with torch.no_grad():\n"
        "            return run(x)\n\n"
        "    @staticmethod\n"
        "    def backward(ctx, grad):\n"
        "        with torch.enable_grad():\n"
        "            return None, torch.autograd.grad(ctx.run(grad), grad)[0]\n\n\n"
        "def spread(fn, x, **kwargs):\n"
        "    return checkpoint(fn, x, **kwargs)\n\n\n"
        "def scaled(x):\n"
        "    global SCALE\n"
        "    saved = SCALE\n"
        "    try:\n"
        "        SCALE = 2.0\n"
        "        return x * SCALE\n"
        "    finally:\n"
        "        SCALE = saved\n\n\n"
        "ckpt = None\n\n\n"
        "class Installer:\n"
        "    def install(self):\n"
        "        global ckpt\n"
        "        ckpt = checkpoint\n\n\n"
        "def counted(items):\n"
        "    if (n := len(items)) > 1:\n"
        "        return n\n"
        "    return 0\n"
    ),
}
USERS = {
    f"users/{name}.py": (
        "from torch.utils.checkpoint import checkpoint\n"
        "from shared.blocks import Block, Recompute, ckpt, counted, scaled, spread\n\n\n"
        "def forward(x):\n"
        "    block = Block()\n"
        "    y = checkpoint(block, x)\n"
        "    z = spread(block.inner, y, use_reentrant=False)\n"
        "    w = checkpoint(scaled, z, use_reentrant=False)\n"
        "    return Recompute.apply(block, w), counted([w]), ckpt(block, x)\n"
    )
    for name in ("first", "second", "third")
}


def described(findings: tuple[Finding, ...]) -> list[tuple[int, int, str, str]]:
    return [(f.line, f.column, f.code, f.message) for f in findings]


def recorded(deps: Dependencies) -> set[tuple[object, ...]]:
    """What ``deps`` says was read, as comparable items (a module read whole covers every
    item of its shape)."""
    items: set[tuple[object, ...]] = {("whole", path) for path in deps.modules}
    for path, read in deps.shapes.items():
        items.add(("module", path))
        if read.skeleton is not None:
            items.add(("skeleton", path))
        items.update(("part", path, key) for key in read.parts)
        items.update(("names", path, name) for name in read.names)
        if read.versions is not None:
            items.add(("versions", path))
    items.update(("resolved", name) for name in deps.resolved)
    items.update(("package", name) for name in deps.packages)
    items.update(("scan", key) for key in deps.scans)
    return items


def unrecorded(shared: Dependencies, fresh: Dependencies) -> list[tuple[object, ...]]:
    """What the fresh analysis recorded that the shared one did not."""
    have = recorded(shared)
    whole = {item[1] for item in have if item[0] == "whole"}
    return sorted(
        (item for item in recorded(fresh) if item not in have and item[1] not in whole), key=str
    )


Computed = tuple[Analyser, Words, Analysed | Exported]


@contextmanager
def results_recorded() -> Iterator[dict[tuple[str, str, str], Computed]]:
    """Each file's findings and exports (for each round's words) as the run computes them,
    with their analyser."""
    seen: dict[tuple[str, str, str], Computed] = {}
    findings, exports = Analyser.findings, Analyser.exports

    def watched_findings(self: Analyser, path: str, fixes: bool) -> Analysed:
        result = findings(self, path, fixes)
        seen[("findings", path, self.words.digest)] = (self, self.words, result)
        return result

    def watched_exports(self: Analyser, path: str) -> Exported:
        result = exports(self, path)
        seen.setdefault(("exports", path, self.words.digest), (self, self.words, result))
        return result

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Analyser, "findings", watched_findings)
        patch.setattr(Analyser, "exports", watched_exports)
        yield seen


def check_recorded(root: Path) -> int:
    """Lint ``root`` whole in one process, then compute each file's exports and findings
    afresh; the files whose findings were computed."""
    paths = sorted(str(p) for p in root.rglob("*.py"))
    saved = os.getcwd()
    os.chdir(root)
    try:
        with results_recorded() as seen:
            list(Engine(Settings(root=root), paths, jobs=1).lint(paths))
        for (kind, path, _), (shared, words, result) in sorted(seen.items()):
            clear_memos()  # nothing learned from the other files
            fresh = Analyser(
                shared.table,
                shared.project.layout,
                shared.project.files,
                shared.project.paths,
                shared.analysis.evaluator.target_torch,
                shared.project.max_tokens,
            )
            fresh.use(words)
            if isinstance(result, Analysed):
                found = fresh.findings(path, False)
                assert described(found.findings) == described(result.findings)
                read = found.dependencies
            else:
                exported = fresh.exports(path)
                assert (exported.calls, exported.classes) == (result.calls, result.classes)
                read = exported.dependencies
            missing = unrecorded(result.dependencies, read)
            assert not missing, (kind, os.path.relpath(path), missing)
        return sum(kind == "findings" for kind, _, _ in seen)
    finally:
        os.chdir(saved)
        clear_memos()


def test_memos_answering_from_a_body_record_it(tmp_path: Path) -> None:
    for relative, text in {**SHARED, **USERS}.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text)
    assert check_recorded(tmp_path) == 4  # the three users and blocks.py


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_fixture_packages_record_the_same_whatever_came_first(package: Path) -> None:
    assert check_recorded(package) >= 1


@settings(
    max_examples=50,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_generated_packages_record_the_same_whatever_came_first(data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        for relative, text in project(hypothesis_chooser(data)).items():
            (root / relative).parent.mkdir(parents=True, exist_ok=True)
            (root / relative).write_text(text)
        check_recorded(root)
