"""torchrun worker for test_ddp_reentrant.py (gloo on CPU, world size 2): reentrant
checkpoint regions under DistributedDataParallel, each case run plainly and under the guard.

Every case builds the same model on each rank (seed 0), feeds each rank its own batch and
compares DDP's gradients with the true average: the plain gradients of the same model on each
rank's batch, all-reduced and divided by the world size. Each rank writes one JSON object per
case to ``OUT/rank<R>.jsonl`` (``python ddp_reentrant_worker.py OUT``).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

import ckptguard


class Net(nn.Module):
    """``layout`` says what runs (every parameter of the model is used: DDP without
    ``find_unused_parameters`` requires it): ``twice`` a block checkpointed twice, ``once`` an
    input layer, the block checkpointed once and a head, ``twice_head`` both, ``tied`` two
    layers sharing one weight, each checkpointed, ``outside`` the block run plainly, then
    checkpointed, ``outside_after`` the other way round. ``checkpointing``: "reentrant",
    "nonreentrant" or "none" (unchecked)."""

    def __init__(self, layout: str, checkpointing: str = "reentrant") -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layout, self.checkpointing = layout, checkpointing
        if layout == "tied":
            self.first, self.second = nn.Linear(8, 8), nn.Linear(8, 8)
            self.second.weight = self.first.weight
            return
        self.block = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8))
        if layout in ("once", "twice_head"):
            self.embed, self.head = nn.Linear(8, 8), nn.Linear(8, 1)

    def _region(self, module: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if self.checkpointing == "none":
            return module(x)
        return checkpoint(module, x, use_reentrant=self.checkpointing == "reentrant")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        layout = self.layout
        if layout == "twice":
            return self._region(self.block, self._region(self.block, x))
        if layout == "tied":
            return self._region(self.second, torch.tanh(self._region(self.first, x)))
        if layout == "outside":
            return self._region(self.block, self.block(x))
        if layout == "outside_after":
            return self.block(self._region(self.block, x))
        x = self._region(self.block, self.embed(x))
        if layout == "twice_head":
            x = self._region(self.block, x)
        return self.head(x)


def _batch(rank: int, step: int) -> torch.Tensor:
    """Each rank's own batch; it requires grad, so a first reentrant region gives its
    parameters gradients (see test_lost_gradients.py for what happens otherwise)."""
    generator = torch.Generator().manual_seed(100 * rank + step)
    return torch.randn(4, 8, generator=generator).requires_grad_()


def true_average(layout: str, steps: int) -> list[list[torch.Tensor]]:
    """Per step, the average over ranks of the unchecked model's gradients, trained with the
    averaged gradients: what DDP must reproduce."""
    model = Net(layout, "none")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    averages = []
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        model(_batch(dist.get_rank(), step)).square().mean().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        averages.append([p.grad.clone() for p in model.parameters()])
        optimizer.step()
    return averages


def train(layout: str, steps: int, guard: bool, options: dict) -> dict:
    """``steps`` DDP steps; what happened, and the gradients of each step."""
    options = dict(options)
    checkpointing = options.pop("checkpointing", "reentrant")
    accumulate = options.pop("accumulate", False)
    model = Net(layout, checkpointing)
    ddp = nn.parallel.DistributedDataParallel(model, **options)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scope = ckptguard.guard() if guard else contextlib.nullcontext()
    result: dict = {"grads": []}
    loss = None  # kept across steps, as training loops keep it: its graph stays alive
    with warnings.catch_warnings(record=True) as caught, scope:
        warnings.simplefilter("always")
        try:
            for step in range(steps):
                optimizer.zero_grad(set_to_none=True)
                if accumulate:  # a first micro-batch under no_sync(), accumulated locally
                    with ddp.no_sync():
                        ddp(_batch(dist.get_rank(), 50 + step)).square().mean().backward()
                loss = ddp(_batch(dist.get_rank(), step)).square().mean()
                loss.backward()
                result["grads"].append([p.grad.clone() for p in model.parameters()])
                optimizer.step()
        except RuntimeError as error:
            cause = error.__cause__
            result.update(
                error=type(error).__name__,
                message=str(error),
                kind=getattr(error, "kind", None),
                details={k: v for k, v in getattr(error, "details", {}).items() if k != "torch"},
                cause=f"{type(cause).__name__}: {cause}" if cause is not None else None,
                grads_touched=any(p.grad is not None for p in model.parameters()),
            )
    result["warnings"] = [str(w.message) for w in caught if "ckptguard" in str(w.message)]
    del loss
    return result


def max_difference(grads: list, averages: list) -> float:
    return max(
        (g - a).abs().max().item()
        for step, average in zip(grads, averages, strict=False)
        for g, a in zip(step, average, strict=True)
    )


def same_grads(first: list, second: list) -> bool:
    return len(first) == len(second) and all(
        torch.equal(a, b)
        for step_a, step_b in zip(first, second, strict=True)
        for a, b in zip(step_a, step_b, strict=True)
    )


CASES = {
    # name: (layout, DDP options)
    "twice": ("twice", {}),
    "twice_head": ("twice_head", {}),
    "tied": ("tied", {}),
    "outside": ("outside", {}),
    "outside_after": ("outside_after", {}),
    "twice_find_unused": ("twice", {"find_unused_parameters": True}),
    "once_find_unused": ("once", {"find_unused_parameters": True}),
    "clean_twice_nonreentrant": ("twice", {"checkpointing": "nonreentrant"}),
    "clean_twice_nonreentrant_find_unused": (
        "twice",
        {"checkpointing": "nonreentrant", "find_unused_parameters": True},
    ),
    "clean_twice_static_graph": ("twice", {"static_graph": True}),
    "clean_once": ("once", {}),
    "clean_once_no_sync": ("once", {"accumulate": True}),
}
STEPS = 2


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    out = open(os.path.join(sys.argv[1], f"rank{rank}.jsonl"), "w")
    for name, (layout, options) in CASES.items():
        averages = true_average(layout, STEPS)
        plain = train(layout, STEPS, False, options)
        dist.barrier()
        guarded = train(layout, STEPS, True, options)
        dist.barrier()
        report = {"case": name, "bit_identical": same_grads(plain["grads"], guarded["grads"])}
        for mode, outcome in (("plain", plain), ("guard", guarded)):
            grads = outcome.pop("grads")
            outcome["steps_done"] = len(grads)
            if grads and not options.get("accumulate"):
                outcome["off_average"] = max_difference(grads, averages)
            report[mode] = outcome
        out.write(json.dumps(report) + "\n")
        out.flush()
    out.close()
    dist.barrier()
    # gloo can abort while tearing down its process group; every result is printed already
    os._exit(0)


if __name__ == "__main__":
    main()
