"""Strict mode: op-by-op value signatures catch what fingerprints cannot name."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import grads_equal
from test_clean_run import _training_run
from torch.utils.checkpoint import checkpoint

import ckptguard
from ckptguard import CheckpointMismatchError


@pytest.mark.parametrize("allow_reentrant", [True, False], ids=["mixed", "autograd_grad"])
def test_clean_run_is_bit_identical_and_silent(allow_reentrant: bool) -> None:
    plain = _training_run(allow_reentrant)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ckptguard.CheckpointMismatchWarning)
        with ckptguard.guard(strict=True):
            strict = _training_run(allow_reentrant)
    assert grads_equal(plain, strict)


class Settings:
    """An object the region reaches through a call and a local variable: the bytecode shows
    no chain from an argument, closure or global to its attribute, so only strict mode sees it."""

    temperature = 1.0


SETTINGS = Settings()


def _current_settings() -> Settings:
    return REGISTRY["settings"]


REGISTRY = {"settings": SETTINGS}


def _settings_region(x: torch.Tensor) -> torch.Tensor:
    hidden = torch.tanh(x)
    settings = _current_settings()
    return torch.sin(hidden / settings.temperature)


@pytest.mark.parametrize("reentrant", [False, True], ids=["nonreentrant", "reentrant"])
def test_attribute_of_arbitrary_object(reentrant: bool) -> None:
    x = torch.randn(6, requires_grad=True)

    def run(change: bool) -> torch.Tensor:
        x.grad = None
        out = checkpoint(_settings_region, x, use_reentrant=reentrant)
        if change:
            SETTINGS.temperature = 2.0
        try:
            out.sum().backward()
        finally:
            SETTINGS.temperature = 1.0
        return x.grad.clone()

    honest = run(False)
    assert not torch.equal(honest, run(True)), "plain torch differs silently"
    ckptguard.enable()
    run(True)  # fingerprints alone cannot see an attribute of an arbitrary object
    ckptguard.enable(strict=True)
    with pytest.raises(CheckpointMismatchError) as info:
        run(True)
    error = info.value
    assert error.kind == "values"
    assert error.details["op"] == "aten.div.Tensor"
    assert error.details["index"] == 1
    division_line = _settings_region.__code__.co_firstlineno + 3
    assert error.details["frame"] == f"called at {__file__}:{division_line}"
    # a saved tensor's signature (non-reentrant) or an op output's (reentrant)
    total = "sum=" if reentrant else "weighted sum="
    assert total in error.details["forward"] and total in error.details["recompute"]
    assert "relative difference" in str(error) and "gradients are affected" in str(error)
    assert torch.equal(run(False), honest)


@pytest.mark.parametrize("reentrant", [False, True], ids=["nonreentrant", "reentrant"])
def test_explicit_generator_is_nondeterministic(reentrant: bool) -> None:
    x = torch.randn(6, requires_grad=True)
    generator = torch.Generator().manual_seed(0)

    def region(t: torch.Tensor) -> torch.Tensor:
        noise = torch.rand(6, generator=generator)  # torch stashes only default generators
        return torch.sin(t * noise)

    ckptguard.enable(strict=True)
    out = checkpoint(region, x, use_reentrant=reentrant)
    with pytest.raises(CheckpointMismatchError) as info:
        out.sum().backward()
    assert info.value.details["op"] == "aten.rand.generator"
    assert info.value.details["index"] == 0


def test_rrelu_training_under_nonreentrant() -> None:
    """PyTorch's own case: the early-stopped recompute skips the op that fills RReLU's noise.
    The backward then reads a buffer never written, so its gradient is wrong or, where the
    allocator hands back the memory the forward's noise was in, right by chance: the guard
    must report it either way."""
    x = torch.randn(64, requires_grad=True)

    def region(t: torch.Tensor) -> torch.Tensor:
        return F.rrelu(t, training=True) * 2

    torch.manual_seed(0)
    out = checkpoint(region, x, use_reentrant=False)
    assert torch.equal(out, region_at_seed(region, x, 0)), "forward outputs are equal"
    out.sum().backward()  # unguarded: no error, whatever the buffer held
    ckptguard.enable(strict=True)
    torch.manual_seed(0)
    out = checkpoint(region, x, use_reentrant=False)
    with pytest.raises(CheckpointMismatchError) as info:
        out.sum().backward()
    assert info.value.kind == "values"
    # the noise buffer: made uninitialised, saved, never filled in the recompute
    assert info.value.details["op"] == "aten.empty_like.default"
    rrelu_line = region.__code__.co_firstlineno + 1
    assert info.value.details["frame"] == f"called at {__file__}:{rrelu_line}"
    assert "stopped the recompute early" in str(info.value)


def region_at_seed(region, x: torch.Tensor, seed: int) -> torch.Tensor:
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(seed)
        return region(x)


def test_nested_regions_and_non_tensor_outputs() -> None:
    inner = nn.Linear(8, 8)
    holder = [Settings()]

    def inner_region(t: torch.Tensor) -> torch.Tensor:
        scale = holder[0]  # reached through a local variable: no fingerprint names it
        return torch.tanh(inner(t) * scale.temperature)

    def outer_region(t: torch.Tensor) -> torch.Tensor:
        count = int(t.abs().sum().item() > 0)  # an op with a non-tensor (scalar) output
        return checkpoint(inner_region, t * count, use_reentrant=False).exp()

    x = torch.randn(3, 8, requires_grad=True)
    ckptguard.enable(strict=True, on_mismatch="warn")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ckptguard.CheckpointGuardWarning)
        checkpoint(outer_region, x, use_reentrant=False).sum().backward()  # clean: silent
    out = checkpoint(outer_region, x, use_reentrant=False)
    holder[0].temperature = 3.0
    with pytest.warns(ckptguard.CheckpointMismatchWarning) as record:
        out.sum().backward()
    # each region names the earliest op whose saved tensor differs in its own checkpoint: the
    # outer one the exp of the inner region's output, the inner one the tanh after its scaling
    # (a product with a Python float saves nothing for backward). The outer index counts the ops
    # torch's checkpoint dispatches for the nested region too: two empty tensors on torch 2.8
    # (#9), none on 2.13 (#7).
    named = [str(w.message) for w in record]
    assert len(named) == 2, named
    assert re.search(r"first differing op: #(7|9) aten\.exp\.default called at ", named[0])
    assert "first differing op: #2 aten.tanh.default" in named[1], named[1]


def test_strict_warn_mode_continues() -> None:
    x = torch.randn(6, requires_grad=True)
    ckptguard.enable(strict=True, on_mismatch="warn")
    out = checkpoint(_settings_region, x, use_reentrant=False)
    SETTINGS.temperature = 2.0
    try:
        with pytest.warns(ckptguard.CheckpointMismatchWarning, match="aten.div"):
            out.sum().backward()
    finally:
        SETTINGS.temperature = 1.0


def test_write_through_data_needs_strict_mode() -> None:
    """``p.data.mul_()`` leaves the version counter alone: only the values show the change."""
    torch.manual_seed(0)
    layer = nn.Linear(4, 4)
    x = torch.randn(2, 4, requires_grad=True)

    def step(change: bool) -> None:
        out = checkpoint(lambda t: torch.tanh(layer(t)), x, use_reentrant=False)
        if change:
            layer.weight.data.mul_(2.0)
        try:
            out.sum().backward()
        finally:
            if change:
                layer.weight.data.div_(2.0)

    ckptguard.enable()
    step(True)  # the fingerprint cannot see it
    ckptguard.enable(strict=True)
    step(False)
    with pytest.raises(CheckpointMismatchError) as info:
        step(True)
    assert info.value.kind == "values" and info.value.details["op"] == "aten.addmm.default"


def test_signatures_of_transposed_tensors() -> None:
    """A transposed saved tensor is checksummed in its memory order (no copy): the same values
    in another layout are no difference; a permutation of them, or their negation, is."""
    from ckptguard import _strict

    matrix = torch.randn(64, 48, generator=torch.Generator().manual_seed(0))
    transposed, contiguous = _strict.signatures([matrix.t(), matrix.t().contiguous()])
    assert _strict.compare_signatures(transposed, contiguous) is None
    order = torch.randperm(64 * 48, generator=torch.Generator().manual_seed(1))
    (permuted,) = _strict.signatures([matrix.reshape(-1)[order].view(64, 48).t()])
    assert transposed[:3] == permuted[:3] and transposed[5] == permuted[5]  # same layout
    assert _strict.compare_signatures(transposed, permuted) is not None
    (flipped,) = _strict.signatures([-matrix.t()])  # the same sum of squares
    assert flipped[4] == transposed[4]
    assert _strict.compare_signatures(transposed, flipped) is not None
