"""The text prefilter that decides which files are parsed at all: a file is skipped only
when no word of interest can be a reference in it."""

from __future__ import annotations

import pytest

from ckptlint.source import Prefilter

WORDS = ["torch.utils.checkpoint.checkpoint_sequential", "GradientCheckpointingLayer", "run_ckpt"]


@pytest.mark.parametrize(
    ("text", "passes"),
    [
        (b"import torch\nx = torch.utils.checkpoint_sequential(f, 2, x)\n", True),
        (b"from transformers.modeling_layers import GradientCheckpointingLayer\n", True),
        (b"from helpers import (\n    run_ckpt,\n)\n", True),
        (b"y = helpers.run_ckpt(block, x)\n", True),
        (b"fn = getattr(helpers, 'run_ckpt')\n", True),
        (b"from helpers import *\nrun_ckpt(block, x)\n", True),
        (b"# load the pretrained checkpoint\nmodel = load()\n", False),
        (b"run_ckpt_count = 0\nrun_ckpts = []\n", False),
        (b"x = run_ckpt(block, x)\n", False),  # bare, no import: a local name
        (b"def forward(self, x):\n    return self.block(x)\n", False),
    ],
)
def test_prefilter(text: bytes, passes: bool) -> None:
    assert Prefilter(WORDS).passes(text) is passes


# a project's layer class names, found round by round: hundreds of words, matched in one pass
MANY_WORDS = WORDS + [f"Model{index}DecoderLayer" for index in range(600)]


@pytest.mark.parametrize(
    ("text", "passes"),
    [
        (b"from .modeling import Model17DecoderLayer\n", True),
        (b"layer = modeling.Model599DecoderLayer(config)\n", True),
        (b"y = helpers.run_ckpt(block, x)\n", True),
        (b"class Model17DecoderLayerNorm(nn.Module):\n    pass\n", False),
        (b"Model17DecoderLayer = None\n", False),  # bare, no import: a local name
        (b"# load the pretrained checkpoint\nmodel = load()\n", False),
    ],
)
def test_prefilter_with_many_words(text: bytes, passes: bool) -> None:
    assert Prefilter(MANY_WORDS).passes(text) is passes
