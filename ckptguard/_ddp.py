"""Reentrant regions under DistributedDataParallel: a parameter whose gradient two backward
passes of one step produce.

A ``use_reentrant=True`` region computes its parameters' gradients in a backward pass of its
own (``torch.autograd.backward`` inside ``CheckpointFunction.backward``), while DDP's reducer
expects one gradient per parameter and step and marks a parameter ready when its gradient
hook fires. Measured on torch 2.13 (gloo, 2 ranks, CPU):

* A parameter in two reentrant regions of one step (a module checkpointed twice, weights
  shared between regions), DDP without ``find_unused_parameters``: when the first of the two
  passes has made every bucket ready, DDP all-reduces and finishes the step inside it, and the
  second pass adds its gradient to each rank's own copy afterwards. No error, and every rank
  steps with a different gradient, none of them the average. (When the second pass reaches a
  parameter before the buckets are complete, DDP raises "Expected to mark a variable ready
  only once" instead.) The guard names it at the second region's forward, before any
  gradient exists.
* ``find_unused_parameters=True`` and any reentrant region: the region's forward runs under
  ``no_grad``, so at the forward's end DDP finds the region's parameters unused and marks them
  ready; the region's backward marks them again and DDP raises. The guard re-raises DDP's
  error (as ``__cause__``) naming the region, the parameter, why, and the fix.
* ``static_graph=True`` (DDP counts the hooks of each parameter), ``no_sync()`` (nothing is
  reduced) and ``use_reentrant=False`` (one backward pass) are right: nothing to report.

Only regions whose forward runs inside a DDP forward are tracked, so a process without DDP
pays one attribute read per reentrant region and one per reentrant backward.
"""

from __future__ import annotations

import re
import weakref
from typing import Any

import torch

from ckptguard import _compat, _explain
from ckptguard._barrier import stage
from ckptguard.errors import CheckpointGuardError

MARKED_TWICE = "Expected to mark a variable ready only once"
_PARAMETER = re.compile(
    r"Parameter at index (\d+)(?: with name (\S+))? has been marked as ready twice"
)

_steps: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # DDP -> _Step
_regions: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Region -> weakref(DDP)
_backpropagated: weakref.WeakSet = weakref.WeakSet()  # tracked regions whose backward ran
_tracking = False  # any region tracked yet: the backward wrapper's fast path until then


class _Step:
    """What one DDP reduces (its parameters by id, with their names as DDP's own
    ``named_parameters`` gives them) and, per parameter, the latest reentrant region whose
    backward pass will produce its gradient."""

    __slots__ = ("names", "users")

    def __init__(self, ddp: Any) -> None:
        ignored = getattr(ddp, "parameters_to_ignore", ())
        self.names: dict[int, str] = {
            id(p): name
            for name, p in ddp.named_parameters()
            if p.requires_grad and name.partition(".")[2] not in ignored
        }
        self.users: dict[int, weakref.ref] = {}


def reentrant_forward(region: Any, ddp: Any, args: tuple) -> None:
    """After the forward of a reentrant region that ran inside ``ddp``'s forward: record the
    parameters its backward pass will produce gradients for, and report those that another
    backward pass of this step produces too: a region still waiting for its backward, or the
    model's own graph, where the module already ran outside the region."""
    global _tracking
    if not ddp.require_backward_grad_sync or ddp.static_graph:
        return  # no_sync(): DDP reduces nothing; a static graph counts the hooks it expects
    step = _steps.get(ddp)
    if step is None:
        step = _steps[ddp] = _Step(ddp)
    _regions[region] = weakref.ref(ddp)
    _tracking = True
    mine = weakref.ref(region)
    own: dict[int, str] = {}
    clashes: dict[Any, dict[str, None]] = {}  # the other region -> names of shared parameters
    for module in region.modules:
        for parameter in module._parameters.values():
            if parameter is None or not parameter.requires_grad:
                continue
            key = id(parameter)
            name = step.names.get(key)
            if name is None:
                continue
            own[key] = name
            previous = step.users.get(key)
            other = previous() if previous is not None else None
            if other is not None and other is not region and other not in _backpropagated:
                clashes.setdefault(other, {})[name] = None
            step.users[key] = mine
    outside = _in_graph_of(args, own) if own else []
    if ddp.find_unused_parameters and not outside:
        return  # DDP raises in the region's own backward pass, explained there
    if clashes or outside:
        error = _explain.ddp_reused_parameters(
            region.name,
            [(other.name, list(names)) for other, names in clashes.items()],
            outside,
            ddp.find_unused_parameters,
        )
        _explain.report(error, region.options.on_mismatch, region.location())


MAX_GRAPH_NODES = 10_000  # nodes read per region, at most: a graph outside regions is small


def _in_graph_of(args: tuple, wanted: dict[int, str]) -> list[str]:
    """Names of the ``wanted`` parameters that the autograd graph of the region's inputs
    already holds (the module ran outside a region earlier in this forward), read up to the
    regions before it: their nodes hold no parameter of the model's graph."""
    region_node = _compat.reentrant_backward_node()
    stack: list[Any] = [
        a.grad_fn for a in args if isinstance(a, torch.Tensor) and a.grad_fn is not None
    ]
    # the nodes themselves, not their ids: torch makes a node's Python object on access and
    # frees it with its last reference, so the id of a node left behind is soon another's
    seen: set = set()
    found: dict[str, None] = {}
    while stack and len(seen) < MAX_GRAPH_NODES:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if type(node) is region_node:
            continue
        variable = getattr(node, "variable", None)  # AccumulateGrad: a leaf's gradient
        if variable is not None:
            name = wanted.get(id(variable))
            if name is not None:
                found[name] = None
            continue
        stack.extend(child for child, _ in node.next_functions)
    return list(found)


def guard_backward(original: Any, region_type: type) -> Any:
    """``CheckpointFunction.backward``, noting which tracked regions were backpropagated and
    explaining DDP's "marked ready twice" error raised by a region's backward pass."""

    def backward(ctx: Any, *grads: Any) -> Any:
        __tracebackhide__ = True  # a hook torch calls: pytest does not show it
        if not _tracking:
            return original(ctx, *grads)
        region = ctx.run_function
        if type(region) is not region_type or region not in _regions:
            return original(ctx, *grads)
        _backpropagated.add(region)
        try:
            return original(ctx, *grads)
        except RuntimeError as error:
            if isinstance(error, CheckpointGuardError) or MARKED_TWICE not in str(error):
                raise
            explained = _explain_marked_twice(region, error)
            if explained is None:  # torch's own error goes on
                raise
            raise explained from error

    return staticmethod(backward)


@stage("explain DistributedDataParallel's error in")
def _explain_marked_twice(region: Any, error: RuntimeError) -> CheckpointGuardError:
    ref = _regions.get(region)
    ddp = ref() if ref is not None else None
    message = str(error)
    found = _PARAMETER.search(message)
    parameter = None
    others: list[str] = []
    if ddp is not None and found is not None:
        step = _steps.get(ddp)
        key = None
        if found.group(2):
            parameter = f"module.{found.group(2)}"
            key = next((k for k, n in (step.names.items() if step else ()) if n == parameter), None)
        else:  # older torch names it only by its index in DDP's list of parameters
            reduced = _reduced_parameters(ddp)
            index = int(found.group(1))
            if index < len(reduced):
                key = id(reduced[index])
                parameter = step.names.get(key) if step is not None else None
        previous = step.users.get(key) if step is not None and key is not None else None
        other = previous() if previous is not None else None
        if other is not None and other is not region:
            others.append(other.name)
    find_unused = bool(getattr(ddp, "find_unused_parameters", False))
    return _explain.ddp_marked_twice(region.name, parameter, others, find_unused, message)


def _reduced_parameters(ddp: Any) -> list:
    """DDP's parameters in the reducer's order: the module's, deduplicated, that require
    grad and are not ignored."""
    ignored = getattr(ddp, "parameters_to_ignore", ())
    return [p for n, p in ddp.module.named_parameters() if p.requires_grad and n not in ignored]
