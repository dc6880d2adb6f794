"""Exact choice of regions: least recompute time whose predicted peak fits the budget.

Dynamic programming over the call tree in forward order. A state is (memory kept so far, recompute
seconds so far, the choices that led there); every constraint of :mod:`memory_model` only depends
on the memory kept so far, so a state that keeps more *and* costs more can never lead anywhere
its rival cannot, and dropping it loses no optimum (Pareto pruning). At a call the states either
go through its child calls (keep) or jump over it as a region (full or selective). The result is
the optimum of the model, not a heuristic; :func:`brute_force` in the tests checks that.

Only when the Pareto front grows past ``max_states`` are kept bytes rounded up to a grid of
budget/``grid_steps`` (conservative: the plan never needs more than predicted); the solution then
says ``exact=False``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ckptguard.planner.memory_model import CostNode, CostTree, Segment

# (path, kind, previous trail): choices as a shared linked list, cheap to extend per state.
Trail = tuple[str, str, Any] | None


class PlanInfeasibleError(ValueError):
    """No plan fits the budget; ``minimum_bytes`` is the least peak any plan reaches."""

    def __init__(
        self,
        budget_bytes: int,
        minimum_bytes: int,
        minimum_choices: dict[str, str],
        exact: bool = True,
    ):
        from ckptguard.pricing import format_bytes

        self.budget_bytes = budget_bytes
        self.minimum_bytes = minimum_bytes
        self.minimum_choices = minimum_choices
        self.exact = exact
        least = (
            "the least activation peak any plan reaches"
            if exact
            else (
                "the least activation peak a bounded search found (the model has too many choices"
                " for an exhaustive one; the true least may be lower)"
            )
        )
        super().__init__(
            f"no checkpoint plan fits an activation budget of {format_bytes(budget_bytes)}: "
            f"{least} on these inputs is "
            f"{format_bytes(minimum_bytes)} (with {len(minimum_choices)} regions); raise the "
            "budget to at least that, or reduce the batch or sequence length"
        )


@dataclass(frozen=True)
class Solution:
    choices: dict[str, str]
    exact: bool


def solve(
    tree: CostTree, budget: int, *, max_states: int = 20_000, grid_steps: int = 1 << 16
) -> Solution:
    """Choices with the least recompute seconds whose predicted peak is at most ``budget``.

    Raises :class:`PlanInfeasibleError` (with the least achievable peak) when none fits.
    """
    search = _CostSearch(budget, max_states, grid_steps)
    states = search.through(tree.root, [(0, 0.0, None)])
    feasible = [s for s in states if s[0] + tree.top_need <= budget]
    if not feasible:
        minimum, choices, exact = least_peak(tree)
        raise PlanInfeasibleError(budget, minimum, choices, exact)
    best = min(feasible, key=lambda s: (s[1], s[0]))
    return Solution(_choices(best[2]), search.exact)


def least_peak(tree: CostTree, *, max_states: int = 20_000) -> tuple[int, dict[str, str], bool]:
    """The least predicted peak any plan reaches, a plan reaching it (same DP, peak-wise), and
    whether the search was exhaustive (False: it thinned a front past ``max_states``, so the
    peak is one a plan reaches, not necessarily the least)."""
    search = _PeakSearch(max_states)
    states = search.through(tree.root, [(0, 0, None)])
    final = [(max(peak, m + tree.top_need), m, trail) for m, peak, trail in states]
    peak, _, trail = min(final, key=lambda s: (s[0], s[1]))
    return peak, _choices(trail), search.exact


def _choices(trail: Trail) -> dict[str, str]:
    chosen = {}
    while trail is not None:
        path, kind, trail = trail
        chosen[path] = kind
    return dict(sorted(chosen.items()))


class _CostSearch:
    """States (kept bytes, seconds, trail) under a fixed budget."""

    def __init__(self, budget: int, max_states: int, grid_steps: int) -> None:
        self.budget = budget
        self.max_states = max_states
        self.grid = max(1, math.ceil(budget / grid_steps))
        self.exact = True

    def through(self, node: CostNode, states: list) -> list:
        budget = self.budget
        results = []
        for option in node.options:
            need = max(option.forward_need, option.backward_need)
            results += [
                (m + option.kept_bytes, cost + option.seconds, (node.path, option.kind, trail))
                for m, cost, trail in states
                if m + need <= budget
            ]
        kept = states
        for item in node.items:
            if not kept:
                break
            if isinstance(item, Segment):
                kept = [
                    (m + item.kept_bytes, cost, trail)
                    for m, cost, trail in kept
                    if m + item.forward_need <= budget
                    and m + item.kept_bytes + item.backward_need <= budget
                ]
            else:
                kept = self.through(item, kept)
        return self.prune(kept + results)

    def prune(self, states: Iterable) -> list:
        front = _pareto(states)
        if len(front) > self.max_states:
            self.exact = False
            grid = self.grid
            front = _pareto((-(-m // grid) * grid, cost, trail) for m, cost, trail in front)
        return front


class _PeakSearch:
    """States (kept bytes, peak so far, trail), budget-free."""

    def __init__(self, max_states: int) -> None:
        self.max_states = max_states
        self.exact = True

    def through(self, node: CostNode, states: list) -> list:
        results = []
        for option in node.options:
            results += [
                (
                    m + option.kept_bytes,
                    max(peak, m + option.forward_need, m + option.backward_need),
                    (node.path, option.kind, trail),
                )
                for m, peak, trail in states
            ]
        kept = states
        for item in node.items:
            if isinstance(item, Segment):
                kept = [
                    (
                        m + item.kept_bytes,
                        max(peak, m + item.forward_need, m + item.kept_bytes + item.backward_need),
                        trail,
                    )
                    for m, peak, trail in kept
                ]
            else:
                kept = self.through(item, kept)
        front = _pareto(kept + results)
        if len(front) > self.max_states:  # keep an evenly spread, still optimal-at-ends subset
            self.exact = False
            step = len(front) / self.max_states
            front = [front[int(i * step)] for i in range(self.max_states)] + [front[-1]]
        return front


def _pareto(states: Iterable) -> list:
    """States not dominated in (first, second), both minimised; stable, so ties keep the first."""
    front = []
    best = math.inf
    for state in sorted(states, key=lambda s: (s[0], s[1])):
        if state[1] < best:
            front.append(state)
            best = state[1]
    return front
