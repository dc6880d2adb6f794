"""Forward hooks count where they can change what the recompute computes (issue 38).

A hook registered before the forward and removed right after it does not run in the recompute.
A recording hook (returns None, writes nothing in place: distillation, probing and
activation-logging code) changes nothing there: silent, gradients ``torch.equal`` to an
unguarded run. One that returns a value or writes in place made the forward compute something
the recompute will not: plain torch's gradients differ, and the guard names ``[hook]``. Both
checkpoint variants, default and strict mode, module and pre-hooks, on a child of a module
region, on a module a function region runs, and registered globally.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
import torch.nn as nn
import torch.nn.modules.module as module_hooks
from conftest import grads_equal, grads_of
from torch.utils.checkpoint import checkpoint

import ckptguard

VARIANTS = pytest.mark.parametrize("reentrant", [False, True], ids=["nonreentrant", "reentrant"])
MODES = pytest.mark.parametrize("strict", [False, True], ids=["default", "strict"])


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = nn.Linear(4, 4)
        self.fc2 = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(self.fc2(torch.tanh(self.fc1(x))))


recorded: list = []


def _records_output(module, args, output):
    recorded.append(output.detach())


def _records_input(module, args):
    recorded.append(args[0].detach())


def _doubles_output(module, args, output):
    return output * 2


def _doubles_input(module, args):
    return (args[0] * 2,)


def _doubles_output_in_place(module, args, output):
    output.mul_(2)


def _returns_what_it_got(module, args, output):
    return output


# what a hook does -> (forward hook or pre-hook, changes what the forward computes)
HOOKS: dict[str, tuple[Callable, bool, bool]] = {
    "records_output": (_records_output, False, False),
    "records_input": (_records_input, True, False),
    "returns_what_it_got": (_returns_what_it_got, False, False),
    "returns_a_new_output": (_doubles_output, False, True),
    "returns_new_arguments": (_doubles_input, True, True),
    "writes_in_place": (_doubles_output_in_place, False, True),
}


def _register(where: str, net: nn.Module, hook: Callable, pre: bool):
    if where == "global":
        register = (
            module_hooks.register_module_forward_pre_hook
            if pre
            else module_hooks.register_module_forward_hook
        )
        return register(hook)
    target = net.fc1
    return target.register_forward_pre_hook(hook) if pre else target.register_forward_hook(hook)


def _run(net: nn.Module, reentrant: bool, region: str, where: str, hook: str | None) -> list:
    """Two steps; ``hook`` registered before each forward and removed right after it."""
    grads = []
    for seed in range(2):
        x = torch.randn(3, 4, generator=torch.Generator().manual_seed(seed), requires_grad=True)
        handle = None if hook is None else _register(where, net, *HOOKS[hook][:2])
        called = net if region == "module" else (lambda h: net(h))
        try:
            out = checkpoint(called, x, use_reentrant=reentrant)
        finally:
            if handle is not None:
                handle.remove()
        out.square().sum().backward()
        grads += grads_of(net, x)
        net.zero_grad(set_to_none=True)
    recorded.clear()
    return grads


@VARIANTS
@MODES
@pytest.mark.parametrize("where", ["child", "global"])
@pytest.mark.parametrize("region", ["module", "function"])
@pytest.mark.parametrize("hook", list(HOOKS))
def test_a_hook_removed_after_the_forward(
    hook: str, region: str, where: str, reentrant: bool, strict: bool
) -> None:
    _, pre, changes = HOOKS[hook]
    # Without the hook in the recompute: the gradients of a plain step with the hook in both
    # passes differ exactly where the hook changed what the forward computed.
    kept = _run_kept(Net(), reentrant, region, where, hook)
    removed = _run(Net(), reentrant, region, where, hook)
    assert grads_equal(kept, removed) != changes
    if pre and region == "function" and where == "child":
        # torch reads a module's pre-hooks before the guard sees a function region's module
        # run: they are not watched, and their removal counts as it always did
        changes = True
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if changes:
            with (
                ckptguard.guard(strict=strict),
                pytest.raises(ckptguard.CheckpointMismatchError) as info,
            ):
                _run(Net(), reentrant, region, where, hook)
            assert info.value.kind == "hook", str(info.value)
            assert "forward" in info.value.details["name"]
        else:
            with ckptguard.guard(strict=strict):
                guarded = _run(Net(), reentrant, region, where, hook)
            assert grads_equal(guarded, removed)
    assert not [w for w in caught if "ckptguard [" in str(w.message)], [
        str(w.message) for w in caught
    ]


def _run_kept(net: nn.Module, reentrant: bool, region: str, where: str, hook: str) -> list:
    """The same steps with the hook kept until after backward (its effect in both passes)."""
    grads = []
    for seed in range(2):
        x = torch.randn(3, 4, generator=torch.Generator().manual_seed(seed), requires_grad=True)
        handle = _register(where, net, *HOOKS[hook][:2])
        called = net if region == "module" else (lambda h: net(h))
        try:
            checkpoint(called, x, use_reentrant=reentrant).square().sum().backward()
        finally:
            handle.remove()
        grads += grads_of(net, x)
        net.zero_grad(set_to_none=True)
    recorded.clear()
    return grads


@VARIANTS
def test_the_hooks_are_back_in_their_dicts_after_the_forward(reentrant: bool) -> None:
    """The guard watches hooks through the forward only: the dicts hold the user's own hook
    objects again afterwards, also where the forward raised."""
    net = Net()
    handle = net.fc1.register_forward_hook(_records_output)
    global_handle = module_hooks.register_module_forward_hook(_records_output)
    try:
        with ckptguard.guard():
            checkpoint(net, torch.randn(3, 4, requires_grad=True), use_reentrant=reentrant)
            assert net.fc1._forward_hooks[handle.id] is _records_output
            assert module_hooks._global_forward_hooks[global_handle.id] is _records_output
            with pytest.raises(RuntimeError, match="cannot be multiplied"):
                checkpoint(
                    net, torch.randn(3, 5, requires_grad=True), use_reentrant=reentrant
                )  # the Linear raises on the wrong width
            assert net.fc1._forward_hooks[handle.id] is _records_output
            assert module_hooks._global_forward_hooks[global_handle.id] is _records_output
    finally:
        handle.remove()
        global_handle.remove()
        recorded.clear()


def test_watches_that_end_out_of_order_leave_the_user_s_hook() -> None:
    """Two forwards on two threads watch one module's hooks, the first ending before the
    second: the dict holds the user's hook afterwards, not a probe of a watch that ended."""
    from ckptguard import _hooks

    net = Net()
    handle = net.fc1.register_forward_hook(_records_output)
    try:
        first, second = _hooks.HookWatch(), _hooks.HookWatch()
        first.watch_module(net.fc1)
        second.watch_module(net.fc1)  # wraps the first's probe
        first.__exit__(None, None, None)  # the second's probe is in the dict: left there
        net(torch.randn(3, 4))  # runs through both probes
        second.__exit__(None, None, None)
        assert net.fc1._forward_hooks[handle.id] is _records_output
        assert handle.id in first.inert() and handle.id in second.inert()
    finally:
        handle.remove()
        recorded.clear()


@VARIANTS
def test_a_guard_failure_before_the_forward_puts_the_hooks_back(monkeypatch, reentrant) -> None:
    """A stage failing after the hooks were wrapped (here strict mode's record of the forward)
    gives the region up: one [internal] warning, gradients as plain torch computes them, and
    the user's hooks back in their dicts."""
    from ckptguard import _strict

    def fail(*args, **kwargs):
        raise RuntimeError("injected failure")

    plain = _run_kept(Net(), reentrant, "module", "child", "returns_a_new_output")
    net = Net()
    handle = net.fc1.register_forward_hook(_doubles_output)
    monkeypatch.setattr(_strict, "StrictForward", fail)
    try:
        with warnings.catch_warnings(record=True) as caught, ckptguard.guard(strict=True):
            warnings.simplefilter("always")
            x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0), requires_grad=True)
            checkpoint(net, x, use_reentrant=reentrant).square().sum().backward()
            guarded = grads_of(net, x)
        assert net.fc1._forward_hooks[handle.id] is _doubles_output
    finally:
        handle.remove()
    assert grads_equal(guarded, plain[: len(guarded)])
    internal = [str(w.message) for w in caught if "[internal]" in str(w.message)]
    assert len(internal) == 1 and "could not prepare" in internal[0]
