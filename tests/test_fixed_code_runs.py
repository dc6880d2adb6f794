"""Fixed code, run: what ``--fix --unsafe-fixes`` writes is imported and trained with real
backward passes, and compared with the model without checkpoints (``torch.equal``)."""

from __future__ import annotations

import importlib.util
import textwrap
import warnings
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")


def load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fixed(tmp_path: Path, source: str, code: str) -> tuple[ModuleType, ModuleType]:
    """The module as written and as ``--fix --unsafe-fixes`` left it (which must compile and
    leave no finding of ``code``)."""
    (tmp_path / "pyproject.toml").write_text("[tool.ckptlint]\n")
    before = tmp_path / "before.py"
    after = tmp_path / "after.py"
    before.write_text(textwrap.dedent(source))
    after.write_text(textwrap.dedent(source))
    result = run_cli("--fix", "--unsafe-fixes", "--select", code, "after.py", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert after.read_text() != before.read_text()
    return load(before), load(after)


def test_the_ckp001_fix_makes_a_call_with_region_keywords_run(tmp_path: Path) -> None:
    before, after = fixed(
        tmp_path,
        """
        import torch
        from torch.utils.checkpoint import checkpoint

        def block(h, mask, scale=1.0):
            return (h * mask).tanh() * scale

        def forward(x, mask):
            return checkpoint(block, x, mask=mask, scale=3.0)
        """,
        "CKP001",
    )
    x, mask = torch.randn(4, 8, requires_grad=True), torch.randn(4, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # use_reentrant left out
        with pytest.raises(ValueError, match="Unexpected keyword arguments: mask,scale"):
            before.forward(x, mask)
    after.forward(x, mask).sum().backward()
    checkpointed = x.grad
    x.grad = None
    after.block(x, mask, 3.0).sum().backward()
    assert torch.equal(checkpointed, x.grad)


ENCODER = """
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, hidden, past):
        return torch.tanh(self.linear(hidden) + past)


class Encoder(nn.Module):
    def __init__(self, layers=3):
        super().__init__()
        self.layer = nn.ModuleList(Layer() for _ in range(layers))
        self.pasts = nn.Parameter(torch.randn(layers, 8))
        self.scales = [0.5 * (i + 1) for i in range(layers)]
        self.gradient_checkpointing = True

    def forward(self, hidden_states):
        for i, layer_module in enumerate(self.layer):
            past_key_value = self.pasts[i]
            if self.gradient_checkpointing and self.training:

                def create_custom_forward(module):
                    def custom_forward(*inputs):
                        return module(*inputs, past_key_value)

                    return custom_forward

                hidden_states = checkpoint(
                    create_custom_forward(layer_module), hidden_states, use_reentrant=False
                )
            else:
                hidden_states = layer_module(hidden_states, past_key_value)
        for scale in self.scales:
            if self.gradient_checkpointing and self.training:
                hidden_states = checkpoint(
                    lambda h: torch.sin(h * scale) * scale, hidden_states, use_reentrant=False
                )
            else:
                hidden_states = torch.sin(hidden_states * scale) * scale
        return hidden_states
"""


def gradients(module: ModuleType, checkpointed: bool) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = module.Encoder()
    model.gradient_checkpointing = checkpointed
    inputs = torch.randn(4, 8, requires_grad=True)
    model(inputs).square().sum().backward()
    return [inputs.grad, *(p.grad for p in model.parameters())]


def test_a_fixed_late_binding_closure_gives_the_gradients_of_the_model_without_checkpoints(
    tmp_path: Path,
) -> None:
    """The BERT closure over ``past_key_value`` and a lambda over the loop's ``scale``,
    each rebound by its loop: checkpointed as written, the recompute reads the last value
    and the gradients differ; fixed, they are those of the plain model, bit for bit."""
    before, after = fixed(tmp_path, ENCODER, "CKP202")
    text = (tmp_path / "after.py").read_text()
    assert "def custom_forward(*inputs, past_key_value=past_key_value):" in text
    assert "lambda h, scale=scale: torch.sin(h * scale) * scale" in text
    plain = gradients(before, checkpointed=False)
    assert not all(map(torch.equal, gradients(before, checkpointed=True), plain))
    assert all(map(torch.equal, gradients(after, checkpointed=True), plain))
    assert all(map(torch.equal, gradients(after, checkpointed=False), plain))
