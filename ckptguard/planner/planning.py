"""``ckptguard.plan``: which modules to checkpoint for a memory budget, and the Plan it returns."""

from __future__ import annotations

import re
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from ckptguard.planner.memory_model import CHOICES, KEEP, CostTree, Option, evaluate
from ckptguard.planner.solver import least_peak, solve

if TYPE_CHECKING:
    from ckptguard.planner.verify import VerifyReport

FORMAT_VERSION = 1
_UNITS = {"b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
_UNITS |= {"kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "k": 1 << 10, "m": 1 << 20}
_UNITS |= {"g": 1 << 30}


def parse_budget(budget: str | int | float, unplanned_peak: int) -> int:
    """Bytes from ``"2GiB"``, ``"512MB"``, an int of bytes, or a float fraction in (0, 1] of the
    unplanned activation peak."""
    if isinstance(budget, bool):
        raise TypeError("budget must be a size like '2GiB', a number of bytes or a fraction")
    if isinstance(budget, float):
        if not 0 < budget <= 1:
            raise ValueError(f"a fractional budget must be in (0, 1], got {budget}")
        return int(budget * unplanned_peak)
    if isinstance(budget, int):
        if budget <= 0:
            raise ValueError(f"budget must be positive, got {budget}")
        return budget
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(budget))
    unit = match and (match.group(2).lower() or "b")
    if not match or unit not in _UNITS:
        raise ValueError(
            f"cannot read budget {budget!r}: use e.g. '2GiB', '512MiB', '1.5GB' or a fraction"
        )
    return int(float(match.group(1)) * _UNITS[unit])


@dataclass(frozen=True)
class Region:
    """One chosen region, as planned."""

    path: str
    kind: str
    saved_bytes: int  # activation bytes the unplanned call keeps
    kept_bytes: int  # what the region keeps instead
    recompute_seconds: float
    recompute_flops: int

    @property
    def freed_bytes(self) -> int:
        return self.saved_bytes - self.kept_bytes


@dataclass
class Plan:
    """The modules to checkpoint, what the planner predicts, and how to apply and check it."""

    regions: list[Region]
    budget_bytes: int
    predicted_peak_bytes: int
    predicted_unplanned_peak_bytes: int
    measured_unplanned_peak_bytes: int
    recompute_seconds: float
    recompute_flops: int
    exact: bool = True
    model: str = ""
    tree: CostTree | None = field(default=None, repr=False, compare=False)
    _applied: Any = field(default_factory=weakref.WeakKeyDictionary, repr=False, compare=False)

    @property
    def choices(self) -> dict[str, str]:
        return {region.path: region.kind for region in self.regions}

    # -- applying ------------------------------------------------------------------------------

    def apply(self, model: Any) -> Plan:
        """Make the chosen modules checkpoint regions (non-reentrant); returns the plan."""
        from ckptguard.planner.regions import apply_regions

        model = unwrap(model)
        if model in self._applied:
            raise RuntimeError("this plan is already applied to the model")
        self._applied[model] = apply_regions(model, self.choices)
        return self

    def remove(self, model: Any) -> None:
        """Undo :meth:`apply`: the model is left exactly as before."""
        from ckptguard.planner.regions import remove_regions

        model = unwrap(model)
        remove_regions(model, self.choices, self._applied.pop(model, None))

    def is_applied(self, model: Any) -> bool:
        return unwrap(model) in self._applied

    def verify(
        self,
        model: Any,
        *example_inputs: Any,
        loss_fn: Any = None,
        repeats: int = 3,
        quiet: bool = False,
        **example_kwargs: Any,
    ) -> VerifyReport:
        """Measure the step with and without the plan (memory, time) and compare gradients;
        ``print`` the report for a table. Progress goes to stderr (a bar on a terminal, a line
        per stage elsewhere) unless ``quiet``."""
        from ckptguard.planner.progress import shown
        from ckptguard.planner.verify import verify_plan

        _validate(model, loss_fn)
        if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
            raise ValueError(f"repeats must be a positive int, got {repeats!r}")
        with shown(quiet):
            return verify_plan(
                self, unwrap(model), example_inputs, example_kwargs, loss_fn, repeats=repeats
            )

    # -- the trade-off ---------------------------------------------------------------------------

    def tradeoff(self, budgets: Sequence[int] | None = None, points: int = 256) -> list[dict]:
        """Least recompute time per budget, from the costs already measured. Default: the
        exact front, every plan where the least recompute time steps down (walking from the
        unplanned peak down to the least achievable one, at most ``points`` of them), so any
        plan, this one included, lies on or above it; else the optimum at each of ``budgets``."""
        tree = self._require_tree()
        if budgets is None:
            return _front(tree, points)
        curve = []
        for budget in budgets:
            try:
                choices = solve(tree, budget).choices
            except ValueError:
                continue
            outcome = evaluate(tree, choices)
            curve.append(_curve_point(budget, outcome.peak_bytes, outcome.seconds, choices))
        return curve

    def every_layer(self) -> dict[str, Any]:
        """The usual alternative, priced by the same model: every layer of the model's longest
        stack of numbered layers checkpointed in full."""
        tree = self._require_tree()
        choices = every_layer_choices(tree)
        outcome = evaluate(tree, choices)
        return {
            "choices": choices,
            "peak_bytes": outcome.peak_bytes,
            "recompute_seconds": outcome.seconds,
        }

    def plot(self, path: str, points: int = 256) -> str:
        """Draw the memory/recompute trade-off to ``path`` (needs the ``plot`` extra)."""
        from ckptguard.planner.report import plot_tradeoff

        return plot_tradeoff(self, path, points=points)

    def _require_tree(self) -> CostTree:
        if self.tree is None:
            raise RuntimeError(
                "this plan was loaded with from_dict and has no measured costs; "
                "plan the model again for the trade-off"
            )
        return self.tree

    # -- saving ------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable: save it with the run's config, apply it again with from_dict."""
        return {
            "format": FORMAT_VERSION,
            "model": self.model,
            "budget_bytes": self.budget_bytes,
            "predicted_peak_bytes": self.predicted_peak_bytes,
            "predicted_unplanned_peak_bytes": self.predicted_unplanned_peak_bytes,
            "measured_unplanned_peak_bytes": self.measured_unplanned_peak_bytes,
            "recompute_seconds": self.recompute_seconds,
            "recompute_flops": self.recompute_flops,
            "exact": self.exact,
            "regions": [
                {
                    "path": r.path,
                    "kind": r.kind,
                    "saved_bytes": r.saved_bytes,
                    "kept_bytes": r.kept_bytes,
                    "recompute_seconds": r.recompute_seconds,
                    "recompute_flops": r.recompute_flops,
                }
                for r in self.regions
            ],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        """The plan :meth:`to_dict` saved (without the measured costs behind it)."""
        if data.get("format") != FORMAT_VERSION:
            raise ValueError(f"unsupported plan format {data.get('format')!r}")
        regions = [Region(**region) for region in data["regions"]]
        for region in regions:
            if region.kind not in CHOICES or region.kind == KEEP:
                raise ValueError(f"unknown region kind {region.kind!r} for {region.path!r}")
        return cls(
            regions=regions,
            budget_bytes=int(data["budget_bytes"]),
            predicted_peak_bytes=int(data["predicted_peak_bytes"]),
            predicted_unplanned_peak_bytes=int(data["predicted_unplanned_peak_bytes"]),
            measured_unplanned_peak_bytes=int(data["measured_unplanned_peak_bytes"]),
            recompute_seconds=float(data["recompute_seconds"]),
            recompute_flops=int(data["recompute_flops"]),
            exact=bool(data["exact"]),
            model=str(data.get("model", "")),
        )

    def __str__(self) -> str:
        from ckptguard.planner.report import format_plan

        return format_plan(self)


def _front(tree: CostTree, points: int) -> list[dict]:
    """The exact trade-off front: from the unplanned peak down, the optimal plan for a budget
    one byte below the previous plan's peak, until no plan fits (each is a step of the least
    recompute time as a function of the budget), in order of rising peak."""
    low, _, _ = least_peak(tree)
    budget = max(low, evaluate(tree, {}).peak_bytes)
    curve: list[dict] = []
    while len(curve) < points and budget >= low:
        try:
            choices = solve(tree, budget).choices
        except ValueError:
            break
        outcome = evaluate(tree, choices)
        curve.append(_curve_point(budget, outcome.peak_bytes, outcome.seconds, choices))
        budget = outcome.peak_bytes - 1
    return curve[::-1]


def _validate(model: Any, loss_fn: Any) -> None:
    import torch

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if loss_fn is not None and not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable or None, got {type(loss_fn).__name__}")


def every_layer_choices(tree: CostTree) -> dict[str, str]:
    """Full regions on the children of the container with the most numbered children that can
    be regions (a ModuleList or Sequential of layers: ``model.layers.0``, ``blocks.3``)."""
    stacks: dict[str, list[str]] = {}
    for node in tree.root.walk():
        parent, _, name = node.path.rpartition(".")
        if name.isdigit() and node.option("full") is not None:
            stacks.setdefault(parent, []).append(node.path)
    if not stacks:
        return {}
    longest = max(stacks.values(), key=len)
    return dict.fromkeys(longest, "full")


def unwrap(model: Any) -> Any:
    """The module inside DistributedDataParallel / DataParallel (paths are relative to it)."""
    import torch

    wrappers = (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)
    while isinstance(model, wrappers):
        model = model.module
    return model


def plan(
    model: Any,
    *example_inputs: Any,
    budget: str | int | float,
    loss_fn: Any = None,
    quiet: bool = False,
    **example_kwargs: Any,
) -> Plan:
    """Choose what to checkpoint so one training step fits ``budget`` at least recompute time.

    ``budget``: activation memory as ``"2GiB"`` / ``"512MB"`` / bytes, or a fraction of the
    unplanned activation peak (``0.5``). The model is measured once on the example inputs in the
    mode it is in (``train()`` for dropout), with ``loss_fn(output)`` as the loss (default: the
    output's ``loss``, else the sum of its floating-point outputs). Raises
    :class:`~ckptguard.planner.solver.PlanInfeasibleError` with the least achievable peak when
    no plan fits. Under torch.distributed, rank 0 plans and every rank receives its plan, so all
    ranks apply the same regions. Progress goes to stderr (a bar on a terminal, a line per
    stage elsewhere) unless ``quiet``.
    """
    import torch.distributed as dist

    from ckptguard.planner.progress import shown

    _validate(model, loss_fn)
    parse_budget(budget, 1)  # its form, before the model is measured (fractions need the peak)
    with shown(quiet):
        return _plan_distributed(model, example_inputs, example_kwargs, budget, loss_fn, dist)


def _plan_distributed(
    model: Any,
    example_inputs: Sequence[Any],
    example_kwargs: Mapping[str, Any],
    budget: str | int | float,
    loss_fn: Any,
    dist: Any,
) -> Plan:
    distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    if not distributed:
        return _plan_here(unwrap(model), example_inputs, example_kwargs, budget, loss_fn)
    payload: list[Any] = [None]
    if dist.get_rank() == 0:
        try:
            planned = _plan_here(unwrap(model), example_inputs, example_kwargs, budget, loss_fn)
            payload = [planned.to_dict()]
        except Exception as exc:  # every rank must leave the broadcast, then all raise
            payload = [exc]
    dist.broadcast_object_list(payload, src=0)
    if isinstance(payload[0], Exception):
        raise payload[0]
    return planned if dist.get_rank() == 0 else Plan.from_dict(payload[0])


def _plan_here(
    model: Any,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    budget: str | int | float,
    loss_fn: Any,
) -> Plan:
    from ckptguard.planner.candidates import build_cost_tree
    from ckptguard.planner.measure import measure
    from ckptguard.planner.regions import is_region, transformers_as_planned

    if any(is_region(m) for m in model.modules()):
        raise RuntimeError("the model has a plan applied; remove it before planning again")
    from ckptguard.planner.progress import progress

    with transformers_as_planned(model):
        trace = measure(model, args, kwargs, loss_fn)
    progress("plan", "costing the call tree")
    tree = build_cost_tree(trace)
    progress("plan", "solving")
    return plan_from_tree(tree, parse_budget(budget, tree.unplanned_peak), type(model).__name__)


def plan_from_tree(tree: CostTree, budget_bytes: int, model_name: str = "") -> Plan:
    """The optimal plan for ``budget_bytes`` on an already costed tree."""
    solution = solve(tree, budget_bytes)
    return plan_for_choices(tree, solution.choices, budget_bytes, model_name, solution.exact)


def plan_for_choices(
    tree: CostTree,
    choices: Mapping[str, str],
    budget_bytes: int,
    model_name: str = "",
    exact: bool = True,
) -> Plan:
    """A plan of given regions, priced by the model (e.g. :func:`every_layer_choices`)."""
    outcome = evaluate(tree, choices)
    nodes = {node.path: node for node in tree.root.walk() if node.options}
    order = {node.path: i for i, node in enumerate(tree.root.walk())}
    regions = []
    for path in sorted(choices, key=order.__getitem__):
        node = nodes[path]
        option = cast(Option, node.option(choices[path]))  # a choice is one of its options
        regions.append(
            Region(
                path, option.kind, node.saved_bytes, option.kept_bytes, option.seconds, option.flops
            )
        )
    return Plan(
        regions=regions,
        budget_bytes=budget_bytes,
        predicted_peak_bytes=outcome.peak_bytes,
        predicted_unplanned_peak_bytes=evaluate(tree, {}).peak_bytes,
        measured_unplanned_peak_bytes=tree.unplanned_peak,
        recompute_seconds=outcome.seconds,
        recompute_flops=outcome.flops,
        exact=exact,
        model=model_name,
        tree=tree,
    )


def _curve_point(budget: int, peak: int, seconds: float, choices: dict) -> dict:
    """One point of a trade-off curve, as ``tradeoff()`` and the plot report it."""
    return {
        "budget_bytes": budget,
        "peak_bytes": peak,
        "recompute_seconds": seconds,
        "regions": len(choices),
    }
