"""The guard never stops training (NOTE [ The guard never stops training ] in _intercept): each
stage of its work on a region made to fail in turn (barrier_worker.py), whatever ``__main__`` is:
a script, ``python -c``, ``python - < train.py`` and an IPython shell. Every gradient stays
``torch.equal`` to a plain run's and each region's failure is one ``[internal]`` warning naming
the stage; a warning that cannot be placed at the user's line is issued all the same."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

from tests.conftest import SUBPROCESS_TIMEOUT

WORKER = pathlib.Path(__file__).with_name("barrier_worker.py")
INJECTED = "RuntimeError: injected failure."
UNPLACEABLE = "ImportError: '__main__' is not a built-in module."


def _side_effect(block: str) -> str:
    return (
        f"ckptguard [side_effect]: the recompute of checkpointed region Block.forward "
        f"({block}) updated state a second time: Block.norm.running_mean, "
        "Block.norm.running_var, Block.norm.num_batches_tracked."
    )


def _expected(file: str, lines: dict[str, int]) -> dict[str, tuple[list, int, list[str]]]:
    """stage -> (its warnings, warnings not placed at the user's line, lines written to
    stderr), the worker's code coming from ``file``: two steps of one model, so two regions,
    except where a report comes once per module and run."""
    block, function = f"{file}:{lines['Block.forward']}", f"{file}:{lines['lambda']}"

    def internal(stage: str, region: str = f"Block.forward ({block})", error: str = INJECTED):
        return [
            "CheckpointGuardWarning",
            f"ckptguard [internal]: could not {stage} checkpointed region {region}: {error}",
        ]

    recompute = "check the recompute of"
    return {
        "capture": ([internal("fingerprint")] * 2, 0, []),
        "verify": ([internal("verify")] * 2, 0, []),
        "strict compare": ([internal(recompute)] * 2, 0, []),
        "side-effect watch": ([internal(recompute)] * 2, 0, []),
        "side-effect watch inside the forward": (
            [internal("record the forward of", f"_region.<locals>.<lambda> ({function})")] * 2,
            0,
            [],
        ),
        "RNG watch inside the forward": ([internal("fingerprint")] * 2, 0, []),
        "torch settings watch inside the recompute": (  # judged once the recompute ran
            [["CheckpointGuardWarning", _side_effect(block)]]
            + [internal("judge the torch settings of")] * 2,
            0,
            [],
        ),
        "DDP check": (
            [
                internal(
                    "check the DistributedDataParallel step of",
                    f"module.block (Block.forward, {block})",
                )
            ]
            * 2,
            0,
            [],
        ),
        "selective policy check": (
            [internal("check the selective-checkpoint policy of")] * 2,
            0,
            [],
        ),
        "explain": ([internal(recompute)], 0, []),
        "warn": ([["CheckpointGuardWarning", _side_effect(block)]], 1, []),
        "warn, unplaced too": (
            [],
            0,
            [f"CheckpointGuardWarning: {internal(recompute, error=UNPLACEABLE)[1]}"],
        ),
    }


_IPYTHON_SHELL = """
import sys
from IPython.core.interactiveshell import InteractiveShell
result = InteractiveShell.instance().run_cell(open(sys.argv[1]).read())
sys.exit(0 if result.success else 1)
"""


def _launch(how: str) -> subprocess.CompletedProcess:
    source = WORKER.read_text()
    command = {
        "script": [str(WORKER)],
        "python -c": ["-c", source],
        "stdin": ["-"],
        "ipython": ["-c", _IPYTHON_SHELL, str(WORKER)],
    }[how]
    env = {k: v for k, v in os.environ.items() if k != "CKPTGUARD"}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run(
        [sys.executable, *command],
        input=source if how == "stdin" else None,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
        env=env,
    )


@pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
    reason="the DDP stage needs torch.distributed with gloo",
)
@pytest.mark.parametrize("how", ["script", "python -c", "stdin", "ipython"])
def test_every_stage_failing_leaves_training_alone(how: str) -> None:
    if how == "ipython" and importlib.util.find_spec("IPython") is None:
        pytest.skip("IPython is not installed")
    done = _launch(how)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    report = json.loads(next(line for line in lines if line.startswith("{")))
    file, results = report["file"], report["stages"]
    assert {
        "script": file == str(WORKER),
        "python -c": file == "<string>",
        "stdin": file == "<stdin>",
        "ipython": file.startswith("<ipython-input-"),
    }[how], file
    expected = _expected(file, report["lines"])
    assert list(results) == list(expected)
    for stage, (warned, unplaced, stderr) in expected.items():
        found = results[stage]
        assert found["equal"], stage
        assert found["warnings"] == warned, (stage, found["warnings"])
        assert found["unplaced"] == unplaced, stage
        assert found["stderr"] == stderr, (stage, found["stderr"])
    # the BatchNorm warning printed the way Python prints warnings, once per line
    assert lines[-1] == "trained to the end", done.stdout
    block = f"{file}:{report['lines']['Block.forward']}"
    assert f"CheckpointGuardWarning: {_side_effect(block)}" in done.stderr, done.stderr
    assert done.stderr.count("CheckpointGuardWarning:") == 1, done.stderr
    assert "Traceback" not in done.stderr and "[internal]" not in done.stderr, done.stderr
