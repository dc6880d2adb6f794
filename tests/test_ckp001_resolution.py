"""CKP001: which calls are torch's checkpoint, through every import form, and which are not."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests.conftest import lint

# Which calls are torch's checkpoint and which are not, as exact cases (line, column):
# tests/fixtures/rules/CKP001.


def test_multiline_call_is_reported_at_its_first_line() -> None:
    source = textwrap.dedent(
        """
        import torch.utils.checkpoint

        out = torch.utils.checkpoint.checkpoint(
            block,
            x,
        )
        """
    )
    (finding,) = lint(source)
    assert (finding.line, finding.column, finding.end_line) == (4, 7, 7)


def test_columns_count_characters_not_bytes() -> None:
    source = 'import torch.utils.checkpoint as cp\ny = "ééé", cp.checkpoint(f, x)\n'
    (finding,) = lint(source)
    assert finding.column == len('y = "ééé", ') + 1


def test_extend_checkpoint_functions() -> None:
    source = "from mylib.memory import ckpt\nckpt(f, x)\n"
    assert lint(source) == []
    assert [f.code for f in lint(source, extend_checkpoint_functions=("mylib.memory.ckpt",))] == [
        "CKP001"
    ]


def test_verdicts_do_not_depend_on_hash_seed(tmp_path) -> None:
    """A try/except import must give the same verdict whatever PYTHONHASHSEED is."""
    module = tmp_path / "model.py"
    module.write_text(
        textwrap.dedent(
            """
            try:
                from deepspeed.checkpointing import checkpoint
            except ImportError:
                from torch.utils.checkpoint import checkpoint
            try:
                from torch.utils.checkpoint import checkpoint_sequential as seq
            except ImportError:
                seq = None
            def forward(x):
                checkpoint(f, x)
                seq(fs, 2, x)
            """
        )
    )
    outputs = set()
    for seed in ("0", "1", "2", "3", "12345"):
        result = subprocess.run(
            # --no-cache: each seed analyses afresh (a cached result would hide a difference)
            [sys.executable, "-m", "ckptlint", "--no-cache", "--format", "json", str(module)],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
            check=False,
        )
        outputs.add(result.stdout)
    assert len(outputs) == 1
    assert outputs.pop().count('"CKP001"') == 2


def test_line_numbers_follow_python_past_form_feeds() -> None:
    """str.splitlines breaks at a form feed; Python's line numbering does not."""
    source = "import torch.utils.checkpoint as cp\n\x0c\ndef f(x):  # \x0c here too\n"
    source += "    return cp.checkpoint(g, x)\n"
    (finding,) = lint(source)
    assert (finding.line, finding.column) == (4, 12)
