"""The text prefilter that decides which files are parsed at all: a file is skipped only
when no word of interest can be a reference in it."""

from __future__ import annotations

import pytest

from ckptlint.source import Prefilter, identifiers, may_name, names_in_bytes, names_word

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


@pytest.mark.parametrize(
    "text",
    [
        "from .modeling import Model17DecoderLayer\n",
        "x = «Model17DecoderLayer»  # a word between characters that are not ASCII\n",
        "layer = ÿModel17DecoderLayer\n",  # not a whole identifier in the text: no need to pass
        "é = modeling.Model17DecoderLayer\n",
    ],
)
@pytest.mark.parametrize("encoding", ["utf-8", "latin-1"])
def test_one_scan_of_a_file_serves_every_search(text: str, encoding: str) -> None:
    """A file's ``names_in_bytes`` are scanned once and reused by the prefilter, the cache's
    words and a module's candidate lines: the prefilter gives the same answer from them as
    from the bytes, and every ASCII word the text names whole is among them."""
    data = f"# -*- coding: {encoding} -*-\n{text}".encode(encoding)
    names = names_in_bytes(data)
    whole = {w for w in identifiers(text) if w.isascii() and names_word(text, w)}
    assert whole <= {name.decode() for name in names}
    prefilter = Prefilter(MANY_WORDS)
    assert prefilter.needs_names
    assert prefilter.passes(data, names) is prefilter.passes(data)
    assert may_name(frozenset(MANY_WORDS), names) == (
        ["Model17DecoderLayer"] if "Model17DecoderLayer" in text else []
    )


def test_words_that_are_not_ascii_are_always_looked_for() -> None:
    words = frozenset({"schicht_ß", "Model17DecoderLayer"})
    assert may_name(words, names_in_bytes(b"x = 1\n")) == ["schicht_ß"]
