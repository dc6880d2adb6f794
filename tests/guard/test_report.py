"""Report mode: per-region figures of a real run, priced with ckptguard.pricing's helpers."""

from __future__ import annotations

import json

import torch
import torch.nn as nn
from conftest import grads_equal
from test_clean_run import Block, _training_run
from torch.utils.checkpoint import checkpoint

import ckptguard


def _run(blocks: nn.ModuleList, activation: nn.Module, steps: int) -> None:
    x = torch.randn(8, 16, 16, requires_grad=True)
    for _ in range(steps):
        hidden = x
        for block in blocks:
            hidden = checkpoint(block, hidden, use_reentrant=False)
        hidden = checkpoint(activation, hidden, use_reentrant=True)
        hidden.square().mean().backward()


def test_profile_reports_each_region() -> None:
    torch.manual_seed(0)
    blocks = nn.ModuleList(Block() for _ in range(2))
    with ckptguard.profile(print_table=False) as report:
        _run(blocks, nn.GELU(), steps=3)
    assert not ckptguard.is_enabled()
    data = {entry["name"].split(" (")[0]: entry for entry in report.data()}
    assert set(data) == {"Block.forward", "GELU.forward"}
    block, gelu = data["Block.forward"], data["GELU.forward"]
    assert block["calls"] == 6 and block["recomputes"] == 6
    assert gelu["calls"] == 3 and gelu["recomputes"] == 3
    assert block["verdict"] == "worth it" and not block["negligible"]
    assert block["bytes_saved_per_call"] > 0 and block["recompute_flops_per_call"] > 0
    assert block["recompute_flops_total"] == 6 * block["recompute_flops_per_call"]
    assert block["recompute_seconds"] > 0
    assert gelu["verdict"] == "not worth it" and gelu["negligible"]
    json.dumps(report.data())  # JSON-serialisable as it is
    table = report.table()
    assert "NEGLIGIBLE SAVING" in table and "Block.forward" in table


def test_profile_keeps_gradients_bit_identical() -> None:
    plain = _training_run(True)
    with ckptguard.profile(print_table=False) as report:
        profiled = _training_run(True)
    assert grads_equal(plain, profiled)
    assert report.data()


def test_enable_report_collects_until_read() -> None:
    torch.manual_seed(0)
    ckptguard.enable(report=True)
    _run(nn.ModuleList([Block()]), nn.ReLU(), steps=1)
    names = [entry["name"].split(" (")[0] for entry in ckptguard.region_report()]
    assert "Block.forward" in names and "ReLU.forward" in names


def test_price_is_exported() -> None:
    assert ckptguard.price(nn.GELU(), torch.randn(4, 16)).verdict == "not worth it"


class TwoSequences(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.encoder = nn.Sequential(nn.Linear(16, 16), nn.Tanh())
        self.decoder = nn.Sequential(nn.Linear(16, 16), nn.Tanh())

    def forward(self, x):
        x = checkpoint(self.encoder, x, use_reentrant=False)
        return checkpoint(self.decoder, x, use_reentrant=False)


def test_report_keys_regions_by_location_and_module_path() -> None:
    """Two ``Sequential`` regions run the same code: they are two rows, named by path."""
    model = TwoSequences()
    with ckptguard.profile(print_table=False) as report:
        for _ in range(2):
            model(torch.randn(4, 16, requires_grad=True)).sum().backward()
    rows = {entry["name"].split(" (")[0]: entry for entry in report.data()}
    assert set(rows) == {"encoder", "decoder"}
    assert all(row["calls"] == 2 and row["recomputes"] == 2 for row in rows.values())
    assert all("Sequential.forward, " in entry["name"] for entry in report.data())
