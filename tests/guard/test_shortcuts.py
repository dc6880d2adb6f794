"""The edges of what the guard works out once and reuses (issue 21): each shortcut must leave
every change between forward and backward caught and every clean step silent.

- A region's callable is taken apart once per structure (the partial's function, the module
  bound into it, the closure cells its functions hold): a cell rebound later leads the guard
  to the functions it now holds.
"""

from __future__ import annotations

import functools

import torch
import torch.nn as nn
from conftest import grads_of, silently_wrong_then_named
from torch.utils.checkpoint import checkpoint

GAIN_A = 1.0
GAIN_B = 1.0


def _scaled_by_a(self, x: torch.Tensor) -> torch.Tensor:
    return torch.sin(self.fc(x) * GAIN_A)


def _scaled_by_b(self, x: torch.Tensor) -> torch.Tensor:
    return torch.sin(self.fc(x) * GAIN_B)


def _swappable(func):
    """A decorator whose wrapper calls the function its closure cell holds now."""

    def forward(self, x):
        return func(self, x)

    def swap(new) -> None:
        nonlocal func
        func = new

    forward.swap = swap
    return forward


class Swappable(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 4)

    forward = _swappable(_scaled_by_a)


def test_a_closure_cell_rebound_after_the_structure_was_cached() -> None:
    """transformers' form, ``partial(Layer.forward, layer)``: its structure is cached at the
    first step; then the decorator's cell is rebound to a function reading another global,
    and that global changes between forward and backward."""
    layer = Swappable()
    x = torch.randn(3, 4, requires_grad=True)

    def step(change):
        layer.zero_grad(set_to_none=True)
        x.grad = None
        out = checkpoint(functools.partial(Swappable.forward, layer), x, use_reentrant=False)
        if change is not None:
            change()
        out.sum().backward()
        return grads_of(layer, x)

    def rebind(value: float):
        def apply() -> None:
            global GAIN_B
            GAIN_B = value

        return apply

    import ckptguard

    with ckptguard.guard():
        step(None)  # the structure, its functions and its reader are worked out
    Swappable.forward.swap(_scaled_by_b)
    try:
        silently_wrong_then_named(step, rebind(3.0), rebind(1.0), "global", "GAIN_B")
    finally:
        Swappable.forward.swap(_scaled_by_a)
