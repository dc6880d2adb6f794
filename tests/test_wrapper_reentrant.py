"""CKP001 through a project's own wrappers: reported at the call that decides
``use_reentrant``, and only where the callee can take the keyword the fix adds.

A wrapper that passes ``use_reentrant`` on to torch (its own parameter, or ``**kwargs``
forwarded to ``checkpoint``) leaves the decision to its callers: CKP001 fires at the calls
that leave it unset. A wrapper that cannot take it is reported at its own ``checkpoint``
call, never at its callers. The fixes are applied and the fixed package is run with torch.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SUBPROCESS_TIMEOUT, lint_tree, messages_of, run_cli

MEMORY = """
    from torch.utils.checkpoint import checkpoint


    def checkpoint_block(fn, *args):
        return fn(*args)


    def forward_kw(fn, *args, **kw):
        return checkpoint(fn, *args, **kw)


    def own_flag(fn, *args, reentrant=None, preserve=True):
        return checkpoint(fn, *args, use_reentrant=reentrant, preserve_rng_state=preserve)


    def decided(fn, *args, use_reentrant=False):
        return checkpoint(fn, *args, use_reentrant=use_reentrant)


    def forgets(fn, *args):
        return checkpoint(fn, *args)


    def outer_kw(fn, *args, **options):
        return forward_kw(fn, *args, **options)
"""

MODEL = """
    from mylib.memory import checkpoint_block, decided, forgets, forward_kw, outer_kw, own_flag


    def forward(block, x):
        x = checkpoint_block(block, x)
        x = forward_kw(block, x)
        x = forward_kw(block, x, use_reentrant=False)
        x = own_flag(block, x)
        x = own_flag(block, x, reentrant=None)
        x = own_flag(block, x, reentrant=True)
        x = decided(block, x)
        x = forgets(block, x)
        x = outer_kw(block, x)
        x = outer_kw(block, x, use_reentrant=True)
        return x
"""

FILES = {
    "mylib/__init__.py": "",
    "mylib/memory.py": MEMORY,
    "pkg/__init__.py": "",
    "pkg/model.py": MODEL,
}

EXPECTED = [
    ("mylib/memory.py", 22, 12, "CKP001"),  # forgets: its own call leaves it out
    ("pkg/model.py", 7, 9, "CKP001"),  # forward_kw(block, x): **kw reaches checkpoint
    ("pkg/model.py", 9, 9, "CKP001"),  # own_flag(block, x): its default is None
    ("pkg/model.py", 10, 9, "CKP001"),  # own_flag(..., reentrant=None)
    ("pkg/model.py", 14, 9, "CKP001"),  # outer_kw(block, x): **options -> **kw -> checkpoint
]


def test_reported_where_use_reentrant_is_decided(tmp_path: Path) -> None:
    assert lint_tree(tmp_path, FILES) == EXPECTED


def test_configured_wrapper_without_the_keyword_is_not_reported(tmp_path: Path) -> None:
    """Declared in extend-checkpoint-functions, ``checkpoint_block(fn, *args)`` takes no
    ``use_reentrant``: adding it would be a TypeError (it once was the fix)."""
    configured = lint_tree(
        tmp_path, FILES, extend_checkpoint_functions=("mylib.memory.checkpoint_block",)
    )
    assert configured == EXPECTED


def test_configured_function_outside_the_project_is_taken_as_declared(tmp_path: Path) -> None:
    files = {
        "model.py": "from vendor.memory import ckpt\n\n\n"
        "def forward(f, x):\n    return ckpt(f, x)\n"
    }
    assert lint_tree(tmp_path, files, extend_checkpoint_functions=("vendor.memory.ckpt",)) == [
        ("model.py", 5, 12, "CKP001")
    ]


def test_messages_name_the_keyword_the_wrapper_takes(tmp_path: Path) -> None:
    messages = [m for m in messages_of(tmp_path, FILES) if "own_flag" in m]
    assert messages == [
        "`own_flag()` called without `reentrant` (`own_flag()` passes it on to `checkpoint()` as"
        " `use_reentrant`); pass `reentrant=False` (recommended) or `reentrant=True` explicitly",
        "`own_flag()` called with `reentrant=None` (`own_flag()` passes it on to `checkpoint()`"
        " as `use_reentrant`), which torch treats as not passed; pass `reentrant=False`"
        " (recommended) or `reentrant=True`",
    ]


@pytest.mark.torch
def test_fixes_add_only_keywords_the_callee_takes_and_the_code_runs(tmp_path: Path) -> None:
    lint_tree(tmp_path, FILES)
    (tmp_path / "pyproject.toml").write_text(
        '[tool.ckptlint]\nextend-checkpoint-functions = ["mylib.memory.checkpoint_block"]\n'
    )
    result = run_cli("--fix", "--unsafe-fixes", ".", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    fixed = (tmp_path / "pkg/model.py").read_text()
    assert "forward_kw(block, x, use_reentrant=False)\n    x = forward_kw(block, x, use" in fixed
    assert fixed.count("own_flag(block, x, reentrant=False)") == 2
    assert "checkpoint_block(block, x)\n" in fixed
    assert "outer_kw(block, x, use_reentrant=False)" in fixed
    script = (
        "import torch\n"
        "from pkg.model import forward\n"
        "x = torch.randn(2, 4, requires_grad=True)\n"
        "forward(torch.nn.Linear(4, 4), x).sum().backward()\n"
        "print(x.grad.shape)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout == "torch.Size([2, 4])\n"


def test_preserve_rng_state_through_a_forwarded_kwargs(tmp_path: Path) -> None:
    """``forward_kw(block, x, preserve_rng_state=False)`` reaches torch through ``**kw``."""
    files = {
        **FILES,
        "pkg/blocks.py": """
            import torch.nn as nn

            class Block(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.linear = nn.Linear(8, 8)
                    self.drop = nn.Dropout(0.1)

                def forward(self, x):
                    return self.drop(self.linear(x))
        """,
        "pkg/model.py": """
            from mylib.memory import forward_kw, outer_kw
            from pkg.blocks import Block

            def forward(block: Block, x):
                x = forward_kw(block, x, use_reentrant=False, preserve_rng_state=False)
                x = outer_kw(block, x, use_reentrant=False, preserve_rng_state=False)
                return forward_kw(block, x, use_reentrant=False)
        """,
    }
    found = [f for f in lint_tree(tmp_path, files) if f[0] == "pkg/model.py"]
    assert found == [("pkg/model.py", 6, 9, "CKP301"), ("pkg/model.py", 7, 9, "CKP301")]
