"""Multi-process runs under torchrun (gloo on CPU, world size 2): DDP, FSDP2 and the planner
under DDP."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

from tests.conftest import SUBPROCESS_TIMEOUT

WORKER = pathlib.Path(__file__).with_name("distributed_worker.py")

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
    reason="needs torch.distributed with gloo",
)


@pytest.fixture(scope="module")
def ranks() -> subprocess.CompletedProcess:
    """One torchrun launch of the worker's three scenarios, read by each test below."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        str(WORKER),
    ]  # fmt: skip
    return subprocess.run(
        command, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT, env=env
    )


def test_ddp_trains_without_alarm(ranks: subprocess.CompletedProcess) -> None:
    for rank in (0, 1):
        assert f"rank {rank}: ddp ok" in ranks.stdout, ranks.stdout + ranks.stderr


def test_ddp_fault_is_named_on_the_faulting_rank(ranks: subprocess.CompletedProcess) -> None:
    assert ranks.returncode != 0
    assert "rank 1: CheckpointMismatchError [attribute] module.blocks.0.scale" in ranks.stdout
    assert "rank 0: CheckpointMismatchError" not in ranks.stdout
    assert "fault run ok" not in ranks.stdout


def test_fsdp2_trains_without_false_alarm(ranks: subprocess.CompletedProcess) -> None:
    for rank in (0, 1):
        assert f"rank {rank}: fsdp ok same_losses=True fault=attribute" in ranks.stdout, (
            ranks.stdout + ranks.stderr
        )


def test_ddp_ranks_apply_the_same_plan(ranks: subprocess.CompletedProcess) -> None:
    lines = ranks.stdout.splitlines()
    plans = [line.split(": plan ", 1)[1] for line in lines if ": plan {" in line]
    assert len(plans) == 2 and plans[0] == plans[1] and json.loads(plans[0]), ranks.stdout
    assert "rank 0: plan ok" in ranks.stdout and "rank 1: plan ok" in ranks.stdout
