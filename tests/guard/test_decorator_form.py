"""torch 2.14's decorator form, ``@checkpoint(use_reentrant=False)``, is guarded too."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import ckptguard
from ckptguard import CheckpointMismatchError

if inspect.signature(checkpoint).parameters["function"].default is not None:
    pytest.skip("this torch has no decorator form of checkpoint", allow_module_level=True)

OFFSET = 1.0


@checkpoint(use_reentrant=False)
def region(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.sin(x @ weight + OFFSET)


def gradient(change_between: bool) -> torch.Tensor:
    global OFFSET
    OFFSET = 1.0
    weight = torch.linspace(-1.0, 1.0, 16).reshape(4, 4).requires_grad_()
    loss = region(torch.ones(2, 4), weight).sum()
    if change_between:
        OFFSET = 2.0
    loss.backward()
    OFFSET = 1.0
    return weight.grad


def test_decorator_form_is_guarded() -> None:
    plain, changed = gradient(False), gradient(True)
    assert not torch.equal(plain, changed)  # plain torch: silently different gradients
    with ckptguard.guard():
        assert torch.equal(gradient(False), plain)  # clean: bit-identical
        with pytest.raises(CheckpointMismatchError) as info:
            gradient(True)
    assert info.value.kind == "global" and "OFFSET" in str(info.value)
