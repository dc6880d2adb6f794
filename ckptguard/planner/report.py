"""A plan as text, and its memory/recompute trade-off as a picture (the ``plot`` extra)."""

from __future__ import annotations

from typing import Any

from ckptguard.pricing import MIB, format_bytes


def format_plan(plan: Any) -> str:
    """Header with budget and predictions, then one row per region in forward order."""
    lines = [
        f"ckptguard plan for {plan.model or 'the model'}: budget {format_bytes(plan.budget_bytes)}"
        f", predicted activation peak {format_bytes(plan.predicted_peak_bytes)} "
        f"(unplanned {format_bytes(plan.predicted_unplanned_peak_bytes)} predicted, "
        f"{format_bytes(plan.measured_unplanned_peak_bytes)} measured)",
        f"recompute added per step: {plan.recompute_seconds * 1e3:.1f} ms, "
        f"{plan.recompute_flops / 1e9:.2f} GFLOP; {len(plan.regions)} regions"
        + ("" if plan.exact else " (memory rounded to a grid: optimal up to that rounding)"),
    ]
    if not plan.regions:
        lines.append("nothing to checkpoint: the unplanned step fits the budget")
        return "\n".join(lines)
    width = max(12, *(len(r.path) for r in plan.regions))
    header = (
        f"{'module path':<{width}}  {'choice':<9} {'MiB saved':>10} {'recompute ms':>12} "
        f"{'GFLOP':>8} {'cumulative MiB saved':>21}"
    )
    lines += [header, "-" * len(header)]
    cumulative = 0
    for region in plan.regions:
        cumulative += region.freed_bytes
        lines.append(
            f"{region.path:<{width}}  {region.kind:<9} {region.freed_bytes / MIB:>10.1f} "
            f"{region.recompute_seconds * 1e3:>12.2f} {region.recompute_flops / 1e9:>8.2f} "
            f"{cumulative / MIB:>21.1f}"
        )
    return "\n".join(lines)


def plot_data(plan: Any, points: int = 256) -> dict[str, Any]:
    """What the trade-off plot draws, in MiB and ms: the exact front (a staircase: each
    step holds its recompute time up to the next point's peak), this plan and every layer.
    The front is the least recompute time at each peak, so both marks lie on or above it."""
    curve = plan.tradeoff(points=points)
    every = plan.every_layer()
    data: dict[str, Any] = {
        "front": [(p["peak_bytes"] / MIB, p["recompute_seconds"] * 1e3) for p in curve],
        "plan": (plan.predicted_peak_bytes / MIB, plan.recompute_seconds * 1e3),
        "every_layer": None,
    }
    if every["choices"]:
        data["every_layer"] = (every["peak_bytes"] / MIB, every["recompute_seconds"] * 1e3)
    return data


def front_at(front: list[tuple[float, float]], peak: float) -> float:
    """The staircase's recompute time at ``peak``: that of the last front point at or below
    it (infinite below the least peak)."""
    below = [seconds for at, seconds in front if at <= peak]
    return below[-1] if below else float("inf")


def plot_tradeoff(plan: Any, path: str, points: int = 256) -> str:
    """Least recompute time against activation peak, the plan and "every layer" marked."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError(
            "plotting needs matplotlib: pip install matplotlib (or, from a clone of ckptlint, "
            "pip install -e '.[plot]')"
        ) from exc
    data = plot_data(plan, points)
    figure, axes = plt.subplots(figsize=(6, 4), dpi=100)
    front = data["front"]
    axes.step(
        [x for x, _ in front],
        [y for _, y in front],
        where="post",
        marker=".",
        label="planner optimum (exact front)",
    )
    axes.plot(
        *data["plan"],
        "o",
        markersize=9,
        label=f"this plan (budget {format_bytes(plan.budget_bytes)})",
    )
    if data["every_layer"] is not None:
        axes.plot(*data["every_layer"], "s", markersize=8, label="checkpoint every layer")
    axes.set_xlabel("predicted activation peak (MiB)")
    axes.set_ylabel("recompute added per step (ms)")
    axes.set_title(f"ckptguard plan: {plan.model or 'model'}")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return path
