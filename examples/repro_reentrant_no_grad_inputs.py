"""Reproduction: reentrant checkpoint with no input requiring grad leaves the region untrained.

``checkpoint(block, x, use_reentrant=True)`` is an autograd Function whose forward runs under
``no_grad``; its output joins the graph only through inputs that require grad. When none does
(raw features, frozen embeddings, the first block of a network), the region's output has no
grad_fn, backward never reaches the region, and its parameters get ``None`` gradients while the
rest of the model trains normally. PyTorch only warns "None of the inputs have
requires_grad=True". ``use_reentrant=False`` records the graph through the parameters and gives
gradients equal to the unchecked model. Under ``ckptguard.guard()`` the reentrant run also
warns, naming the parameters that will get no gradient.

Run: ``python examples/repro_reentrant_no_grad_inputs.py`` (CPU, PyTorch 2.13).
"""

from __future__ import annotations

import warnings

import torch
from repro_nonreentrant_equal import Block
from torch import nn
from torch.utils.checkpoint import checkpoint

import ckptguard


class Model(nn.Module):
    """A checkpointed block followed by an unchecked head."""

    def __init__(self, use_reentrant: bool | None, dim: int = 32) -> None:
        super().__init__()
        self.block = Block(dim)
        self.head = nn.Linear(dim, 1)
        self.use_reentrant = use_reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_reentrant is None:
            hidden = self.block(x)
        else:
            hidden = checkpoint(self.block, x, use_reentrant=self.use_reentrant)
        return self.head(hidden)


def train_step(
    use_reentrant: bool | None,
) -> tuple[dict[str, torch.Tensor | None], list[warnings.WarningMessage]]:
    """Gradients of one step on an input that does not require grad, and the warnings raised."""
    torch.manual_seed(0)
    model = Model(use_reentrant)
    x = torch.randn(4, 16, 32)  # requires_grad=False, like features or frozen embeddings
    torch.manual_seed(1234)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model(x).square().mean().backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    return grads, caught


def summarise(
    grads: dict[str, torch.Tensor | None],
    plain_grads: dict[str, torch.Tensor | None],
    caught: list[warnings.WarningMessage],
) -> dict[str, object]:
    return {
        "none_gradients": [n for n, g in grads.items() if g is None],
        "gradients_equal_to_plain": [
            n for n, g in grads.items() if g is not None and torch.equal(g, plain_grads[n])
        ],
        "warnings": [
            {
                "category": f"{w.category.__module__}.{w.category.__qualname__}",
                "message": str(w.message),
            }
            for w in caught
        ],
    }


def main(verbose: bool = True) -> dict[str, dict[str, object]]:
    """Figures per run; the reentrant run is repeated under ckptguard's guard when it exists."""
    plain_grads, _ = train_step(use_reentrant=None)
    figures: dict[str, dict[str, object]] = {}
    for use_reentrant in (True, False):
        grads, caught = train_step(use_reentrant)
        figures[f"use_reentrant={use_reentrant}"] = summarise(grads, plain_grads, caught)
    guard = getattr(ckptguard, "guard", None)
    if guard is not None:
        with guard():
            grads, caught = train_step(use_reentrant=True)
        figures["use_reentrant=True under ckptguard.guard()"] = summarise(
            grads, plain_grads, caught
        )
    if verbose:
        print(__doc__.split("\n\nRun:")[0])
        print()
        for mode, result in figures.items():
            print(f"checkpoint({mode}), input without requires_grad:")
            print(
                f"  parameters with None grad:        {', '.join(result['none_gradients']) or '-'}"
            )
            print(
                "  grads torch.equal to plain model: "
                f"{', '.join(result['gradients_equal_to_plain']) or '-'}"
            )
            for warning in result["warnings"]:
                print(f"  warning ({warning['category']}): {warning['message']}")
    return figures


if __name__ == "__main__":
    main()
