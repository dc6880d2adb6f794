"""Fixed code, run: what ``--fix --unsafe-fixes`` writes is imported and trained with real
backward passes, and compared with the model without checkpoints (``torch.equal``)."""

from __future__ import annotations

import importlib.util
import textwrap
import warnings
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import run_cli

torch = pytest.importorskip("torch")


def load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fixed(tmp_path: Path, source: str, code: str) -> tuple[ModuleType, ModuleType]:
    """The module as written and as ``--fix --unsafe-fixes`` left it (which must compile and
    leave no finding of ``code``)."""
    (tmp_path / "pyproject.toml").write_text("[tool.ckptlint]\n")
    before = tmp_path / "before.py"
    after = tmp_path / "after.py"
    before.write_text(textwrap.dedent(source))
    after.write_text(textwrap.dedent(source))
    result = run_cli("--fix", "--unsafe-fixes", "--select", code, "after.py", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert after.read_text() != before.read_text()
    return load(before), load(after)


def test_the_ckp001_fix_makes_a_call_with_region_keywords_run(tmp_path: Path) -> None:
    before, after = fixed(
        tmp_path,
        """
        import torch
        from torch.utils.checkpoint import checkpoint

        def block(h, mask, scale=1.0):
            return (h * mask).tanh() * scale

        def forward(x, mask):
            return checkpoint(block, x, mask=mask, scale=3.0)
        """,
        "CKP001",
    )
    x, mask = torch.randn(4, 8, requires_grad=True), torch.randn(4, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # use_reentrant left out
        with pytest.raises(ValueError, match="Unexpected keyword arguments: mask,scale"):
            before.forward(x, mask)
    after.forward(x, mask).sum().backward()
    checkpointed = x.grad
    x.grad = None
    after.block(x, mask, 3.0).sum().backward()
    assert torch.equal(checkpointed, x.grad)
