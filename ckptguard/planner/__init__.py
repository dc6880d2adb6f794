"""ckptguard.plan: choose what to checkpoint for a memory budget, from measured prices.

Layers, in the order a plan is made: :mod:`measure` (one profiled step of the unplanned model),
:mod:`candidates` (the costed call tree), :mod:`memory_model` (what a plan keeps and needs),
:mod:`solver` (the exact optimum), :mod:`regions` (apply / remove), :mod:`verify` (measured
against predicted), :mod:`report` (table and plot); :mod:`planning` ties them together.
"""

from ckptguard.planner.planning import (
    Plan,
    Region,
    every_layer_choices,
    parse_budget,
    plan,
    plan_for_choices,
    plan_from_tree,
)
from ckptguard.planner.solver import PlanInfeasibleError

__all__ = [
    "Plan",
    "PlanInfeasibleError",
    "Region",
    "every_layer_choices",
    "parse_budget",
    "plan",
    "plan_for_choices",
    "plan_from_tree",
]
