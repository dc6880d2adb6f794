"""Multi-process runs under torchrun (gloo on CPU, world size 2): DDP and FSDP2."""

from __future__ import annotations

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


def _torchrun(mode: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        str(WORKER), "--mode", mode,
    ]  # fmt: skip
    return subprocess.run(
        command, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT, env=env
    )


def test_ddp_trains_without_alarm() -> None:
    result = _torchrun("ddp")
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in (0, 1):
        assert f"rank {rank}: ok" in result.stdout


def test_ddp_fault_is_named_on_the_faulting_rank() -> None:
    result = _torchrun("ddp_fault")
    assert result.returncode != 0
    assert "rank 1: CheckpointMismatchError [attribute] module.blocks.0.scale" in result.stdout
    assert "rank 0: CheckpointMismatchError" not in result.stdout


def test_fsdp2_trains_without_false_alarm() -> None:
    result = _torchrun("fsdp")
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in (0, 1):
        assert f"rank {rank}: fsdp ok same_losses=True fault=attribute" in result.stdout
