"""Overhead of ckptguard on a CPU training step, plain and guarded runs interleaved.

Prints the median step time of each and their ratio for the two configurations the issue names:
8 blocks x hidden 512 x batch 32 x seq 128 (compute-bound) and batch 1 x seq 16 (host-bound).
With --strict it also measures strict mode (goal: at most 1.5x a plain step on the 8 x 512 model).
Run: python benchmarks/guard_overhead.py [--steps-large N] [--steps-small N] [--strict]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import ckptguard


class Block(nn.Module):
    """Pre-norm transformer block: attention and a 4x MLP, with dropout."""

    def __init__(self, hidden: int, heads: int = 8, dropout: float = 0.1):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.norm2 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, seq, 3, self.heads, -1).unbind(2)
        attn = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        )
        x = x + self.dropout(self.proj(attn.transpose(1, 2).reshape(batch, seq, hidden)))
        return x + self.dropout(self.fc2(F.gelu(self.fc1(self.norm2(x)))))


class Model(nn.Module):
    def __init__(self, blocks: int, hidden: int):
        super().__init__()
        self.blocks = nn.ModuleList(Block(hidden) for _ in range(blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False)
        return x


def step(model: Model, x: torch.Tensor) -> float:
    start = time.perf_counter()
    model(x).square().mean().backward()
    elapsed = time.perf_counter() - start
    for p in model.parameters():
        p.grad = None
    return elapsed


def measure(batch: int, seq: int, steps: int, options: dict) -> tuple[float, float, float]:
    torch.manual_seed(0)
    model = Model(blocks=8, hidden=512)
    x = torch.randn(batch, seq, 512, requires_grad=True)
    for _ in range(1 if steps < 20 else 3):  # warm-up, also builds the guard's plans
        step(model, x)
        with ckptguard.guard(**options):
            step(model, x)
    plain, guarded = [], []
    for _ in range(steps):
        plain.append(step(model, x))
        with ckptguard.guard(**options):
            guarded.append(step(model, x))
    paired = statistics.median(g / p for g, p in zip(guarded, plain, strict=True))
    return statistics.median(plain), statistics.median(guarded), paired


def region_cost_us(repeats: int = 2000) -> float:
    """Guard work for one region of the model (fingerprint at forward + verify at recompute)."""
    from ckptguard._intercept import Options, RegionGuard

    block = Block(512)
    x = torch.randn(1, 16, 512)
    options = Options()
    start = time.perf_counter()
    for _ in range(repeats):
        region = RegionGuard(block, options)
        region.capture((x,))
        region.verify((x,))
    return (time.perf_counter() - start) / repeats * 1e6


def report(name: str, batch: int, seq: int, steps: int, options: dict, region_cost: float) -> None:
    plain, guarded, paired = measure(batch, seq, steps, options)
    print(
        f"{name:<44} plain {plain * 1e3:9.2f} ms  guarded {guarded * 1e3:9.2f} ms  "
        f"ratio of medians {guarded / plain:.4f}  median paired ratio {paired:.4f} "
        f"({(paired - 1) * 100:+.2f} %)  [{steps} interleaved pairs]"
    )
    if not options:
        share = 8 * region_cost / plain / 1e6 * 100
        print(f"{'':<44} guard work 8 x {region_cost:.1f} us = {share:.4f} % of the plain step")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps-large", type=int, default=5)
    parser.add_argument("--steps-small", type=int, default=100)
    parser.add_argument(
        "--threads", type=int, default=1, help="intra-op threads; 1 keeps a shared CPU stable"
    )
    parser.add_argument("--strict", action="store_true", help="also measure strict mode")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, 8 blocks x hidden 512")
    region_cost = region_cost_us()
    print(f"guard work per region (fingerprint + verify, one block): {region_cost:.1f} us")
    modes = [("guard", {}, "<= 1 %", "<= 3 %")]
    if args.strict:
        modes.append(("strict", {"strict": True}, "<= 1.5x", "none set"))
    for mode, options, goal_large, goal_small in modes:
        for label, batch, seq, steps in (
            (f"batch 32 x seq 128 (goal {goal_large})", 32, 128, args.steps_large),
            (f"batch 1 x seq 16 (goal {goal_small})", 1, 16, args.steps_small),
        ):
            report(f"{mode}: {label}", batch, seq, steps, options, region_cost)


if __name__ == "__main__":
    main()
