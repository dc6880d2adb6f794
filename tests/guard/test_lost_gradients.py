"""Reentrant regions whose parameters or nested tensor inputs get no gradient (issue 9, item 4):
a warning naming them by default, ``LostGradientsError`` with ``on_lost_gradients="raise"``."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

import ckptguard


class Adapter(nn.Module):
    """PEFT style: a frozen embedding feeds checkpointed layers with trainable adapters."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(10, 8).requires_grad_(False)
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))
        self.layers[0].weight.requires_grad_(False)
        self.head = nn.Linear(8, 1)

    def forward(self, ids):
        hidden = self.embed(ids)
        for layer in self.layers:
            hidden = checkpoint(layer, hidden, use_reentrant=True)
        return self.head(hidden)


def test_frozen_inputs_name_the_parameters_left_without_gradient() -> None:
    model = Adapter()
    ids = torch.tensor([[1, 2, 3]])
    with pytest.warns(UserWarning):  # torch's own, unnamed warning
        model(ids).sum().backward()
    assert model.layers[1].weight.grad is None, "plain torch leaves them without gradient"
    ckptguard.enable()
    with pytest.warns(ckptguard.CheckpointGuardWarning) as record:
        model(ids)
    messages = [str(r.message) for r in record if r.category is ckptguard.CheckpointGuardWarning]
    assert any("layers.0.bias" in m for m in messages), messages
    assert not any("layers.0.weight" in m for m in messages)  # frozen: nothing is lost
    # layer 0's output does not require grad either, so layer 1 loses its parameters too
    assert any("layers.1.weight" in m and "layers.1.bias" in m for m in messages), messages
    ckptguard.enable(on_lost_gradients="raise")
    with pytest.raises(ckptguard.LostGradientsError) as info:
        model(ids)
    assert info.value.kind == "lost_gradients"
    assert info.value.details["parameters"] == ["layers.0.bias"]  # the first region raises


def _scaled(x, extras):
    return torch.sin(x * extras[0])


def test_tensors_nested_in_containers_are_named() -> None:
    """With no positional tensor that requires grad, a nested one gets no gradient."""
    x = torch.randn(4)
    factor = torch.randn(4, requires_grad=True)
    with pytest.warns(UserWarning):
        out = checkpoint(_scaled, x, [factor], use_reentrant=True)
    assert not out.requires_grad, "plain torch: nothing can reach factor"
    ckptguard.enable(on_lost_gradients="raise")
    with pytest.raises(ckptguard.LostGradientsError) as info:
        checkpoint(_scaled, x, [factor], use_reentrant=True)
    assert info.value.details["nested"] == ["positional argument 1[0]"]
    ckptguard.enable(on_lost_gradients="raise")
    checkpoint(_scaled, x, [factor], use_reentrant=False).sum().backward()  # fine there
    assert factor.grad is not None
    factor.grad = None
    y = torch.randn(4, requires_grad=True)  # the recompute's backward then reaches factor
    checkpoint(_scaled, y, [factor], use_reentrant=True).sum().backward()
    assert factor.grad is not None


def test_bad_on_lost_gradients_is_rejected() -> None:
    with pytest.raises(ValueError, match="on_lost_gradients"):
        ckptguard.enable(on_lost_gradients="ignore")
