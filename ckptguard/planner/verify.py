"""Checking a plan on the real model: measured memory and time, and bit-identical gradients.

The activation peak is measured by the allocator, independently of the saved-tensor hooks the
planner's prediction is built from: on CUDA ``torch.cuda.max_memory_allocated`` above what was
allocated before the step; on CPU the running total of c10's CPU allocator, which the profiler
records at every allocation and free when ``profile_memory=True`` (every tensor allocation is
seen, frees included, so the maximum of that total is the true peak of tensor memory). Both steps
use the planner's protocol: gradients pre-allocated, same RNG state, buffers restored.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, cast

import torch

from ckptguard.planner import _torch
from ckptguard.planner.measure import LossFn, isolated_steps, run_step, synchronize
from ckptguard.planner.progress import progress
from ckptguard.pricing import format_bytes


@dataclass
class VerifyReport:
    """Predicted against measured, with and without the plan."""

    budget_bytes: int
    predicted_peak_bytes: int
    measured_peak_bytes: int
    unplanned_predicted_peak_bytes: int
    unplanned_measured_peak_bytes: int
    step_seconds: float
    unplanned_step_seconds: float
    predicted_recompute_seconds: float  # the plan's recompute time, from measured call times
    gradients_identical: bool
    differing_gradients: list[str] = field(default_factory=list)
    memory_source: str = ""

    @property
    def peak_error(self) -> float:
        """(predicted - measured) / measured, with the plan applied."""
        return (self.predicted_peak_bytes - self.measured_peak_bytes) / max(
            1, self.measured_peak_bytes
        )

    @property
    def predicted_step_seconds(self) -> float:
        """The unplanned step as measured here plus the recompute the plan predicts."""
        return self.unplanned_step_seconds + self.predicted_recompute_seconds

    @property
    def measured_recompute_seconds(self) -> float:
        return self.step_seconds - self.unplanned_step_seconds

    @property
    def budget_met(self) -> bool:
        return self.measured_peak_bytes <= self.budget_bytes

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["peak_error"] = self.peak_error
        data["budget_met"] = self.budget_met
        data["predicted_step_seconds"] = self.predicted_step_seconds
        data["measured_recompute_seconds"] = self.measured_recompute_seconds
        return data

    def __str__(self) -> str:
        rows = [
            f"ckptguard plan verify (memory: {self.memory_source})",
            f"{'':24}{'predicted':>12}{'measured':>12}{'error':>8}",
            _row("activation peak, plan", self.predicted_peak_bytes, self.measured_peak_bytes),
            _row(
                "activation peak, none",
                self.unplanned_predicted_peak_bytes,
                self.unplanned_measured_peak_bytes,
            ),
            f"budget {format_bytes(self.budget_bytes)}: "
            + ("met" if self.budget_met else "EXCEEDED"),
            _time_row("step time, plan", self.predicted_step_seconds, self.step_seconds),
            _time_row(
                "recompute added",
                self.predicted_recompute_seconds,
                self.measured_recompute_seconds,
            ),
            f"step time without the plan: {self.unplanned_step_seconds * 1e3:.1f} ms measured "
            f"(x{self.step_seconds / max(1e-12, self.unplanned_step_seconds):.2f} with it)",
            "gradients: bit-identical to the unplanned model"
            if self.gradients_identical
            else "gradients: DIFFER for " + ", ".join(self.differing_gradients[:8]),
        ]
        return "\n".join(rows)


def _row(label: str, predicted: int, measured: int) -> str:
    error = (predicted - measured) / max(1, measured)
    return f"{label:<24}{format_bytes(predicted):>12}{format_bytes(measured):>12}{error:>+8.1%}"


def _time_row(label: str, predicted: float, measured: float) -> str:
    error = (predicted - measured) / max(1e-12, abs(measured))
    return f"{label:<24}{predicted * 1e3:>9.1f} ms{measured * 1e3:>9.1f} ms{error:>+8.1%}"


def measured_peak(device: torch.device, step: Callable[[], None]) -> tuple[int, str]:
    """Peak tensor memory allocated by ``step`` above what was allocated before it."""
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        step()
        synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before, "torch.cuda.max_memory_allocated"
    from torch.profiler import ProfilerActivity

    with _torch.quiet_profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    allocations, _ = _torch.profiler_events(prof, device)
    if not allocations:
        return 0, "CPU allocator total (torch.profiler)"
    baseline = allocations[0].total - allocations[0].size
    return max(a.total for a in allocations) - baseline, "CPU allocator total (torch.profiler)"


def verify_plan(
    plan: Any,
    model: torch.nn.Module,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    loss_fn: LossFn | None,
    repeats: int,
) -> VerifyReport:
    """Run the step without and with ``plan`` (the model ends as it started)."""
    from ckptguard.planner.measure import model_device
    from ckptguard.planner.regions import transformers_as_planned

    device = model_device(model, args, kwargs)
    was_applied = plan.is_applied(model)
    if was_applied:
        plan.remove(model)
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    try:
        with transformers_as_planned(model), isolated_steps(model, device) as state:

            def step() -> None:
                run_step(model, args, kwargs, loss_fn)

            state.reset()
            progress("verify", "warm-up step")
            step()  # warm-up
            state.reset()
            progress("verify", "unplanned peak")
            unplanned_peak, source = measured_peak(device, step)
            state.reset()
            progress("verify", "unplanned gradients")
            step()
            reference = [cast(torch.Tensor, p.grad).clone() for p in state.params]
            plan.apply(model)
            state.reset()
            progress("verify", "planned gradients")
            step()
            differing = [
                name
                for name, p, ref in zip(names, state.params, reference, strict=True)
                if not torch.equal(cast(torch.Tensor, p.grad), ref)
            ]
            state.reset()
            progress("verify", "planned peak")
            planned_peak, _ = measured_peak(device, step)
            planned_times: list[float] = []
            unplanned_times: list[float] = []
            for repeat in range(repeats):  # interleaved: the machine's load hits both alike
                progress("verify", "timing steps with and without the plan", repeat + 1, repeats)
                for times, planned in ((planned_times, True), (unplanned_times, False)):
                    if planned != plan.is_applied(model):
                        (plan.apply if planned else plan.remove)(model)
                    state.reset()
                    synchronize(device)
                    start = time.perf_counter()
                    step()
                    synchronize(device)
                    times.append(time.perf_counter() - start)
    finally:
        if plan.is_applied(model) != was_applied:
            (plan.apply if was_applied else plan.remove)(model)
    return VerifyReport(
        budget_bytes=plan.budget_bytes,
        predicted_peak_bytes=plan.predicted_peak_bytes,
        measured_peak_bytes=planned_peak,
        unplanned_predicted_peak_bytes=plan.predicted_unplanned_peak_bytes,
        unplanned_measured_peak_bytes=unplanned_peak,
        step_seconds=statistics.median(planned_times),
        unplanned_step_seconds=statistics.median(unplanned_times),
        predicted_recompute_seconds=plan.recompute_seconds,
        gradients_identical=not differing,
        differing_gradients=differing,
        memory_source=source,
    )
