"""A recompute that updates module state a second time (issue 9, item 4; issue 19): a warning
naming the state, once per module and run, in every mode (strict mode raises only where the
tensors backward uses differ). Normalisation statistics are said not to affect gradients; any
other state may be what the recompute computes from."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn
from conftest import grads_equal, grads_of
from torch.utils.checkpoint import checkpoint

import ckptguard

VARIANTS = pytest.mark.parametrize("reentrant", [False, True], ids=["nonreentrant", "reentrant"])


def _normed() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.ReLU())


def _step(module: nn.Module, reentrant: bool) -> list:
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(3), requires_grad=True)
    checkpoint(module, x, use_reentrant=reentrant).sum().backward()
    grads = grads_of(module, x)
    module.zero_grad(set_to_none=True)
    return grads


@VARIANTS
def test_batchnorm_statistics_updated_twice_warn(reentrant: bool) -> None:
    plain_module = _normed()
    plain = _step(plain_module, reentrant)
    assert int(plain_module[1].num_batches_tracked) == 2, "plain torch counts the step twice"
    module = _normed()
    with ckptguard.guard(), pytest.warns(ckptguard.CheckpointGuardWarning) as record:
        guarded = _step(module, reentrant)
    assert grads_equal(plain, guarded)
    message = str(record[0].message)
    assert "[side_effect]" in message and "Sequential.1.num_batches_tracked" in message
    assert "Sequential.1.running_mean" in message and "Sequential.1.running_var" in message
    assert "gradients are not affected" in message


@VARIANTS
def test_batchnorm_statistics_updated_twice_strict(reentrant: bool) -> None:
    """Strict mode on a CNN in training: its BatchNorms' second update is one warning per
    module for the whole run, not an error, and the gradients are bit-identical."""

    def cnn() -> nn.Module:
        torch.manual_seed(0)
        block = [nn.Conv2d(3, 3, 3, padding=1), nn.BatchNorm2d(3), nn.ReLU()]
        return nn.Sequential(*block, nn.Conv2d(3, 3, 3, padding=1), nn.BatchNorm2d(3))

    def steps(model: nn.Module) -> list:
        grads = []
        for seed in range(3):
            x = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(seed))
            x.requires_grad_()
            checkpoint(model, x, use_reentrant=reentrant).square().sum().backward()
            grads += grads_of(model, x)
            model.zero_grad(set_to_none=True)
        return grads

    plain = steps(cnn())
    model = cnn()
    with ckptguard.guard(strict=True), warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        guarded = steps(model)
    assert grads_equal(plain, guarded)
    messages = [str(w.message) for w in record if w.category is ckptguard.CheckpointGuardWarning]
    assert len(messages) == 1, messages  # one region, two BatchNorms, three steps: once
    assert "Sequential.1.running_mean" in messages[0] and "Sequential.4.running_var" in messages[0]
    assert "gradients are not affected" in messages[0]
    assert "as if momentum were about twice as large" in messages[0]
    assert record[0].filename == __file__  # at the backward call, not in ckptguard


class Counting(nn.Module):
    """Custom counters: a buffer incremented in place and a Python attribute."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(8, 8)
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))
        self.calls = 0

    def forward(self, x):
        self.steps.add_(1)
        self.calls += 1
        return torch.tanh(self.fc(x))


@VARIANTS
def test_custom_counters_are_named(reentrant: bool) -> None:
    module = Counting()
    with ckptguard.guard(), pytest.warns(ckptguard.CheckpointGuardWarning) as record:
        _step(module, reentrant)
    message = str(record[0].message)
    assert "Counting.steps" in message and "Counting.calls" in message
    assert "gradients are not affected" not in message
    assert "if the region computes its output from it" in message
    assert int(module.steps) == 2 and module.calls == 2


@VARIANTS
def test_spectral_norm_power_iteration_runs_twice(reentrant: bool) -> None:
    """spectral_norm's forward updates its ``_u``/``_v`` buffers (assigned through
    ``self._u = ...`` although they live in ``_buffers``) and computes the weight from them:
    the recompute starts from the forward's update, so its weight differs from the forward's
    and checkpointed gradients differ from unchecked ones (issue 38: once a side-effect
    warning, now the mismatch it is)."""

    def build() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.utils.parametrizations.spectral_norm(nn.Linear(8, 8)), nn.Tanh())

    module = build()
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(3), requires_grad=True)
    module(x).sum().backward()
    unchecked = grads_of(module, x)
    assert not grads_equal(unchecked, _step(build(), reentrant)), "plain torch: other gradients"
    with ckptguard.guard(), pytest.raises(ckptguard.CheckpointMismatchError) as info:
        _step(build(), reentrant)
    assert info.value.kind == "tensor"
    assert "Sequential.0.parametrizations.weight.0._v" in info.value.details["name"]
    assert "the recompute computes from the update" in str(info.value)


@VARIANTS
def test_no_side_effect_no_warning(reentrant: bool) -> None:
    module = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8).eval())
    with warnings.catch_warnings():
        warnings.simplefilter("error", ckptguard.CheckpointGuardWarning)
        with ckptguard.guard(strict=True):
            _step(module, reentrant)


class Caching(nn.Module):
    """Stores its input in an attribute that held None: the recompute stores an equal tensor
    again, which is no side effect (and ``!=`` on tensors is elementwise)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(8, 8)
        self.last = None

    def forward(self, x):
        self.last = x.detach()
        return torch.tanh(self.fc(self.last)) + x


@VARIANTS
def test_an_attribute_caching_a_tensor_is_no_side_effect(reentrant: bool) -> None:
    plain_module = Caching()
    plain = [_step(plain_module, reentrant) for _ in range(2)]
    module = Caching()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ckptguard.CheckpointGuardWarning)
        with ckptguard.guard():
            guarded = [_step(module, reentrant) for _ in range(2)]
    assert all(grads_equal(a, b) for a, b in zip(plain, guarded, strict=True))
