"""Which devices' RNG a region consumed, and which of them torch stashed for its recompute.

Torch stashes the CPU generator, plus the generators of the devices of tensor *positional*
arguments of one device type (``_infer_device_type``), and only when that device module is
already initialised. Randomness drawn anywhere else is not replayed by the recompute.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import checkpoint as torch_checkpoint
from torch.utils._pytree import tree_leaves

_CANDIDATE_DEVICE_TYPES = ("cuda", "xpu", "mps", "mtia", "hpu")


def _device_types() -> tuple[str, ...]:
    private = torch._C._get_privateuse1_backend_name()
    if private != "privateuseone" and private not in _CANDIDATE_DEVICE_TYPES:
        return (*_CANDIDATE_DEVICE_TYPES, private)
    return _CANDIDATE_DEVICE_TYPES


def _initialised_modules() -> list[tuple[str, Any]]:
    found = []
    for device_type in _device_types():
        module = getattr(torch, device_type, None)
        if module is not None and getattr(module, "_initialized", False):
            found.append((device_type, module))
    return found


def _get_state(module: Any, index: int) -> Any:
    try:
        return module.get_rng_state(index)
    except TypeError:
        with module.device(index):
            return module.get_rng_state()


def snapshot(preserve_rng_state: bool) -> dict[str, Any] | None:
    """RNG states of every initialised accelerator (and CPU when torch will not restore it)."""
    modules = _initialised_modules()
    if preserve_rng_state and not modules:
        return None
    states: dict[str, Any] = {}
    if not preserve_rng_state:
        states["cpu"] = torch.get_rng_state()
    for device_type, module in modules:
        for index in range(module.device_count()):
            states[f"{device_type}:{index}"] = _get_state(module, index)
    return states


def stashed_devices(preserve_rng_state: bool, args: tuple) -> set[str]:
    """The devices whose RNG state torch will restore before recomputing, mirroring torch."""
    if not preserve_rng_state:
        return set()
    devices = {"cpu"}
    device_type = torch_checkpoint._infer_device_type(*args)
    module = getattr(torch, device_type, None)
    if device_type == "meta" or not getattr(module, "_initialized", False):
        return devices
    for arg in tree_leaves(args):
        if isinstance(arg, torch.Tensor) and arg.device.type not in ("cpu", "meta"):
            devices.add(f"{device_type}:{arg.get_device()}")
    return devices


def consumed_unstashed(
    before: dict[str, Any] | None, preserve_rng_state: bool, args: tuple
) -> list[str]:
    """Devices whose generator advanced during the forward but will not be replayed."""
    if before is None:
        return []
    after = snapshot(preserve_rng_state) or {}
    advanced = [
        device
        for device, state in after.items()
        if device not in before or not torch.equal(before[device], state)
    ]
    if not advanced:
        return []
    stashed = stashed_devices(preserve_rng_state, args)
    return sorted(d for d in advanced if d not in stashed)
