"""Values a recompute computes otherwise than its forward did, followed to what backward uses.

A judge (``_settings``' for a torch setting that changed, ``_side_effects``' for state the
region's own forward updated) finds an op whose result differs from the forward's by running
it again as the forward ran it. Whether that matters is a question of data flow: a result that
differs is followed through the ops that consume it, and counts once a tensor it reaches is
saved for backward (a Linear's backward uses its input and weight, not its output, so a
Linear output that differs leaves the gradients as they are). An op that writes into a tensor
from inputs that do not differ makes that tensor agree again.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from ckptguard._compat import TorchDispatchMode, resolve, tree_leaves

# (cause, evidence, certain): what made a tensor differ, as the verdict will name it
Cause = tuple[str, str, bool]
_SEEDED = torch.Tag.nondeterministic_seeded


class Divergence:
    """The tensors of a recompute that differ from the forward's, by id (weakly held), and
    the saved-tensor hook that reports the first one backward uses (``on_saved``)."""

    def __init__(self, on_saved: Callable[[Cause], None]) -> None:
        self.differing: dict[int, tuple[weakref.ref, Cause]] = {}
        self.on_saved = on_saved
        self._hooks: Any = None

    def __enter__(self) -> Divergence:
        top = resolve().top_saved_tensors_hooks()
        pack_inner, unpack = top if top is not None else (_same_tensor, _same_tensor)

        def pack(tensor: torch.Tensor) -> Any:
            found = self.differing.get(id(tensor))
            if found is not None and found[0]() is tensor:
                self.on_saved(found[1])
            return pack_inner(tensor)

        self._hooks = torch.autograd.graph.saved_tensors_hooks(pack, unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._hooks.__exit__(*exc)
        self._hooks = None  # torch's hooks close over its checkpoint frame: do not keep them

    def differs(self, out: Any, cause: Cause) -> None:
        """The tensors of ``out`` differ from what the forward computed, because of ``cause``."""
        differing = self.differing
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                known = differing.get(id(leaf))
                if known is None or known[0]() is not leaf:  # new, or a dead one's id reused
                    differing[id(leaf)] = (weakref.ref(leaf), cause)

    def agrees(self, tensors: list) -> None:
        """``tensors`` were written from inputs that do not differ: they agree again."""
        for tensor in tensors:
            self.differing.pop(id(tensor), None)

    def consumed(self, args: Any, kwargs: Any) -> Cause | None:
        """The cause of a differing tensor among an op's inputs."""
        differing = self.differing
        if not differing:
            return None
        for leaf in tree_leaves((args, kwargs)):
            found = differing.get(id(leaf))
            if found is not None and found[0]() is leaf:
                return found[1]
        return None


class OpJudge(TorchDispatchMode):
    """Runs each op of a recompute, then hands it to its watch's judge (``look``), unless the
    watch is running ops of its own to compare, has reached its verdict, or failed: a failure
    is noted for the region to report once the recompute ran, never raised inside the user's
    function (See NOTE [ The guard never stops training ])."""

    def __init__(self, watch: Any) -> None:
        super().__init__()
        self.watch = watch

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        watch = self.watch
        if not watch.rerunning and not watch.decided() and watch.failure is None:
            try:
                watch.look(func, args, kwargs, out)
            except Exception as error:
                watch.failure = error
        return out


def same(first: Any, second: Any) -> bool:
    """Bitwise the same results (NaN where the other has NaN)."""
    one, two = tree_leaves(first), tree_leaves(second)
    if len(one) != len(two):
        return False
    for a, b in zip(one, two, strict=True):
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            if a.dtype != b.dtype or a.shape != b.shape:
                return False
            if a.is_floating_point() or a.is_complex():
                if not torch.equal(torch.isnan(a), torch.isnan(b)):
                    return False
                a, b = torch.nan_to_num(a), torch.nan_to_num(b)
            if not torch.equal(a, b):
                return False
        elif a is not b and a != b:
            return False
    return True


def draws_random_numbers(func: Any, args: tuple, kwargs: dict) -> bool:
    """Whether running the op draws random numbers (which would move the generator the
    region's later ops draw from; an attention kernel with ``dropout_p`` 0 draws none)."""
    if _SEEDED not in func.tags:
        return False
    for index, argument in enumerate(func._schema.arguments):
        if argument.name == "dropout_p":
            value = kwargs.get("dropout_p", args[index] if index < len(args) else 0.0)
            return value != 0
    return True


def written_tensors(func: Any, args: tuple, kwargs: dict) -> list:
    """The tensors an op writes into (``add_``'s self, ``out=``), from its schema."""
    written = []
    for index, argument in enumerate(func._schema.arguments):
        if argument.alias_info is None or not argument.alias_info.is_write:
            continue
        value = args[index] if index < len(args) else kwargs.get(argument.name)
        written += [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]
    return written


def _same_tensor(tensor: Any) -> Any:
    return tensor
