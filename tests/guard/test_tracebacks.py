"""A guard error's traceback ends where torch called the guard (issue 31): the last frame is the
hook torch called, the frame before it torch's, and every ckptguard frame left is such a hook
that sets ``__tracebackhide__``, so pytest shows torch's frame last (IPython's debugger skips
the hook too). An error raised inside the user's function (a nested region's) keeps the frames
it came through."""

from __future__ import annotations

import os
import traceback
import warnings

import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

import ckptguard

GUARD_DIR = os.path.dirname(os.path.abspath(ckptguard.__file__)) + os.sep
TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
VARIANTS = pytest.mark.parametrize("reentrant", [False, True], ids=["nonreentrant", "reentrant"])

SCALE = 1.0


def _scaled(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x * SCALE)


def _frames(error: BaseException) -> list:
    return [frame for frame, _ in traceback.walk_tb(error.__traceback__)]


def _ends_at_the_hook(error: BaseException) -> str:
    """The name of the last frame, the guard's hook, called by torch; fails unless every guard
    frame is a hook that hides itself (the reentrant backward runs through two: the wrapped
    ``CheckpointFunction.backward``, then the region torch's backward calls)."""
    frames = _frames(error)
    hook, caller = frames[-1], frames[-2]
    assert hook.f_code.co_filename.startswith(GUARD_DIR), hook.f_code
    assert caller.f_code.co_filename.startswith(TORCH_DIR), caller.f_code
    for frame in frames:
        if frame.f_code.co_filename.startswith(GUARD_DIR):
            assert frame.f_locals.get("__tracebackhide__") is True, frame.f_code
    return hook.f_code.co_name


@VARIANTS
def test_a_mismatch_at_the_recompute(reentrant: bool) -> None:
    global SCALE
    x = torch.randn(3, requires_grad=True)
    with ckptguard.guard():
        out = checkpoint(_scaled, x, use_reentrant=reentrant)
        SCALE = 2.0
        try:
            with pytest.raises(ckptguard.CheckpointMismatchError) as info:
                out.sum().backward()
        finally:
            SCALE = 1.0
    assert info.value.kind == "global"
    assert _ends_at_the_hook(info.value) == "__call__"
    assert _frames(info.value)[0].f_code is test_a_mismatch_at_the_recompute.__code__


def test_a_verdict_at_the_reentrant_forward() -> None:
    layer = nn.Linear(3, 3)
    with ckptguard.guard(on_lost_gradients="raise"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's own "None of the inputs have requires_grad"
        with pytest.raises(ckptguard.LostGradientsError) as info:
            checkpoint(layer, torch.randn(2, 3), use_reentrant=True)
    assert _ends_at_the_hook(info.value) == "apply"


def test_a_verdict_at_the_non_reentrant_forward() -> None:
    """``preserve_rng_state=False`` and a dropout inside the region: named at the forward, by
    the generator torch runs."""
    dropped = nn.Dropout(0.5)
    x = torch.randn(4, requires_grad=True)
    with ckptguard.guard(), pytest.raises(ckptguard.CheckpointMismatchError) as info:
        checkpoint(dropped, x, use_reentrant=False, preserve_rng_state=False)
    assert info.value.kind == "rng_device"
    assert _ends_at_the_hook(info.value) == "generator"


@VARIANTS
def test_strict_modes_verdict_after_the_recompute(reentrant: bool) -> None:
    """An explicit generator: torch replays default generators only."""
    generator = torch.Generator().manual_seed(0)

    def noisy(x: torch.Tensor) -> torch.Tensor:
        return torch.sin(x) * torch.rand(x.shape, generator=generator)

    x = torch.randn(4, requires_grad=True)
    with ckptguard.guard(strict=True):
        out = checkpoint(noisy, x, use_reentrant=reentrant)
        with pytest.raises(ckptguard.CheckpointMismatchError) as info:
            out.sum().backward()
    assert info.value.kind == "values"
    assert _ends_at_the_hook(info.value) == "__call__"


def test_torchs_error_explained() -> None:
    """train() -> eval() with dropout: torch's CheckpointError (saved tensors differ in number),
    re-raised by the guard naming the switch, from the hook torch called."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
    with ckptguard.guard(on_mismatch="warn"), warnings.catch_warnings():
        warnings.simplefilter("ignore", ckptguard.CheckpointMismatchWarning)
        out = checkpoint(model, torch.randn(2, 4, requires_grad=True), use_reentrant=False)
        model.eval()
        with pytest.raises(ckptguard.CheckpointMismatchError) as info:
            out.sum().backward()
    assert info.value.kind == "training"
    assert isinstance(info.value.__cause__, torch.utils.checkpoint.CheckpointError)
    assert _ends_at_the_hook(info.value) in ("__call__", "check_recomputed_tensors_match")


def test_an_error_from_inside_the_users_function_keeps_its_frames() -> None:
    """A reentrant region's forward runs without grad, where torch runs a nested checkpoint
    plainly; its recompute runs with grad, where the nested region's forward is guarded and
    names the dropout it runs with ``preserve_rng_state=False``, raised through the user's
    function and the outer region's recompute, frames kept."""
    dropped = nn.Dropout(0.5)

    def outer(h: torch.Tensor) -> torch.Tensor:
        return checkpoint(dropped, torch.cos(h), use_reentrant=False, preserve_rng_state=False)

    x = torch.randn(4, requires_grad=True)
    with ckptguard.guard():
        out = checkpoint(outer, x, use_reentrant=True)
        with pytest.raises(ckptguard.CheckpointMismatchError) as info:
            out.sum().backward()
    assert info.value.kind == "rng_device"
    names = [f.f_code.co_name for f in _frames(info.value)]
    assert names[-1] == "generator", names
    assert names.index("__call__") < names.index("outer"), names
