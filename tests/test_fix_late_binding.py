"""The CKP202 fix: each late-bound name becomes a parameter ``name=name`` of the def or
lambda, bound where the region is made. Every fixed file compiles, keeps every other line,
and a second run finds no CKP202 in it; where the function is not made for the call, no
fix is offered."""

from __future__ import annotations

import difflib
import textwrap
from pathlib import Path

import pytest

from tests.conftest import lint, run_cli

BERT = """\
import torch.utils.checkpoint


class Encoder:
    def forward(self, hidden_states, past_key_values=None, output_attentions=False):
        for i, layer_module in enumerate(self.layer):
            past_key_value = past_key_values[i] if past_key_values is not None else None
            if self.gradient_checkpointing and self.training:

                def create_custom_forward(module):
                    def custom_forward(*inputs):
                        return module(*inputs, past_key_value, output_attentions)

                    return custom_forward

                layer_outputs = torch.utils.checkpoint.checkpoint(
                    create_custom_forward(layer_module),
                    hidden_states,
                )
            else:
                layer_outputs = layer_module(hidden_states, past_key_value, output_attentions)
            hidden_states = layer_outputs[0]
        return hidden_states
"""

FIXED = {
    "a lambda in the call": (
        "for layer in self.layers:\n"
        "    x = checkpoint(lambda h: layer(h), x, use_reentrant=False)\n",
        "for layer in self.layers:\n"
        "    x = checkpoint(lambda h, layer=layer: layer(h), x, use_reentrant=False)\n",
    ),
    "a lambda taking *args": (
        "for layer in self.layers:\n"
        "    x = checkpoint(lambda *a: layer(*a), x, use_reentrant=False)\n",
        "for layer in self.layers:\n"
        "    x = checkpoint(lambda *a, layer=layer: layer(*a), x, use_reentrant=False)\n",
    ),
    "a def in the loop, two names": (
        "for i, layer in enumerate(self.layers):\n"
        "    scale = self.scales[i]\n"
        "\n"
        "    def block(h, **kwargs):\n"
        "        return layer(h, **kwargs) * scale\n"
        "\n"
        "    x = checkpoint(block, x, use_reentrant=False)\n",
        "for i, layer in enumerate(self.layers):\n"
        "    scale = self.scales[i]\n"
        "\n"
        "    def block(h, layer=layer, scale=scale, **kwargs):\n"
        "        return layer(h, **kwargs) * scale\n"
        "\n"
        "    x = checkpoint(block, x, use_reentrant=False)\n",
    ),
    "a def with one parameter a line": (
        "for layer in self.layers:\n"
        "\n"
        "    def block(\n"
        "        h,\n"
        "        mask,\n"
        "    ):\n"
        "        return layer(h, mask)\n"
        "\n"
        "    x = checkpoint(block, x, m, use_reentrant=False)\n",
        "for layer in self.layers:\n"
        "\n"
        "    def block(\n"
        "        h,\n"
        "        mask,\n"
        "        layer=layer,\n"
        "    ):\n"
        "        return layer(h, mask)\n"
        "\n"
        "    x = checkpoint(block, x, m, use_reentrant=False)\n",
    ),
    "a factory made before the loop, called in the call": (
        "def make(module):\n"
        "    def run(*inputs):\n"
        "        return module(*inputs, cache)\n"
        "\n"
        "    return run\n"
        "\n"
        "for layer, cache in zip(self.layers, caches):\n"
        "    x = checkpoint(make(layer), x, use_reentrant=False)\n",
        "def make(module):\n"
        "    def run(*inputs, cache=cache):\n"
        "        return module(*inputs, cache)\n"
        "\n"
        "    return run\n"
        "\n"
        "for layer, cache in zip(self.layers, caches):\n"
        "    x = checkpoint(make(layer), x, use_reentrant=False)\n",
    ),
}

HEADER = "from torch.utils.checkpoint import checkpoint\n\n\ndef forward(self, x, m, caches):\n"


def in_forward(body: str) -> str:
    return (
        HEADER + textwrap.indent(body, "    ", lambda line: bool(line.strip())) + "    return x\n"
    )


def changed_lines(before: str, after: str) -> list[str]:
    diff = difflib.ndiff(before.splitlines(), after.splitlines())
    return [line for line in diff if line.startswith(("-", "+"))]


@pytest.mark.parametrize(("before", "after"), FIXED.values(), ids=FIXED.keys())
def test_the_fix_binds_the_late_bound_names_where_the_region_is_made(
    project: Path, before: str, after: str
) -> None:
    path = project / "model.py"
    path.write_text(in_forward(before))
    result = run_cli("--fix", "--unsafe-fixes", "--select", "CKP202", "model.py", cwd=project)
    assert result.returncode == 0, result.stdout + result.stderr
    assert path.read_text() == in_forward(after)
    compile(path.read_text(), "model.py", "exec")
    assert "CKP202" not in [f.code for f in lint(path.read_text())]


def test_the_bert_closure_over_past_key_value(project: Path) -> None:
    """transformers 4.34.1's pattern, copied into 35 of its models: one line changes, with
    CKP001's fix of the same call (both unsafe) beside it."""
    path = project / "modeling.py"
    path.write_text(BERT)
    diff = run_cli("--diff", "--unsafe-fixes", "modeling.py", cwd=project)
    assert diff.returncode == 1
    assert (
        "-                    def custom_forward(*inputs):\n"
        "+                    def custom_forward(*inputs, past_key_value=past_key_value):\n"
    ) in diff.stdout
    assert path.read_text() == BERT  # --diff writes nothing
    result = run_cli("--fix", "--unsafe-fixes", "modeling.py", cwd=project)
    assert result.returncode == 0, result.stdout + result.stderr
    fixed = path.read_text()
    assert changed_lines(BERT, fixed) == [
        "-                     def custom_forward(*inputs):",
        "+                     def custom_forward(*inputs, past_key_value=past_key_value):",
        "+                     use_reentrant=False,",
    ]
    compile(fixed, "modeling.py", "exec")
    assert lint(fixed) == []


def test_a_lambda_fixed_inside_a_call_that_ckp001_fixes_too(project: Path) -> None:
    path = project / "model.py"
    path.write_text(
        in_forward("for layer in self.layers:\n    x = checkpoint(lambda h: layer(h), x)\n")
    )
    result = run_cli("--fix", "--unsafe-fixes", "model.py", cwd=project)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Found 2 findings (2 fixed, 0 remaining)." in result.stdout
    assert path.read_text() == in_forward(
        "for layer in self.layers:\n"
        "    x = checkpoint(lambda h, layer=layer: layer(h), x, use_reentrant=False)\n"
    )


def test_without_unsafe_fixes_the_file_is_left_as_it_is(project: Path) -> None:
    path = project / "model.py"
    path.write_text(BERT)
    result = run_cli("--fix", "--select", "CKP202", "model.py", cwd=project)
    assert result.returncode == 1
    assert path.read_text() == BERT


NOT_FIXED = {
    "a def made once, before the loop": (
        "def block(h):\n"
        "    return layer(h)\n"
        "\n"
        "for layer in self.layers:\n"
        "    x = checkpoint(block, x, use_reentrant=False)\n"
    ),
    "the name rebound between the def and the call": (
        "for i in range(4):\n"
        "\n"
        "    def block(h):\n"
        "        return h * scale\n"
        "\n"
        "    scale = i * 2\n"
        "    x = checkpoint(block, x, use_reentrant=False)\n"
    ),
    "a dict changed in place": (
        "options = {}\n"
        "for window in self.windows:\n"
        '    options["window"] = window\n'
        "    x = checkpoint(lambda h: self.attend(h, **options), x, use_reentrant=False)\n"
    ),
}


@pytest.mark.parametrize("body", NOT_FIXED.values(), ids=NOT_FIXED.keys())
def test_no_fix_where_a_default_would_not_hold_what_the_forward_read(
    project: Path, body: str
) -> None:
    source = in_forward(body)
    findings = [f for f in lint(source) if f.code == "CKP202"]
    assert len(findings) == 1 and findings[0].fixable is None
    path = project / "model.py"
    path.write_text(source)
    result = run_cli("--fix", "--unsafe-fixes", "--select", "CKP202", "model.py", cwd=project)
    assert result.returncode == 1
    assert path.read_text() == source
