"""Cheap, comparable fingerprints of single values.

A fingerprint never holds a strong reference to a tensor or a module: tensors are recorded by
``id``, version counter, data pointer, dtype, device and shape (2-4 µs whatever their size;
hashing contents costs ~2 ms per MiB), modules and other objects by ``id`` and type. Scalars and
strings compare by value, small containers by their shallow content.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import torch

SCALAR_TYPES = frozenset({int, float, bool, str, bytes, complex, type(None)})
SMALL_CONTAINER = 16


class _Marker:
    """First element of a plain-tuple fingerprint (tuples are cheaper than classes)."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


TENSOR = _Marker("tensor")
LOOSE_TENSOR = _Marker("loose tensor")
OBJECT = _Marker("object")
MISSING = _Marker("<unset>")
SKIPPED = _Marker("<not evaluated>")  # a property or other descriptor: reading it runs code


class Described(str):
    """An object a message names by what it is (``blocks.2 (Block)``, ``function f (x.py:3)``),
    shown without quotes; ``module`` says whether it is a module."""

    module: bool

    def __new__(cls, text: str, module: bool = False) -> Described:
        described = super().__new__(cls, text)
        described.module = module
        return described

    def __repr__(self) -> str:
        return str(self)


class TensorFP(NamedTuple):
    """Readable view of ``(TENSOR, id, version, data_ptr, dtype[, device, shape,
    requires_grad])``; parameters and buffers leave out device and shape (a move or a resize
    changes the data pointer or the version counter anyway) and keep whether they require
    grad (``requires_grad_(False)`` before a reentrant recompute leaves them without a
    gradient), arguments keep device and shape."""

    ident: int
    version: int
    data_ptr: int
    dtype: torch.dtype
    device: torch.device | None = None
    shape: tuple | None = None
    requires_grad: bool | None = None


class LooseTensorFP(NamedTuple):
    """Readable view of ``(LOOSE_TENSOR, dtype, device, shape)``: for tensors whose object and
    storage change on purpose (FSDP2 parameters)."""

    dtype: torch.dtype
    device: torch.device
    shape: tuple


class ObjectFP(NamedTuple):
    """Readable view of ``(OBJECT, id, type)``."""

    ident: int
    type: type


def of_type(value: Any, kinds: type | tuple[type, ...]) -> bool:
    """``isinstance`` by the object's own type: ``isinstance`` asks for ``__class__``, which
    an object's ``__getattribute__`` (user code: transformers' configs, proxies) answers, and
    the guard reads state without running user code."""
    return issubclass(type(value), kinds)


def instance_dict(value: Any) -> dict | None:
    """An object's own ``__dict__``, read without running its code (no ``__getattr__`` or
    ``__getattribute__`` of its class), or None where it has none or it cannot be read: a
    probe of a user's object treats any exception as "cannot read"."""
    try:
        state = object.__getattribute__(value, "__dict__")
    except Exception:
        return None
    return state if type(state) is dict else None


def tensor_fp(t: Any) -> Any:
    if t is None:
        return None
    try:
        ptr = t.data_ptr()
    except (RuntimeError, ValueError):  # no storage: wrapper subclasses (DTensor, fake
        ptr = -1  # devices), lazy modules' uninitialised parameters
    return (TENSOR, id(t), t._version, ptr, t.dtype, None, None, t.requires_grad)


def loose_tensor_fp(t: Any) -> Any:
    if t is None:
        return None
    return (LOOSE_TENSOR, t.dtype, t.device, t.shape)


def input_fp(t: Any) -> Any:
    """Recompute receives detached copies of inputs: compare storage and version, not object."""
    try:
        ptr = t.data_ptr()
    except (RuntimeError, ValueError):
        ptr = -1
    return (TENSOR, 0, t._version, ptr, t.dtype, t.device, t.shape)


def script_tensors(module: torch.jit.ScriptModule) -> tuple:
    """A TorchScript module's parameters and buffers by name, as a dict fingerprint (read
    through torch's own accessors: its state lives in C++, not in its ``__dict__``)."""
    named = (*module.named_parameters(), *module.named_buffers())
    return (dict, tuple([(name, tensor_fp(tensor)) for name, tensor in named]))


def readable(value: Any) -> Any:
    """The named view of a tensor or object fingerprint, else ``value`` itself."""
    if type(value) is tuple and value:
        marker = value[0]
        if marker is TENSOR:
            return TensorFP(*value[1:])
        if marker is LOOSE_TENSOR:
            return LooseTensorFP(*value[1:])
        if marker is OBJECT:
            return ObjectFP(*value[1:])
    return value


def _shallow_fp(value: Any) -> Any:
    if type(value) in SCALAR_TYPES:
        return value
    if of_type(value, torch.Tensor):
        return tensor_fp(value)
    return (OBJECT, id(value), type(value))


def value_fp(value: Any) -> Any:
    """Scalars by value, tensors by metadata, small containers by shallow content, else identity."""
    kind = type(value)
    if kind in SCALAR_TYPES or value is MISSING or value is SKIPPED:
        return value
    if of_type(value, torch.Tensor):
        return tensor_fp(value)
    if kind is list or kind is tuple:
        if len(value) <= SMALL_CONTAINER:
            return (kind, tuple([_shallow_fp(v) for v in value]))
    elif kind is dict:
        if len(value) <= SMALL_CONTAINER:
            return (dict, tuple([(k, _shallow_fp(v)) for k, v in value.items()]))
    elif kind is set or kind is frozenset:
        if len(value) <= SMALL_CONTAINER:
            return (kind, frozenset([_shallow_fp(v) for v in value]))
    elif kind is functools.partial:  # its keywords are a dict, mutable in place
        if len(value.args) + len(value.keywords) <= SMALL_CONTAINER:
            keywords = tuple([(k, _shallow_fp(v)) for k, v in value.keywords.items()])
            return (kind, id(value.func), tuple(map(_shallow_fp, value.args)), keywords)
    return (OBJECT, id(value), kind)


def nested_tensors(value: Any, limit: int = SMALL_CONTAINER) -> list[tuple[str, torch.Tensor]]:
    """Tensors inside a (possibly nested) list, tuple or dict argument, with their index path;
    bounded to ``limit`` items per container and two levels."""
    found: list[tuple[str, torch.Tensor]] = []

    def walk(item: Any, path: str, depth: int) -> None:
        if of_type(item, torch.Tensor):
            found.append((path, item))
        elif depth < 2 and type(item) in (list, tuple) and len(item) <= limit:
            for index, element in enumerate(item):
                walk(element, f"{path}[{index}]", depth + 1)
        elif depth < 2 and type(item) is dict and len(item) <= limit:
            for key, element in item.items():
                walk(element, f"{path}[{key!r}]", depth + 1)

    walk(value, "", 0)
    return found


def argument_fp(value: Any) -> Any:
    """An argument of the region: tensors by metadata (their object may be a recomputed copy),
    containers to two levels and ``SMALL_CONTAINER`` items, other objects by identity."""
    kind = type(value)
    if kind in SCALAR_TYPES:
        return value
    if of_type(value, torch.Tensor):
        return input_fp(value)
    if (kind is list or kind is tuple) and len(value) <= SMALL_CONTAINER:
        return (kind, tuple([value_fp(v) for v in value]))
    if kind is dict and len(value) <= SMALL_CONTAINER:
        return (dict, tuple([(k, value_fp(v)) for k, v in value.items()]))
    return (OBJECT, id(value), kind)


def arguments_fp(values: list) -> list:
    """``argument_fp`` of each value, with scalars, plain tensors and small lists and tuples
    of them handled here: a region's arguments are fingerprinted twice a step."""
    out = []
    for value in values:
        kind = type(value)
        if kind in SCALAR_TYPES:
            out.append(value)
        elif kind is torch.Tensor:
            out.append(input_fp(value))
        elif (kind is tuple or kind is list) and len(value) <= SMALL_CONTAINER:
            items = []
            for item in value:
                if type(item) is torch.Tensor:
                    items.append(tensor_fp(item))
                elif type(item) in SCALAR_TYPES:
                    items.append(item)
                else:
                    items.append(value_fp(item))
            out.append((kind, tuple(items)))
        else:
            out.append(argument_fp(value))
    return out
