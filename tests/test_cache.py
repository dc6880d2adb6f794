"""The results cache: reused while nothing a run depended on changed, never stale."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

import ckptlint.engine
from tests.conftest import run_cli

BLOCK = """
import torch.nn as nn

SCALE = 1.0

class Block(nn.Module):
    def forward(self, x):
        h = x.relu()
        return h * SCALE
"""
MODEL = """
from torch.utils.checkpoint import checkpoint
from blocks import Block

def forward(x):
    return checkpoint(Block(), x, use_reentrant=False)
"""
SETTER = """

def set_scale(value):
    global SCALE
    SCALE = value
"""


def write(root: Path, name: str, text: str) -> None:
    (root / name).write_text(textwrap.dedent(text))


def codes(root: Path, *arguments: str) -> list[str]:
    result = run_cli("--format", "json", *arguments, ".", cwd=root)
    return sorted(item["code"] for item in json.loads(result.stdout))


@pytest.fixture
def tree(project: Path) -> Path:
    write(project, "blocks.py", BLOCK)
    write(project, "model.py", MODEL)
    write(project, "unrelated.py", "def add(a, b):\n    return a + b\n")
    return project


def test_a_second_run_parses_nothing(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = run_cli("--format", "json", ".", cwd=tree).stdout
    cache = tree / ".ckptlint_cache"
    assert (cache / "CACHEDIR.TAG").is_file() and (cache / ".gitignore").read_text() == "*\n"

    def no_parse(*arguments: object, **keywords: object) -> None:
        raise AssertionError("parsed although nothing changed")

    monkeypatch.setattr(ckptlint.engine, "parse", no_parse)
    assert run_cli("--format", "json", ".", cwd=tree).stdout == first


def test_an_edit_to_a_file_the_run_never_read_reuses_the_results(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_cli(".", cwd=tree)
    write(tree, "unrelated.py", "def add(a, b):\n    return b + a\n")
    monkeypatch.setattr(ckptlint.engine, "parse", None)  # any parse would fail
    assert run_cli("--format", "json", ".", cwd=tree).returncode == 0


def test_an_edit_to_a_module_a_region_runs_is_seen(tree: Path) -> None:
    assert codes(tree) == []
    (tree / "blocks.py").write_text(textwrap.dedent(BLOCK) + SETTER)
    assert codes(tree) == ["CKP201"]
    write(tree, "blocks.py", BLOCK)
    assert codes(tree) == []


def test_a_new_file_naming_a_word_of_interest_is_linted(tree: Path) -> None:
    assert codes(tree) == []
    write(tree, "late.py", "from torch.utils.checkpoint import checkpoint\ncheckpoint(f, x)\n")
    assert codes(tree) == ["CKP001"]


def test_a_new_file_providing_a_missing_module_is_seen(project: Path) -> None:
    write(
        project,
        "model.py",
        "from torch.utils.checkpoint import checkpoint\nfrom helpers import run\n"
        "def forward(x):\n    return run(x)\n",
    )
    assert codes(project) == []
    write(
        project,
        "helpers.py",
        "from torch.utils.checkpoint import checkpoint\ndef run(x):\n    return checkpoint(f, x)\n",
    )
    assert codes(project) == ["CKP001"]


def test_a_broken_or_half_written_entry_is_a_miss(tree: Path) -> None:
    assert codes(tree) == []
    cache = tree / ".ckptlint_cache"
    for entry in cache.glob("run-*.json"):
        entry.write_text("{not json")
    (cache / ".run-leftover.tmp").write_text("from a killed run")
    (tree / "blocks.py").write_text(textwrap.dedent(BLOCK) + SETTER)
    assert codes(tree) == ["CKP201"]


def test_no_cache_writes_nothing(tree: Path) -> None:
    assert codes(tree, "--no-cache") == []
    assert not (tree / ".ckptlint_cache").exists()


def test_settings_are_part_of_the_entry(tree: Path) -> None:
    write(tree, "bad.py", "from torch.utils.checkpoint import checkpoint\ncheckpoint(f, x)\n")
    assert codes(tree) == ["CKP001"]
    assert codes(tree, "--select", "CKP2") == []
    assert codes(tree) == ["CKP001"]


def test_cached_results_keep_their_fixes(tree: Path) -> None:
    write(tree, "bad.py", "from torch.utils.checkpoint import checkpoint\ncheckpoint(f, x)\n")
    run_cli(".", cwd=tree)
    assert run_cli("--fix", "--unsafe-fixes", ".", cwd=tree).returncode == 0
    assert "use_reentrant=False" in (tree / "bad.py").read_text()
    assert os.listdir(tree / ".ckptlint_cache")
