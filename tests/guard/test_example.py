"""examples/train_guarded.py: clean with the guard, and each injected mistake is named."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

EXAMPLE = pathlib.Path(__file__).parents[2] / "examples" / "train_guarded.py"
EXPECTED_KIND = {
    "global": "global",
    "closure": "closure",
    "training": "training",
    "attribute": "attribute",
    "tensor": "tensor",
    "placement": "placement",
    "function": "function",
    "rng_device": "rng_device",
    "hook": "hook",
    "torch_state": "torch_state",
}


def _run(*flags: str) -> subprocess.CompletedProcess:
    command = [sys.executable, str(EXAMPLE), "--steps", "3", *flags]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_clean_run_under_guard() -> None:
    result = _run("--guard")
    assert result.returncode == 0, result.stderr
    assert "finished without an error" in result.stdout


@pytest.mark.parametrize("mistake", list(EXPECTED_KIND))
def test_injected_mistake_is_named(mistake: str) -> None:
    result = _run("--guard", "--inject", mistake)
    assert result.returncode != 0
    assert f"CheckpointMismatchError: ckptguard [{EXPECTED_KIND[mistake]}]" in result.stderr
