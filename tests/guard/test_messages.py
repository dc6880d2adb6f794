"""Values in the guard's messages are named by what they are (issue 28): a function by its name,
qualified name, ``file:line`` and the closure values that differ; a module by its path in the
model and what it is; a partial by the keyword that changed; never a bare address (conftest's
``_messages_name_no_address`` checks every message the tests raise). Advice names the API of
the installed transformers (issue 31)."""

from __future__ import annotations

import functools
import sys
import types
import warnings

import pytest
import torch
import torch.nn as nn
from conftest import ADDRESS
from torch.utils.checkpoint import checkpoint

import ckptguard
from ckptguard import _verify

VARIANTS = pytest.mark.parametrize("reentrant", [False, True], ids=["nonreentrant", "reentrant"])


def make(scale: float):
    def helper(x: torch.Tensor) -> torch.Tensor:
        return x * scale

    return helper


HELPER_LINE = make.__code__.co_firstlineno + 1
helper = make(2.0)


def _through_global(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(helper(x))


def _mismatch(step) -> ckptguard.CheckpointMismatchError:
    with ckptguard.guard(), pytest.raises(ckptguard.CheckpointMismatchError) as info:
        step()
    return info.value


@VARIANTS
def test_a_rebound_global_function_is_named_with_its_closure_values(reentrant: bool) -> None:
    global helper
    x = torch.randn(3, requires_grad=True)

    def step() -> None:
        global helper
        out = checkpoint(_through_global, x, use_reentrant=reentrant)
        helper = make(3.0)
        out.sum().backward()

    try:
        error = _mismatch(step)
    finally:
        helper = make(2.0)
    where = f"make.<locals>.helper, {__file__}:{HELPER_LINE}"
    assert error.kind == "global"
    assert error.details["old"] == f"helper ({where}) with scale=2.0"
    assert error.details["new"] == f"helper ({where}) with scale=3.0"


@VARIANTS
def test_a_rebound_closure_variable_is_named_with_its_closure_values(reentrant: bool) -> None:
    x = torch.randn(3, requires_grad=True)

    def step() -> None:
        chosen = make(2.0)

        def region(h: torch.Tensor) -> torch.Tensor:
            return torch.sin(chosen(h))

        out = checkpoint(region, x, use_reentrant=reentrant)
        chosen = make(0.5)  # read by the recompute
        out.sum().backward()

    error = _mismatch(step)
    where = f"make.<locals>.helper, {__file__}:{HELPER_LINE}"
    assert error.kind == "closure"
    assert error.details["old"] == f"helper ({where}) with scale=2.0"
    assert error.details["new"] == f"helper ({where}) with scale=0.5"


class Parent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.child = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(self.child(x))


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Parent(), Parent()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False)
        return x


def test_a_replaced_module_is_named_by_its_path_and_what_it_is() -> None:
    model = Model()
    x = torch.randn(2, 4, requires_grad=True)

    def step() -> None:
        out = model(x)
        model.blocks[1].child = nn.Linear(4, 4, bias=False)
        out.sum().backward()

    error = _mismatch(step)
    assert error.kind == "attribute"
    assert error.details["name"] == "blocks.1.child"
    assert error.details["old"] == "Linear(in_features=4, out_features=4, bias=True)"
    assert (
        error.details["new"] == "blocks.1.child (Linear(in_features=4, out_features=4, bias=False))"
    )


class Activated(nn.Module):
    def __init__(self, approximate: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 4)
        self.act = functools.partial(torch.nn.functional.gelu, approximate=approximate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(self.act(self.fc(x)))


def test_a_partials_changed_keyword_is_named() -> None:
    model = Activated("none")
    x = torch.randn(2, 4, requires_grad=True)

    def step() -> None:
        out = checkpoint(model, x, use_reentrant=False)
        model.act = functools.partial(torch.nn.functional.gelu, approximate="tanh")
        out.sum().backward()

    error = _mismatch(step)
    assert error.details["name"] == "Activated.act.keywords['approximate']"
    assert (error.details["old"], error.details["new"]) == ("'none'", "'tanh'")


class Unreadable:
    """An object whose repr (and so an error about it) carries its address."""


def test_an_internal_error_about_an_object_names_no_address(monkeypatch) -> None:
    thing = Unreadable()

    def fail(*args, **kwargs):
        raise TypeError(f"cannot read {thing!r}")

    assert ADDRESS.search(repr(thing)), "the check below needs an address to leave out"
    monkeypatch.setattr(_verify, "capture", fail)
    x = torch.randn(3, requires_grad=True)
    with ckptguard.guard(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        checkpoint(torch.sin, x, use_reentrant=False).sum().backward()
    [message] = [str(w.message) for w in caught if w.category is ckptguard.CheckpointGuardWarning]
    assert f"TypeError: cannot read <{__name__}.Unreadable object>." in message


def _lost_gradients_fix() -> str:
    """The fix line of a reentrant region none of whose inputs requires grad."""
    layer = nn.Linear(3, 3)
    with ckptguard.guard(on_lost_gradients="raise"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's own "None of the inputs have requires_grad"
        with pytest.raises(ckptguard.LostGradientsError) as info:
            checkpoint(layer, torch.randn(2, 3), use_reentrant=True)
    return next(line for line in str(info.value).splitlines() if "how to fix" in line)


FALSE = '{"use_reentrant": False}'
NEW = f"model.activation_checkpointing_enable(activation_checkpointing_kwargs={FALSE})"
OLD = f"model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={FALSE})"


def test_advice_names_the_installed_transformers_api() -> None:
    """transformers 5.25 reports gradient_checkpointing_enable deprecated in favour of
    activation_checkpointing_enable: the advice names the new API, and the old one beside it
    where both exist (4.x has only the old one)."""
    modeling = pytest.importorskip("transformers.modeling_utils")
    if hasattr(modeling.PreTrainedModel, "activation_checkpointing_enable"):
        expected = f"(transformers: {NEW}, or by its older name {OLD})"
    else:
        expected = f"(transformers: {OLD})"
    assert f"use use_reentrant=False {expected}, or make the input" in _lost_gradients_fix()


def test_advice_for_a_transformers_with_the_old_api_only_or_none(monkeypatch) -> None:
    class PreTrainedModel:  # transformers 4.x
        def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None): ...

    older = types.ModuleType("transformers.modeling_utils")
    older.PreTrainedModel = PreTrainedModel  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "transformers.modeling_utils", older)
    assert f"use use_reentrant=False (transformers: {OLD}), or make" in _lost_gradients_fix()
    monkeypatch.delitem(sys.modules, "transformers.modeling_utils")
    assert "how to fix: use use_reentrant=False, or make the input" in _lost_gradients_fix()


# ----------------------------------------------------------------- issue 38: three messages


class Counted(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.counter = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.counter += 1
        return torch.tanh(self.fc(x))


@VARIANTS
def test_a_side_effect_names_modules_that_share_a_name_once(reentrant: bool) -> None:
    """Five modules of one class outside a model are all named by their class: the warning
    says so once, with how many, instead of naming ``Counted.counter`` five times."""
    torch.manual_seed(0)
    blocks = [Counted() for _ in range(5)]

    def region(x: torch.Tensor) -> torch.Tensor:
        for block in blocks:
            x = block(x)
        return x

    x = torch.randn(2, 4, requires_grad=True)
    with ckptguard.guard(), pytest.warns(ckptguard.CheckpointGuardWarning) as record:
        checkpoint(region, x, use_reentrant=reentrant).sum().backward()
    message = str(record[0].message)
    assert "a second time: Counted.counter (in 5 modules)." in message
    assert message.count("Counted.counter") == 1


@VARIANTS
def test_a_global_of_code_run_by_exec_without_a_module_name(reentrant: bool) -> None:
    """Code exec'd in a namespace without ``__name__`` has no module: its global is named by
    where the code comes from, never ``global of None``."""
    namespace: dict = {"torch": torch, "SCALE": 2.0}
    exec(compile("def region(x):\n    return torch.sin(x * SCALE)\n", "<cell>", "exec"), namespace)
    x = torch.randn(4, requires_grad=True)
    with ckptguard.guard(), pytest.raises(ckptguard.CheckpointMismatchError) as info:
        out = checkpoint(namespace["region"], x, use_reentrant=reentrant)
        namespace["SCALE"] = 3.0
        out.sum().backward()
    message = str(info.value)
    assert info.value.kind == "global"
    assert "global of <cell> (run without a module name), read by region (<cell>:1)" in message
    assert "None" not in message.splitlines()[1]
