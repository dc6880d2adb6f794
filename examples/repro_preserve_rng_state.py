"""Reproduction: preserve_rng_state=False keeps the forward but silently changes the gradients.

With ``preserve_rng_state=False`` checkpoint does not stash the RNG state before the forward, so
the recompute in backward draws its dropout mask from the RNG as it stands at backward time,
already advanced past the forward's draws. The forward output (computed with the first mask) is
bit-identical to the unchecked block; backward then differentiates the block with a different
mask, so the gradients are wrong, with no error or warning, in both checkpoint modes. Only
gradients that do not pass through the mask (the last bias here) still match. Keep the default
``preserve_rng_state=True`` (ckptlint reports the mistake as CKP301).

Run: ``python examples/repro_preserve_rng_state.py`` (CPU, PyTorch 2.13).
"""

from __future__ import annotations

import torch
from repro_nonreentrant_equal import Block, forward_and_gradients, plain
from torch import nn
from torch.utils.checkpoint import checkpoint


def unpreserved(use_reentrant: bool):
    def run(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(block, x, use_reentrant=use_reentrant, preserve_rng_state=False)

    return run


def main(verbose: bool = True) -> dict[str, dict[str, object]]:
    torch.manual_seed(0)
    block, x = Block(), torch.randn(4, 16, 32)
    plain_out, plain_grads = forward_and_gradients(block, x, seed=1234, run=plain)
    figures: dict[str, dict[str, object]] = {}
    for use_reentrant in (False, True):
        out, grads = forward_and_gradients(block, x, seed=1234, run=unpreserved(use_reentrant))
        figures[f"use_reentrant={use_reentrant}"] = {
            "forward_equal": torch.equal(plain_out, out),
            "gradients_equal": {n: torch.equal(g, grads[n]) for n, g in plain_grads.items()},
            "max_abs_gradient_difference": max(
                (g - grads[n]).abs().max().item() for n, g in plain_grads.items()
            ),
        }
    if verbose:
        print(__doc__.split("\n\nRun:")[0])
        print()
        for mode, result in figures.items():
            print(f"checkpoint({mode}, preserve_rng_state=False) vs plain block, same seed:")
            print(f"  forward output torch.equal: {result['forward_equal']}")
            differ = [n for n, equal in result["gradients_equal"].items() if not equal]
            same = [n for n, equal in result["gradients_equal"].items() if equal]
            print(f"  gradients that differ:      {', '.join(differ) or '-'}")
            print(f"  gradients still equal:      {', '.join(same) or '-'}")
            print(f"  largest |difference|:       {result['max_abs_gradient_difference']:.3g}")
    return figures


if __name__ == "__main__":
    main()
