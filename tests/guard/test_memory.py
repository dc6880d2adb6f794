"""Fingerprints live and die with the autograd graph; plan caches stay bounded."""

from __future__ import annotations

import gc

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

import ckptguard
from ckptguard._plan import cache_sizes
from ckptguard._intercept import Region


def _live_regions() -> int:
    return sum(1 for obj in gc.get_objects() if type(obj) is Region)


def test_no_growth_over_1000_steps() -> None:
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

    for index in range(50):
        step(index)
    gc.collect()
    baseline_objects = len(gc.get_objects())
    baseline_caches = cache_sizes()
    for index in range(50, 1000):
        step(index)
    gc.collect()
    assert _live_regions() == 0
    assert cache_sizes() == baseline_caches
    assert len(gc.get_objects()) - baseline_objects < 200
