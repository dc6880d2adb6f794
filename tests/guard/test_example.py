"""examples/train_guarded.py: clean with the guard, each injected mistake named, and what plain
torch does about each."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest
import torch

import ckptguard
from tests.conftest import SUBPROCESS_TIMEOUT

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
    return subprocess.run(command, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT)


# The script as a user runs it: a process for each of its three endings (clean, plain
# torch's wrong gradients; the guard's error is README.md's and docs/guard.md's runnable
# example, checked by tests/test_doc_examples.py). Each mistake is then injected in this
# process, through the function the script runs: starting torch ten more times checked
# nothing more.
def test_clean_run_under_guard() -> None:
    result = _run("--guard")
    assert result.returncode == 0, result.stderr
    assert "finished without an error" in result.stdout


@pytest.mark.parametrize("mistake", list(EXPECTED_KIND))
def test_injected_mistake_is_named(mistake: str) -> None:
    example = _example_module()
    with pytest.raises(ckptguard.CheckpointMismatchError) as info:
        example.train(3, mistake, guard=True, log=lambda line: None)
    assert str(info.value).startswith(f"ckptguard [{EXPECTED_KIND[mistake]}]")
    assert not ckptguard.is_enabled()  # the script's train() switched the guard off again


def _example_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_guarded_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# plain torch raises its own, less specific error for these (no gradients to compare)
TORCH_RAISES = {
    "training": "CheckpointError",
    "placement": "RuntimeError",
    "function": "CheckpointError",
}


@pytest.mark.parametrize("mistake", list(EXPECTED_KIND))
def test_each_injection_changes_the_gradients_without_the_guard(mistake: str) -> None:
    """Every alarm of the example is for a change the recompute really sees: without the guard,
    step 2's gradients differ from a clean run's (torch.equal), or plain torch raises."""
    example = _example_module()
    quiet = lambda line: None  # noqa: E731
    clean = example.train(3, log=quiet)
    if mistake in TORCH_RAISES:
        with pytest.raises(RuntimeError) as info:
            example.train(3, mistake, log=quiet)
        assert type(info.value).__name__ == TORCH_RAISES[mistake]
        return
    changed = example.train(3, mistake, log=quiet)
    assert len(changed) == len(clean)
    assert not all(torch.equal(a, b) for a, b in zip(changed, clean, strict=True))


def test_example_says_the_gradients_were_wrong_only_after_checking() -> None:
    result = _run("--inject", "global")
    assert result.returncode == 0, result.stderr
    assert "step 2's gradients differ from a clean run's: they were wrong" in result.stdout
