"""A long-lived process (the language server, the test run) keeps nothing of a project it
linted once it drops the analysis's memos."""

from __future__ import annotations

import gc
from pathlib import Path

from ckptlint.memos import clear_memos
from tests.conftest import run_cli

MODULE = """\
import torch
import torch.utils.checkpoint as cp

SCALE = 1.0


def set_scale(value):
    global SCALE
    SCALE = value


def block(x):
    return x * SCALE


y = cp.checkpoint(block, torch.ones(1))
"""


def test_runs_leave_nothing_behind_once_the_memos_are_dropped(project: Path) -> None:
    (project / ".git").mkdir()
    for index in range(20):
        (project / f"m{index}.py").write_text(MODULE)
    run_cli("--no-cache", ".", cwd=project)  # what a first run imports and fills stays
    clear_memos()
    gc.collect()
    before = len(gc.get_objects())
    for _ in range(3):
        assert run_cli("--no-cache", ".", cwd=project).returncode == 1
    kept = len(gc.get_objects()) - before
    clear_memos()
    gc.collect()
    left = len(gc.get_objects()) - before
    assert kept > 10_000  # the memos held the projects (what this test is about)
    assert left < 1_000  # and nothing else did
