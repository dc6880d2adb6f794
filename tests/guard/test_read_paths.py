"""Reads that do not go through an instance ``__dict__`` (issue 38), and differences the guard
cannot describe.

Each read path is a module whose forward reads a value one way: a ``@dataclass(slots=True)``
field, a class attribute through ``self.__class__`` and ``type(self)``, an attribute of a
``threading.local()`` global, a name a forwarding ``__getattr__`` hands to the module it wraps
(the PEFT / accelerate pattern), a child module's class, a config chain four attributes deep.
For each, in both checkpoint variants and in default and strict mode: plain torch computes
different gradients when the value changes between forward and backward (``torch.equal``
decides), the guard names the change, and the unchanged twin is silent with gradients equal to
an unguarded run's.

Then: a change the guard finds on a module whose probes raise (``__getattr__`` raising
``KeyError`` or ``RuntimeError``, a property that raises) is still a
``CheckpointMismatchError``, and one whose description itself fails is raised all the same,
naming the fingerprint entry, with "could not describe it".
"""

from __future__ import annotations

import dataclasses
import threading
import warnings
from collections.abc import Callable

import pytest
import torch
import torch.nn as nn
from conftest import grads_equal
from torch.utils.checkpoint import checkpoint

import ckptguard
from ckptguard import _explain

VARIANTS = pytest.mark.parametrize("reentrant", [False, True], ids=["nonreentrant", "reentrant"])
MODES = pytest.mark.parametrize("strict", [False, True], ids=["default", "strict"])


def _grads(module: nn.Module, x: torch.Tensor) -> list:
    return [p.grad.clone() for p in module.parameters()] + [x.grad.clone()]


def _step(module: nn.Module, reentrant: bool, change: Callable[[], None] | None) -> list:
    """One checkpointed step; ``change`` runs between its forward and its backward."""
    for parameter in module.parameters():  # not zero_grad(): a hostile __getattr__ breaks it
        parameter.grad = None
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1), requires_grad=True)
    out = checkpoint(module, x, use_reentrant=reentrant)
    if change is not None:
        change()
    out.square().sum().backward()
    return _grads(module, x)


def _named_and_twin_silent(
    make: Callable[[], nn.Module],
    change: Callable[[nn.Module], None],
    undo: Callable[[nn.Module], None],
    reentrant: bool,
    strict: bool,
    kind: str,
    *texts: str,
) -> ckptguard.CheckpointMismatchError:
    """Plain torch differs silently; the guard names the change; the twin stays silent."""
    module = make()
    honest = _step(module, reentrant, None)
    try:
        changed = _step(module, reentrant, lambda: change(module))
    finally:
        undo(module)
    assert not grads_equal(honest, changed), "plain torch should compute other gradients"
    with ckptguard.guard(strict=strict), pytest.raises(ckptguard.CheckpointMismatchError) as info:
        try:
            _step(module, reentrant, lambda: change(module))
        finally:
            undo(module)
    error = info.value
    assert error.kind == kind, str(error)
    for text in texts:
        assert text in str(error), (text, str(error))
    with warnings.catch_warnings():
        warnings.simplefilter("error", ckptguard.CheckpointMismatchWarning)
        warnings.simplefilter("error", ckptguard.CheckpointGuardWarning)
        with ckptguard.guard(strict=strict):
            twin = _step(module, reentrant, None)
    assert grads_equal(twin, honest)
    return error


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 4)


@dataclasses.dataclass(slots=True)
class SlottedConfig:
    scale: float = 1.0


class ReadsSlots(_Block):
    def __init__(self) -> None:
        super().__init__()
        self.config = SlottedConfig()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(self.fc(x) * self.config.scale)


class ReadsClassThroughDunder(_Block):
    SCALE = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(self.fc(x) * self.__class__.SCALE)


class ReadsClassThroughType(_Block):
    SCALE = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(self.fc(x) * type(self).SCALE)


PER_THREAD = threading.local()
PER_THREAD.scale = 1.0


class ReadsThreadLocal(_Block):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(self.fc(x) * PER_THREAD.scale)


class Wrapped(_Block):
    def __init__(self) -> None:
        super().__init__()
        self.scale = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


class Forwarding(nn.Module):
    """Hands names it lacks to the module it wraps, as PEFT's and accelerate's wrappers do."""

    def __init__(self) -> None:
        super().__init__()
        self.model = Wrapped()

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "model":
                raise
            return getattr(self.model, name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(self.model(x) * self.scale)


class WithActivation(_Block):
    def __init__(self) -> None:
        super().__init__()
        self.act = nn.Tanh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x))


class _Level:
    def __init__(self, **values: object) -> None:
        self.__dict__.update(values)


class ReadsDeepChain(_Block):
    def __init__(self) -> None:
        super().__init__()
        self.config = _Level(model=_Level(attention=_Level(rope=_Level(scale=1.0))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(self.fc(x) * self.config.model.attention.rope.scale)


def _set(path: str, value: object) -> Callable[[nn.Module], None]:
    """A change (or its undo) of the attribute at ``path`` from the module (``"."`` steps)."""

    def apply(module: nn.Module) -> None:
        *steps, name = path.split(".")
        target: object = module
        for step in steps:
            target = getattr(target, step)
        setattr(target, name, value)

    return apply


def _set_class(cls: type, value: float) -> Callable[[nn.Module], None]:
    return lambda module: setattr(cls, "SCALE", value)


def _set_thread_local(value: float) -> Callable[[nn.Module], None]:
    return lambda module: setattr(PER_THREAD, "scale", value)


# name -> (module, change, undo, kind, texts the error names)
READ_PATHS = {
    "slots": (
        ReadsSlots,
        _set("config.scale", 3.0),
        _set("config.scale", 1.0),
        "attribute",
        ["ReadsSlots.config.scale", "3.0"],
    ),
    "dunder_class": (
        ReadsClassThroughDunder,
        _set_class(ReadsClassThroughDunder, 3.0),
        _set_class(ReadsClassThroughDunder, 1.0),
        "attribute",
        ["ReadsClassThroughDunder.__class__.SCALE"],
    ),
    "type_of_self": (
        ReadsClassThroughType,
        _set_class(ReadsClassThroughType, 3.0),
        _set_class(ReadsClassThroughType, 1.0),
        "attribute",
        ["ReadsClassThroughType.__class__.SCALE"],
    ),
    "thread_local": (
        ReadsThreadLocal,
        _set_thread_local(3.0),
        _set_thread_local(1.0),
        "global",
        ["PER_THREAD.scale"],
    ),
    "forwarding_getattr": (
        Forwarding,
        _set("model.scale", 3.0),
        _set("model.scale", 1.0),
        "attribute",
        ["Forwarding.model.scale"],
    ),
    "child_class": (
        WithActivation,
        _set("act.__class__", nn.Sigmoid),
        _set("act.__class__", nn.Tanh),
        "function",
        ["WithActivation.act.__class__", "Tanh", "Sigmoid"],
    ),
    "deep_chain": (
        ReadsDeepChain,
        _set("config.model.attention.rope.scale", 3.0),
        _set("config.model.attention.rope.scale", 1.0),
        "attribute",
        ["ReadsDeepChain.config.model.attention.rope.scale"],
    ),
}


@VARIANTS
@MODES
@pytest.mark.parametrize("path", list(READ_PATHS))
def test_read_path_is_seen(path: str, reentrant: bool, strict: bool) -> None:
    make, change, undo, kind, texts = READ_PATHS[path]
    _named_and_twin_silent(make, change, undo, reentrant, strict, kind, *texts)


def test_a_thread_local_is_read_for_the_thread_that_recomputes() -> None:
    """Each thread sees its own value: a region run on another thread with an unchanged value
    there is silent, while the main thread's value changes."""
    module = ReadsThreadLocal()
    results: list = []

    def run() -> None:
        PER_THREAD.scale = 1.0
        with ckptguard.guard():
            results.append(_step(module, False, None))

    PER_THREAD.scale = 5.0
    try:
        worker = threading.Thread(target=run)
        worker.start()
        worker.join()
    finally:
        PER_THREAD.scale = 1.0
    assert len(results) == 1
    assert grads_equal(results[0], _step(module, False, None))


# ------------------------------------------------- probes that raise: the verdict stands


class KeyErrorOnUnknownNames(_Block):
    """Its ``__getattr__`` raises ``KeyError`` (not ``AttributeError``) for names it lacks, so
    ``getattr(module, name, default)`` and ``hasattr`` raise instead of answering."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = 1.0

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            raise KeyError(name) from None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(self.fc(x) * self.scale)


class RuntimeErrorOnUnknownNames(KeyErrorOnUnknownNames):
    def __getattr__(self, name: str):
        try:
            return nn.Module.__getattr__(self, name)
        except AttributeError:
            raise RuntimeError(f"no {name} here") from None


class RaisingProperty(KeyErrorOnUnknownNames):
    """A property that raises, beside the attribute the region reads."""

    @property
    def broken(self) -> float:
        raise RuntimeError("a property that raises")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(self.fc(x) * self.scale)


@VARIANTS
@MODES
@pytest.mark.parametrize(
    "make", [KeyErrorOnUnknownNames, RuntimeErrorOnUnknownNames, RaisingProperty]
)
def test_a_change_on_a_module_whose_probes_raise_is_named(
    make: type, reentrant: bool, strict: bool
) -> None:
    error = _named_and_twin_silent(
        make,
        _set("scale", 3.0),
        _set("scale", 1.0),
        reentrant,
        strict,
        "attribute",
        f"{make.__name__}.scale",
    )
    assert "[internal]" not in str(error)


def _fail(*args: object, **kwargs: object) -> None:
    raise KeyError("describing failed")


@VARIANTS
@MODES
@pytest.mark.parametrize("failing", ["_describe_value", "_read_difference", "mismatch_error"])
def test_a_difference_that_cannot_be_described_is_raised_all_the_same(
    monkeypatch, failing: str, reentrant: bool, strict: bool
) -> None:
    """Describing the change fails (here made to, at three depths): the verdict stands, a
    ``CheckpointMismatchError`` naming the region and the fingerprint entry, never an
    ``[internal]`` warning after which training goes on with wrong gradients."""
    module = KeyErrorOnUnknownNames()
    monkeypatch.setattr(_explain, failing, _fail)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with (
            ckptguard.guard(strict=strict),
            pytest.raises(ckptguard.CheckpointMismatchError) as info,
        ):
            try:
                _step(module, reentrant, lambda: setattr(module, "scale", 3.0))
            finally:
                module.scale = 1.0
    message = str(info.value)
    assert info.value.kind == "attribute"
    assert "KeyErrorOnUnknownNames.forward" in info.value.region
    assert "KeyErrorOnUnknownNames.scale" in message
    assert "could not describe it: KeyError: 'describing failed'" in message
    assert not [w for w in caught if "[internal]" in str(w.message)]
    with warnings.catch_warnings(), ckptguard.guard(strict=strict):  # the twin: silent
        warnings.simplefilter("error", ckptguard.CheckpointGuardWarning)
        assert grads_equal(
            _step(module, reentrant, None), _step(KeyErrorOnUnknownNames(), reentrant, None)
        )


@VARIANTS
def test_a_strict_verdict_that_cannot_be_described_is_raised_all_the_same(
    monkeypatch, reentrant: bool
) -> None:
    """Strict mode measured a difference (a value the fingerprint cannot see: a tensor in a
    plain object read through a local variable); naming the first op that diverged fails."""
    holder = type("Holder", (), {})()
    holder.gain = torch.ones(4)

    def region(x: torch.Tensor) -> torch.Tensor:
        found = holder
        return torch.sin(x * found.gain)

    def step(change: Callable[[], None] | None) -> None:
        x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1), requires_grad=True)
        out = checkpoint(region, x, use_reentrant=reentrant)
        if change is not None:
            change()
        out.sum().backward()

    from ckptguard import _strict

    monkeypatch.setattr(_strict.StrictRecompute, "first_diverging_op", _fail)
    with ckptguard.guard(strict=True), pytest.raises(ckptguard.CheckpointMismatchError) as info:
        step(lambda: setattr(holder, "gain", torch.full((4,), 3.0)))
    assert info.value.kind == "values"
    assert "could not describe it: KeyError: 'describing failed'" in str(info.value)
