"""Issue 20: a parameter whose gradient two backward passes of one DistributedDataParallel step
produce, because of reentrant checkpoint regions, is named by the guard (torchrun, gloo on
CPU, 2 ranks; the cases are in ddp_reentrant_worker.py, every one run plainly and guarded).

Plain torch 2.13, measured by these tests: a block checkpointed twice (or run outside, then
inside a region) leaves every rank with gradients off the true average and raises nothing;
with a head after it, weights shared by two regions, or ``find_unused_parameters=True``, DDP
raises "Expected to mark a variable ready only once". Under the guard the first kind is a
``ReentrantDDPError`` at the forward, before any gradient exists, and the second DDP's error
re-raised with names (DDP's error as ``__cause__``); ``use_reentrant=False``,
``static_graph=True``, a module checkpointed once and ``no_sync()`` stay silent, with
gradients bit-identical to plain DDP and equal to the true average.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

from tests.conftest import SUBPROCESS_TIMEOUT

WORKER = pathlib.Path(__file__).with_name("ddp_reentrant_worker.py")
MARKED_TWICE = "Expected to mark a variable ready only once"
BLOCK = [
    "module.block.0.weight",
    "module.block.0.bias",
    "module.block.2.weight",
    "module.block.2.bias",
]
BLOCK_REGION = "module.block (Sequential.forward, "
FIX = "pass use_reentrant=False to these checkpoint calls"

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
    reason="needs torch.distributed with gloo",
)


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, dict]]:
    """Every case's report, per rank."""
    out = tmp_path_factory.mktemp("ddp_reentrant")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        str(WORKER), str(out),
    ]  # fmt: skip
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT, env=env
    )
    assert result.returncode == 0, result.stdout + result.stderr
    found: dict[int, dict[str, dict]] = {}
    for rank in (0, 1):
        lines = (out / f"rank{rank}.jsonl").read_text().splitlines()
        found[rank] = {report["case"]: report for report in map(json.loads, lines)}
    return found


def _both_ranks(cases: dict, name: str) -> list[dict]:
    reports = [cases[rank].get(name) for rank in (0, 1)]
    assert all(reports), (name, cases)
    return reports


@pytest.mark.parametrize("name", ["twice", "outside"])
def test_silent_wrong_average_is_named_at_the_forward(cases: dict, name: str) -> None:
    """A block checkpointed twice, or run plainly and then inside a region: plain DDP trains
    on without a word, each rank's gradients off the average of the plain gradients."""
    for report in _both_ranks(cases, name):
        plain, guard = report["plain"], report["guard"]
        assert "error" not in plain and plain["steps_done"] == 2
        assert plain["off_average"] > 1e-3, plain
        assert guard["error"] == "ReentrantDDPError" and guard["kind"] == "ddp_reentrant"
        assert guard["steps_done"] == 0 and not guard["grads_touched"]  # before any gradient
        assert guard["cause"] is None
        details = guard["details"]
        assert sorted(details["parameters"]) == sorted(BLOCK)
        assert details["find_unused_parameters"] is False
        message = guard["message"]
        assert message.startswith(f"ckptguard [ddp_reentrant]: checkpointed region {BLOCK_REGION}")
        assert FIX in message
        if name == "twice":
            assert "plain PyTorch raises nothing" in message
            assert details["regions"] == [details["regions"][0]]
            assert details["regions"][0].startswith(BLOCK_REGION) and details["outside"] == []
            assert "(the same region, checkpointed again)" in message
        else:
            assert details["regions"] == [] and sorted(details["outside"]) == sorted(BLOCK)
            assert "(the module also ran outside the region before it)" in message
            assert "without a word" in message


@pytest.mark.parametrize("name", ["twice_head", "tied"])
def test_ddp_error_without_find_unused_is_named_before_ddp_raises(cases: dict, name: str) -> None:
    """Where plain DDP raises its error in backward (a head after the twice-checkpointed
    block; a weight shared by two regions), the guard names the cause at the forward."""
    for report in _both_ranks(cases, name):
        plain, guard = report["plain"], report["guard"]
        assert plain["error"] == "RuntimeError" and plain["message"].startswith(MARKED_TWICE)
        assert guard["error"] == "ReentrantDDPError" and not guard["grads_touched"]
        assert guard["cause"] is None and FIX in guard["message"]
        details = guard["details"]
        if name == "tied":
            assert details["parameters"] == ["module.first.weight"]
            assert len(details["regions"]) == 1
            assert details["regions"][0].startswith("module.first (Linear.forward, ")
            assert guard["message"].startswith(
                "ckptguard [ddp_reentrant]: checkpointed region module.second (Linear.forward, "
            )
            assert (
                "module.first.weight (also in region module.first (Linear.forward"
                in (guard["message"])
            )
        else:
            assert sorted(details["parameters"]) == sorted(BLOCK)


@pytest.mark.parametrize("name", ["twice_find_unused", "once_find_unused", "outside_after"])
def test_ddp_marked_twice_error_is_re_raised_with_its_cause(cases: dict, name: str) -> None:
    """find_unused_parameters=True: DDP raises for any reentrant region (here also for a
    module checkpointed once); and without it for a module run again after its region, in
    the region's backward pass. The guard re-raises it naming region, parameter, why, fix."""
    find_unused = name != "outside_after"
    for report in _both_ranks(cases, name):
        plain, guard = report["plain"], report["guard"]
        assert plain["error"] == "RuntimeError" and plain["message"].startswith(MARKED_TWICE)
        assert guard["error"] == "ReentrantDDPError" and guard["kind"] == "ddp_reentrant"
        assert guard["cause"].startswith(f"RuntimeError: {MARKED_TWICE}")
        details = guard["details"]
        assert details["find_unused_parameters"] is find_unused
        assert len(details["parameters"]) == 1 and details["parameters"][0] in BLOCK
        assert details["regions"][0].startswith(BLOCK_REGION)
        message = guard["message"]
        assert message.startswith(
            f"ckptguard [ddp_reentrant]: DistributedDataParallel marked parameter "
            f"{details['parameters'][0]} ready twice in the backward pass of checkpointed "
            f"region {BLOCK_REGION}"
        )
        assert FIX in message
        if find_unused:
            assert "find_unused_parameters=True" in message and "under no_grad" in message
            assert "drop find_unused_parameters" in message
        else:
            assert "where the module also runs outside the region" in message


@pytest.mark.parametrize(
    "name",
    [
        "clean_twice_nonreentrant",
        "clean_twice_nonreentrant_find_unused",
        "clean_twice_static_graph",
        "clean_once",
        "clean_once_no_sync",
    ],
)
def test_right_setups_stay_silent_and_bit_identical(cases: dict, name: str) -> None:
    for report in _both_ranks(cases, name):
        plain, guard = report["plain"], report["guard"]
        assert "error" not in plain and "error" not in guard, report
        assert plain["steps_done"] == guard["steps_done"] == 2
        assert guard["warnings"] == [] and plain["warnings"] == []
        assert report["bit_identical"] is True
        if name != "clean_once_no_sync":  # its steps hold an extra local micro-batch
            assert plain["off_average"] == 0.0 and guard["off_average"] == 0.0


def test_graph_of_a_region_inputs_names_every_parameter_used_before_it() -> None:
    """The walk behind "the module also ran outside the region before it", in one process:
    every parameter of the layers the input went through, none of a reentrant region's."""
    from torch.utils.checkpoint import checkpoint

    import ckptguard
    from ckptguard import _ddp

    torch.manual_seed(0)
    before = torch.nn.Sequential(*(torch.nn.Linear(8, 8) for _ in range(6)))
    inside = torch.nn.Linear(8, 8)
    names = {id(p): n for n, p in [*before.named_parameters(), *inside.named_parameters()]}
    x = torch.randn(4, 8, requires_grad=True)
    with ckptguard.guard():
        hidden = checkpoint(inside, before(x), use_reentrant=True)
        assert sorted(_ddp._in_graph_of((before(x),), names)) == sorted(
            n for n, _ in before.named_parameters()
        )
        # the walk stops at a reentrant region's node: what lies behind it was read by the
        # region's own check, and the region's parameters are not in the model's graph
        assert _ddp._in_graph_of((hidden,), names) == []
