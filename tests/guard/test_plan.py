"""ckptguard.plan on real models: apply/remove, gradients, prediction, saving, transformers."""

from __future__ import annotations

import json
import re
import sys
import warnings

import pytest
import torch
from torch import nn

import ckptguard
from ckptguard.planner import Plan, PlanInfeasibleError
from ckptguard.planner.regions import is_region
from tests.conftest import SUBPROCESS_TIMEOUT


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, 4, dropout=0.1, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.drop = nn.Dropout(0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.drop(self.mlp(self.norm(x)))


class Net(nn.Module):
    def __init__(self, dim: int = 32, depth: int = 3) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim) for _ in range(depth))
        self.head = nn.Linear(dim, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


@pytest.fixture(scope="module")
def net_and_input():
    torch.manual_seed(0)
    return Net().train(), torch.randn(4, 64, 32)


@pytest.fixture(scope="module")
def half_plan(net_and_input):
    model, x = net_and_input
    return ckptguard.plan(model, x, budget=0.5)


def step_grads(model, x, seed):
    for p in model.parameters():
        p.grad = None
    torch.manual_seed(seed)
    model(x).sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def snapshot(model):
    return {
        "types": [(n, type(m)) for n, m in model.named_modules()],
        "objects": [id(m) for m in model.modules()],
        "state": {k: v.clone() for k, v in model.state_dict().items()},
        "dicts": [sorted(m.__dict__) for m in model.modules()],
        "hooks": [
            (dict(m._forward_hooks), dict(m._forward_pre_hooks), dict(m._backward_hooks))
            for m in model.modules()
        ],
        "forwards": [m.forward.__func__ for m in model.modules()],
    }


def assert_same(before, after):
    assert before["types"] == after["types"]
    assert before["objects"] == after["objects"]
    assert before["dicts"] == after["dicts"]
    assert before["hooks"] == after["hooks"]
    assert before["forwards"] == after["forwards"]
    assert before["state"].keys() == after["state"].keys()
    assert all(torch.equal(before["state"][k], after["state"][k]) for k in before["state"])


def test_plan_meets_half_the_unplanned_peak(half_plan):
    assert half_plan.regions, "half of the unplanned peak needs some checkpointing"
    assert half_plan.predicted_peak_bytes <= half_plan.budget_bytes
    assert half_plan.budget_bytes == int(0.5 * half_plan.measured_unplanned_peak_bytes)
    # With no region the model must reproduce the measured unplanned peak.
    assert half_plan.predicted_unplanned_peak_bytes == pytest.approx(
        half_plan.measured_unplanned_peak_bytes, rel=0.02
    )
    table = str(half_plan)
    assert "module path" in table and half_plan.regions[0].path in table


def test_apply_remove_round_trip_leaves_model_identical(net_and_input, half_plan):
    model, x = net_and_input
    handle = model.blocks[0].register_forward_hook(lambda *a: None)  # a user's hook survives
    try:
        before = snapshot(model)
        half_plan.apply(model)
        assert all(is_region(model.get_submodule(r.path)) for r in half_plan.regions)
        assert half_plan.is_applied(model)
        with pytest.raises(RuntimeError, match="already applied"):
            half_plan.apply(model)
        step_grads(model, x, 0)
        half_plan.remove(model)
        assert not any(is_region(m) for m in model.modules())
        assert_same(before, snapshot(model))
    finally:
        handle.remove()


def test_gradients_bit_identical_with_plan_applied(net_and_input, half_plan):
    model, x = net_and_input
    reference = step_grads(model, x, seed=3)
    other_seed = step_grads(model, x, seed=4)
    assert any(not torch.equal(reference[n], other_seed[n]) for n in reference)  # dropout live
    kinds = {r.kind for r in half_plan.regions}
    half_plan.apply(model)
    try:
        planned = step_grads(model, x, seed=3)
    finally:
        half_plan.remove(model)
    assert kinds, "the plan must checkpoint something for this test to mean anything"
    assert all(torch.equal(reference[n], planned[n]) for n in reference)


def test_selective_regions_give_bit_identical_gradients(net_and_input):
    model, x = net_and_input
    plan = Plan.from_dict(
        {
            **ckptguard.plan(model, x, budget=1.0).to_dict(),
            "regions": [
                _region("blocks.0", "selective"),
                _region("blocks.1.mlp", "selective"),
                _region("blocks.2", "full"),
            ],
        }
    )
    reference = step_grads(model, x, seed=5)
    with plan_applied(plan, model):
        planned = step_grads(model, x, seed=5)
    assert all(torch.equal(reference[n], planned[n]) for n in reference)


def _region(path, kind):
    return {
        "path": path,
        "kind": kind,
        "saved_bytes": 0,
        "kept_bytes": 0,
        "recompute_seconds": 0.0,
        "recompute_flops": 0,
    }


class plan_applied:
    def __init__(self, plan, model):
        self.plan, self.model = plan, model

    def __enter__(self):
        self.plan.apply(self.model)

    def __exit__(self, *exc):
        self.plan.remove(self.model)


def test_verify_measures_what_was_predicted(net_and_input, half_plan):
    model, x = net_and_input
    before = snapshot(model)
    report = half_plan.verify(model, x, repeats=1)
    assert report.gradients_identical, report.differing_gradients
    assert abs(report.peak_error) < 0.10, str(report)
    assert report.budget_met, str(report)
    assert report.measured_peak_bytes < report.unplanned_measured_peak_bytes
    assert "bit-identical" in str(report)
    assert_same(before, snapshot(model))  # verify leaves the model unplanned, grads untouched
    assert all(p.grad is None or p.grad is not None for p in model.parameters())


def test_infeasible_budget_names_the_minimum(net_and_input):
    """Raised as ``ckptguard.PlanInfeasibleError``, the name the README gives it."""
    from ckptguard import PlanInfeasibleError as exported

    assert exported is ckptguard.PlanInfeasibleError is PlanInfeasibleError
    assert "PlanInfeasibleError" in ckptguard.__all__
    model, x = net_and_input
    with pytest.raises(ckptguard.PlanInfeasibleError) as info:
        ckptguard.plan(model, x, budget="64KiB")
    error = info.value
    assert error.budget_bytes == 64 * 1024 < error.minimum_bytes
    assert "least activation peak any plan reaches" in str(error)
    assert "64.0 KiB" in str(error)
    at_minimum = ckptguard.plan(model, x, budget=error.minimum_bytes)
    assert at_minimum.predicted_peak_bytes == error.minimum_bytes


def test_to_dict_from_dict_round_trip(net_and_input, half_plan):
    model, x = net_and_input
    data = json.loads(json.dumps(half_plan.to_dict()))
    loaded = Plan.from_dict(data)
    assert loaded.to_dict() == half_plan.to_dict()
    assert loaded.choices == half_plan.choices
    reference = step_grads(model, x, seed=7)
    with plan_applied(loaded, model):
        assert all(is_region(model.get_submodule(p)) for p in loaded.choices)
        planned = step_grads(model, x, seed=7)
    assert all(torch.equal(reference[n], planned[n]) for n in reference)
    with pytest.raises(RuntimeError, match="from_dict"):
        loaded.tradeoff()
    with pytest.raises(ValueError, match="format"):
        Plan.from_dict({**data, "format": 99})


def test_plotted_plan_lies_on_or_above_the_front(net_and_input):
    """The plot's "this plan" and "every layer" marks never lie below its optimum staircase
    (a sampled staircase put plans below it): the front is exact, and the plan on it."""
    from ckptguard.planner.report import front_at, plot_data

    model, x = net_and_input
    plan = ckptguard.plan(model, x, budget=0.4)
    data = plot_data(plan)
    front = data["front"]
    peaks = [peak for peak, _ in front]
    assert peaks == sorted(peaks) and len(front) >= 3
    plan_peak, plan_ms = data["plan"]
    assert plan_ms == pytest.approx(front_at(front, plan_peak))  # optimal: on the front
    every_peak, every_ms = data["every_layer"]
    assert every_ms >= front_at(front, every_peak) - 1e-9
    for budget in range(int(min(peaks) * 2**20), int(max(peaks) * 2**20), 50_000):
        other = ckptguard.planner.plan_from_tree(plan.tree, budget)
        assert (
            other.recompute_seconds * 1e3
            >= front_at(front, other.predicted_peak_bytes / 2**20) - 1e-9
        )


def test_budget_and_arguments_are_checked_before_measuring(net_and_input, monkeypatch):
    from ckptguard.planner import measure

    def never(*args, **kwargs):
        raise AssertionError("measured before the arguments were checked")

    monkeypatch.setattr(measure, "measure", never)
    model, x = net_and_input
    with pytest.raises(ValueError, match="cannot read budget 'lots'"):
        ckptguard.plan(model, x, budget="lots")
    with pytest.raises(ValueError, match=r"fractional budget must be in \(0, 1\]"):
        ckptguard.plan(model, x, budget=1.5)
    with pytest.raises(TypeError, match="loss_fn must be callable"):
        ckptguard.plan(model, x, budget="1GiB", loss_fn="mse")
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        ckptguard.plan(lambda t: t, x, budget="1GiB")


_PLAN_AND_VERIFY = (
    "import sys, torch, ckptguard\n"
    "torch.manual_seed(0)\n"
    "m = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(16, 64), "
    "torch.nn.GELU(), torch.nn.Linear(64, 16)) for _ in range(3)])\n"
    "x = torch.randn(8, 16)\n"
    "for quiet in (True, False):\n"
    "    plan = ckptguard.plan(m, x, budget=1.0, quiet=quiet)\n"
    "    report = plan.verify(m, x, repeats=2, quiet=quiet)\n"
    "    print(report)\n"
    "    print('-- end of run --', flush=True)\n"
)
_STAGES = [
    "ckptguard measure: warm-up step",
    "ckptguard measure: profiled step",
    "ckptguard measure: timing the 13 module calls, 3 times",
    "ckptguard plan: costing the call tree",
    "ckptguard plan: solving",
    "ckptguard verify: warm-up step",
    "ckptguard verify: unplanned peak",
    "ckptguard verify: unplanned gradients",
    "ckptguard verify: planned gradients",
    "ckptguard verify: planned peak",
    "ckptguard verify: timing steps with and without the plan, 2 times",
]


def test_progress_is_a_line_per_stage_in_a_log_and_nothing_quiet(tmp_path):
    """``python -c "...plan(...); plan.verify(...)" > log 2>&1``, with ``quiet=True`` then
    without: nothing but the report when quiet, else one line per stage in the log (the
    report printed after them). The profiler's C++ start/stop lines (kineto's USDT lines,
    written to file descriptor 2) stay silenced."""
    import subprocess

    log = tmp_path / "log"
    with open(log, "w") as output:
        result = subprocess.run(
            [sys.executable, "-c", _PLAN_AND_VERIFY],
            stdout=output,
            stderr=subprocess.STDOUT,
            timeout=SUBPROCESS_TIMEOUT,
        )
    text = log.read_text()
    assert result.returncode == 0, text
    runs = text.split("-- end of run --\n")
    assert len(runs) == 3 and runs[2] == "", text
    for lines, stages in ((runs[0].splitlines(), []), (runs[1].splitlines(), _STAGES)):
        assert lines[: len(stages)] == stages
        report = lines[len(stages) :]  # printed at the end
        assert report[0].startswith("ckptguard plan verify (memory: "), lines
        assert any(line.startswith("step time, plan") for line in report)
        progress = ("ckptguard measure:", "ckptguard plan:")
        assert not any(line.startswith(progress) for line in report)


def test_verify_reports_measured_beside_predicted_step_time(net_and_input, half_plan):
    model, x = net_and_input
    report = half_plan.verify(model, x, repeats=1)
    assert report.predicted_recompute_seconds == half_plan.recompute_seconds
    assert report.predicted_step_seconds == pytest.approx(
        report.unplanned_step_seconds + half_plan.recompute_seconds
    )
    assert report.measured_recompute_seconds == pytest.approx(
        report.step_seconds - report.unplanned_step_seconds
    )
    lines = str(report).splitlines()
    row = next(line for line in lines if line.startswith("step time, plan"))
    assert f"{report.predicted_step_seconds * 1e3:.1f} ms" in row
    assert f"{report.step_seconds * 1e3:.1f} ms" in row
    data = report.to_dict()
    assert data["predicted_step_seconds"] == report.predicted_step_seconds


@pytest.mark.parametrize("bar", ["tqdm", "a line rewritten in place"])
def test_progress_draws_stage_and_step_on_a_terminal(monkeypatch, capsys, bar: str):
    """On a terminal, a bar: tqdm's where it imports, else one line rewritten in place; the
    bar is cleared when the plan or verify ends."""
    from ckptguard.planner import progress

    monkeypatch.setattr(progress, "_terminal", lambda: True)
    if bar != "tqdm":
        monkeypatch.setitem(sys.modules, "tqdm", None)  # as if it were not installed
    else:
        pytest.importorskip("tqdm")
    with progress.shown():
        progress.progress("verify", "warm-up step")
        progress.progress("verify", "timing steps", 1, 3)
        progress.progress("verify", "timing steps", 2, 3)
    err = capsys.readouterr().err
    if bar == "tqdm":
        assert "\rckptguard verify: warm-up step" in err
        assert re.search(r"\rckptguard verify: timing steps \|\S* *\| 2/3 \[", err), err
    else:
        assert "\rckptguard verify: warm-up step" in err
        assert "\rckptguard verify: timing steps (1/3)" in err
        assert "\rckptguard verify: timing steps (2/3)" in err
    assert re.search(r"\r +\r$", err), repr(err)  # the line is cleared at the end
    progress.progress("verify", "outside any plan")  # nothing drawn outside a plan or verify
    with progress.shown(quiet=True):
        progress.progress("verify", "quiet")
    assert capsys.readouterr().err == ""


def test_tradeoff_curve_and_every_layer(half_plan, tmp_path):
    curve = half_plan.tradeoff(budgets=None, points=6)
    assert len(curve) >= 2
    assert all(p["peak_bytes"] <= p["budget_bytes"] for p in curve)
    seconds = [p["recompute_seconds"] for p in curve]
    assert seconds == sorted(seconds, reverse=True)  # more memory never costs more recompute
    every = half_plan.every_layer()
    assert sorted(every["choices"]) == ["blocks.0", "blocks.1", "blocks.2"]
    # The planner's optimum at every-layer's own memory is never slower than every-layer.
    at_same_memory = ckptguard.planner.plan_from_tree(half_plan.tree, every["peak_bytes"])
    assert at_same_memory.recompute_seconds <= every["recompute_seconds"]
    pytest.importorskip("matplotlib")
    out = half_plan.plot(str(tmp_path / "curve.png"), points=4)
    assert (tmp_path / "curve.png").read_bytes()[:4] == b"\x89PNG" and out.endswith(".png")


def test_plan_is_exported_lazily():
    assert ckptguard.plan is ckptguard.planner.plan
    assert ckptguard.Plan is Plan


def test_transformers_llama_plan(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=64,
        max_position_embeddings=64,
        attention_dropout=0.1,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).train()
    ids = torch.randint(0, 64, (2, 32))
    model.gradient_checkpointing_enable()
    plan = ckptguard.plan(model, input_ids=ids, labels=ids, budget=0.6)
    assert plan.regions
    assert model.model.layers[0].gradient_checkpointing  # planning left the flag as it was
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan.apply(model)
    assert any("gradient checkpointing was on" in str(w.message) for w in caught)
    assert not model.model.layers[0].gradient_checkpointing and not model.config.use_cache
    plan.remove(model)
    assert model.model.layers[0].gradient_checkpointing and model.config.use_cache
    model.gradient_checkpointing_disable()
    report = plan.verify(model, input_ids=ids, labels=ids, repeats=1)
    assert report.gradients_identical, report.differing_gradients
    assert abs(report.peak_error) < 0.10, str(report)
