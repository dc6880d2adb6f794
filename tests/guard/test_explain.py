"""torch's own CheckpointError, explained from the region's fingerprints (issue 9, item 3)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import CheckpointError, checkpoint

import ckptguard


class Dropping(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(8, 8)
        self.dropout = nn.Dropout(0.5)

    def forward(self, x):
        return self.dropout(torch.tanh(self.fc(x)))


def test_error_names_the_change_the_guard_saw() -> None:
    """train() -> eval() with dropout: plain torch raises a bare count mismatch; in warn mode
    the guard warns, then re-raises torch's error naming the training flag."""
    module = Dropping()
    x = torch.randn(4, 8, requires_grad=True)
    out = checkpoint(module, x, use_reentrant=False)
    module.eval()
    with pytest.raises(CheckpointError, match="different number of tensors"):
        out.sum().backward()
    module.train()
    ckptguard.enable(on_mismatch="warn")
    out = checkpoint(module, x, use_reentrant=False)
    module.eval()
    with pytest.warns(ckptguard.CheckpointMismatchWarning, match="Dropping.training"):
        with pytest.raises(ckptguard.CheckpointMismatchError) as info:
            out.sum().backward()
    error = info.value
    assert error.kind == "training"
    assert isinstance(error.__cause__, CheckpointError)
    assert "ckptguard saw: [training] Dropping.training (True -> False)" in str(error)
    assert "different number of tensors" in str(error)


class Cache:
    """State the guard cannot name: a tensor kept inside an object and read by a function
    the object is passed to (the guard follows a region's own reads of its arguments and the
    methods it calls on them, not what other functions read from their arguments)."""

    def __init__(self) -> None:
        self._keys = torch.randn(2, 4)

    def grow(self) -> None:
        self._keys = torch.cat([self._keys, torch.randn(1, 4)])


def _keys_of(cache: Cache) -> torch.Tensor:
    return cache._keys


def _attend(x: torch.Tensor, cache: Cache) -> torch.Tensor:
    scores = torch.tanh(x) @ _keys_of(cache).T
    return scores.softmax(-1).sum(-1)


@pytest.mark.parametrize("strict", [False, True], ids=["guard", "strict"])
def test_unnameable_change_is_explained_with_torchs_facts(strict: bool) -> None:
    cache = Cache()
    x = torch.randn(5, 4, requires_grad=True)
    ckptguard.enable(strict=strict)
    out = checkpoint(_attend, x, cache, use_reentrant=False)
    cache.grow()  # a grown KV cache: the recompute saves tensors of another shape
    with pytest.raises(ckptguard.CheckpointMismatchError) as info:
        out.sum().backward()
    error = info.value
    assert error.kind == "saved_tensors"
    assert isinstance(error.__cause__, CheckpointError)
    assert "saw no change in what it fingerprints" in str(error)
    assert "Recomputed values for the following tensors have different metadata" in str(error)
    if strict:
        assert error.details["op"] == "aten.mm.default"
        assert "first differing op: #" in str(error)
        # the grown keys, as mm saved them for backward
        assert "mm.default saved for backward [4, 2]" in str(error)
        assert "mm.default saved for backward [4, 3]" in str(error)
    else:
        assert "enable(strict=True) names the first op that diverged" in str(error)
