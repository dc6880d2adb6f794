"""The edges of what the guard works out once and reuses (issue 21): each shortcut must leave
every change between forward and backward caught and every clean step silent.

- A region's callable is taken apart once per structure (the partial's function, the module
  bound into it, the closure cells its functions hold): a cell rebound later leads the guard
  to the functions it now holds.
- In a backward pass, what several regions share (torch settings, global hooks, the functions
  their code runs, with their globals, closures and defaults) is read at the pass's first
  recompute and reused by its later ones; each region's modules (their attributes, children,
  hooks, training flag, tensors, the objects their attribute chains reach, a shared config
  among them) are read before every recompute. So a change made between forward and
  backward is seen by every region of the pass, a write that bypasses ``__setattr__`` or a
  tensor's ``.data`` is seen, a config object changed during the pass is seen by the regions
  recomputed after it, and a region whose own code writes shared state makes the pass read it
  again (no alarm that a full read would not give).
- A module region's reader is found before its forward (for the modules whose state the
  forward may update) and read through after it, its modules dereferenced and its shape
  checked then: a child replaced during the forward is what the capture reads.
- The attribute chains a region's function reads from its arguments are kept with the code
  they were worked out from: a code swapped since is worked out again.
"""

from __future__ import annotations

import functools
import warnings

import pytest
import torch
import torch.nn as nn
from conftest import grads_of, silently_wrong_then_named
from torch.utils.checkpoint import checkpoint

import ckptguard

GAIN_A = 1.0
GAIN_B = 1.0


def _scaled_by_a(self, x: torch.Tensor) -> torch.Tensor:
    return torch.sin(self.fc(x) * GAIN_A)


def _scaled_by_b(self, x: torch.Tensor) -> torch.Tensor:
    return torch.sin(self.fc(x) * GAIN_B)


def _swappable(func):
    """A decorator whose wrapper calls the function its closure cell holds now."""

    def forward(self, x):
        return func(self, x)

    def swap(new) -> None:
        nonlocal func
        func = new

    forward.swap = swap
    return forward


class Swappable(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 4)

    forward = _swappable(_scaled_by_a)


def test_a_closure_cell_rebound_after_the_structure_was_cached() -> None:
    """transformers' form, ``partial(Layer.forward, layer)``: its structure is cached at the
    first step; then the decorator's cell is rebound to a function reading another global,
    and that global changes between forward and backward."""
    layer = Swappable()
    x = torch.randn(3, 4, requires_grad=True)

    def step(change):
        layer.zero_grad(set_to_none=True)
        x.grad = None
        out = checkpoint(functools.partial(Swappable.forward, layer), x, use_reentrant=False)
        if change is not None:
            change()
        out.sum().backward()
        return grads_of(layer, x)

    def rebind(value: float):
        def apply() -> None:
            global GAIN_B
            GAIN_B = value

        return apply

    with ckptguard.guard():
        step(None)  # the structure, its functions and its reader are worked out
    Swappable.forward.swap(_scaled_by_b)
    try:
        silently_wrong_then_named(step, rebind(3.0), rebind(1.0), "global", "GAIN_B")
    finally:
        Swappable.forward.swap(_scaled_by_a)


# ------------------------------------------------- what the regions of one pass share

SCALE = 1.0
TICKS = [0]


class Config:
    gain = 1.0

    def __init__(self) -> None:
        self.gain = 1.0


def _scaled(x: torch.Tensor) -> torch.Tensor:
    return x * SCALE


class Layer(nn.Module):
    """The layers of a model: the same code, the same helper and its global, one config."""

    def __init__(self, config: Config, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.fc = nn.Linear(4, 4)
        self.config = config
        self.scale = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(_scaled(self.fc(x)) * self.config.gain * self.scale)


class Model(nn.Module):
    def __init__(self, depth: int = 3) -> None:
        super().__init__()
        config = Config()
        self.layers = nn.ModuleList(Layer(config, seed) for seed in range(depth))

    def forward(self, x: torch.Tensor, between=None) -> torch.Tensor:
        for index, layer in enumerate(self.layers):
            x = checkpoint(layer, x, use_reentrant=False)
            if between is not None:
                between(index, x)
        return x


def _warned_regions(model: Model, change, between=None) -> list[str]:
    """Runs a guarded step in warn mode with ``change`` between forward and backward; the
    regions named by the mismatch warnings, in the order backward recomputed them."""
    x = torch.randn(3, 4, requires_grad=True)
    ckptguard.enable(on_mismatch="warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = model(x, between)
            change()
            out.sum().backward()
    finally:
        ckptguard.disable()
    return [
        str(w.message).split("checkpointed region ")[1].split(" (")[0]
        for w in caught
        if issubclass(w.category, ckptguard.CheckpointMismatchWarning)
    ]


def _set_scale(value: float):
    def apply() -> None:
        global SCALE
        SCALE = value

    return apply


def test_a_global_rebound_between_forward_and_backward_is_seen_by_every_region() -> None:
    model = Model()
    try:
        assert _warned_regions(model, _set_scale(2.0)) == ["layers.2", "layers.1", "layers.0"]
    finally:
        _set_scale(1.0)()


def test_a_setting_changed_between_forward_and_backward_is_seen_by_every_region(
    monkeypatch,
) -> None:
    """Every region's recompute is judged against the setting (the 4x4 Linear layers compute
    the same under either precision, so none is named: see test_settings.py)."""
    from ckptguard import _settings

    judged: list[list] = []
    made = _settings.SettingsWatch.__init__

    def recording(self, changes) -> None:
        judged.append(changes)
        made(self, changes)

    monkeypatch.setattr(_settings.SettingsWatch, "__init__", recording)
    model = Model()
    before = torch.get_float32_matmul_precision()
    try:
        changed = _warned_regions(model, lambda: torch.set_float32_matmul_precision("medium"))
    finally:
        torch.set_float32_matmul_precision(before)
    name = "torch.get_float32_matmul_precision()"
    assert judged == [[(name, before, "medium")]] * 3
    assert changed == []


def test_a_shared_config_changed_after_the_first_recompute_is_seen_by_the_regions_after() -> None:
    """The config all layers read is changed by a hook that backward runs after the last
    layer's recompute (a hook on that layer's input): the layers recomputed after it see it."""
    model = Model()
    config = model.layers[0].config

    def between(index: int, hidden: torch.Tensor) -> None:
        if index == 1:  # the input of layers.2: its gradient arrives after that recompute
            hidden.register_hook(lambda grad: setattr(config, "gain", 3.0))

    assert _warned_regions(model, lambda: None, between) == ["layers.1", "layers.0"]


@pytest.mark.parametrize(
    "bypass",
    [
        "setattr",
        "__dict__",
        "object.__setattr__",
        "_modules",
        "_parameters",
        "register_forward_hook",
        "_forward_hooks",
        "data",
        "requires_grad_",
    ],
)
def test_writes_that_bypass_setattr_are_seen(bypass: str) -> None:
    """Every way a module's state is written, through ``nn.Module``'s methods or past them:
    the guard reads the modules themselves (issue 28: no write is observed instead of read,
    since these paths would go unseen; docs/guard.md, "What is read")."""
    model = Model(depth=1)
    layer = model.layers[0]
    fc, weight = layer.fc, layer.fc.weight
    replacement = nn.Linear(4, 4)
    change = {
        "setattr": lambda: setattr(layer, "scale", 0.5),
        "__dict__": lambda: layer.__dict__.__setitem__("scale", 0.5),
        "object.__setattr__": lambda: object.__setattr__(layer, "scale", 0.5),
        "_modules": lambda: layer._modules.__setitem__("fc", replacement),
        "_parameters": lambda: fc._parameters.__setitem__("weight", nn.Parameter(weight * 2)),
        "register_forward_hook": lambda: fc.register_forward_hook(lambda m, i, o: o * 2),
        "_forward_hooks": lambda: fc._forward_hooks.__setitem__(-1, lambda m, i, o: o * 2),
        "data": lambda: setattr(weight, "data", weight.data * 2),
        "requires_grad_": lambda: weight.requires_grad_(False),
    }[bypass]
    if bypass == "requires_grad_":  # the recompute saves fewer tensors: torch raises after
        ckptguard.enable()
        try:
            out = model(torch.randn(3, 4, requires_grad=True))
            change()
            with pytest.raises(ckptguard.CheckpointMismatchError) as info:
                out.sum().backward()
        finally:
            ckptguard.disable()
        assert info.value.kind == "tensor" and "requires_grad" in str(info.value)
        return
    assert _warned_regions(model, change) == ["layers.0"]


def test_a_write_through_data_in_place_is_seen_in_strict_mode() -> None:
    """``p.data.mul_`` moves no version counter: strict mode compares the saved tensors."""
    model = Model(depth=1)
    weight = model.layers[0].fc.weight
    x = torch.randn(3, 4, requires_grad=True)
    ckptguard.enable(strict=True)
    try:
        out = model(x)
        weight.data.mul_(2)
        with pytest.raises(ckptguard.CheckpointMismatchError) as info:
            out.sum().backward()
    finally:
        ckptguard.disable()
    assert info.value.kind == "values"


def _ticking(x: torch.Tensor) -> torch.Tensor:
    TICKS[0] += 1  # a container the function's own code mutates: shared, and written
    return x * (1.0 + TICKS[0] % 2)


class Ticking(nn.Module):
    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(_ticking(self.fc(x)))


def test_a_region_writing_shared_state_makes_the_pass_read_it_again() -> None:
    """Each layer's recompute advances the counter all layers read (their gradients do
    change): the region recomputed next is told what its recompute will read now, as a full
    read tells it, not what the pass read before the previous recompute."""
    layers = nn.ModuleList(Ticking(seed) for seed in range(3))
    x = torch.randn(3, 4, requires_grad=True)
    TICKS[0] = 0
    with ckptguard.guard():
        hidden = x
        for layer in layers:
            hidden = checkpoint(layer, hidden, use_reentrant=False)
        with pytest.raises(ckptguard.CheckpointMismatchError) as info:
            hidden.sum().backward()  # the last layer's recompute advances it from 3 to 4
    error = str(info.value)
    assert "TICKS[0]" in error
    assert "forward saw:  2" in error and "now:          4" in error


def test_in_place_writes_are_found_by_the_container_written() -> None:
    """A decorator's ``kwargs[new_name] = kwargs.pop(old_name)`` (transformers'
    ``deprecate_kwarg`` on every layer's forward) writes a local dict, not the closure
    variables naming its keys: such a function leaves the pass's shared read in place.
    Where the key is not one load the names on the line count, as before."""
    from ckptguard import _readplan

    def make():
        calls, old_name, new_name = [0], "past_key_value", "past_key_values"

        def written(kwargs, x):
            kwargs[new_name] = kwargs.pop(old_name)
            calls[0] += 1
            CONFIG.table["k"] = 2
            del CACHE[x]
            TABLE[x + 1] = 3  # the key is an expression: TABLE and x's line count
            local = {}
            local[KEY] = 1

        return written

    assert _readplan.code_reads(make().__code__).mutated == {"calls", "CONFIG", "CACHE", "TABLE"}


CONFIG = CACHE = TABLE = KEY = None


def test_the_shared_part_is_read_once_per_backward_pass(monkeypatch) -> None:
    """Three layers running the same code: one read of what they share per backward pass (and
    one per region at its forward, with its modules); their modules are read for each
    recompute."""
    from ckptguard import _reader

    counts = {"shared": 0, "modules": 0}
    made = _reader.RegionReader.__init__

    def counting(self, *args, **kwargs):
        made(self, *args, **kwargs)
        shared, modules = self.read_shared, self.read_modules

        def read_shared(*a):
            counts["shared"] += 1
            return shared(*a)

        def read_modules(*a):
            counts["modules"] += 1
            return modules(*a)

        self.read_shared, self.read_modules = read_shared, read_modules

    monkeypatch.setattr(_reader.RegionReader, "__init__", counting)
    model = Model()
    x = torch.randn(3, 4, requires_grad=True)
    with ckptguard.guard():
        for _ in range(2):
            model(x).sum().backward()
    forwards = 6  # two steps of three regions
    assert counts == {"shared": 2 + forwards, "modules": 6 + forwards}


# ------------------------------------------- what a region's structure remembers: its reader


def _helper(x: torch.Tensor) -> torch.Tensor:
    return x * GAIN_A


def _helper_reading_b(x: torch.Tensor) -> torch.Tensor:
    return x * GAIN_B


class Helped(nn.Module):
    """A layer whose forward calls a helper function (a callee its reader follows)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(_helper(self.fc(x)))


def _set_gain_b(value: float):
    def apply() -> None:
        global GAIN_B
        GAIN_B = value

    return apply


def _layer_step(layer: nn.Module, callable_of, reentrant: bool = False):
    x = torch.randn(3, 4, requires_grad=True, generator=torch.Generator().manual_seed(1))

    def step(change):
        layer.zero_grad(set_to_none=True)
        x.grad = None
        out = checkpoint(callable_of(layer), x, use_reentrant=reentrant)
        if change is not None:
            change()
        out.sum().backward()
        return grads_of(layer, x)

    return step


@pytest.mark.parametrize(
    "callable_of",
    [lambda layer: layer, lambda layer: functools.partial(Helped.forward, layer)],
    ids=["module", "partial"],
)
def test_a_callee_s_code_swapped_after_the_reader_was_built(callable_of) -> None:
    """The reader follows the forward into ``_helper``; then ``_helper.__code__`` is swapped for
    code reading another global (the function object, so what the plan followed, stays the
    same), and that global changes between forward and backward."""
    layer = Helped()
    step = _layer_step(layer, callable_of)
    with ckptguard.guard():
        step(None)  # the structure and its reader are worked out
    original = _helper.__code__
    _helper.__code__ = _helper_reading_b.__code__
    try:
        silently_wrong_then_named(step, _set_gain_b(3.0), _set_gain_b(1.0), "global", "GAIN_B")
    finally:
        _helper.__code__ = original


def test_a_decorated_function_s_code_swapped_after_the_reader_was_built() -> None:
    """transformers' form on a decorated forward: the region's own functions are the wrapper
    and the function its cell holds. The latter's code is swapped after the first step; the
    module's forward (the wrapper) keeps its code, so only the functions' part can show it."""
    layer = Swappable()
    step = _layer_step(layer, lambda m: functools.partial(Swappable.forward, m))
    with ckptguard.guard():
        step(None)
    original = _scaled_by_a.__code__
    _scaled_by_a.__code__ = _scaled_by_b.__code__
    try:
        silently_wrong_then_named(step, _set_gain_b(3.0), _set_gain_b(1.0), "global", "GAIN_B")
    finally:
        _scaled_by_a.__code__ = original


def test_a_structure_run_both_ways_keeps_a_reader_for_each() -> None:
    """One layer checkpointed non-reentrant, then reentrant: a reentrant recompute runs the
    region module's own forward hooks (a non-reentrant one stops inside its forward, so its
    reader leaves them out), so a hook added between forward and backward must be named."""
    layer = Helped()
    with ckptguard.guard():
        _layer_step(layer, lambda m: m)(None)  # the non-reentrant reader, remembered
    step = _layer_step(layer, lambda m: m, reentrant=True)
    handles = []

    def add_hook() -> None:
        handles.append(layer.register_forward_hook(lambda m, i, out: out * 2))

    def remove_hooks() -> None:
        while handles:
            handles.pop().remove()

    error = silently_wrong_then_named(step, add_hook, remove_hooks, "hook", "_forward_hooks")
    assert "Helped" in str(error)


def test_a_child_replaced_after_the_reader_was_built() -> None:
    """The first step's reader reads ``fc``; then ``fc`` is replaced (the old one kept alive,
    so its weak reference still answers) and the new one's weight changes in place between
    forward and backward."""
    layer = Helped()
    step = _layer_step(layer, lambda m: functools.partial(Helped.forward, m))
    with ckptguard.guard():
        step(None)
    old = layer.fc
    torch.manual_seed(5)
    layer.fc = nn.Linear(4, 4)
    weight = layer.fc.weight

    def scale(factor: float):
        def apply() -> None:
            with torch.no_grad():
                weight.mul_(factor)

        return apply

    silently_wrong_then_named(step, scale(2.0), scale(0.5), "tensor", "fc.weight")
    assert old.weight is not weight


class TwoLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = nn.Linear(4, 4)
        self.fc2 = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(self.fc2(torch.sin(self.fc1(x))))


def test_a_child_replaced_during_the_forward_is_what_the_capture_reads() -> None:
    """A module region's reader is found before its forward (for the modules whose state the
    forward may update) and read through after it: a child replaced during the forward (by a
    hook of another child, as each step begins with the original one) is what the capture
    reads, so the new child's weight changed between forward and backward is named."""
    layer = TwoLinear()
    original = layer.fc2
    torch.manual_seed(1)
    replacement = nn.Linear(4, 4)

    def swap(module, inputs, output) -> None:
        layer._modules["fc2"] = replacement  # a plain dict write, inside the region

    layer.fc1.register_forward_hook(swap)
    x = torch.randn(3, 4, requires_grad=True)

    def step(change):
        layer._modules["fc2"] = original
        for module in (layer, replacement):
            module.zero_grad(set_to_none=True)
        x.grad = None
        out = checkpoint(layer, x, use_reentrant=False)
        if change is not None:
            change()
        out.sum().backward()
        return grads_of(replacement, x)

    with ckptguard.guard():
        step(None)  # the reader of the tree with the original child, remembered

    def scale(factor: float):
        def apply() -> None:
            with torch.no_grad():
                replacement.weight.mul_(factor)

        return apply

    silently_wrong_then_named(step, scale(2.0), scale(0.5), "tensor", "fc2.weight")


def _region_reading_scale(x: torch.Tensor, settings) -> torch.Tensor:
    return torch.sin(x * settings.scale)


def _region_reading_gain(x: torch.Tensor, settings) -> torch.Tensor:
    return torch.sin(x * settings.gain)


def test_a_region_function_s_code_swapped_after_its_argument_chains_were_cached() -> None:
    """The attribute chains a region's function reads from its arguments are worked out once
    per structure and kept with the code they came from: after the first step the function's
    code is swapped for code reading another attribute of the same argument, and that
    attribute changes between forward and backward."""
    settings = Config()
    settings.scale = 1.0
    region = functools.partial(_region_reading_scale, settings=settings)
    x = torch.randn(5, requires_grad=True)

    def step(change):
        x.grad = None
        out = checkpoint(region, x, use_reentrant=False)
        if change is not None:
            change()
        out.sum().backward()
        return [x.grad.clone()]

    with ckptguard.guard():
        step(None)  # the structure, with the chains of the code reading settings.scale
    original = _region_reading_scale.__code__
    _region_reading_scale.__code__ = _region_reading_gain.__code__
    try:
        silently_wrong_then_named(
            step,
            lambda: setattr(settings, "gain", 3.0),
            lambda: setattr(settings, "gain", 1.0),
            "attribute",
            "settings.gain",
        )
    finally:
        _region_reading_scale.__code__ = original
