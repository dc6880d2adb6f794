"""Which devices' RNG a region consumed, and which of them torch stashed for its recompute.

Torch stashes the CPU generator (unless ``preserve_rng_state=False``), plus the generators of
the devices of tensor *positional* arguments of one device type (``_infer_device_type``), and
only when that device module is already initialised. Randomness drawn anywhere else is not
replayed by the recompute.

Attribution to the region's own thread: with ``preserve_rng_state=False`` a dispatch mode (the
mode stack is per thread) sees each random op the region runs, so another thread drawing
numbers meanwhile is never blamed on the region. With ``preserve_rng_state=True`` only
accelerator generators torch does not stash are watched, by comparing their states before and
after the forward (a dispatch mode on every region would cost too much); a thread drawing on
such a device during the region's forward is the documented limit.
"""

from __future__ import annotations

import types
from typing import Any

import torch

from ckptguard import _compat
from ckptguard._compat import TorchDispatchMode, tree_leaves

_CANDIDATE_DEVICE_TYPES = ("cuda", "xpu", "mps", "mtia", "hpu")
_SEEDED = torch.Tag.nondeterministic_seeded


def _device_types() -> tuple[str, ...]:
    private = _compat.resolve().privateuse1_name()
    if private != "privateuseone" and private not in _CANDIDATE_DEVICE_TYPES:
        return (*_CANDIDATE_DEVICE_TYPES, private)
    return _CANDIDATE_DEVICE_TYPES


# privateuse1 name -> (device type, device module, reader of its "_initialized" flag): module
# dicts are read without raising for the devices that have no such flag (mps)
_device_modules: dict[str, tuple[tuple[str, Any, Any], ...]] = {}


def _initialised_modules() -> list[tuple[str, Any]]:
    private = _compat.resolve().privateuse1_name()
    modules = _device_modules.get(private)
    if modules is None:
        modules = _device_modules[private] = tuple(
            (device_type, module, _flag_reader(module))
            for device_type in _device_types()
            if (module := getattr(torch, device_type, None)) is not None
        )
    return [(t, m) for t, m, initialised in modules if initialised("_initialized", False)]


def _flag_reader(module: Any) -> Any:
    if isinstance(module, types.ModuleType):
        return module.__dict__.get
    return lambda name, default: getattr(module, name, default)


def _get_state(module: Any, index: int) -> Any:
    try:
        return module.get_rng_state(index)
    except TypeError:
        with module.device(index):
            return module.get_rng_state()


def snapshot() -> dict[str, Any] | None:
    """RNG states of every initialised accelerator; None when there is none (every region
    asks, before its forward: the flags are read without building the list)."""
    known = _device_modules.get(_compat.resolve().privateuse1_name())
    if known is not None:
        for _, _, initialised in known:
            if initialised("_initialized", False):
                break
        else:
            return None
    modules = _initialised_modules()
    if not modules:
        return None
    states: dict[str, Any] = {}
    for device_type, module in modules:
        for index in range(module.device_count()):
            states[f"{device_type}:{index}"] = _get_state(module, index)
    return states


def stashed_devices(preserve_rng_state: bool, args: tuple) -> set[str]:
    """The devices whose RNG state torch will restore before recomputing, mirroring torch."""
    if not preserve_rng_state:
        return set()
    devices = {"cpu"}
    device_type = _compat.resolve().infer_device_type(*args)
    module = getattr(torch, device_type, None)
    if device_type == "meta" or not getattr(module, "_initialized", False):
        return devices
    for arg in tree_leaves(args):
        if isinstance(arg, torch.Tensor) and arg.device.type not in ("cpu", "meta"):
            devices.add(f"{device_type}:{arg.get_device()}")
    return devices


def _device_name(device: torch.device) -> str:
    if device.type == "cpu":
        return "cpu"
    return f"{device.type}:{device.index if device.index is not None else 0}"


class RandomOps(TorchDispatchMode):
    """Devices on which ops of this thread drew from a default generator (explicit
    ``torch.Generator`` arguments are strict mode's business)."""

    def __init__(self) -> None:
        super().__init__()
        self.devices: set[str] = set()
        self.failure: Exception | None = None  # reported by the region once its forward ran

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if _SEEDED in func.tags and kwargs.get("generator") is None and self.failure is None:
            try:
                self._note(out, args)
            except Exception as error:  # inside the user's function: must not raise there
                self.failure = error  # See NOTE [ The guard never stops training ]
        return out

    def _note(self, out: Any, args: Any) -> None:
        for leaf in tree_leaves((out, args)):
            if isinstance(leaf, torch.Tensor):
                self.devices.add(_device_name(leaf.device))
                break


def consumed_unstashed(
    before: dict[str, Any] | None,
    drawn: set[str] | None,
    preserve_rng_state: bool,
    args: tuple,
) -> list[str]:
    """Devices the region drew random numbers on that its recompute will not replay."""
    advanced = set(drawn or ())
    if before is not None:
        after = snapshot() or {}
        advanced.update(
            device
            for device, state in after.items()
            if device not in before or not torch.equal(before[device], state)
        )
    if not advanced:
        return []
    stashed = stashed_devices(preserve_rng_state, args)
    return sorted(d for d in advanced if d not in stashed)
