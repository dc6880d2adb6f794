"""Subprocess for the RNG-device tests: a renamed PrivateUse1 device with a Python RNG module.

Renaming PrivateUse1 is process-global and irreversible, hence a separate process. The fake
device has no kernels; its tensors are storage-less wrapper subclasses used only as non-grad
positional or keyword arguments, and its "random op" draws CPU numbers from a per-device
generator that torch's own get_device_states / set_device_states / fork_rng save and restore.
Prints one JSON object: for each scenario, whether plain torch's gradient matched the
non-checkpointed one, and which error kind and devices the guard reported.
"""

from __future__ import annotations

import contextlib
import json
import sys
import types

import torch
from torch.utils.checkpoint import checkpoint

import ckptguard

DEVICE = "fakegpu"


def _make_device_module() -> types.ModuleType:
    module = types.ModuleType(f"torch.{DEVICE}")
    generators = [torch.Generator().manual_seed(100 + i) for i in range(2)]
    current = [0]

    @contextlib.contextmanager
    def device(index):
        previous, current[0] = current[0], int(getattr(index, "index", index) or 0)
        try:
            yield
        finally:
            current[0] = previous

    def _index(dev) -> int:
        if dev is None or dev == DEVICE:
            return current[0]
        return int(getattr(torch.device(dev) if isinstance(dev, str) else dev, "index", dev))

    module._initialized = True
    module.device = device
    module.device_count = lambda: len(generators)
    module.current_device = lambda: current[0]
    module.is_available = lambda: True
    module._is_in_bad_fork = lambda: False
    module.get_amp_supported_dtype = lambda: [torch.float16, torch.bfloat16]
    module.get_rng_state = lambda device=None: generators[_index(device)].get_state()
    module.set_rng_state = lambda state, device=None: generators[_index(device)].set_state(state)
    module.manual_seed_all = lambda seed: [g.manual_seed(seed) for g in generators]
    module.draw = lambda shape, index: torch.rand(shape, generator=generators[index])
    return module


class FakeDeviceTensor(torch.Tensor):
    """A tensor that only carries a fakegpu device; detach/alias are all it supports."""

    @staticmethod
    def __new__(cls, index: int):
        device = torch.device(DEVICE, index)
        return torch.Tensor._make_wrapper_subclass(cls, (1,), device=device, dtype=torch.float32)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.detach.default, torch.ops.aten.alias.default):
            return FakeDeviceTensor(args[0].device.index)
        raise NotImplementedError(f"{func} on the fake test device")


def main() -> None:
    torch.utils.rename_privateuse1_backend(DEVICE)
    fake = _make_device_module()
    torch._register_device_module(DEVICE, fake)

    def region(x, tag=None, draw_on=0):
        return torch.sin(x * fake.draw(x.shape, draw_on))

    def honest_grad(draw_on: int) -> torch.Tensor:
        x = torch.linspace(-1, 1, 8, requires_grad=True)
        states = [fake.get_rng_state(i) for i in range(2)]
        region(x, draw_on=draw_on).sum().backward()
        for i, state in enumerate(states):
            fake.set_rng_state(state, i)
        return x.grad

    def checkpointed_grad(draw_on: int, tag_index: int, as_kwarg: bool, reentrant: bool):
        x = torch.linspace(-1, 1, 8, requires_grad=True)
        tag = FakeDeviceTensor(tag_index)
        if as_kwarg:
            out = checkpoint(region, x, tag=tag, draw_on=draw_on, use_reentrant=reentrant)
        else:
            out = checkpoint(lambda t, g: region(t, g, draw_on), x, tag, use_reentrant=reentrant)
        fake.draw((3,), draw_on)  # the device RNG moves on before backward
        out.sum().backward()
        return x.grad

    scenarios = {
        "stashed_positional": dict(draw_on=0, tag_index=0, as_kwarg=False),
        "other_device": dict(draw_on=1, tag_index=0, as_kwarg=False),
        "keyword_only": dict(draw_on=0, tag_index=0, as_kwarg=True),
    }
    results = {}
    for reentrant in (False, True):
        for name, scenario in scenarios.items():
            if reentrant and scenario["as_kwarg"]:
                continue
            key = f"{name}/{'reentrant' if reentrant else 'nonreentrant'}"
            expected = honest_grad(scenario["draw_on"])
            plain = checkpointed_grad(reentrant=reentrant, **scenario)
            entry = {"plain_matches": bool(torch.equal(plain, expected))}
            expected = honest_grad(scenario["draw_on"])
            ckptguard.enable()
            try:
                guarded = checkpointed_grad(reentrant=reentrant, **scenario)
                entry["guard"] = None
                entry["guarded_matches"] = bool(torch.equal(guarded, expected))
            except ckptguard.CheckpointMismatchError as error:
                entry["guard"] = error.kind
                entry["devices"] = error.details["devices"]
                entry["message"] = str(error)
            finally:
                ckptguard.disable()
            results[key] = entry
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
