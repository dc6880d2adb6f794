"""Reproduction: memory a checkpoint saves versus the recompute it adds, measured per region.

``ckptguard.pricing.price`` runs a region once under ``saved_tensors_hooks`` and adds up the
activations autograd keeps for backward (each storage once, parameters and buffers excluded);
with checkpoint only the region's inputs are kept. It counts the FLOPs checkpoint adds to
backward (``FlopCounterMode``: matmul, conv and attention) and times the forward that backward
repeats. A transformer block frees many times its input for one extra forward; a lone GELU,
LayerNorm or dropout frees nothing, so checkpointing it only adds work (ckptlint: CKP101).

Run: ``python examples/repro_pricing.py [--batch 32 --seq 128 --dim 512]`` (CPU).
"""

from __future__ import annotations

import argparse
import json

import torch
from torch import nn

from ckptguard.pricing import RegionPrice, format_price_table, price_call


def main(
    batch: int = 32, seq: int = 128, dim: int = 512, verbose: bool = True
) -> list[RegionPrice]:
    torch.manual_seed(0)
    x = torch.randn(batch, seq, dim)
    heads = max(1, dim // 64)
    regions: dict[str, nn.Module] = {
        "transformer block": nn.TransformerEncoderLayer(
            dim, heads, dim_feedforward=4 * dim, batch_first=True
        ),
        "MLP (Linear-GELU-Linear)": nn.Sequential(
            nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim)
        ),
        "lone GELU": nn.GELU(),
        "lone LayerNorm": nn.LayerNorm(dim),
        "lone Dropout(0.1)": nn.Dropout(0.1),
    }
    prices = [price_call(region, [x], name=name) for name, region in regions.items()]
    if verbose:
        print(__doc__.split("\n\nRun:")[0])
        print(f"\ninput [{batch}, {seq}, {dim}] fp32, torch {torch.__version__}\n")
        print(format_price_table(prices))
        print("\ntransformer block as data:")
        print(json.dumps(prices[0].to_dict(), indent=2))
    return prices


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--dim", type=int, default=512)
    options = parser.parse_args()
    main(options.batch, options.seq, options.dim)
