"""From a measured step to the costed call tree the solver works on.

Every submodule call is a candidate region (any depth), except the model itself and modules
called more than once per step (a choice would apply to all their calls at once). Options per
candidate: ``full`` recompute and ``selective`` recompute, each with the bytes it keeps, the
memory its forward and its recompute need on top of what is kept before it, its measured
recompute time and FLOPs. Options that would keep as much as the call saves are left out.

Where a storage is charged (see :mod:`memory_model`): at the lowest call that sees all of its
uses (saved by an op, or passed as a call's input). While that call is kept the storage is
counted there once, however many of its children use it; if that call is a region the storage
is kept only if it is one of the region's inputs. A storage that autograd never saves is kept
only as some region's input.
"""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from ckptguard.planner.measure import Call, Trace
from ckptguard.planner.memory_model import (
    FULL,
    SELECTIVE,
    CostNode,
    CostTree,
    Option,
    Segment,
)

OUTSIDE = -1  # a use outside the model's forward (the loss): charged at the model itself


@dataclass
class _Window:
    start: int
    end: int


def build_cost_tree(trace: Trace) -> CostTree:
    """The costed call tree of ``trace`` (see the module docstring)."""
    return _Builder(trace).build()


class _Builder:
    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self.calls = trace.calls
        if not self.calls:
            raise ValueError("the model ran no module call: nothing to plan")
        self.depth = [0] * len(self.calls)
        for call in self.calls:
            if call.parent is not None:
                self.depth[call.index] = self.depth[call.parent] + 1
        counts: dict[str, int] = defaultdict(int)
        for call in self.calls:
            counts[call.path] += 1
        self.call_counts = counts
        self._storages()
        self._saved_prefix()
        self._backward_windows()

    # -- storages ------------------------------------------------------------------------------

    def _storages(self) -> None:
        self.nbytes: dict[int, int] = {}
        self.first_pack: dict[int, int] = {}
        saved_uses: dict[int, set[int]] = defaultdict(set)
        self.saved_in: list[set[int]] = [set() for _ in self.calls]  # subtree's saved storages
        self.last_pack: list[int | None] = [None] * len(self.calls)
        for pack in self.trace.packs:
            if pack.storage is None:
                continue
            self.nbytes[pack.storage] = pack.nbytes
            self.first_pack.setdefault(pack.storage, pack.time_ns)
            saved_uses[pack.storage].add(OUTSIDE if pack.call is None else pack.call)
            for index in self._ancestors(pack.call):
                self.saved_in[index].add(pack.storage)
                self.last_pack[index] = pack.time_ns
        input_uses: dict[int, set[int]] = defaultdict(set)
        for call in self.calls:
            for storage, nbytes in call.inputs:
                if storage is not None:
                    self.nbytes.setdefault(storage, nbytes)
                    input_uses[storage].add(call.index)
        self.owner: dict[int, int] = {}
        for storage, uses in saved_uses.items():
            nodes = uses | input_uses.get(storage, set())
            self.owner[storage] = 0 if OUTSIDE in nodes else self._lca(nodes)

    def _ancestors(self, index: int | None) -> list[int]:
        chain = []
        while index is not None:
            chain.append(index)
            index = self.calls[index].parent
        return chain

    def _lca(self, nodes: set[int]) -> int:
        it = iter(nodes)
        lca = next(it)
        for other in it:
            # the walk ends at None when the nodes hang from different top-level calls
            a: Any = lca
            b: Any = other
            while self.depth[a] > self.depth[b]:
                a = self.calls[a].parent
            while self.depth[b] > self.depth[a]:
                b = self.calls[b].parent
            while a != b:
                a, b = self.calls[a].parent, self.calls[b].parent
            lca = a
        return lca

    def _saved_prefix(self) -> None:
        firsts = sorted((t, self.nbytes[s]) for s, t in self.first_pack.items())
        self._prefix_times = [t for t, _ in firsts]
        self._prefix_bytes = list(itertools.accumulate(b for _, b in firsts))

    def saved_before(self, time_ns: int) -> int:
        """Bytes the unplanned step had saved by ``time_ns`` (alive until backward)."""
        position = bisect.bisect_right(self._prefix_times, time_ns)
        return self._prefix_bytes[position - 1] if position else 0

    # -- windows -------------------------------------------------------------------------------

    def _atomic_items(self) -> list[tuple[int, int, int, int, int]]:
        """(call, gap index or -1 for a leaf, seq_lo, seq_hi, forward start) of every piece of
        work that belongs to exactly one call and none of its children."""
        items = []
        for call in self.calls:
            if not call.children:
                items.append((call.index, -1, call.seq_lo, call.seq_hi, call.start_ns))
                continue
            for k in range(len(call.children) + 1):
                lo, hi = self._gap_seq(call, k)
                items.append((call.index, k, lo, hi, self._gap_time(call, k)[0]))
        return items

    def _gap_time(self, call: Call, k: int) -> tuple[int, int]:
        children = [self.calls[i] for i in call.children]
        start = call.start_ns if k == 0 else children[k - 1].end_ns
        end = children[k].start_ns if k < len(children) else call.end_ns
        return start, end

    def _gap_seq(self, call: Call, k: int) -> tuple[int, int]:
        children = [self.calls[i] for i in call.children]
        lo = call.seq_lo if k == 0 else children[k - 1].seq_hi
        hi = children[k].seq_lo if k < len(children) else call.seq_hi
        return lo, hi

    def _backward_windows(self) -> None:
        """Backward time of each atomic item: from its first backward node to the next item's
        first node (so the windows tile the whole backward), and the top window before them."""
        items = self._atomic_items()
        by_seq = sorted((lo, hi, n) for n, (_, _, lo, hi, _) in enumerate(items) if hi > lo)
        starts = [lo for lo, _, _ in by_seq]
        first: dict[int, int] = {}
        root = self.calls[0]
        top_end = self.trace.step_end_ns
        for node in self.trace.backward:
            position = bisect.bisect_right(starts, node.sequence_nr) - 1
            if position < 0 or node.sequence_nr >= by_seq[position][1]:
                continue  # the loss's nodes, or nodes made outside any module
            item = by_seq[position][2]
            first.setdefault(item, node.start_ns)
        ordered = sorted((start, item) for item, start in first.items())
        self.item_backward: dict[tuple[int, int], _Window] = {}
        for position, (start, item) in enumerate(ordered):
            end = ordered[position + 1][0] if position + 1 < len(ordered) else top_end
            call, gap = items[item][0], items[item][1]
            self.item_backward[(call, gap)] = _Window(start, max(start, end))
        self.top_window = _Window(root.end_ns, ordered[0][0] if ordered else top_end)

    def _call_backward(self, index: int) -> _Window | None:
        call = self.calls[index]
        keys = [(index, -1)] + [(index, k) for k in range(len(call.children) + 1)]
        windows = [self.item_backward[key] for key in keys if key in self.item_backward]
        for child in call.children:
            child_window = self._call_backward(child)
            if child_window is not None:
                windows.append(child_window)
        if not windows:
            return None
        return _Window(min(w.start for w in windows), max(w.end for w in windows))

    # -- the tree ------------------------------------------------------------------------------

    def build(self) -> CostTree:
        trace = self.trace
        self._charges()
        self._forward_over: dict[int, int] = {}
        root = self._node(0)
        top_need = trace.peak_between(self.top_window.start, self.top_window.end)
        top_need -= self.saved_before(self.calls[0].end_ns)
        return CostTree(root=root, top_need=max(0, top_need), unplanned_peak=trace.peak)

    def _charges(self) -> None:
        """Bytes charged to each gap of each call (and to each leaf call)."""
        self.charge: dict[tuple[int, int], int] = defaultdict(int)
        for storage, owner in self.owner.items():
            call = self.calls[owner]
            first = self.first_pack[storage]
            if owner == 0 and first > call.end_ns:
                continue  # saved only by the loss: part of the top window
            if not call.children:
                self.charge[(owner, -1)] += self.nbytes[storage]
                continue
            gap = sum(1 for child in call.children if self.calls[child].end_ns < first)
            self.charge[(owner, gap)] += self.nbytes[storage]

    def _segment(self, call: Call, gap: int) -> tuple[Segment, int]:
        trace = self.trace
        start, end = (call.start_ns, call.end_ns) if gap < 0 else self._gap_time(call, gap)
        forward_over = trace.peak_between(start, end) - self.saved_before(start)
        window = self.item_backward.get((call.index, gap))
        backward_need = 0
        if window is not None:
            backward_need = trace.peak_between(window.start, window.end) - self.saved_before(end)
        kept = self.charge.get((call.index, gap), 0)
        return Segment(kept, max(0, forward_over), max(0, backward_need)), forward_over

    def _node(self, index: int) -> CostNode:
        call = self.calls[index]
        node = CostNode(path=call.path)
        forward_over = 0
        gaps = [-1] if not call.children else range(len(call.children) + 1)
        for k, child in zip(gaps, [*call.children, None], strict=False):
            segment, over = self._segment(call, k)
            node.items.append(segment)
            node.saved_bytes += segment.kept_bytes
            forward_over = max(forward_over, over)
            if child is not None:
                child_node = self._node(child)
                node.items.append(child_node)
                node.saved_bytes += child_node.saved_bytes
                forward_over = max(forward_over, self._forward_over[child])
        self._forward_over[index] = forward_over
        node.options = self._options(call, node, forward_over)
        return node

    def _options(self, call: Call, node: CostNode, forward_over: int) -> tuple[Option, ...]:
        if call.index == 0 or self.call_counts[call.path] > 1 or node.saved_bytes <= 0:
            return ()
        window = self._call_backward(call.index)
        if window is None:
            return ()
        # While the region's backward runs, its RNG stash is alive too (the unplanned step had
        # none), and so are cached selective outputs that autograd itself never saved.
        overhead = self.trace.region_overhead_bytes
        backward_need = self.trace.peak_between(window.start, window.end)
        backward_need = max(0, backward_need - self.saved_before(call.start_ns)) + overhead
        inputs = {
            storage: nbytes
            for storage, nbytes in call.inputs
            if storage is not None and self.owner.get(storage, call.index) == call.index
        }
        kept_full = sum(inputs.values()) + overhead
        timing = self.trace.timings[call.index]
        subtree = set(self._subtree(call.index))
        last = self.last_pack[call.index]
        recompute_ops = [
            op
            for op in self.trace.ops
            if op.call in subtree and last is not None and op.time_ns <= last
        ]
        options = []
        if kept_full < node.saved_bytes:
            options.append(
                Option(
                    FULL,
                    kept_full,
                    kept_full + forward_over,
                    backward_need,
                    timing.recompute_seconds,
                    sum(op.flops for op in recompute_ops),
                )
            )
        kept_outputs: dict[int, int] = {}
        for op in self.trace.ops:
            if op.must_save and op.call in subtree:
                for storage, nbytes in op.outputs:
                    owner = self.owner.get(storage)
                    if (
                        storage is not None
                        and storage not in inputs
                        and (owner is None or owner in subtree)
                    ):
                        kept_outputs[storage] = nbytes
        kept_selective = kept_full + sum(kept_outputs.values())
        if kept_outputs and kept_selective < node.saved_bytes:
            options.append(
                Option(
                    SELECTIVE,
                    kept_selective,
                    kept_selective + forward_over,
                    backward_need
                    + sum(b for s, b in kept_outputs.items() if s not in self.first_pack),
                    timing.recompute_seconds * (1.0 - timing.must_save_share),
                    sum(op.flops for op in recompute_ops if not op.must_save),
                )
            )
        return tuple(options)

    def _subtree(self, index: int) -> list[int]:
        result = [index]
        for child in self.calls[index].children:
            result += self._subtree(child)
        return result
