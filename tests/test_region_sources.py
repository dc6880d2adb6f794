"""Each semantic rule through each kind of region source of the table, and the shapes that
must stay silent (one-time initialisation, memos, registries filled at import).

A source is written once as a template with a ``{region}`` slot; each rule supplies a
region that breaks it. Expectations are exact: the rule's code at the site's line and
column, and nothing else.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import lint_tree

# A block module for each rule: what the region runs, in another file than the site.
BLOCKS = """
import torch.nn as nn

SCALE = {"value": 1.0}
STEPS = 0


def set_scale(value):
    SCALE["value"] = value


class Reads(nn.Module):
    def forward(self, x):
        return x * SCALE["value"]


class Writes(nn.Module):
    def forward(self, x):
        global STEPS
        STEPS += 1
        return x * 2


class Draws(nn.Module):
    def __init__(self):
        super().__init__()
        self.dropout = nn.Dropout(0.1)

    def forward(self, x):
        return self.dropout(x) * 2
"""

RULES = {
    "CKP201": "Reads()",
    "CKP203": "Writes()",
    "CKP301": "Draws()",
    "CKP101": "nn.GELU()",
}

# name: (imports, statement making the site with {region} and {rng}, whether the source
# takes preserve_rng_state, whether one op as a region is CKP101's business).
SOURCES = {
    "torch checkpoint": (
        "from torch.utils.checkpoint import checkpoint",
        "out = checkpoint({region}, x, use_reentrant=False{rng})",
    ),
    "checkpoint_sequential": (
        "from torch.utils.checkpoint import checkpoint_sequential",
        "out = checkpoint_sequential(nn.Sequential({region}, nn.Identity()), 2, x, False{rng})",
    ),
    "checkpoint_wrapper": (
        "from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import"
        " checkpoint_wrapper",
        "out = checkpoint_wrapper({region}{rng})",
    ),
    "CheckpointWrapper class": (
        "from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper",
        "out = CheckpointWrapper({region}{rng})",
    ),
    "composable checkpoint": (
        "from torch.distributed._composable import checkpoint",
        "out = checkpoint({region}{rng})",
    ),
    "timm checkpoint": (
        "from timm.models import checkpoint",
        "out = checkpoint({region}, x{rng})",
    ),
    "timm checkpoint_seq": (
        "from timm.models._manipulate import checkpoint_seq",
        "out = checkpoint_seq(nn.Sequential({region}), x)",
    ),
    "Megatron": (
        "from megatron.core import tensor_parallel",
        "out = tensor_parallel.checkpoint({region}, False, x)",
    ),
    "Megatron CheckpointWithoutOutput": (
        "from megatron.core.tensor_parallel import CheckpointWithoutOutput",
        "out = CheckpointWithoutOutput().checkpoint({region}, x)",
    ),
    "DeepSpeed": (
        "import deepspeed",
        "out = deepspeed.checkpointing.checkpoint({region}, x)",
    ),
    "fairscale": (
        "from fairscale.nn import checkpoint_wrapper",
        "out = checkpoint_wrapper({region})",
    ),
    "Transformer Engine": (
        "import transformer_engine.pytorch as te",
        "out = te.checkpoint({region}, x)",
    ),
    "xformers": (
        "from xformers.checkpoint import checkpoint",
        "out = checkpoint({region}, x{rng})",
    ),
    "partial of checkpoint": (
        "import functools\nfrom torch.utils.checkpoint import checkpoint\n"
        "ckpt = functools.partial(checkpoint, use_reentrant=False)",
        "out = ckpt({region}, x{rng})",
    ),
}
RNG_KEYWORD = {
    "torch checkpoint",
    "checkpoint_sequential",
    "checkpoint_wrapper",
    "CheckpointWrapper class",
    "composable checkpoint",
    "timm checkpoint",
    "xformers",
    "partial of checkpoint",
}
SEQUENCES = {"checkpoint_sequential", "timm checkpoint_seq"}

CASES = [
    pytest.param(source, code, id=f"{code}-{source}")
    for source in SOURCES
    for code in RULES
    if (code != "CKP301" or source in RNG_KEYWORD) and (code != "CKP101" or source not in SEQUENCES)
]


def site_module(source: str, region: str, rng: str) -> str:
    imports, statement = SOURCES[source]
    return (
        "import torch.nn as nn\n"
        f"{imports}\n"
        "from blocks import Reads, Writes, Draws\n"
        "\n"
        "def forward(x):\n"
        f"    {statement.format(region=region, rng=rng)}\n"
        "    return out\n"
    )


@pytest.mark.parametrize(("source", "code"), CASES)
def test_rule_through_source(tmp_path: Path, source: str, code: str) -> None:
    rng = ", preserve_rng_state=False" if code == "CKP301" else ""
    site = site_module(source, RULES[code], rng)
    files = {"blocks.py": BLOCKS, "site.py": site}
    found = lint_tree(tmp_path, files, select=(code,))
    line = site.splitlines().index(next(s for s in site.splitlines() if "out =" in s)) + 1
    column = site.splitlines()[line - 1].index("=") + 3
    assert found == [("site.py", line, column, code)]


@pytest.mark.parametrize("source", sorted(RNG_KEYWORD))
def test_preserved_rng_is_silent(tmp_path: Path, source: str) -> None:
    files = {"blocks.py": BLOCKS, "site.py": site_module(source, "Draws()", "")}
    assert lint_tree(tmp_path, files, select=("CKP301",)) == []


def test_apply_activation_checkpointing_selects_by_isinstance(tmp_path: Path) -> None:
    files = {
        "blocks.py": BLOCKS,
        "site.py": """
            import functools
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
                apply_activation_checkpointing,
                checkpoint_wrapper,
            )
            from blocks import Draws, Reads

            def setup(model):
                apply_activation_checkpointing(
                    model,
                    checkpoint_wrapper_fn=functools.partial(
                        checkpoint_wrapper, preserve_rng_state=False
                    ),
                    check_fn=lambda module: isinstance(module, (Draws, Reads)),
                )
        """,
    }
    assert lint_tree(tmp_path, files) == [
        ("site.py", 10, 5, "CKP201"),
        ("site.py", 10, 5, "CKP301"),
    ]


def test_gradient_checkpointing_func_attribute(tmp_path: Path) -> None:
    files = {
        "blocks.py": BLOCKS,
        "site.py": """
            import torch.nn as nn
            from blocks import Reads, Writes

            class Encoder(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.layers = nn.ModuleList([Reads(), Writes()])
                    self.gradient_checkpointing = False

                def forward(self, x):
                    for layer in self.layers:
                        if self.gradient_checkpointing and self.training:
                            x = self._gradient_checkpointing_func(layer.__call__, x)
                        else:
                            x = layer(x)
                    return x
        """,
    }
    assert lint_tree(tmp_path, files) == [
        ("site.py", 14, 21, "CKP201"),
        ("site.py", 14, 21, "CKP203"),
    ]


def test_use_reentrant_is_checked_only_where_the_callee_takes_it(tmp_path: Path) -> None:
    files = {
        "site.py": """
            import deepspeed
            from timm.models import checkpoint as timm_checkpoint
            from torch.utils.checkpoint import checkpoint

            def forward(self, x):
                x = deepspeed.checkpointing.checkpoint(self.block, x)
                x = timm_checkpoint(self.block, x)
                x = self._gradient_checkpointing_func(self.block, x)
                return checkpoint(self.block, x)
        """,
    }
    assert lint_tree(tmp_path, files, select=("CKP001",)) == [("site.py", 10, 12, "CKP001")]


def test_late_binding_through_a_project_wrapper(tmp_path: Path) -> None:
    files = {
        "wrap.py": """
            from torch.utils.checkpoint import checkpoint

            def run(function, *args):
                return checkpoint(function, *args, use_reentrant=False)
        """,
        "site.py": """
            from wrap import run

            def forward(self, x):
                for layer in self.layers:
                    x = run(lambda h: layer(h), x)
                return x
        """,
    }
    assert lint_tree(tmp_path, files) == [("site.py", 6, 13, "CKP202")]


# -- what must stay silent ----------------------------------------------------------------

SILENT = {
    "kernel handle loaded when the model is built": {
        "kernels.py": """
            KERNEL = None

            def load_kernel():
                global KERNEL
                KERNEL = object()
        """,
        "site.py": """
            import torch.nn as nn
            from torch.utils.checkpoint import checkpoint
            import kernels

            class Block(nn.Module):
                def __init__(self):
                    super().__init__()
                    kernels.load_kernel()

                def forward(self, x):
                    return x * (kernels.KERNEL is None)

            def forward(block, x):
                return checkpoint(Block(), x, use_reentrant=False)
        """,
    },
    "lazy cache guarded by is None": {
        "site.py": """
            from torch.utils.checkpoint import checkpoint

            _MASK = None

            def mask(n):
                global _MASK
                if _MASK is None:
                    _MASK = [1.0] * n
                return _MASK

            def block(x):
                return x * mask(4)[0]

            def forward(x):
                return checkpoint(block, x, use_reentrant=False)
        """,
    },
    "registry filled by a decorator factory at import": {
        "registry.py": """
            ACTIVATIONS = {}

            def register(name):
                def decorate(function):
                    ACTIVATIONS[name] = function
                    return function
                return decorate

            @register("relu")
            def relu(x):
                return x.relu()
        """,
        "site.py": """
            from torch.utils.checkpoint import checkpoint
            from registry import ACTIVATIONS

            def block(x):
                return ACTIVATIONS["relu"](x) * 2 + 1

            def forward(x):
                return checkpoint(block, x, use_reentrant=False)
        """,
    },
    "memo keyed by a loaded flag": {
        "site.py": """
            from torch.utils.checkpoint import checkpoint

            _loaded = None
            _kernel = None

            def kernel(name):
                global _loaded, _kernel
                if _loaded != name:
                    _kernel = name.upper()
                    _loaded = name
                return _kernel

            def block(x):
                return x * len(kernel("a"))

            def forward(x):
                return checkpoint(block, x, use_reentrant=False)
        """,
    },
    "a function of the same name in another module changes its own global": {
        "other.py": """
            SCALE = 1.0

            def configure():
                global SCALE
                SCALE = 2.0
        """,
        "site.py": """
            from torch.utils.checkpoint import checkpoint

            SCALE = 1.0

            def configure():
                pass

            def block(x):
                h = x.relu()
                return h * SCALE

            def forward(x):
                return checkpoint(block, x, use_reentrant=False)
        """,
    },
}


@pytest.mark.parametrize("files", SILENT.values(), ids=SILENT.keys())
def test_silent(tmp_path: Path, files: dict[str, str]) -> None:
    assert lint_tree(tmp_path, files, select=("CKP1", "CKP2", "CKP3")) == []


def test_the_reference_lists_every_region_source() -> None:
    """The linter reference's table of region sources names every library of the built-in
    table."""
    from ckptlint.regions.sources import SOURCES

    reference = (Path(__file__).resolve().parent.parent / "docs" / "linter.md").read_text()
    table = reference[reference.index("## Regions: what ckptlint sees") :]
    for source in SOURCES:
        library = source.library.split(",")[0].split("-")[0]
        assert library in table, library
        assert source.label in table, source.label


LATE_BINDING_FORMS = {
    "lambda bound to a name before the call": """
        from torch.utils.checkpoint import checkpoint

        def forward(self, x):
            for layer in self.layers:
                run = lambda h: layer(h) + 1
                x = checkpoint(run, x, use_reentrant=False)
            return x
        """,
    "nested def bound before the call": """
        from torch.utils.checkpoint import checkpoint

        def forward(self, x, scales):
            for scale in scales:
                def run(h):
                    return self.block(h) * scale
                x = checkpoint(run, x, use_reentrant=False)
            return x
        """,
    "loop variable bound by a walrus": """
        from torch.utils.checkpoint import checkpoint

        def forward(self, x, scales):
            i = 0
            while (scale := scales[i]) > 0:
                x = checkpoint(lambda h: self.block(h) * scale, x, use_reentrant=False)
                i += 1
            return x
        """,
    "loop variable bound by with": """
        from torch.utils.checkpoint import checkpoint

        def forward(self, x, contexts):
            for context in contexts:
                with context as scale:
                    x = checkpoint(lambda h: self.block(h) * scale, x, use_reentrant=False)
            return x
        """,
    "comprehension variable": """
        from torch.utils.checkpoint import checkpoint

        def forward(self, x):
            return [
                checkpoint(lambda h: layer(h) + 1, x, use_reentrant=False)
                for layer in self.layers
            ]
        """,
}


@pytest.mark.parametrize("source", LATE_BINDING_FORMS.values(), ids=LATE_BINDING_FORMS.keys())
def test_late_binding_through_every_binding_form(tmp_path: Path, source: str) -> None:
    found = lint_tree(tmp_path, {"model.py": source}, select=("CKP202",))
    assert [code for _, _, _, code in found] == ["CKP202"]
