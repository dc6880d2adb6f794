"""Each mismatch kind: plain torch gives silently different gradients, the guard names it.

Every scenario runs the same checkpointed step three times: honestly, with a change made between
forward and backward under plain torch (gradients differ, no error), and with the guard on
(``CheckpointMismatchError`` of the right kind, naming what changed).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
import torch.nn as nn
from conftest import grads_equal, grads_of
from torch.utils.checkpoint import checkpoint

import ckptguard
from ckptguard import CheckpointMismatchError

SCALE = 1.0
GAIN = torch.tensor([1.0, 2.0, 3.0, 4.0])


class Scaled(nn.Module):
    """Reads a module global, a plain attribute, a buffer and its parameters."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 4)
        self.scale = 1.0
        self.register_buffer("gain", torch.tensor(1.0001))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        factor = 1.0 if self.training else 2.0
        hidden = self.fc(x) * self.scale * SCALE * factor
        return torch.sin(hidden * self.gain.to(x.dtype) * GAIN)


def _doubled_forward(self: Scaled, x: torch.Tensor) -> torch.Tensor:
    return torch.sin(2.0 * self.fc(x) * self.scale * SCALE * self.gain.to(x.dtype) * GAIN)


@dataclass
class Scenario:
    kind: str
    change: Callable[[Scaled], None]
    undo: Callable[[Scaled], None]
    names: tuple[str, ...]  # substrings the error message must contain


def _set_global(name: str, value: object) -> Callable[[Scaled], None]:
    def apply(_: Scaled) -> None:
        globals()[name] = value

    return apply


def _bump_weight(model: Scaled) -> None:
    with torch.no_grad():  # what optimizer.step() does between forward and backward
        model.fc.weight.add_(0.25)


def _unbump_weight(model: Scaled) -> None:
    with torch.no_grad():
        model.fc.weight.sub_(0.25)


_replaced: dict[int, nn.Parameter] = {}


def _replace_weight(model: Scaled) -> None:
    _replaced[id(model)] = model.fc.weight
    model.fc.weight = nn.Parameter(model.fc.weight.detach() * 2)


def _restore_weight(model: Scaled) -> None:
    model.fc.weight = _replaced.pop(id(model))


def _cast_buffer_to_half(model: Scaled) -> None:
    """What ``Module.half()`` / ``.to()`` do to each tensor: swap ``.data`` in place."""
    _replaced[id(model.gain)] = model.gain.data
    model.gain.data = model.gain.data.half()


def _restore_buffer(model: Scaled) -> None:
    model.gain.data = _replaced.pop(id(model.gain))


def _bump_gain(_: Scaled) -> None:
    GAIN.mul_(3.0)


def _unbump_gain(_: Scaled) -> None:
    GAIN.div_(3.0)


SCENARIOS = {
    "global": Scenario("global", _set_global("SCALE", 3.0), _set_global("SCALE", 1.0), ("SCALE",)),
    "global_tensor": Scenario("tensor", _bump_gain, _unbump_gain, ("GAIN", "in place")),
    "attribute": Scenario(
        "attribute",
        lambda m: setattr(m, "scale", 0.5),
        lambda m: setattr(m, "scale", 1.0),
        ("Scaled.scale", "1.0", "0.5"),
    ),
    "training": Scenario("training", lambda m: m.eval(), lambda m: m.train(), ("Scaled",)),
    "tensor_in_place": Scenario(
        "tensor", _bump_weight, _unbump_weight, ("Scaled.fc.weight", "in place")
    ),
    "tensor_replaced": Scenario(
        "tensor", _replace_weight, _restore_weight, ("Scaled.fc.weight", "replaced")
    ),
    "placement": Scenario(
        "placement",
        _cast_buffer_to_half,
        _restore_buffer,
        ("Scaled.gain", "torch.float32", "torch.float16"),
    ),
    "function_replaced": Scenario(
        "function",
        lambda m: setattr(type(m), "forward", _doubled_forward),
        lambda m: setattr(type(m), "forward", Scaled.__dict__["_original_forward"]),
        ("Scaled.forward",),
    ),
}
Scaled._original_forward = Scaled.forward


def _step(model: Scaled, x: torch.Tensor, reentrant: bool, change=None) -> list:
    model.zero_grad(set_to_none=True)
    x.grad = None
    out = checkpoint(model, x, use_reentrant=reentrant)
    if change is not None:
        change(model)
    out.sum().backward()
    return grads_of(model, x)


@pytest.fixture
def model_and_input():
    model = Scaled()
    x = torch.randn(3, 4, requires_grad=True)
    return model, x


@pytest.mark.parametrize("reentrant", [False, True], ids=["nonreentrant", "reentrant"])
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_silent_change_is_named(name: str, reentrant: bool, model_and_input) -> None:
    scenario = SCENARIOS[name]
    model, x = model_and_input
    honest = _step(model, x, reentrant)
    try:
        changed = _step(model, x, reentrant, scenario.change)
    finally:
        scenario.undo(model)
    assert not grads_equal(honest, changed), "plain torch should silently differ"

    ckptguard.enable()
    try:
        with pytest.raises(CheckpointMismatchError) as info:
            _step(model, x, reentrant, scenario.change)
    finally:
        scenario.undo(model)
    error = info.value
    assert error.kind == scenario.kind, str(error)
    assert "Scaled.forward" in error.region and "test_kinds.py" in error.region
    for text in scenario.names:
        assert text in str(error), (text, str(error))
    assert "how to fix" in str(error)
    # the same step without the change still passes and matches plain torch exactly
    assert grads_equal(_step(model, x, reentrant), honest)


def test_code_object_swapped(model_and_input) -> None:
    model, x = model_and_input
    original = Scaled.forward.__code__
    honest = _step(model, x, False)

    def swap(_: Scaled) -> None:
        Scaled.forward.__code__ = _doubled_forward.__code__

    try:
        assert not grads_equal(honest, _step(model, x, False, swap))
    finally:
        Scaled.forward.__code__ = original
    ckptguard.enable()
    try:
        with pytest.raises(CheckpointMismatchError) as info:
            _step(model, x, False, swap)
    finally:
        Scaled.forward.__code__ = original
    assert info.value.kind == "function"
    assert "_doubled_forward" in str(info.value)


@pytest.mark.parametrize("reentrant", [False, True], ids=["nonreentrant", "reentrant"])
def test_closure_rebound(reentrant: bool) -> None:
    x = torch.randn(5, requires_grad=True)

    def run(rebind: bool) -> torch.Tensor:
        factor = 2.0

        def region(t: torch.Tensor) -> torch.Tensor:
            return torch.sin(t * factor)

        x.grad = None
        out = checkpoint(region, x, use_reentrant=reentrant)
        if rebind:
            factor = 5.0  # noqa: F841  (read by region's recompute through the closure cell)
        out.sum().backward()
        return x.grad.clone()

    honest = run(False)
    assert not torch.equal(honest, run(True))
    ckptguard.enable()
    with pytest.raises(CheckpointMismatchError) as info:
        run(True)
    assert info.value.kind == "closure"
    assert "factor" in str(info.value) and "2.0" in str(info.value) and "5.0" in str(info.value)
    assert torch.equal(run(False), honest)


@pytest.mark.parametrize("reentrant", [False, True], ids=["nonreentrant", "reentrant"])
def test_unpreserved_rng_is_rng_device(reentrant: bool) -> None:
    dropout = nn.Dropout(0.5)
    x = torch.randn(64, requires_grad=True)

    def run() -> torch.Tensor:
        x.grad = None
        torch.manual_seed(0)
        out = checkpoint(dropout, x, use_reentrant=reentrant, preserve_rng_state=False)
        torch.rand(3)  # the RNG moves on before backward, as in any training step
        out.sum().backward()
        return x.grad.clone()

    with torch.random.fork_rng():
        torch.manual_seed(0)
        expected_mask = (dropout(x) != 0).float() * 2.0
    assert not torch.equal(run(), expected_mask), "plain torch replays a different mask"
    ckptguard.enable()
    with pytest.raises(CheckpointMismatchError) as info:
        run()
    assert info.value.kind == "rng_device"
    assert info.value.details["devices"] == ["cpu"]
    assert "preserve_rng_state=False" in str(info.value)
    # no argument makes torch restore a state it does not stash at all
    assert "how to fix: keep preserve_rng_state=True (the default), or draw" in str(info.value)
    assert "positional argument" not in str(info.value)


def test_warn_mode_warns_and_continues(model_and_input) -> None:
    model, x = model_and_input
    scenario = SCENARIOS["attribute"]
    ckptguard.enable(on_mismatch="warn")
    try:
        with pytest.warns(ckptguard.CheckpointMismatchWarning, match="Scaled.scale"):
            _step(model, x, False, scenario.change)
    finally:
        scenario.undo(model)


OFFSET = 0.0


def _logged(forward):
    """A functools.wraps decorator, as transformers puts on its layers' forwards."""

    @functools.wraps(forward)
    def wrapper(*args, **kwargs):
        return forward(*args, **kwargs)

    return wrapper


class Decorated(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    @_logged
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(self.fc(x) + OFFSET)


def test_decorated_forward_is_seen_through() -> None:
    global OFFSET
    model = Decorated()
    x = torch.randn(2, 4, requires_grad=True)
    ckptguard.enable()
    out = checkpoint(model, x, use_reentrant=False)
    OFFSET = 1.0
    try:
        with pytest.raises(CheckpointMismatchError) as info:
            out.sum().backward()
    finally:
        OFFSET = 0.0
    assert info.value.kind == "global" and "OFFSET" in str(info.value)
    line = Decorated.forward.__wrapped__.__code__.co_firstlineno
    assert info.value.region == f"Decorated.forward ({__file__}:{line})"


LINEAR = nn.Linear(4, 4)


def _user_region(x: torch.Tensor) -> torch.Tensor:
    return LINEAR(x) * 2


@pytest.mark.parametrize("reentrant", [False, True], ids=["nonreentrant", "reentrant"])
def test_a_function_region_outside_a_model_is_named_by_its_function(reentrant: bool) -> None:
    """No model on the stack: the user's function names the region, not the class of the
    first module it ran (``Linear (_user_region, ...)`` read as a Linear region)."""
    x = torch.randn(2, 4, requires_grad=True)
    with ckptguard.guard():
        out = checkpoint(_user_region, x, use_reentrant=reentrant)
        with torch.no_grad():
            LINEAR.weight.add_(1.0)
        with pytest.raises(CheckpointMismatchError) as info:
            out.sum().backward()
    line = _user_region.__code__.co_firstlineno
    assert info.value.region == f"_user_region ({__file__}:{line})"
    assert info.value.details["name"] == "Linear.weight"


def _tanh(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x)


_ORIGINAL_TANH = _tanh


class Table:
    def __len__(self) -> int:
        return 1


class Repeated(nn.Module):
    """An int attribute (read by value), an object attribute and a global function (both read
    by identity)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 4)
        self.repeats = 2
        self.table = Table()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.repeats):
            x = _tanh(self.fc(x))
        return x * len(self.table)


def _rebind_activation(_: Repeated) -> None:
    globals()["_tanh"] = torch.sigmoid


@pytest.mark.parametrize(
    ("change", "what_changed", "forward_saw", "now"),
    [
        (
            lambda m: setattr(m, "repeats", 3),
            "Repeated.repeats (read by Repeated's code) changed",
            "2",
            "3",
        ),
        (
            lambda m: setattr(m, "table", ["k"]),
            "Repeated.table (read by Repeated's code) now refers to another object",
            "an object the guard knows by identity only (it keeps no reference to it)",
            "['k']",
        ),
        (
            _rebind_activation,
            "_tanh (global of test_kinds, read by Repeated.forward "
            f"({__file__}:{Repeated.forward.__code__.co_firstlineno})) "
            "now refers to another object",
            f"_tanh ({__file__}:{_tanh.__code__.co_firstlineno})",
            "built-in torch.sigmoid",
        ),
        (
            lambda m: m.fc.weight.detach().add_(1),
            "Repeated.fc.weight (parameter or buffer of Linear) was modified in place (version "
            "counter 1 -> 2, e.g. an optimizer step or a .copy_/.add_)",
            "tensor torch.float32 (version 1)",
            "tensor (4, 4) torch.float32 on cpu (version 2)",
        ),
    ],
    ids=["int_by_value", "object_by_identity", "global_function", "tensor"],
)
def test_what_changed_reads_as_one_sentence(change, what_changed, forward_saw, now) -> None:
    """Values read by identity are described as what they are, never by address (an int
    attribute read by value is not an object id), a tensor the module holds now by shape,
    dtype, device and version, and each change is a predicate of its own ("was ..." or
    "now ...")."""
    model = Repeated()
    x = torch.randn(3, 4, requires_grad=True)
    ckptguard.enable()
    try:
        with pytest.raises(CheckpointMismatchError) as info:
            checkpoint(model, x, use_reentrant=False)
            out = checkpoint(model, x, use_reentrant=False)
            change(model)
            out.sum().backward()
    finally:
        globals()["_tanh"] = _ORIGINAL_TANH
    lines = str(info.value).splitlines()
    assert lines[1] == f"  what changed: {what_changed}", lines[1]
    assert info.value.details["old"] == forward_saw, info.value.details
    assert info.value.details["new"] == now, info.value.details


class WithScripted(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inner = torch.jit.script(nn.Sequential(nn.Linear(4, 4), nn.Tanh()))
        self.out = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.inner(x))


@pytest.mark.filterwarnings("error::ckptguard.CheckpointGuardWarning")
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_torchscript_submodules_are_read_through_their_tensors() -> None:
    """A TorchScript module keeps its state in C++ (no Python ``__dict__`` tables, no Python
    code to read): its plan is its training flag and its tensors by name. Reentrant only:
    torch's non-reentrant early stop cannot cross the TorchScript interpreter, plain torch
    fails there."""
    x = torch.randn(3, 4, requires_grad=True)
    plain = WithScripted()
    honest = _step(plain, x, True)
    model = WithScripted()
    ckptguard.enable()
    assert grads_equal(_step(model, x, True), honest)

    def bump(module: WithScripted) -> None:
        with torch.no_grad():
            module.inner[0].weight.add_(1.0)

    with pytest.raises(CheckpointMismatchError) as info:
        _step(model, x, True, bump)
    assert info.value.kind == "tensor"
    assert info.value.details["name"] == "WithScripted.inner['0.weight']"


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_a_torchscript_region_is_named_by_its_original_class() -> None:
    scripted = torch.jit.script(nn.Sequential(nn.Linear(4, 4), nn.Tanh()))
    x = torch.randn(3, 4, requires_grad=True)
    with ckptguard.guard():
        out = checkpoint(scripted, x, use_reentrant=True)
        with torch.no_grad():
            scripted[0].weight.add_(1.0)
        with pytest.raises(CheckpointMismatchError) as info:
            out.sum().backward()
    assert info.value.region == "Sequential.forward (TorchScript)"
