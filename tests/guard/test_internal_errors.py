"""The guard's own failure never stops training: the region runs on unguarded, gradients stay
bit-identical to plain torch, and a warning names the region, the stage and the error."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn
from conftest import grads_equal, grads_of
from torch.utils.checkpoint import checkpoint

import ckptguard
from ckptguard import _verify

VARIANTS = pytest.mark.parametrize("reentrant", [False, True], ids=["nonreentrant", "reentrant"])


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 4)
        self.register_buffer("gain", torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(self.fc(x) * self.gain)


def _steps(module: nn.Module, reentrant: bool, region: str) -> list:
    grads = []
    for seed in range(2):
        x = torch.randn(3, 4, generator=torch.Generator().manual_seed(seed), requires_grad=True)
        called = module if region == "module" else (lambda h: module(h))
        checkpoint(called, x, use_reentrant=reentrant).sum().backward()
        grads += grads_of(module, x)
        module.zero_grad(set_to_none=True)
    return grads


def _fail(*args, **kwargs):
    raise RuntimeError("injected failure")


@VARIANTS
@pytest.mark.parametrize(
    ("region", "failing", "stage"),
    [
        ("module", "stateful_modules", "prepare"),  # a module region, before its forward
        ("module", "capture", "fingerprint"),
        ("function", "capture", "fingerprint"),
        ("module", "compare", "verify"),
        ("function", "compare", "verify"),
    ],
)
def test_a_failing_guard_leaves_training_alone(
    monkeypatch, reentrant: bool, region: str, failing: str, stage: str
) -> None:
    plain = _steps(Block(), reentrant, region)
    monkeypatch.setattr(_verify, failing, _fail)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with ckptguard.guard():
            guarded = _steps(Block(), reentrant, region)
    assert grads_equal(plain, guarded)
    messages = [str(w.message) for w in caught if w.category is ckptguard.CheckpointGuardWarning]
    assert messages, "the failure must be reported"
    assert all(f"could not {stage} checkpointed region" in m for m in messages), messages
    assert "RuntimeError: injected failure" in messages[0]
    assert "runs without the guard from here" in messages[0]


@VARIANTS
def test_a_failing_strict_check_leaves_training_alone(monkeypatch, reentrant: bool) -> None:
    from ckptguard import _strict

    plain = _steps(Block(), reentrant, "module")
    monkeypatch.setattr(_strict.StrictRecompute, "difference", _fail)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with ckptguard.guard(strict=True):
            guarded = _steps(Block(), reentrant, "module")
    assert grads_equal(plain, guarded)
    messages = [str(w.message) for w in caught if w.category is ckptguard.CheckpointGuardWarning]
    assert any("could not check the recompute of checkpointed region" in m for m in messages)
