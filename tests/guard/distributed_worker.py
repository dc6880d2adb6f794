"""torchrun worker for the multi-process tests (gloo on CPU, world size 2). One launch runs
the three scenarios in turn (a launch costs two torch start-ups and a rendezvous):

1. DDP over checkpointed blocks, guard on in strict mode: trains with no alarm.
2. FSDP2 fully_shard per block and at the root, blocks checkpointed (and an inner submodule
   checkpointed too): losses equal with the guard off, on and strict, and an attribute change
   made on both ranks is still named.
3. Every rank plans a DDP model (``ckptguard.plan``): "rank R: plan <choices as JSON>", then,
   after two DDP steps with the plan applied whose gradients agree across ranks, "rank R:
   plan ok".
4. As 1, but rank 1 changes a block attribute between forward and backward at step 2: that
   rank reports the named error and exits with status 3 (last: the other rank's collective
   then fails).
Each rank prints lines starting with "rank R:" that the tests read.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

import ckptguard


class Block(nn.Module):
    def __init__(self, checkpoint_mlp: bool = False) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))
        self.norm = nn.LayerNorm(16)
        self.scale = 1.0
        self.checkpoint_mlp = checkpoint_mlp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.norm(x)
        if self.checkpoint_mlp:  # a region inside an FSDP unit rather than the unit itself
            return x + checkpoint(self.mlp, hidden, use_reentrant=False) * self.scale
        return x + self.mlp(hidden) * self.scale


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList([Block(), Block(), Block(checkpoint_mlp=True)])
        self.head = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x) if block.checkpoint_mlp else checkpoint(block, x, use_reentrant=False)
        return self.head(x)


def train(model: nn.Module, steps: int, rank: int, fault_at: int | None = None) -> list[float]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(1234 + rank)
    losses = []
    for step in range(steps):
        x = torch.randn(4, 8, 16, generator=generator)
        loss = model(x).square().mean()
        if step == fault_at:
            target = model.module if hasattr(model, "module") else model
            target.blocks[0].scale = 2.0
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ddp(rank, fault=False)
    fsdp(rank)
    planned_ddp(rank)
    dist.barrier()
    ddp(rank, fault=True)
    # gloo can abort ("terminate called without an active exception") while tearing down
    # its process group; every result is printed already, so leave without teardown
    os._exit(0)


def ddp(rank: int, fault: bool) -> None:
    model = nn.parallel.DistributedDataParallel(Model())
    ckptguard.enable(strict=not fault)
    try:
        losses = train(model, 4, rank, 2 if fault and rank == 1 else None)
    except ckptguard.CheckpointMismatchError as error:
        say(f"rank {rank}: CheckpointMismatchError [{error.kind}] {error.details['name']}")
        say(f"rank {rank}: {error}")
        os._exit(3)
    finally:
        ckptguard.disable()
    say(f"rank {rank}: {'fault run' if fault else 'ddp'} ok losses={losses}")


def fsdp(rank: int) -> None:
    from torch.distributed.fsdp import fully_shard

    def sharded() -> nn.Module:
        model = Model()
        for block in model.blocks:
            fully_shard(block)
        return fully_shard(model)

    plain = train(sharded(), 3, rank)
    with ckptguard.guard():
        guarded = train(sharded(), 3, rank)
        try:  # the guard is live under FSDP2: the same change on both ranks is named
            train(sharded(), 1, rank, fault_at=0)
            caught = "none"
        except ckptguard.CheckpointMismatchError as error:
            caught = error.kind
    with ckptguard.guard(strict=True):
        strict = train(sharded(), 3, rank)
    same = plain == guarded == strict
    say(f"rank {rank}: fsdp ok same_losses={same} fault={caught} losses={guarded}")


def planned_ddp(rank: int) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(
        *[
            nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Dropout(0.1), nn.Linear(64, 16))
            for _ in range(3)
        ]
    )
    ddp = nn.parallel.DistributedDataParallel(model)
    plan = ckptguard.plan(ddp, torch.randn(8, 32, 16), budget=0.5)
    say(f"rank {rank}: plan {json.dumps(plan.choices, sort_keys=True)}")
    plan.apply(ddp)
    torch.manual_seed(1 + rank)
    for _ in range(2):
        ddp.zero_grad()
        ddp(torch.randn(8, 32, 16)).sum().backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    gathered = [torch.empty_like(grads) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, grads)
    if all(torch.equal(gathered[0], g) for g in gathered):
        say(f"rank {rank}: plan ok")


def say(line: str) -> None:
    """One write per line: both ranks share the pipe, and a print writes its text and its
    newline separately, so two ranks' lines could run together."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
