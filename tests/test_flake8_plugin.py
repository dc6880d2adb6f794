"""The real flake8 executable with the plugin installed reports what the CLI reports."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import run_ckptlint

SOURCE = textwrap.dedent(
    """\
    import functools
    import torch.utils.checkpoint as cp
    from torch.utils.checkpoint import checkpoint, checkpoint_sequential

    run = functools.partial(checkpoint, preserve_rng_state=True)


    def forward(self, x, é="é"):
        x = cp.checkpoint(self.block, x)
        x = run(self.block, x)
        x = checkpoint_sequential(self.layers, 2, x)
        x = checkpoint(self.block, x)  # noqa: CKP001
        x = checkpoint(self.block, x, use_reentrant=False)
        return é, cp.checkpoint(
            self.block,
            x,
        )
    """
)


def flake8(*arguments: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flake8", *arguments],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_flake8_reports_the_same_places_as_the_cli(project: Path) -> None:
    (project / "model.py").write_text(SOURCE)
    result = flake8("--select", "CKP", "model.py", cwd=project)
    assert result.returncode == 1, result.stderr
    from_flake8 = [line.split(" ", 2)[:2] for line in result.stdout.splitlines()]
    cli = json.loads(run_ckptlint("--format", "json", "model.py", cwd=project).stdout)
    from_cli = [[f"model.py:{i['line']}:{i['column']}:", i["code"]] for i in cli]
    assert from_flake8 == from_cli
    assert [place for place, _ in from_flake8] == [
        "model.py:9:9:",
        "model.py:10:9:",
        "model.py:11:9:",
        "model.py:14:15:",
    ]


def test_plugin_is_registered_with_flake8(project: Path) -> None:
    result = flake8("--version", cwd=project)
    assert "ckptlint" in result.stdout


def test_extend_checkpoint_functions_through_flake8_config(project: Path) -> None:
    (project / "model.py").write_text("from mylib.mem import ckpt\n\nckpt(f, x)\n")
    assert flake8("--select", "CKP", "model.py", cwd=project).stdout == ""
    (project / "setup.cfg").write_text(
        "[flake8]\nextend-checkpoint-functions = mylib.mem.ckpt, other.wrapper\n"
    )
    result = flake8("--select", "CKP", "model.py", cwd=project)
    assert result.stdout.startswith("model.py:3:1: CKP001 ")


def test_files_without_checkpoint_are_untouched(project: Path) -> None:
    (project / "plain.py").write_text("def checkpointing_helper():\n    return 1\n")
    result = flake8("--select", "CKP", "plain.py", cwd=project)
    assert result.returncode == 0 and result.stdout == ""
