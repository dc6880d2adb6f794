"""State a region both reads and updates during its own forward (issue 38): a mismatch when
the recompute computes from the updated value, a side-effect warning only when the output does
not depend on it.

Plain torch decides: the checkpointed run's gradients are compared (``torch.equal``) with the
same model run without checkpoint. A quantization-aware region (``FakeQuantize``: the
recompute observes again and quantizes with a new scale) and an exponential moving average the
output is normalised with differ, and the guard raises ``[tensor]`` naming the state, in both
checkpoint variants and in default and strict mode. Their twins (observers frozen, a counter
buffer the output never reads) train bit-identically and the guard raises nothing.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn
from conftest import grads_equal, grads_of
from torch.ao.quantization import FakeQuantize, disable_observer
from torch.utils.checkpoint import checkpoint

import ckptguard
from ckptguard import _side_effects

VARIANTS = pytest.mark.parametrize("reentrant", [False, True], ids=["nonreentrant", "reentrant"])
MODES = pytest.mark.parametrize("strict", [False, True], ids=["default", "strict"])


class QuantizationAware(nn.Module):
    def __init__(self, frozen: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 4)
        self.quantize = FakeQuantize()
        if frozen:  # scale and zero point fixed: calibrated once, then frozen
            self.quantize(torch.randn(16, 4, generator=torch.Generator().manual_seed(7)))
            self.quantize.apply(disable_observer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(self.quantize(self.fc(x)))


class MovingAverageNormalised(nn.Module):
    """Normalises by a running mean it updates in its own forward, from the updated value."""

    def __init__(self, size: int = 4) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 4)
        self.register_buffer("mean", torch.zeros(size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.fc(x)
        with torch.no_grad():
            self.mean.mul_(0.9).add_(hidden.mean(0).repeat(self.mean.numel() // 4), alpha=0.1)
        return torch.tanh(hidden - self.mean[:4])


class CountsSteps(nn.Module):
    """Updates a counter buffer its output never reads."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 4)
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.steps.add_(1)
        return torch.tanh(self.fc(x))


def _steps(module: nn.Module, reentrant: bool | None) -> list:
    """Three training steps (``reentrant`` None: without checkpoint); every gradient."""
    grads = []
    for seed in range(3):
        x = torch.randn(8, 4, generator=torch.Generator().manual_seed(seed), requires_grad=True)
        out = module(x) if reentrant is None else checkpoint(module, x, use_reentrant=reentrant)
        out.square().sum().backward()
        grads += grads_of(module, x)
        module.zero_grad(set_to_none=True)
    return grads


FAULTS = {
    "fake_quantize": (QuantizationAware, "QuantizationAware.quantize.activation_post_process"),
    "moving_average": (MovingAverageNormalised, "MovingAverageNormalised.mean"),
}


@VARIANTS
@MODES
@pytest.mark.parametrize("fault", list(FAULTS))
def test_state_the_recompute_computes_from_is_named(
    fault: str, reentrant: bool, strict: bool
) -> None:
    make, name = FAULTS[fault]
    unchecked = _steps(make(), None)
    assert not grads_equal(unchecked, _steps(make(), reentrant)), "plain torch: other gradients"
    with ckptguard.guard(strict=strict), pytest.raises(ckptguard.CheckpointMismatchError) as info:
        _steps(make(), reentrant)
    error = info.value
    assert error.kind == "tensor", str(error)
    assert error.details["name"].startswith(name), error.details["name"]
    assert error.details["certain"] is True
    assert "the recompute computes from the update" in str(error)


TWINS = {
    "frozen_observers": lambda: QuantizationAware(frozen=True),
    "counter_the_output_never_reads": CountsSteps,
}


@VARIANTS
@MODES
@pytest.mark.parametrize("twin", list(TWINS))
def test_state_the_output_does_not_depend_on_is_no_mismatch(
    twin: str, reentrant: bool, strict: bool
) -> None:
    make = TWINS[twin]
    plain = _steps(make(), reentrant)
    if twin == "frozen_observers":
        assert grads_equal(plain, _steps(make(), None)), "checkpoint changes nothing here"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with ckptguard.guard(strict=strict):
            guarded = _steps(make(), reentrant)
    assert grads_equal(plain, guarded)
    mismatches = [w for w in caught if issubclass(w.category, ckptguard.CheckpointMismatchWarning)]
    assert not mismatches, [str(w.message) for w in mismatches]
    side_effects = [str(w.message) for w in caught if "[side_effect]" in str(w.message)]
    if twin == "counter_the_output_never_reads":  # updated twice: said once, as it always was
        assert len(side_effects) == 1 and "CountsSteps.steps" in side_effects[0]
    else:
        assert side_effects == []


@VARIANTS
def test_state_too_large_to_copy_is_a_may(reentrant: bool) -> None:
    """A buffer larger than the guard copies before a forward cannot be put back to run an op
    again: the recompute *may* compute otherwise, a ``CheckpointMismatchWarning`` in default
    mode; strict mode measures the values and raises."""
    size = _side_effects.SMALL_BUFFER * 2
    assert not grads_equal(
        _steps(MovingAverageNormalised(size), None),
        _steps(MovingAverageNormalised(size), reentrant),
    )
    with ckptguard.guard(), pytest.warns(ckptguard.CheckpointMismatchWarning) as record:
        _steps(MovingAverageNormalised(size), reentrant)
    message = str(record[0].message)
    assert "may have been recomputed differently" in message
    assert "MovingAverageNormalised.mean" in message
    with ckptguard.guard(strict=True), pytest.raises(ckptguard.CheckpointMismatchError) as info:
        _steps(MovingAverageNormalised(size), reentrant)
    assert info.value.kind == "values"
