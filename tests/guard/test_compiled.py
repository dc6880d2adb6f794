"""Strict mode on regions that run code ``torch.compile`` made (issue 38).

Strict mode's per-op log is a dispatch mode, under which compiled code falls back to eager
kernels that save other tensors in another order: a clean compiled module under the
non-reentrant variant raised ``[saved_tensors]``. Now a region that runs compiled code is
compared by what is comparable without that log (the tensors saved for backward, a reentrant
region's outputs): silent on a clean run, with gradients ``torch.equal`` to an unguarded run,
and a write only strict mode can see (``param.data.mul_``, which skips the version counter) is
still ``[values]``. ``aot_eager`` compiles as inductor does (AOT autograd saves its own
tensors) without generating kernels.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn
from conftest import grads_equal
from torch.utils.checkpoint import checkpoint

import ckptguard

VARIANTS = pytest.mark.parametrize("reentrant", [False, True], ids=["nonreentrant", "reentrant"])
MODES = pytest.mark.parametrize("strict", [False, True], ids=["default", "strict"])
BACKEND = "aot_eager"


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = nn.Linear(4, 4)
        self.fc2 = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(self.fc2(torch.tanh(self.fc1(x))))


class WithCompiledChild(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = torch.compile(Net(), backend=BACKEND)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cos(self.inner(x))


def _compiled_module() -> tuple[nn.Module, object]:
    net = Net()
    return net, torch.compile(net, backend=BACKEND)


def _compiled_in_place() -> tuple[nn.Module, object]:
    net = Net()
    net.compile(backend=BACKEND)
    return net, net


def _compiled_function() -> tuple[nn.Module, object]:
    net = Net()
    return net, torch.compile(lambda x: net(x), backend=BACKEND)


def _compiled_child() -> tuple[nn.Module, object]:
    net = WithCompiledChild()
    return net, net


SHAPES = {
    "torch.compile(module)": _compiled_module,
    "module.compile()": _compiled_in_place,
    "compiled function": _compiled_function,
    "compiled child": _compiled_child,
}


def _steps(net: nn.Module, region: object, reentrant: bool, change=None) -> list:
    grads = []
    for seed in range(2):
        x = torch.randn(3, 4, generator=torch.Generator().manual_seed(seed), requires_grad=True)
        out = checkpoint(region, x, use_reentrant=reentrant)
        if change is not None:
            change()
        out.square().sum().backward()
        grads += [p.grad.clone() for p in net.parameters()] + [x.grad.clone()]
        net.zero_grad(set_to_none=True)
    return grads


@VARIANTS
@MODES
@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_clean_compiled_region_is_silent(shape: str, reentrant: bool, strict: bool) -> None:
    net, region = SHAPES[shape]()
    plain = _steps(net, region, reentrant)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ckptguard.CheckpointMismatchWarning)
        warnings.simplefilter("error", ckptguard.CheckpointGuardWarning)
        with ckptguard.guard(strict=strict):
            guarded = _steps(net, region, reentrant)
    assert grads_equal(plain, guarded)


@VARIANTS
def test_a_write_only_strict_mode_sees_is_named_in_a_compiled_region(reentrant: bool) -> None:
    net, region = _compiled_module()
    weight = net.fc1.weight

    def doubled() -> None:
        weight.data.mul_(2)

    def undo() -> None:
        weight.data.div_(2)

    honest = _steps(net, region, reentrant)
    try:
        changed = _steps(net, region, reentrant, doubled)
    finally:
        undo()
    assert not grads_equal(honest, changed), "plain torch: other gradients"
    with ckptguard.guard(strict=True), pytest.raises(ckptguard.CheckpointMismatchError) as info:
        try:
            _steps(net, region, reentrant, doubled)
        finally:
            undo()
    assert info.value.kind == "values", str(info.value)
