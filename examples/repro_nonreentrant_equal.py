"""Reproduction: non-reentrant checkpoint gives bit-identical gradients, dropout included.

``checkpoint(block, x, use_reentrant=False)`` stashes the CPU RNG state before the forward and
restores it for the recompute in backward, so the recomputed dropout mask is the very mask the
forward used. Gradients are ``torch.equal`` (not merely close) to the unchecked block at the same
seed. A second unchecked run at another seed shows the dropout is live: its gradients differ.

Run: ``python examples/repro_nonreentrant_equal.py`` (CPU, PyTorch 2.13).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

Run = Callable[[nn.Module, torch.Tensor], torch.Tensor]


class Block(nn.Module):
    """Pre-norm residual MLP block with dropout between the two projections."""

    def __init__(self, dim: int = 32, dropout: float = 0.1) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.drop = nn.Dropout(dropout)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(self.drop(nn.functional.gelu(self.up(self.norm(x)))))


def forward_and_gradients(
    block: nn.Module, x: torch.Tensor, seed: int, run: Run
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Output and gradients (input and every parameter) of ``run`` at a fixed seed."""
    block.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_(True)
    torch.manual_seed(seed)
    out = run(block, x)
    out.square().sum().backward()  # square: the gradient depends on the output's values
    grads = {"input": x.grad, **{name: p.grad for name, p in block.named_parameters()}}
    return out.detach(), grads


def plain(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return block(x)


def non_reentrant(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return checkpoint(block, x, use_reentrant=False)


def main(verbose: bool = True) -> dict[str, object]:
    torch.manual_seed(0)
    block, x = Block(), torch.randn(4, 16, 32)
    plain_out, plain_grads = forward_and_gradients(block, x, seed=1234, run=plain)
    ckpt_out, ckpt_grads = forward_and_gradients(block, x, seed=1234, run=non_reentrant)
    _, other_seed_grads = forward_and_gradients(block, x, seed=4321, run=plain)
    figures: dict[str, object] = {
        "forward_equal": torch.equal(plain_out, ckpt_out),
        "gradients_equal": {n: torch.equal(g, ckpt_grads[n]) for n, g in plain_grads.items()},
        "other_seed_gradients_equal": {
            n: torch.equal(g, other_seed_grads[n]) for n, g in plain_grads.items()
        },
    }
    if verbose:
        print(__doc__.split("\n\n")[0])
        print(f"forward output torch.equal:           {figures['forward_equal']}")
        print("gradient torch.equal, checkpoint(use_reentrant=False) vs plain, same seed:")
        for name, equal in figures["gradients_equal"].items():
            print(f"  {name:<14} {equal}")
        print("gradient torch.equal, plain at seed 1234 vs plain at seed 4321 (dropout is live):")
        for name, equal in figures["other_seed_gradients_equal"].items():
            print(f"  {name:<14} {equal}")
    return figures


if __name__ == "__main__":
    main()
