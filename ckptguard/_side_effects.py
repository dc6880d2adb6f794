"""The side-effect watch: state a region's forward updates itself (BatchNorm's running
statistics, a counter, spectral_norm's vectors), which its recompute updates again.

Before the forward, the state of each module that holds buffers or assigns attributes is noted
(``state_before``); right after it, what the forward changed is the region's output, not its
input (``written_by_forward``; See NOTE [ Outputs are not inputs ]), and is watched; around
each recompute the watched state is read again (``state_before_recompute``) and a second update
is found once per module and run (``updated_again``), for a ``CheckpointGuardWarning``.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.nn.parameter import is_lazy

from ckptguard import _compat, _readplan
from ckptguard._compat import tree_leaves, tree_map
from ckptguard._divergence import (
    Cause,
    Divergence,
    OpJudge,
    draws_random_numbers,
    same,
    written_tensors,
)
from ckptguard._fingerprint import MISSING, SCALAR_TYPES
from ckptguard._strict import _user_frame

# NOTE [ Outputs are not inputs ]
# State a region's forward writes itself (a buffer it updates, a scalar attribute it assigns,
# a container its own code mutates in place) is the region's output, not its input: the
# recompute writes it again, from the same inputs. So it is not compared as an input (the
# buffers the forward wrote are masked out of the fingerprint, an attribute the code assigns
# is not planned as a read), its second update is a side effect (warned once per module and
# run), and the containers the region's own code mutates are read again after each recompute
# (``_verify.refresh_own_writes``), so that a second recompute of the same graph starts from
# what the first left there. A change made by other code after the forward is still caught.

SMALL_BUFFER = 4096  # elements: copied to see writes that skip the version counter

# (weak reference to a module, buffers the forward wrote, scalar attributes it changed, each
# written buffer as it was before the forward: a copy, None for one too large to copy)
Watched = tuple[weakref.ref, tuple[str, ...], tuple[str, ...], dict[str, Any]]
# (module, its watched buffers' state, the attributes, their values) before a recompute
BeforeRecompute = tuple[torch.nn.Module, dict, tuple[str, ...], tuple]


def stored_scalars(module: torch.nn.Module) -> frozenset:
    """Attributes the module's code assigns on ``self``."""
    return _readplan.class_reads(type(module), _readplan.forward_of(module)).self_stored


def state_before(module: torch.nn.Module) -> tuple[dict, dict] | None:
    """(buffer state, scalar attributes its code assigns) of a module that has either; None
    for one with neither (most modules)."""
    state = module.__dict__
    buffers = state["_buffers"]
    stored = stored_scalars(module)
    if not buffers and not stored:
        return None
    scalars = {n: v for n in stored if type(v := state.get(n, MISSING)) in SCALAR_TYPES}
    return _buffer_state(buffers), scalars


def _buffer_state(buffers: dict, names: Iterable[str] | None = None) -> dict[str, tuple]:
    """Version and, for small buffers, a copy: BatchNorm's running statistics are written by
    ``native_batch_norm``, whose schema does not mark them mutable, so the version counter
    does not move."""
    state = {}
    with _compat.disable_dispatch_modes(), torch.no_grad():
        for name in buffers if names is None else names:
            tensor = buffers.get(name)
            if tensor is None:
                continue
            small = (
                not is_lazy(tensor)
                and tensor.device.type != "meta"
                and tensor.numel() <= SMALL_BUFFER
            )
            state[name] = (tensor._version, tensor.clone() if small else None)
    return state


def _buffer_changed(before: tuple, tensor: Any) -> bool:
    if tensor is None:
        return True
    version, copy = before
    if tensor._version != version:
        return True
    if copy is None:
        return False
    with _compat.disable_dispatch_modes(), torch.no_grad():
        return copy.shape != tensor.shape or not torch.equal(copy, tensor)


def _rebound(old: Any, new: Any) -> bool:
    """Whether a watched attribute (a scalar the forward changed) changed in the recompute:
    by value while it holds a scalar, else by identity (``!=`` on a tensor is elementwise)."""
    if type(new) in SCALAR_TYPES:
        return type(old) not in SCALAR_TYPES or new != old
    return new is not old


def written_by_forward(
    modules: Iterable[torch.nn.Module], before: dict[int, tuple[dict, dict]]
) -> tuple[dict[int, frozenset], list[Watched]]:
    """({id of a module: the buffers the forward itself updated}, the state to watch): the
    region's outputs, not its inputs; the recompute will update them again."""
    written: dict[int, frozenset] = {}
    watch: list[Watched] = []
    for module in modules:
        noted = before.get(id(module))
        if noted is None:
            continue
        buffer_state, scalars = noted
        state = module.__dict__
        buffers = state["_buffers"]
        names = tuple(n for n, old in buffer_state.items() if _buffer_changed(old, buffers.get(n)))
        # a scalar the forward changed (a counter); one it replaced by an object (a cache) is
        # not watched, as it is not on the following steps
        attrs = tuple(
            n
            for n, v in scalars.items()
            if type(new := state.get(n, MISSING)) in SCALAR_TYPES and new != v
        )
        if names:
            written[id(module)] = frozenset(names)
        if names or attrs:
            copies = {n: buffer_state[n][1] for n in names}
            watch.append((weakref.ref(module), names, attrs, copies))
    return written, watch


def state_before_recompute(watch: list[Watched]) -> list[BeforeRecompute]:
    state = []
    for ref, buffers, attrs, _ in watch:
        module = ref()
        if module is None:
            continue
        values = module.__dict__
        buffer_state = _buffer_state(module._buffers, buffers)
        state.append((module, buffer_state, attrs, tuple(values.get(a, MISSING) for a in attrs)))
    return state


# modules whose second update in a recompute was reported: once per module and run
_reported: weakref.WeakSet = weakref.WeakSet()


def updated_again(
    watched: list[BeforeRecompute], name_module: Callable[[torch.nn.Module], str]
) -> tuple[list[str], bool]:
    """(names of the state the recompute updated again, not reported before; whether all of
    it is normalisation statistics, which no gradient depends on)."""
    changed: list[str] = []
    statistics_only = True
    for module, buffer_state, attrs, scalars in watched:
        if module in _reported:
            continue  # once per module and run
        table, values = module._buffers, module.__dict__
        buffers = [n for n, old in buffer_state.items() if _buffer_changed(old, table.get(n))]
        attributes = [
            n for n, a in zip(attrs, scalars, strict=True) if _rebound(a, values.get(n, MISSING))
        ]
        if buffers or attributes:
            _reported.add(module)
            prefix = name_module(module)
            changed += [f"{prefix}.{n}" for n in (*buffers, *attributes)]
            statistics_only &= not attributes and _only_statistics(module, buffers)
    return changed, statistics_only


_NORMS_WITH_STATISTICS = (
    torch.nn.BatchNorm1d,
    torch.nn.BatchNorm2d,
    torch.nn.BatchNorm3d,
    torch.nn.SyncBatchNorm,
    torch.nn.InstanceNorm1d,
    torch.nn.InstanceNorm2d,
    torch.nn.InstanceNorm3d,
)
_STATISTICS = frozenset({"running_mean", "running_var", "num_batches_tracked"})


def _only_statistics(module: torch.nn.Module, buffers: list[str]) -> bool:
    """Running statistics of a normalisation layer in training, which computes its output
    from the batch's own statistics: updating them twice cannot change a gradient. Any other
    state a forward updates (power-iteration vectors, an EMA codebook, a counter feeding a
    schedule) may be what the recompute computes from."""
    return (
        isinstance(module, _NORMS_WITH_STATISTICS)
        and module.training
        and _STATISTICS.issuperset(buffers)
    )


# --------------------------------------------- state the recompute computes from, updated


class StateReads:
    """Watches the recompute of a region whose forward updated module state (an observer's
    statistics, a fake-quantization scale, spectral_norm's vectors, a counter buffer): the
    recompute starts from the forward's update, not from what the forward read. Each op that
    reads such a buffer before the recompute has written it again is run a second time with
    the buffer as it was before the forward (its copy) in its place; a result that differs is
    followed to what backward uses (``_divergence``). So the state is a mismatch where the
    recompute computes from the updated value and backward uses what it computed, and no more
    than a side effect where the output does not depend on it (a call counter). An op that
    cannot be run again (it draws random numbers, writes another input), or a buffer too large
    to have been copied, makes it a *may*. Normalisation statistics in training are left out:
    the layer computes from the batch's own statistics (See NOTE [ Outputs are not inputs ])."""

    def __init__(self, stale: dict[int, tuple[weakref.ref, Any, str]]) -> None:
        # id of a buffer -> (weak reference, its copy from before the forward or None, name)
        self.stale = stale
        self.divergence = Divergence(self._saved)
        self.ops = OpJudge(self)
        self.rerunning = False
        self.certain: tuple[str, str] | None = None  # (state, evidence) backward uses
        self.possible: tuple[str, str] | None = None
        self.failure: Exception | None = None  # reported by the region once the recompute ran

    def _saved(self, cause: Cause) -> None:
        name, evidence, certain = cause
        if certain and self.certain is None:
            self.certain = (name, evidence)
        elif not certain and self.possible is None:
            self.possible = (name, evidence)

    def __enter__(self) -> StateReads:
        self.divergence.__enter__()
        self.ops.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.ops.__exit__(*exc)
        self.divergence.__exit__(*exc)

    def decided(self) -> bool:
        """Whether a certain verdict was reached: no op needs judging any more."""
        return self.certain is not None

    def verdict(self) -> tuple[str, str, bool] | None:
        """(the state, the evidence, certain) of the first state backward used, or None."""
        if self.failure is not None:
            raise self.failure  # its dispatch mode's, noted inside the recompute
        found = self.certain or self.possible
        return None if found is None else (*found, found is self.certain)

    def look(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        divergence = self.divergence
        written = written_tensors(func, args, kwargs)
        inherited = divergence.consumed(args, kwargs)
        stale = self._stale_among((args, kwargs))
        if inherited is not None:  # computed from a value that differs: differs too
            divergence.differs((out, written), inherited)
        elif stale:
            self._judge(func, args, kwargs, out, stale, written)
        else:
            divergence.agrees(written)  # written from values that agree
        for tensor in written:  # written by the recompute: its own value from here on
            self.stale.pop(id(tensor), None)

    def _stale_among(self, values: Any) -> list:
        stale = self.stale
        if not stale:
            return []
        return [
            leaf
            for leaf in tree_leaves(values)
            if id(leaf) in stale and stale[id(leaf)][0]() is leaf
        ]

    def _judge(
        self, func: Any, args: tuple, kwargs: dict, out: Any, stale: list, written: list
    ) -> None:
        """Run the op again with the stale buffers as they were before the forward."""
        name = self.stale[id(stale[0])][2]
        where = f"{func} {_where()}"
        copies = {id(t): self.stale[id(t)][1] for t in stale}
        rerun = (
            None not in copies.values()
            and not draws_random_numbers(func, args, kwargs)
            and all(id(t) in copies for t in written)
        )
        if not rerun:
            evidence = f"{where}, which read {name} as the forward left it"
            self.divergence.differs((out, written), (name, evidence, False))
            return
        substitutes = {key: copy.clone() for key, copy in copies.items()}

        def as_before(value: Any) -> Any:
            return substitutes.get(id(value), value) if isinstance(value, torch.Tensor) else value

        self.rerunning = True
        try:
            again = func(*tree_map(as_before, args), **tree_map(as_before, kwargs))
        finally:
            self.rerunning = False
        rewritten = [substitutes[id(t)] for t in written]
        if same((out, written), (again, rewritten)):
            self.divergence.agrees(written)
        else:
            evidence = f"{where}, which read {name} as the forward left it and computed otherwise"
            self.divergence.differs((out, written), (name, evidence, True))


def state_reads(
    watch: list[Watched], name_module: Callable[[torch.nn.Module], str]
) -> StateReads | None:
    """A watch of the recompute, where the forward updated state other than normalisation
    statistics in training; None where it updated none (most regions)."""
    stale: dict[int, tuple[weakref.ref, Any, str]] = {}
    for ref, buffers, _, copies in watch:
        module = ref()
        if module is None or not buffers or _only_statistics(module, list(buffers)):
            continue
        table = module._buffers
        for name in buffers:
            tensor = table.get(name)
            copy = copies.get(name)
            if tensor is None or (copy is not None and _same_values(copy, tensor)):
                continue  # put back as it was: the recompute reads what the forward read
            stale[id(tensor)] = (weakref.ref(tensor), copy, f"{name_module(module)}.{name}")
    return StateReads(stale) if stale else None


def _same_values(copy: torch.Tensor, tensor: torch.Tensor) -> bool:
    with _compat.disable_dispatch_modes(), torch.no_grad():
        return (
            copy.shape == tensor.shape and copy.dtype == tensor.dtype and torch.equal(copy, tensor)
        )


def _where() -> str:
    frame = _user_frame()
    return f"(called at {frame[0]}:{frame[1]})" if frame is not None else "(in library code)"
