"""The examples/repro_*.py scripts show what they claim on this PyTorch (CPU)."""

import importlib
import runpy
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BLOCK_PARAMETERS = [
    f"block.{layer}.{kind}" for layer in ("norm", "up", "down") for kind in ("weight", "bias")
]


@pytest.fixture
def load(monkeypatch):
    """Import an example by module name, with examples/ on sys.path as when run as a script."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    return importlib.import_module


def test_non_reentrant_gradients_are_bit_identical_with_dropout(load):
    figures = load("repro_nonreentrant_equal").main(verbose=False)
    assert figures["forward_equal"]
    assert all(figures["gradients_equal"].values()), figures["gradients_equal"]
    # Another seed changes every gradient: dropout is live, so the equality above means something.
    assert not any(figures["other_seed_gradients_equal"].values())


@pytest.mark.parametrize("mode", ["use_reentrant=False", "use_reentrant=True"])
def test_unpreserved_rng_keeps_forward_but_changes_gradients(load, mode):
    result = load("repro_preserve_rng_state").main(verbose=False)[mode]
    assert result["forward_equal"]
    equal = result["gradients_equal"]
    assert not any(equal[name] for name in ("input", "up.weight", "down.weight", "norm.weight"))
    # down.bias's gradient is the output gradient summed: it never passes through the mask.
    assert equal["down.bias"]
    assert result["max_abs_gradient_difference"] > 0


def test_reentrant_without_grad_inputs_leaves_region_parameters_without_gradients(load):
    figures = load("repro_reentrant_no_grad_inputs").main(verbose=False)
    reentrant = figures["use_reentrant=True"]
    assert reentrant["none_gradients"] == BLOCK_PARAMETERS
    assert reentrant["gradients_equal_to_plain"] == ["head.weight", "head.bias"]
    assert any(
        "None of the inputs have requires_grad" in w["message"] for w in reentrant["warnings"]
    )

    non_reentrant = figures["use_reentrant=False"]
    assert non_reentrant["none_gradients"] == []
    assert non_reentrant["gradients_equal_to_plain"] == [
        *BLOCK_PARAMETERS,
        "head.weight",
        "head.bias",
    ]


def test_ckptguard_warns_for_reentrant_region_without_grad_inputs(load):
    figures = load("repro_reentrant_no_grad_inputs").main(verbose=False)
    guarded = figures.get("use_reentrant=True under ckptguard.guard()")
    if guarded is None:
        pytest.skip("ckptguard.guard() is not implemented yet (runtime guard issue)")
    from_guard = [w for w in guarded["warnings"] if w["category"].startswith("ckptguard.")]
    assert len(from_guard) == 1, guarded["warnings"]
    assert "use_reentrant=False" in from_guard[0]["message"]
    # The guard only warns: gradients are exactly those of the unguarded reentrant run.
    assert guarded["none_gradients"] == BLOCK_PARAMETERS
    assert guarded["gradients_equal_to_plain"] == ["head.weight", "head.bias"]


def test_pricing_repro_separates_blocks_from_lone_ops(load):
    prices = {p.name: p for p in load("repro_pricing").main(batch=4, seq=16, dim=64, verbose=False)}
    assert prices["transformer block"].worth_it
    assert prices["MLP (Linear-GELU-Linear)"].worth_it
    for lone in ("lone GELU", "lone LayerNorm", "lone Dropout(0.1)"):
        assert not prices[lone].worth_it, prices[lone].reason
        assert prices[lone].bytes_saved < prices[lone].bytes_with_checkpoint


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("repro_nonreentrant_equal.py", "forward output torch.equal:           True"),
        ("repro_preserve_rng_state.py", "gradients still equal:      down.bias"),
        ("repro_reentrant_no_grad_inputs.py", "warning (builtins.UserWarning): None of the inputs"),
        ("repro_pricing.py", "lone GELU"),
    ],
)
def test_scripts_run_and_explain(monkeypatch, capsys, script, expected):
    """Run each file as ``python examples/<script>`` would (in-process: no second torch import)."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    args = ["--batch", "2", "--seq", "8", "--dim", "64"] if script == "repro_pricing.py" else []
    monkeypatch.setattr(sys, "argv", [script, *args])
    runpy.run_path(str(EXAMPLES / script), run_name="__main__")
    printed = capsys.readouterr().out
    assert printed.startswith("Reproduction:")
    assert expected in printed
