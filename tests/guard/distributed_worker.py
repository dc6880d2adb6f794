"""torchrun worker for the multi-process tests (gloo on CPU, world size 2).

--mode ddp        DDP over checkpointed blocks, guard on in strict mode: trains with no alarm.
--mode ddp_fault  as ddp, but rank 1 changes a block attribute between forward and backward
                  at step 2: that rank reports the named error and exits with status 3.
--mode fsdp       FSDP2 fully_shard per block and at the root, blocks checkpointed (and an
                  inner submodule checkpointed too): losses equal with the guard off, on and
                  strict, and an attribute change made on both ranks is still named.
Each rank prints lines starting with "rank R:" that the test reads.
"""

from __future__ import annotations

import argparse
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
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["ddp", "ddp_fault", "fsdp"], required=True)
    mode = parser.parse_args().mode
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if mode in ("ddp", "ddp_fault"):
        model = nn.parallel.DistributedDataParallel(Model())
        ckptguard.enable(strict=mode == "ddp")
        fault_at = 2 if mode == "ddp_fault" and rank == 1 else None
        try:
            losses = train(model, 4, rank, fault_at)
        except ckptguard.CheckpointMismatchError as error:
            print(f"rank {rank}: CheckpointMismatchError [{error.kind}] {error.details['name']}")
            print(f"rank {rank}: {error}", flush=True)
            os._exit(3)
        print(f"rank {rank}: ok losses={losses}", flush=True)
    else:
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
        print(f"rank {rank}: fsdp ok same_losses={same} fault={caught} losses={guarded}")
    sys.stdout.flush()
    dist.barrier()
    # gloo can abort ("terminate called without an active exception") while tearing down
    # its process group; every result is printed already, so leave without teardown
    os._exit(0)


if __name__ == "__main__":
    main()
