"""Nothing the guard stores keeps a model, tensor or frame alive; caches stay bounded."""

from __future__ import annotations

import functools
import gc
import weakref

import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

import ckptguard
from ckptguard._intercept import Region
from ckptguard._reader import cache_sizes


def _live_regions() -> int:
    return sum(1 for obj in gc.get_objects() if type(obj) is Region)


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.norm = nn.BatchNorm1d(16).eval()  # reads its buffers, never writes them
        self.scale = 1.0

    def forward(self, x, mask=None):
        return torch.tanh(self.norm(self.fc(x))) * self.scale


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Layer() for _ in range(3))
        self.tail = nn.Sequential(Layer(), Layer())

    def forward(self, x):
        x = checkpoint(self.layers[0], x, use_reentrant=False)
        x = checkpoint(self.layers[1], x, use_reentrant=True)
        x = checkpoint(
            functools.partial(Layer.forward, self.layers[2], mask=x), x, use_reentrant=False
        )
        return checkpoint_sequential(self.tail, 2, x, use_reentrant=False)


@pytest.mark.parametrize("strict", [False, True], ids=["guard", "strict"])
def test_20_models_built_and_dropped_are_collected(strict: bool) -> None:
    """Every model, parameter and input is collectable right after its step (the guard's plan
    and reader caches are keyed weakly), and after ``disable()`` too."""
    ckptguard.enable(strict=strict)
    gc.collect()
    regions_before = _live_regions()
    plans_before = cache_sizes()
    models, tensors = [], []
    for index in range(20):
        model = Model()
        x = torch.randn(4, 16, requires_grad=True)
        model(x).sum().backward()
        if index % 5 == 0:  # a forward whose graph is dropped without backward
            model(torch.randn(4, 16, requires_grad=True))
        models.append(weakref.ref(model))
        tensors += [weakref.ref(x), weakref.ref(model.layers[0].fc.weight)]
        del model, x
    gc.collect()
    assert [ref for ref in models if ref() is not None] == []
    assert [ref for ref in tensors if ref() is not None] == []
    assert _live_regions() <= regions_before
    assert cache_sizes()["module_plans"] <= plans_before["module_plans"]
    assert cache_sizes()["region_readers"] <= plans_before["region_readers"]
    ckptguard.disable()
    gc.collect()
    assert _live_regions() <= regions_before


def test_no_growth_over_400_steps() -> None:
    torch.manual_seed(0)
    blocks = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(3))
    optimizer = torch.optim.SGD(blocks.parameters(), lr=0.01)
    ckptguard.enable()

    def step(index: int) -> None:
        x = torch.randn(2, 8, requires_grad=True)
        for position, block in enumerate(blocks):
            reentrant = (index + position) % 2 == 0
            x = checkpoint(block, x, use_reentrant=reentrant)
        x.square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        if index % 7 == 0:  # a forward whose graph is dropped without backward
            checkpoint(blocks[0], torch.randn(2, 8, requires_grad=True), use_reentrant=False)

    regions_before = _live_regions()
    for index in range(50):
        step(index)
    gc.collect()
    baseline_objects = len(gc.get_objects())
    baseline_caches = cache_sizes()
    for index in range(50, 400):
        step(index)
    gc.collect()
    assert _live_regions() <= regions_before
    assert cache_sizes() == baseline_caches
    assert len(gc.get_objects()) - baseline_objects < 200  # under one object a step
