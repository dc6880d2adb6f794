"""Makes each stage of the guard's work fail in turn, and checks that training goes on.

Run by test_barrier.py as a script, through ``python -c``, through stdin and in an IPython
shell (its source is the program: it must not depend on ``__file__``). For each stage it runs
two training steps plainly and two under the guard with that stage raising, and prints one
JSON line: the file and lines its regions' code comes from and, per stage, whether every gradient is
``torch.equal`` to the plain run's, the guard's warnings (category and first line), how many
were not placed at the user's line, and what the guard wrote to stderr. Last, it runs a
BatchNorm region under the guard (default and strict mode) with warnings printed as Python
prints them, which once ended a ``python -c`` run with ``ImportError: '__main__' is not a
built-in module``.
"""

import contextlib
import functools
import io
import json
import types
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

import ckptguard
from ckptguard import (
    _ddp,
    _explain,
    _rng,
    _selective,
    _settings,
    _side_effects,
    _strict,
    _verify,
)


class Block(nn.Module):
    """A Linear, a BatchNorm (the recompute updates the running statistics again, so the
    side-effect watch has work to do) and a dropout (random numbers drawn)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 4)
        self.norm = nn.BatchNorm1d(4)
        self.drop = nn.Dropout(0.25)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(torch.sin(self.norm(self.fc(x))))


class Outer(nn.Module):
    """A reentrant region inside DistributedDataParallel's forward."""

    def __init__(self) -> None:
        super().__init__()
        self.block = Block()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.block, x, use_reentrant=True)


def _save_matmuls(ctx, op, *args, **kwargs):
    if op == torch.ops.aten.addmm.default:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def _region(kind: str, model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    if kind == "module":
        return checkpoint(model, x, use_reentrant=False)
    if kind == "function":  # its forward is observed: the guard's hook runs inside it
        return checkpoint(lambda h: model(h), x, use_reentrant=False)
    if kind == "selective":
        context = functools.partial(create_selective_checkpoint_contexts, _save_matmuls)
        return checkpoint(model, x, use_reentrant=False, context_fn=context)
    if kind == "unpreserved":  # the guard watches which devices the forward draws on
        return checkpoint(model, x, use_reentrant=False, preserve_rng_state=False)
    assert kind == "ddp"
    return model(x)


def _steps(kind: str) -> list:
    """Two steps of a fresh model; every parameter's and input's gradient. Kind "settings"
    changes a torch setting between forward and backward: the recompute is watched."""
    model = DistributedDataParallel(Outer()) if kind == "ddp" else Block()
    grads = []
    for seed in range(2):
        x = torch.randn(3, 4, generator=torch.Generator().manual_seed(seed), requires_grad=True)
        loss = _region("module" if kind == "settings" else kind, model, x).sum()
        precision = torch.get_float32_matmul_precision()
        if kind == "settings":
            torch.set_float32_matmul_precision("medium" if precision != "medium" else "high")
        try:
            loss.backward()
        finally:
            torch.set_float32_matmul_precision(precision)
        grads += [p.grad.clone() for p in model.parameters()] + [x.grad]
        model.zero_grad(set_to_none=True)
    return grads


def _fail(*args, **kwargs):
    raise RuntimeError("injected failure")


def _unplaceable(*args, **kwargs):  # what a loader without source once raised
    raise ImportError("'__main__' is not a built-in module")


# stage -> (region kind, strict, the (owner, attribute) made to fail, its replacement)
STAGES = {
    "capture": ("module", False, [(_verify, "capture")], _fail),
    "verify": ("module", False, [(_verify, "compare")], _fail),
    "strict compare": ("module", True, [(_strict.StrictRecompute, "difference")], _fail),
    "side-effect watch": ("module", False, [(_side_effects, "updated_again")], _fail),
    "side-effect watch inside the forward": (
        "function",
        False,
        [(_side_effects, "state_before")],
        _fail,
    ),
    "RNG watch inside the forward": ("unpreserved", False, [(_rng.RandomOps, "_note")], _fail),
    "torch settings watch inside the recompute": (
        "settings",
        False,
        [(_settings.SettingsWatch, "look")],
        _fail,
    ),
    "DDP check": ("ddp", False, [(_ddp, "reentrant_forward")], _fail),
    "selective policy check": ("selective", False, [(_selective, "_mutated_outputs")], _fail),
    "explain": ("module", False, [(_explain, "side_effect")], _fail),
    "warn": ("module", False, [(warnings, "warn_explicit")], _unplaceable),
    "warn, unplaced too": (
        "module",
        False,
        [(warnings, "warn_explicit"), (warnings, "warn")],
        _unplaceable,
    ),
}


def run_stage(stage: str) -> dict:
    kind, strict, targets, replacement = STAGES[stage]
    plain = _steps(kind)
    originals = [(owner, name, getattr(owner, name)) for owner, name in targets]
    stderr = io.StringIO()
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stderr(stderr):
        warnings.simplefilter("always")
        ckptguard.enable(strict=strict)
        for owner, name, _ in originals:
            setattr(owner, name, replacement)
        try:
            guarded = _steps(kind)
        finally:
            for owner, name, original in originals:
                setattr(owner, name, original)
            ckptguard.disable()
    guard_warnings = [
        [w.category.__name__, str(w.message).splitlines()[0]]
        for w in caught
        if issubclass(w.category, ckptguard.CheckpointGuardWarning)
    ]
    placed = ["could not place this warning" in str(w.message) for w in caught]
    return {
        "equal": len(plain) == len(guarded)
        and all(torch.equal(a, b) for a, b in zip(plain, guarded, strict=True)),
        "warnings": guard_warnings,
        "unplaced": sum(placed),
        "stderr": [line for line in stderr.getvalue().splitlines() if "ckptguard [" in line],
    }


def main() -> None:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        results = {stage: run_stage(stage) for stage in STAGES}
    finally:
        dist.destroy_process_group()
    lambda_code = next(c for c in _region.__code__.co_consts if isinstance(c, types.CodeType))
    where = Block.forward.__code__
    lines = {"Block.forward": where.co_firstlineno, "lambda": lambda_code.co_firstlineno}
    print(json.dumps({"file": where.co_filename, "lines": lines, "stages": results}))
    # warnings as Python prints them, at the user's line of this program
    for strict in (False, True):
        with ckptguard.guard(strict=strict):
            checkpoint(Block(), torch.randn(3, 4), use_reentrant=False).sum().backward()
    print("trained to the end")


main()
