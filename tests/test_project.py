"""Regions across files: every import form resolves, wrappers are found, regions are
followed into the modules they run, and findings land where users expect them.

Each case is a real multi-file package written to disk and linted as a folder; the
expectations are exact (file, line, column, code).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import lint_tree, messages_of

# A block in its own module that reads a global its module changes at run time.
SCALED_BLOCK = """
    import torch.nn as nn

    SCALE = {"value": 1.0}

    def set_scale(value):
        SCALE["value"] = value

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(8, 8)

        def forward(self, x):
            return self.linear(x) * SCALE["value"]
"""

# A block in its own module that applies dropout.
DROPOUT_BLOCK = """
    import torch.nn as nn

    class Block(nn.Module):
        def __init__(self, p=0.1):
            super().__init__()
            self.linear = nn.Linear(8, 8)
            self.dropout = nn.Dropout(p)

        def forward(self, x):
            return self.dropout(self.linear(x))
"""

WRAPPER = """
    from torch.utils.checkpoint import checkpoint

    def run_checkpointed(function, *args, preserve=True):
        return checkpoint(function, *args, use_reentrant=False, preserve_rng_state=preserve)
"""


def test_region_followed_into_another_module(tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": "",
        "pkg/blocks.py": SCALED_BLOCK,
        "pkg/model.py": """
            from torch.utils.checkpoint import checkpoint
            from pkg.blocks import Block

            class Model:
                def __init__(self):
                    self.block = Block()

                def forward(self, x):
                    return checkpoint(self.block, x, use_reentrant=False)
        """,
    }
    assert lint_tree(tmp_path, files) == [("pkg/model.py", 10, 16, "CKP201")]
    (message,) = messages_of(tmp_path, files)
    assert "`SCALE` (pkg/blocks.py:15)" in message.replace(str(tmp_path) + "/", "")
    assert "changed at pkg/blocks.py:7" in message.replace(str(tmp_path) + "/", "")


@pytest.mark.parametrize(
    "import_line",
    [
        "from pkg.utils import run_checkpointed",
        "from .utils import run_checkpointed",
        "from pkg import run_checkpointed",  # re-exported by pkg/__init__.py
        "from .utils import *",
        "import pkg.utils as utils\nrun_checkpointed = utils.run_checkpointed",
        "from pkg import utils\nrun_checkpointed = getattr(utils, 'run_checkpointed')",
    ],
    ids=["absolute", "relative", "re-export", "star", "module alias", "getattr"],
)
def test_project_wrapper_through_every_import_form(tmp_path: Path, import_line: str) -> None:
    files = {
        "pkg/__init__.py": "from pkg.utils import run_checkpointed\n",
        "pkg/utils.py": WRAPPER,
        "pkg/blocks.py": DROPOUT_BLOCK,
        "pkg/model.py": f"""
{import_line}
from pkg.blocks import Block

def forward(block: Block, x):
    return run_checkpointed(block, x, preserve=False)
""",
    }
    found = lint_tree(tmp_path, files)
    line = len(import_line.splitlines()) + 5
    assert found == [("pkg/model.py", line, 12, "CKP301")]


def test_wrapper_with_rng_preserved_is_silent(tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": "",
        "pkg/utils.py": WRAPPER,
        "pkg/blocks.py": DROPOUT_BLOCK,
        "pkg/model.py": """
            from pkg.utils import run_checkpointed
            from pkg.blocks import Block

            def forward(block: Block, x):
                return run_checkpointed(block, x)
        """,
    }
    assert lint_tree(tmp_path, files) == []


def test_wrappers_found_transitively_across_three_files(tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": "",
        "pkg/low.py": WRAPPER,
        "pkg/mid.py": """
            from pkg.low import run_checkpointed

            def checkpoint_layer(layer, hidden):
                return run_checkpointed(layer, hidden)
        """,
        "pkg/blocks.py": SCALED_BLOCK,
        "pkg/model.py": """
            from pkg.mid import checkpoint_layer
            from pkg.blocks import Block

            LAYERS = [Block(), Block()]

            def forward(x):
                for layer in LAYERS:
                    x = checkpoint_layer(layer, x)
                return x
        """,
    }
    assert lint_tree(tmp_path, files) == [("pkg/model.py", 9, 13, "CKP201")]


def test_partial_on_self_assigned_in_a_base_class_in_another_module(tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": "",
        "pkg/base.py": """
            import functools
            import torch.nn as nn
            from torch.utils.checkpoint import checkpoint

            class CheckpointedModule(nn.Module):
                def __init__(self):
                    super().__init__()
                    self._activation_checkpoint_fn = functools.partial(
                        checkpoint, use_reentrant=False, preserve_rng_state=False
                    )
        """,
        "pkg/blocks.py": DROPOUT_BLOCK,
        "pkg/model.py": """
            from pkg.base import CheckpointedModule
            from pkg.blocks import Block

            class Model(CheckpointedModule):
                def __init__(self):
                    super().__init__()
                    self.block = Block()

                def forward(self, x):
                    return self._activation_checkpoint_fn(self.block, x)
        """,
    }
    assert lint_tree(tmp_path, files) == [("pkg/model.py", 11, 16, "CKP301")]


def test_factory_returning_a_partial(tmp_path: Path) -> None:
    files = {
        "olmo_like.py": """
            from functools import partial
            import torch.nn as nn

            def activation_checkpoint_function(dropout):
                from torch.utils.checkpoint import checkpoint

                return partial(checkpoint, preserve_rng_state=False, use_reentrant=False)

            class Block(nn.Module):
                def __init__(self, checkpoint_func=None):
                    super().__init__()
                    self.dropout = nn.Dropout(0.1)
                    self._activation_checkpoint_fn = (
                        checkpoint_func or activation_checkpoint_function(0.1)
                    )

                def attend(self, x):
                    h = x.softmax(-1)
                    return self.dropout(h) @ x

                def forward(self, x):
                    return self._activation_checkpoint_fn(self.attend, x)
        """,
    }
    assert lint_tree(tmp_path, files) == [("olmo_like.py", 23, 16, "CKP301")]


def test_staticmethod_checkpoint_as_class_attribute(tmp_path: Path) -> None:
    files = {
        "model.py": """
            import torch.nn as nn
            from torch.utils.checkpoint import checkpoint

            class Model(nn.Module):
                run = staticmethod(checkpoint)

                def __init__(self):
                    super().__init__()
                    self.act = nn.GELU()

                def forward(self, x):
                    return self.run(self.act, x, use_reentrant=False)
        """,
    }
    assert lint_tree(tmp_path, files) == [("model.py", 13, 16, "CKP101")]


def test_type_checking_imports_bind_nothing(tmp_path: Path) -> None:
    files = {
        "model.py": """
            from typing import TYPE_CHECKING

            if TYPE_CHECKING:
                from torch.utils.checkpoint import checkpoint
            else:
                def checkpoint(function, *args):
                    return function(*args)

            def forward(block, x):
                return checkpoint(block, x)
        """,
    }
    assert lint_tree(tmp_path, files) == []


def test_attribute_assigned_in_a_parent_init_in_another_module(tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": "",
        "pkg/base.py": """
            import torch.nn as nn

            class Base(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.dropout = nn.Dropout(0.2)
        """,
        "pkg/block.py": """
            from torch.utils.checkpoint import checkpoint
            from pkg.base import Base

            class Block(Base):
                def inner(self, x):
                    return self.dropout(x) * 2

                def forward(self, x):
                    return checkpoint(self.inner, x, use_reentrant=False, preserve_rng_state=False)
        """,
    }
    assert lint_tree(tmp_path, files) == [("pkg/block.py", 10, 16, "CKP301")]


def test_module_list_built_with_append_and_looped_over(tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": "",
        "pkg/blocks.py": SCALED_BLOCK,
        "pkg/model.py": """
            import torch.nn as nn
            from torch.utils.checkpoint import checkpoint
            from pkg.blocks import Block

            class Model(nn.Module):
                def __init__(self, depth):
                    super().__init__()
                    layers = []
                    for _ in range(depth):
                        layers.append(Block())
                    self.layers = nn.ModuleList(layers)

                def forward(self, x):
                    for i, layer in enumerate(self.layers[:2]):
                        x = checkpoint(layer, x, use_reentrant=False)
                    return x
        """,
    }
    assert lint_tree(tmp_path, files) == [("pkg/model.py", 16, 17, "CKP201")]


def test_unannotated_model_parameter_resolved_from_the_classes_its_module_imports(
    tmp_path: Path,
) -> None:
    """litgpt's LoRA fine-tuning: checkpoint_wrapper(block, preserve_rng_state=False) in one
    file, the blocks' LoRA dropout in another."""
    files = {
        "lit/__init__.py": "",
        "lit/lora.py": """
            import torch.nn as nn

            class LoRALinear(nn.Module):
                def __init__(self, r, lora_dropout=0.05):
                    super().__init__()
                    self.linear = nn.Linear(8, 8)
                    if lora_dropout > 0.0:
                        self.lora_dropout = nn.Dropout(p=lora_dropout)
                    else:
                        self.lora_dropout = lambda x: x

                def forward(self, x):
                    return self.linear(x) + self.lora_dropout(x)

            class Block(nn.Module):
                def __init__(self, config):
                    super().__init__()
                    self.attn = LoRALinear(config.r)

                def forward(self, x):
                    return x + self.attn(x)

            class GPT(nn.Module):
                def __init__(self, config):
                    super().__init__()
                    self.transformer = nn.ModuleDict(
                        dict(h=nn.ModuleList(Block(config) for _ in range(config.n_layer)))
                    )
        """,
        "lit/finetune.py": """
            import torch
            from lit.lora import GPT, Block

            def parallelize_fn(model, activation_checkpointing=True):
                from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
                    checkpoint_wrapper,
                )

                if activation_checkpointing:
                    model.transformer.h = torch.nn.ModuleList(
                        [
                            checkpoint_wrapper(el, preserve_rng_state=False)
                            for el in model.transformer.h
                        ]
                    )
                return model
        """,
    }
    assert lint_tree(tmp_path, files) == [("lit/finetune.py", 13, 17, "CKP301")]
    (message,) = messages_of(tmp_path, files)
    assert "`nn.Dropout`" in message and "lit/lora.py:9" in message
    files["lit/finetune.py"] = files["lit/finetune.py"].replace(
        "preserve_rng_state=False", "preserve_rng_state=True"
    )
    assert lint_tree(tmp_path, files) == []


def test_gradient_checkpointing_layer_subclass_reported_at_its_forward(tmp_path: Path) -> None:
    files = {
        "models/__init__.py": "",
        "models/modeling_toy.py": """
            import torch.nn as nn
            from transformers.modeling_layers import GradientCheckpointingLayer

            SEEN = []

            class ToyLayer(GradientCheckpointingLayer):
                def __init__(self):
                    super().__init__()
                    self.mlp = nn.Linear(8, 8)

                def forward(self, hidden_states):
                    SEEN.append(hidden_states.shape)
                    return self.mlp(hidden_states)

            class QuietLayer(GradientCheckpointingLayer):
                def forward(self, hidden_states):
                    return hidden_states * 2
        """,
        "models/modeling_derived.py": """
            from models.modeling_toy import ToyLayer

            COUNT = 0

            class DerivedLayer(ToyLayer):
                def forward(self, hidden_states):
                    global COUNT
                    COUNT += 1
                    return super().forward(hidden_states)
        """,
    }
    assert lint_tree(tmp_path, files) == [
        ("models/modeling_derived.py", 7, 5, "CKP203"),
        ("models/modeling_toy.py", 12, 5, "CKP203"),
    ]


def test_layer_subclasses_two_levels_down_stay_known_when_a_module_is_scoped_again(
    tmp_path: Path,
) -> None:
    files = {
        "models/__init__.py": "",
        "models/base.py": """
            from transformers.modeling_layers import GradientCheckpointingLayer

            class BaseLayer(GradientCheckpointingLayer):
                pass
        """,
        "models/middle.py": """
            from models.base import BaseLayer

            class MiddleLayer(BaseLayer):
                pass
        """,
        "models/leaf.py": """
            from torch.utils.checkpoint import checkpoint
            from models.middle import MiddleLayer

            ckpt = checkpoint
            CALLS = 0

            class LeafLayer(MiddleLayer):
                def forward(self, hidden_states):
                    global CALLS
                    CALLS += 1
                    return hidden_states

            def run(layer, x):
                return ckpt(layer, x, use_reentrant=False)
        """,
    }
    assert lint_tree(tmp_path, files) == [("models/leaf.py", 9, 5, "CKP203")]


def test_two_trees_holding_the_same_module_name_are_both_linted(tmp_path: Path) -> None:
    """Two checkouts linted in one run (an old and a new release side by side): each file is
    analysed as itself, not as the first file found under its module name."""
    old = """
        from torch.utils.checkpoint import checkpoint

        def run(block, x):
            return checkpoint(block, x)
    """
    new = """
        from torch.utils.checkpoint import checkpoint

        def run(block, x):
            y = block(x)
            return checkpoint(block, y)
    """
    files = {
        "old/pkg/__init__.py": "",
        "old/pkg/model.py": old,
        "new/pkg/__init__.py": "",
        "new/pkg/model.py": new,
    }
    assert lint_tree(tmp_path, files) == [
        ("new/pkg/model.py", 6, 12, "CKP001"),
        ("old/pkg/model.py", 5, 12, "CKP001"),
    ]
