"""Changes between forward and backward that plain torch lets through with wrong gradients:
each is named by the guard in default mode (issue 9, "silent while gradients are wrong").

Every test checks three things through ``silently_wrong_then_named``: plain torch's gradients
differ without an error, the guard raises the named kind, and an unchanged guarded step is
bit-identical to plain torch. Both checkpoint variants run where both apply.
"""

from __future__ import annotations

import contextlib
import functools
import os
import warnings

import pytest
import torch
import torch.nn as nn
from conftest import grads_equal, grads_of, silently_wrong_then_named
from guard_fixture_pkg import cfg, helpers
from guard_fixture_pkg.model import CrossModuleBlock
from torch.utils.checkpoint import checkpoint

import ckptguard

VARIANTS = pytest.mark.parametrize("reentrant", [False, True], ids=["nonreentrant", "reentrant"])


def _module_step(module: nn.Module, reentrant: bool, *extra, through_function: bool = False):
    """A step checkpointing ``module`` itself, or a function that calls it (a function
    region: the guard observes the modules it runs)."""
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1), requires_grad=True)
    region = (lambda *inputs: module(*inputs)) if through_function else module

    def step(change):
        module.zero_grad(set_to_none=True)
        x.grad = None
        out = checkpoint(region, x, *extra, use_reentrant=reentrant)
        if change is not None:
            change()
        out.sum().backward()
        return grads_of(module, x)

    return step


class Gained(nn.Module):
    """Reads a buffer in train() mode (the version check used to be skipped there)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 4)
        self.register_buffer("gain", torch.tensor([1.0, 2.0, 3.0, 4.0]))

    def forward(self, x):
        return torch.sin(self.fc(x) * self.gain)


@VARIANTS
def test_buffer_written_in_place_in_train_mode(reentrant: bool) -> None:
    module = Gained().train()
    error = silently_wrong_then_named(
        _module_step(module, reentrant),
        lambda: module.gain.mul_(2),
        lambda: module.gain.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0])),
        "tensor",
        "Gained.gain",
        "in place",
    )
    assert error.details["name"] == "Gained.gain"


def _keyword_region(x, *, scale):
    return torch.sin(x * scale)


def test_keyword_tensor_changed_in_place() -> None:
    x = torch.randn(5, requires_grad=True)
    scale = torch.full((5,), 2.0)

    def step(change):
        x.grad = None
        out = checkpoint(_keyword_region, x, scale=scale, use_reentrant=False)
        if change is not None:
            change()
        out.sum().backward()
        return [x.grad.clone()]

    silently_wrong_then_named(
        step, lambda: scale.mul_(3), lambda: scale.fill_(2.0), "tensor", "keyword argument scale"
    )


def _container_region(x, factors):
    return torch.sin(x * factors[0] + factors[1])


@VARIANTS
@pytest.mark.parametrize("how", ["in_place", "replaced"])
@pytest.mark.parametrize("container", ["list", "dict"])
def test_tensor_in_container_argument(reentrant: bool, how: str, container: str) -> None:
    x = torch.randn(5, requires_grad=True)
    factors: dict | list = [torch.full((5,), 2.0), torch.zeros(5)]
    if container == "dict":
        factors = dict(enumerate(factors))
    original = factors[0]

    def change():
        if how == "in_place":
            factors[0].mul_(3)
        else:
            factors[0] = torch.full((5,), 6.0)

    def undo():
        original.fill_(2.0)
        factors[0] = original

    def step(change):
        x.grad = None
        out = checkpoint(_container_region, x, factors, use_reentrant=reentrant)
        if change is not None:
            change()
        out.sum().backward()
        return [x.grad.clone()]

    expected = "in place" if how == "in_place" else "replaced"
    silently_wrong_then_named(step, change, undo, "tensor", "positional argument 1", expected)


class Parent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.child = nn.Linear(4, 4)

    def forward(self, x):
        return torch.sin(self.child(x))


@VARIANTS
def test_child_module_replaced(reentrant: bool) -> None:
    module = Parent()
    original = module.child
    replacement = nn.Linear(4, 4)
    silently_wrong_then_named(
        _module_step(module, reentrant),
        lambda: setattr(module, "child", replacement),
        lambda: setattr(module, "child", original),
        "attribute",
        "Parent.child",
        "replaced by another module",
    )


class LateAttribute(nn.Module):
    """Reads an attribute that only exists after the module's first call."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return torch.sin(self.fc(x) * getattr(self, "temperature", 1.0))


@VARIANTS
def test_attribute_added_after_first_call_then_changed(reentrant: bool) -> None:
    module = LateAttribute()
    step = _module_step(module, reentrant)
    step(None)  # the module's plan is built without the attribute
    module.temperature = 1.5
    silently_wrong_then_named(
        step,
        lambda: setattr(module, "temperature", 3.0),
        lambda: setattr(module, "temperature", 1.5),
        "attribute",
        "LateAttribute.temperature",
    )


def _doubling_hook(module, args, output):
    return output * 2


def _doubling_pre_hook(module, args):
    return (args[0] * 2,)


@VARIANTS
@pytest.mark.parametrize("where", ["module", "submodule", "global"])
@pytest.mark.parametrize("pre", [False, True], ids=["forward_hook", "pre_hook"])
def test_hook_registered_between_forward_and_backward(reentrant: bool, where: str, pre) -> None:
    module = Parent()
    handles = []
    global_registry = torch.nn.modules.module

    def change():
        if where == "global":
            register = (
                global_registry.register_module_forward_pre_hook
                if pre
                else global_registry.register_module_forward_hook
            )
            handles.append(register(_doubling_pre_hook if pre else _doubling_hook))
            return
        target = module if where == "module" else module.child
        if pre:
            handles.append(target.register_forward_pre_hook(_doubling_pre_hook))
        else:
            handles.append(target.register_forward_hook(_doubling_hook))

    def undo():
        while handles:
            handles.pop().remove()

    step = _module_step(module, reentrant)
    if where == "module" and not pre and not reentrant:
        # the non-reentrant recompute stops inside the forward and discards its output: a
        # forward hook on the region's own module never runs there; gradients stay right
        with ckptguard.guard():
            honest = step(None)
            try:
                assert grads_equal(step(change), honest)
            finally:
                undo()
        return
    dictionary = "_forward_pre_hooks" if pre else "_forward_hooks"
    name = {
        "module": f"Parent.{dictionary}",
        "submodule": f"Parent.child.{dictionary}",
        "global": f"torch.nn.modules.module._global{dictionary}",
    }
    silently_wrong_then_named(step, change, undo, "hook", name[where])


class Tables(nn.Module):
    """Reads tensors kept in a dict and in a list attribute."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 4)
        self.table = {"gain": torch.full((4,), 2.0)}
        self.shifts = [torch.zeros(4)]

    def forward(self, x):
        return torch.sin(self.fc(x) * self.table["gain"] + self.shifts[0])


@VARIANTS
@pytest.mark.parametrize("which", ["dict", "list"])
def test_dict_or_list_of_tensors_attribute(reentrant: bool, which: str) -> None:
    module = Tables()
    tensor = module.table["gain"] if which == "dict" else module.shifts[0]
    saved = tensor.clone()
    silently_wrong_then_named(
        _module_step(module, reentrant),
        lambda: tensor.add_(1.0),
        lambda: tensor.copy_(saved),
        "tensor",
        "Tables.table" if which == "dict" else "Tables.shifts",
    )


class Config:
    scale = 1.0

    def __init__(self) -> None:
        self.scale = 1.0


class Configured(nn.Module):
    """transformers style: reads ``self.config.scale``; and a class attribute, ``bias``."""

    bias = 0.0

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 4)
        self.config = Config()

    def forward(self, x):
        return torch.sin(self.fc(x) * self.config.scale + self.bias)


@VARIANTS
def test_attribute_of_config_object(reentrant: bool) -> None:
    module = Configured()
    silently_wrong_then_named(
        _module_step(module, reentrant),
        lambda: setattr(module.config, "scale", 2.0),
        lambda: setattr(module.config, "scale", 1.0),
        "attribute",
        "Configured.config.scale",
    )


@VARIANTS
def test_class_attribute(reentrant: bool) -> None:
    module = Configured()
    silently_wrong_then_named(
        _module_step(module, reentrant),
        lambda: setattr(Configured, "bias", 0.5),
        lambda: setattr(Configured, "bias", 0.0),
        "attribute",
        "Configured.bias",
    )


def _partial_region(x, settings):
    return torch.sin(x * settings.scale)


@VARIANTS
def test_attribute_of_object_bound_into_partial(reentrant: bool) -> None:
    settings = Config()
    region = functools.partial(_partial_region, settings=settings)
    x = torch.randn(5, requires_grad=True)

    def step(change):
        x.grad = None
        out = checkpoint(region, x, use_reentrant=reentrant)
        if change is not None:
            change()
        out.sum().backward()
        return [x.grad.clone()]

    silently_wrong_then_named(
        step,
        lambda: setattr(settings, "scale", 3.0),
        lambda: setattr(settings, "scale", 1.0),
        "attribute",
        "settings.scale",
    )


@VARIANTS
def test_attribute_of_another_module(reentrant: bool) -> None:
    torch.manual_seed(0)
    module = CrossModuleBlock()
    silently_wrong_then_named(
        _module_step(module, reentrant),
        lambda: setattr(cfg, "SCALE", 2.0),
        lambda: setattr(cfg, "SCALE", 1.0),
        "global",
        "cfg.SCALE",
        "guard_fixture_pkg.model",
    )


@VARIANTS
def test_global_of_helper_in_another_module(reentrant: bool) -> None:
    torch.manual_seed(0)
    module = CrossModuleBlock()
    silently_wrong_then_named(
        _module_step(module, reentrant),
        lambda: setattr(helpers, "OFFSET", 0.5),
        lambda: setattr(helpers, "OFFSET", 0.0),
        "global",
        "OFFSET",
        "global of guard_fixture_pkg.helpers, read by shift",
    )


def _matmul_region(x):
    return torch.sin(x @ x.T + torch.ones(()))  # torch.ones follows the default dtype


def _dtype_region(t):
    return torch.sin(t * torch.tensor(0.1))  # the constant follows the default dtype


def test_default_dtype_changed() -> None:
    """Reentrant: silently wrong. Non-reentrant: torch's own check sees a saved tensor's dtype
    change (a CheckpointError); the guard names the cause before it."""
    x = torch.randn(4, 4, dtype=torch.float64, requires_grad=True)

    def step(change, reentrant=True):
        x.grad = None
        out = checkpoint(_dtype_region, x, use_reentrant=reentrant)
        if change is not None:
            change()
        out.sum().backward()
        return [x.grad.clone()]

    def to_double():
        torch.set_default_dtype(torch.float64)

    def undo():
        torch.set_default_dtype(torch.float32)

    silently_wrong_then_named(step, to_double, undo, "torch_state", "torch.get_default_dtype()")
    with ckptguard.guard(), pytest.raises(ckptguard.CheckpointMismatchError) as info:
        try:
            step(to_double, reentrant=False)
        finally:
            undo()
    assert info.value.kind == "torch_state"


@pytest.mark.parametrize("setting", ["matmul_precision", "deterministic"])
def test_other_process_wide_settings_are_judged_by_what_they_change(setting: str) -> None:
    """Settings are fingerprinted, and a changed one is judged by the recompute's ops: a 4x4
    float32 matmul computes the same under either precision, and no CPU op of this region has
    a nondeterministic kernel, so both changes are silent, with bit-identical gradients
    (test_settings.py: where they do change what backward uses, they are named)."""
    x = torch.randn(4, 4, requires_grad=True)
    before = (torch.get_float32_matmul_precision(), torch.are_deterministic_algorithms_enabled())
    change = {
        "matmul_precision": lambda: torch.set_float32_matmul_precision("medium"),
        "deterministic": lambda: torch.use_deterministic_algorithms(True),
    }[setting]

    def step() -> torch.Tensor:
        x.grad = None
        out = checkpoint(_matmul_region, x, use_reentrant=False)
        change()
        try:
            out.sum().backward()
        finally:
            torch.set_float32_matmul_precision(before[0])
            torch.use_deterministic_algorithms(before[1])
        return x.grad.clone()

    plain = step()
    with ckptguard.guard(), warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(step(), plain)


class Settings:
    SCALE = 1.0


def _class_attribute_region(x):
    return torch.sin(x * Settings.SCALE)


def _default_argument_region(x, scale=1.0):
    return torch.sin(x * scale)


def _function_step(region, reentrant: bool):
    x = torch.randn(5, generator=torch.Generator().manual_seed(1), requires_grad=True)

    def step(change):
        x.grad = None
        out = checkpoint(region, x, use_reentrant=reentrant)
        if change is not None:
            change()
        out.sum().backward()
        return [x.grad.clone()]

    return step


@VARIANTS
def test_class_attribute_read_through_a_global(reentrant: bool) -> None:
    silently_wrong_then_named(
        _function_step(_class_attribute_region, reentrant),
        lambda: setattr(Settings, "SCALE", 2.0),
        lambda: setattr(Settings, "SCALE", 1.0),
        "global",
        "Settings.SCALE",
        "1.0",
        "2.0",
    )


@VARIANTS
def test_default_argument_rebound(reentrant: bool) -> None:
    silently_wrong_then_named(
        _function_step(_default_argument_region, reentrant),
        lambda: setattr(_default_argument_region, "__defaults__", (2.0,)),
        lambda: setattr(_default_argument_region, "__defaults__", (1.0,)),
        "closure",
        "_default_argument_region.__defaults__",
        "1.0",
        "2.0",
    )


class Scaler:
    def apply(self, x):
        return x * 1.0


def _doubling_apply(self, x):
    return x * 2.0


SCALER = Scaler()


def _method_of_global_region(x):
    return torch.sin(SCALER.apply(x))


@VARIANTS
@pytest.mark.parametrize("where", ["class", "instance"])
def test_method_of_a_global_object_replaced(reentrant: bool, where: str) -> None:
    """``SCALER.apply`` lives on the class; replacing it there, or shadowing it on the
    instance, changes what the recompute runs."""
    target = Scaler if where == "class" else SCALER
    replacement = _doubling_apply if where == "class" else _doubling_apply.__get__(SCALER)

    def undo() -> None:
        if where == "class":
            Scaler.apply = Scaler.__dict__["_original_apply"]
        else:
            SCALER.__dict__.pop("apply", None)

    silently_wrong_then_named(
        _function_step(_method_of_global_region, reentrant),
        lambda: setattr(target, "apply", replacement),
        undo,
        "global",
        "SCALER.apply",
    )


Scaler._original_apply = Scaler.apply


def _closure_region(settings: Config):
    def region(x):
        return torch.sin(x * settings.scale)

    return region


@VARIANTS
def test_attribute_of_object_in_closure(reentrant: bool) -> None:
    """A region nested in a function (or a method: ``self`` in a closure) reads attributes
    of an object it closes over."""
    settings = Config()
    silently_wrong_then_named(
        _function_step(_closure_region(settings), reentrant),
        lambda: setattr(settings, "scale", 3.0),
        lambda: setattr(settings, "scale", 1.0),
        "closure",
        "settings.scale",
        "read through a closure cell of _closure_region.<locals>.region (",
    )


class Activated(nn.Module):
    """Holds a ``functools.partial``, whose keywords dict can be changed in place."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 4)
        self.act = functools.partial(torch.nn.functional.gelu, approximate="none")

    def forward(self, x):
        return torch.sin(self.act(self.fc(x)))


@VARIANTS
def test_keywords_of_a_partial_attribute_changed_in_place(reentrant: bool) -> None:
    module = Activated()
    silently_wrong_then_named(
        _module_step(module, reentrant),
        lambda: module.act.keywords.update(approximate="tanh"),
        lambda: module.act.keywords.update(approximate="none"),
        "attribute",
        "Activated.act",
        "tanh",
    )


class PropertyConfig:
    """transformers style: ``config._attn_implementation`` is a property over a stored
    ``_attn_implementation_internal``."""

    def __init__(self) -> None:
        self._scale_internal = 1.0

    @property
    def scale(self) -> float:
        return self._scale_internal

    @scale.setter
    def scale(self, value: float) -> None:
        self._scale_internal = value


class PropertyConfigured(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 4)
        self.config = PropertyConfig()

    def forward(self, x):
        return torch.sin(self.fc(x) * self.config.scale)


@VARIANTS
def test_attribute_behind_a_property_of_a_config_object(reentrant: bool) -> None:
    """The property is never evaluated; what its getter reads from ``self`` is."""
    module = PropertyConfigured()
    silently_wrong_then_named(
        _module_step(module, reentrant),
        lambda: setattr(module.config, "scale", 2.0),
        lambda: setattr(module.config, "scale", 1.0),
        "attribute",
        "PropertyConfigured.config._scale_internal",
    )


def _property_region(settings: PropertyConfig):
    def region(x):
        return torch.sin(x * settings.scale)

    return region


@VARIANTS
def test_property_of_an_object_in_closure(reentrant: bool) -> None:
    settings = PropertyConfig()
    silently_wrong_then_named(
        _function_step(_property_region(settings), reentrant),
        lambda: setattr(settings, "scale", 3.0),
        lambda: setattr(settings, "scale", 1.0),
        "closure",
        "settings._scale_internal",
    )


class Stacked(nn.Module):
    """Runs what its containers hold: the blocks of a ModuleList, a Sequential, and the scales
    of a ParameterList."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList([nn.Linear(4, 4)])
        self.tail = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
        self.scales = nn.ParameterList([nn.Parameter(torch.full((4,), 1.5))])

    def forward(self, x):
        for block in self.blocks:
            x = torch.sin(block(x))
        for scale in self.scales:
            x = x * scale
        return self.tail(x)


@VARIANTS
@pytest.mark.parametrize("region", ["module", "function"])
@pytest.mark.parametrize(
    ("container", "change", "shown"),
    [
        ("blocks", lambda m, new: m.blocks.append(new), "2 modules"),
        ("tail", lambda m, new: m.tail.__setitem__(0, new), "as many, one or more replaced"),
        ("scales", lambda m, new: m.scales.append(nn.Parameter(torch.ones(4))), "2 parameters"),
    ],
    ids=["module_list_append", "sequential_replace", "parameter_list_append"],
)
def test_contents_of_a_container_changed(reentrant, region, container, change, shown) -> None:
    """A module added to or replaced in a container the region iterates changes what the
    recompute runs, though no attribute its code names changed."""
    module = Stacked()
    saved = {name: list(getattr(module, name)) for name in ("blocks", "tail", "scales")}
    replacement = nn.Linear(4, 4)

    def undo() -> None:
        module.blocks = nn.ModuleList(saved["blocks"])
        module.tail = nn.Sequential(*saved["tail"])
        module.scales = nn.ParameterList(saved["scales"])

    step = _module_step(module, reentrant, through_function=region == "function")
    if reentrant or container == "tail":
        error = silently_wrong_then_named(
            step, lambda: change(module, replacement), undo, "attribute", f"Stacked.{container}"
        )
    else:  # one more saved tensor: torch's own check fires, and the guard says why first
        with ckptguard.guard(), pytest.raises(ckptguard.CheckpointMismatchError) as info:
            step(lambda: change(module, replacement))
        undo()
        error = info.value
        assert error.kind == "attribute" and f"Stacked.{container}" in str(error)
    assert shown in str(error)


class Rescaler:
    """A plain object whose method reads its own state (accelerate's module hooks, custom
    callables): the state behind a method call."""

    def __init__(self) -> None:
        self.factor = 1.0
        self.calls = 0

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1  # assigned by the method: its output, not an input
        return self._scaled(x)

    def _scaled(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor


class Hooked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 4)
        self.rescaler = Rescaler()

    def forward(self, x):
        return torch.sin(self.rescaler.apply(self.fc(x)))


@VARIANTS
def test_state_read_by_a_method_of_a_held_object(reentrant: bool) -> None:
    """``self.rescaler.apply(...)``: what ``apply`` and the methods it calls on its ``self``
    read (``factor``) is fingerprinted; what it assigns (``calls``) is its output."""
    module = Hooked()
    silently_wrong_then_named(
        _module_step(module, reentrant),
        lambda: setattr(module.rescaler, "factor", 3.0),
        lambda: setattr(module.rescaler, "factor", 1.0),
        "attribute",
        "Hooked.rescaler.factor",
    )


def _method_region(rescaler: Rescaler):
    def region(x):
        return torch.sin(rescaler.apply(x))

    return region


@VARIANTS
def test_state_read_by_a_method_of_an_object_in_closure(reentrant: bool) -> None:
    rescaler = Rescaler()
    silently_wrong_then_named(
        _function_step(_method_region(rescaler), reentrant),
        lambda: setattr(rescaler, "factor", 3.0),
        lambda: setattr(rescaler, "factor", 1.0),
        "closure",
        "rescaler.factor",
    )


# ------------------------------------------------ issue 28: misses of default mode, caught


def _scaled_sin(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    return torch.sin(x * scale)


@VARIANTS
def test_keywords_of_the_region_s_partial_changed_in_place(reentrant: bool) -> None:
    """``functools.partial(f, scale=2.0)`` checkpointed, then ``p.keywords["scale"] = 3.0``
    before backward: the recompute calls f with 3.0, an ``argument`` of the region."""
    region = functools.partial(_scaled_sin, scale=2.0)
    keywords = region.keywords
    x = torch.randn(5, generator=torch.Generator().manual_seed(1), requires_grad=True)

    def step(change):
        x.grad = None
        out = checkpoint(region, x, use_reentrant=reentrant)
        if change is not None:
            change()
        out.sum().backward()
        return [x.grad.clone()]

    def set_scale(value: float):
        return lambda: keywords.__setitem__("scale", value)

    error = silently_wrong_then_named(
        step, set_scale(3.0), set_scale(2.0), "argument", "bound keyword scale"
    )
    # a float is named as the value it is (it once was kind "tensor")
    assert error.details["old"] == "2.0" and error.details["new"] == "3.0"
    assert "tensor" not in str(error).splitlines()[1]


class Scaled(nn.Module):
    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(x * self.factor)


@VARIANTS
def test_checkpoint_sequential_over_a_plain_list_whose_item_is_replaced(reentrant: bool) -> None:
    """``checkpoint_sequential`` runs a plain list as it is (an ``nn.Sequential`` it copies):
    an item replaced after the forward is what the segment's recompute runs."""
    from torch.utils.checkpoint import checkpoint_sequential

    blocks = [Scaled(1.0), Scaled(2.0), Scaled(3.0), Scaled(4.0)]
    original = blocks[1]
    x = torch.randn(5, generator=torch.Generator().manual_seed(1), requires_grad=True)

    def step(change):
        x.grad = None
        out = checkpoint_sequential(blocks, 2, x, use_reentrant=reentrant)
        if change is not None:
            change()
        out.sum().backward()
        return [x.grad.clone()]

    def replace() -> None:
        blocks[1] = Scaled(5.0)

    def undo() -> None:
        blocks[1] = original

    error = silently_wrong_then_named(step, replace, undo, "attribute", "checkpoint_sequential")
    assert "Scaled" in str(error)


def _gelu_region(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x) * 2


def _sin_region(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x).exp()


def _tensor_method_region(x: torch.Tensor) -> torch.Tensor:
    return x.softmax(-1) * 3


def _patched_gelu(x, approximate="none"):
    return torch.tanh(x)


def _patched_softmax(self, dim):
    return torch.sigmoid(self)


@VARIANTS
@pytest.mark.parametrize(
    "where", ["torch.nn.functional.gelu", "torch.sin", "torch.Tensor.softmax", "nn.GELU"]
)
def test_a_torch_function_monkeypatched_between_the_passes(reentrant: bool, where: str) -> None:
    """The region calls a torch function (from its own code, or torch's module code for
    ``nn.GELU``), patched after the forward: the recompute calls the patch."""
    owner, name, patch = {
        "torch.nn.functional.gelu": (torch.nn.functional, "gelu", _patched_gelu),
        "nn.GELU": (torch.nn.functional, "gelu", _patched_gelu),
        "torch.sin": (torch, "sin", torch.cos),
        "torch.Tensor.softmax": (torch.Tensor, "softmax", _patched_softmax),
    }[where]
    region = {
        "torch.nn.functional.gelu": _gelu_region,
        "nn.GELU": nn.GELU(),
        "torch.sin": _sin_region,
        "torch.Tensor.softmax": _tensor_method_region,
    }[where]
    original = owner.__dict__.get(name)
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1), requires_grad=True)

    def step(change):
        x.grad = None
        out = checkpoint(region, x, use_reentrant=reentrant)
        if change is not None:
            change()
        (out * torch.arange(4.0)).sum().backward()
        return [x.grad.clone()]

    def apply() -> None:
        setattr(owner, name, patch)

    def undo() -> None:
        if original is None:
            delattr(owner, name)
        else:
            setattr(owner, name, original)

    shown = "torch.Tensor.softmax" if where == "torch.Tensor.softmax" else name
    silently_wrong_then_named(step, apply, undo, "function", shown)


def _environment_region(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x * float(os.environ.get("CKPTGUARD_TEST_SCALE", "1")))


def _environment_key_region(x: torch.Tensor) -> torch.Tensor:
    key = "CKPTGUARD_TEST_" + "SCALE"  # computed: the guard reads the whole environment
    return torch.sin(x * float(os.getenv(key, "1")))


@VARIANTS
@pytest.mark.parametrize("region", [_environment_region, _environment_key_region])
def test_environment_variable_read_by_the_region(reentrant: bool, region) -> None:
    x = torch.randn(5, generator=torch.Generator().manual_seed(1), requires_grad=True)

    def step(change):
        x.grad = None
        out = checkpoint(region, x, use_reentrant=reentrant)
        if change is not None:
            change()
        out.sum().backward()
        return [x.grad.clone()]

    def set_scale() -> None:
        os.environ["CKPTGUARD_TEST_SCALE"] = "3"

    def undo() -> None:
        os.environ.pop("CKPTGUARD_TEST_SCALE", None)

    silently_wrong_then_named(step, set_scale, undo, "global", "os.environ")


class Drawing(nn.Module):
    """Draws its gain from an iterator each forward: the recompute draws the next one."""

    def __init__(self) -> None:
        super().__init__()
        self.gains = iter([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(x * next(self.gains))


def _generator_of_gains():
    value = 1.0
    while True:
        yield value
        value += 1.0


GAINS = _generator_of_gains()


def _global_generator_region(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x * next(GAINS))


def _argument_iterator_region(x: torch.Tensor, gains) -> torch.Tensor:
    return torch.sin(x * next(gains))


@VARIANTS
@pytest.mark.parametrize("holder", ["module attribute", "global generator", "argument"])
def test_an_iterator_the_region_advances_is_a_warning_at_the_forward(
    reentrant: bool, holder: str
) -> None:
    """Plain torch recomputes with the next value (silently different gradients); the guard
    warns at the forward, naming what it advances."""
    module = Drawing()
    x = torch.randn(5, generator=torch.Generator().manual_seed(1), requires_grad=True)

    def run(guarded: bool) -> tuple[torch.Tensor, list[str]]:
        x.grad = None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with ckptguard.guard() if guarded else contextlib.nullcontext():
                if holder == "module attribute":
                    out = checkpoint(module, x, use_reentrant=reentrant)
                elif holder == "global generator":
                    out = checkpoint(_global_generator_region, x, use_reentrant=reentrant)
                else:
                    gains = iter([2.0, 5.0])
                    out = checkpoint(_argument_iterator_region, x, gains, use_reentrant=reentrant)
                out.sum().backward()
        found = [
            str(w.message)
            for w in caught
            if issubclass(w.category, ckptguard.CheckpointGuardWarning)
        ]
        return x.grad.clone(), found

    _, plain_warnings = run(guarded=False)
    assert plain_warnings == []
    _, found = run(guarded=True)
    assert len(found) == 1 and "[iterator]" in found[0], found
    named = {"module attribute": "gains", "global generator": "GAINS", "argument": "argument gains"}
    assert named[holder] in found[0] and "will draw the next value" in found[0]


def test_requires_grad_switched_between_the_passes() -> None:
    """``requires_grad_(False)`` on a weight after the forward: the reentrant recompute
    builds a graph without it, so the weight silently gets no gradient."""
    torch.manual_seed(0)
    module = nn.Linear(4, 4)
    step = _module_step(module, True)

    def freeze() -> None:
        module.weight.requires_grad_(False)

    def unfreeze() -> None:
        module.weight.requires_grad_(True)

    error = silently_wrong_then_named(step, freeze, unfreeze, "tensor", "weight")
    assert "requires_grad" in str(error)
