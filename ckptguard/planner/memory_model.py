"""The planner's memory model: what a plan keeps after forward and what each moment needs on top.

The model is a tree of the model's module *calls* in forward order. Walking it with a running
prefix ``m`` (bytes kept alive by everything that ran before) gives the activation peak of a
plan as the largest of:

* ``m + forward_need`` while an item's forward runs,
* ``m + backward_need`` while an item's backward runs (for a checkpointed region that is the
  moment its recompute re-materialises all of it, on top of the prefix still alive),
* ``m_end + top_need`` after the forward (loss, the first gradients).

The needs are measured on the unplanned run (allocator peak within a window minus the bytes the
unplanned run had saved before that window), so transients the planner cannot name (gradient
buffers, temporaries, the recompute of the region being differentiated) are measured, not
guessed. Storages are charged once, at the lowest call that sees all of their uses, which is how
a tensor shared by neighbouring regions (one region's output is the next one's input) or by
siblings (q, k and v projections reading one input) is counted once. Pure arithmetic: no torch.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

KEEP = "keep"
FULL = "full"
SELECTIVE = "selective"
CHOICES = (KEEP, FULL, SELECTIVE)


@dataclass(frozen=True)
class Option:
    """Checkpointing one call as a region: ``full`` recompute or ``selective`` recompute."""

    kind: str
    kept_bytes: int  # alive after forward: inputs, RNG state (selective: matmul outputs too)
    forward_need: int  # above the prefix while the region's forward runs
    backward_need: int  # above the prefix while the region is recomputed and differentiated
    seconds: float  # measured recompute time added to backward
    flops: int  # recompute FLOPs (matmul, conv, attention)


@dataclass(frozen=True)
class Segment:
    """Work of a call that belongs to none of its child calls (or a leaf call's own work)."""

    kept_bytes: int  # storages charged here, alive from here to the matching backward
    forward_need: int  # above the prefix before ``kept_bytes`` while it runs forward
    backward_need: int  # above the prefix after ``kept_bytes`` while its backward runs


@dataclass
class CostNode:
    """One module call: its own work and child calls in forward order, and its region options."""

    path: str
    items: list[CostNode | Segment] = field(default_factory=list)
    options: tuple[Option, ...] = ()
    saved_bytes: int = 0  # charged inside this call when it is kept: what a region could free

    def walk(self) -> Iterator[CostNode]:
        yield self
        for item in self.items:
            if isinstance(item, CostNode):
                yield from item.walk()

    def option(self, kind: str) -> Option | None:
        return next((o for o in self.options if o.kind == kind), None)


@dataclass
class CostTree:
    """The costed call tree of one model on one set of example inputs."""

    root: CostNode
    top_need: int  # after the forward (loss and first gradients), above everything kept
    unplanned_peak: int  # measured activation peak of the unplanned step


@dataclass(frozen=True)
class Outcome:
    """What the model predicts for one plan."""

    peak_bytes: int
    kept_bytes: int  # alive at the end of the forward
    seconds: float  # recompute time added to a step
    flops: int


def evaluate(tree: CostTree, choices: Mapping[str, str]) -> Outcome:
    """Predicted activation peak, memory kept and recompute cost of ``choices`` (path -> kind).

    Paths not in ``choices`` are kept; a choice under a chosen ancestor is moot and ignored.
    """
    state = _Walk()
    _walk(tree.root, choices, state)
    state.peak = max(state.peak, state.prefix + tree.top_need)
    return Outcome(state.peak, state.prefix, state.seconds, state.flops)


@dataclass
class _Walk:
    prefix: int = 0
    peak: int = 0
    seconds: float = 0.0
    flops: int = 0


def _walk(node: CostNode, choices: Mapping[str, str], state: _Walk) -> None:
    kind = choices.get(node.path, KEEP)
    option = node.option(kind) if kind != KEEP else None
    if kind != KEEP and option is None:
        raise ValueError(f"{node.path!r} has no {kind!r} option")
    if option is not None:
        state.peak = max(
            state.peak,
            state.prefix + option.forward_need,
            state.prefix + option.backward_need,
        )
        state.prefix += option.kept_bytes
        state.seconds += option.seconds
        state.flops += option.flops
        return
    for item in node.items:
        if isinstance(item, Segment):
            state.peak = max(state.peak, state.prefix + item.forward_need)
            state.prefix += item.kept_bytes
            state.peak = max(state.peak, state.prefix + item.backward_need)
        else:
            _walk(item, choices, state)
