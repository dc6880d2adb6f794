"""CKP001: which calls are torch's checkpoint, through every import form, and which are not."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import lint

FLAGGED = {
    "attribute chain": """
        import torch
        torch.utils.checkpoint.checkpoint(f, x)
    """,
    "module alias": """
        import torch.utils.checkpoint as cp
        cp.checkpoint(f, x)
    """,
    "from torch.utils import checkpoint": """
        from torch.utils import checkpoint
        checkpoint.checkpoint(f, x)
    """,
    "function alias": """
        from torch.utils.checkpoint import checkpoint as ckpt
        ckpt(f, x)
    """,
    "assigned name": """
        import torch
        ckpt = torch.utils.checkpoint.checkpoint
        def forward(x):
            return ckpt(f, x)
    """,
    "import inside a function": """
        def forward(x):
            from torch.utils.checkpoint import checkpoint
            return checkpoint(f, x)
    """,
    "try/except import": """
        try:
            from torch.utils.checkpoint import checkpoint
        except ImportError:
            checkpoint = None
        checkpoint(f, x)
    """,
    "if/else import, one branch torch": """
        if USE_DEEPSPEED:
            from deepspeed.checkpointing import checkpoint
        else:
            from torch.utils.checkpoint import checkpoint
        checkpoint(f, x)
    """,
    "checkpoint_sequential": """
        from torch.utils.checkpoint import checkpoint_sequential
        checkpoint_sequential(functions, 2, x)
    """,
    "partial without keyword, call without keyword": """
        import functools
        from torch.utils.checkpoint import checkpoint
        run = functools.partial(checkpoint, preserve_rng_state=False)
        run(f, x)
    """,
    "partial never called in the file": """
        from functools import partial
        from torch.utils.checkpoint import checkpoint
        self_fn = partial(checkpoint)
        register(self_fn)
    """,
    "partial on self, called in another method": """
        from functools import partial
        from torch.utils.checkpoint import checkpoint
        class M:
            def __init__(self):
                self.run = partial(checkpoint)
            def forward(self, x):
                return self.run(self.block, x)
    """,
    "positional *args do not carry the keyword-only use_reentrant": """
        from torch.utils.checkpoint import checkpoint
        checkpoint(f, *inputs)
    """,
    "torch 2.14 decorator form without the keyword": """
        from torch.utils.checkpoint import checkpoint
        @checkpoint(preserve_rng_state=True)
        def block(x):
            return x
    """,
    "global rebinding in a function is only an alternative": """
        from torch.utils.checkpoint import checkpoint
        def disable():
            global checkpoint
            checkpoint = None
        checkpoint(f, x)
    """,
}

NOT_FLAGGED = {
    "use_reentrant passed": """
        from torch.utils.checkpoint import checkpoint
        checkpoint(f, x, use_reentrant=False)
    """,
    "torch 2.14 decorator form with the keyword": """
        from torch.utils.checkpoint import checkpoint
        @checkpoint(use_reentrant=False)
        def block(x):
            return x
    """,
    "**kwargs may carry it": """
        from torch.utils.checkpoint import checkpoint
        checkpoint(f, x, **kwargs)
    """,
    "checkpoint_sequential 4th positional": """
        from torch.utils.checkpoint import checkpoint_sequential
        checkpoint_sequential(functions, 2, x, False)
    """,
    "checkpoint_sequential *args may carry it": """
        from torch.utils.checkpoint import checkpoint_sequential
        checkpoint_sequential(functions, *rest)
    """,
    "partial carries the keyword": """
        import functools
        from torch.utils.checkpoint import checkpoint
        run = functools.partial(checkpoint, use_reentrant=True)
        run(f, x)
    """,
    "partial with **kwargs (transformers)": """
        import functools
        from torch.utils.checkpoint import checkpoint
        self_func = functools.partial(checkpoint, **gradient_checkpointing_kwargs)
        self_func(f, x)
    """,
    "the later calls of the partial carry it": """
        from functools import partial
        from torch.utils.checkpoint import checkpoint
        run = partial(checkpoint)
        run(f, x, use_reentrant=False)
    """,
    "self.checkpoint method": """
        from torch.utils.checkpoint import checkpoint
        class T:
            def step(self, x):
                return self.checkpoint(x)
    """,
    "trainer.save_checkpoint": """
        import torch.utils.checkpoint
        trainer.save_checkpoint("out")
    """,
    "deepspeed checkpoint": """
        import deepspeed
        deepspeed.checkpointing.checkpoint(f, x)
    """,
    "megatron checkpoint": """
        from megatron.core.tensor_parallel.random import checkpoint
        checkpoint(f, False, x)
    """,
    "fairscale checkpoint_wrapper": """
        from fairscale.nn.checkpoint import checkpoint_wrapper
        checkpoint_wrapper(module)
    """,
    "timm checkpoint_seq": """
        from timm.models._manipulate import checkpoint_seq
        checkpoint_seq(blocks, x)
    """,
    "local def shadows the import": """
        from torch.utils.checkpoint import checkpoint
        def checkpoint(f, *args):
            return f(*args)
        checkpoint(f, x)
    """,
    "parameter shadows the import": """
        from torch.utils.checkpoint import checkpoint
        def forward(x, checkpoint):
            return checkpoint(f, x)
    """,
    "local assignment shadows in a function": """
        from torch.utils.checkpoint import checkpoint
        def forward(x):
            checkpoint = make_checkpointer()
            return checkpoint(f, x)
    """,
    "no torch import at all": """
        def forward(x):
            return checkpoint(f, x)
    """,
    "relative import of a look-alike": """
        from .utils import checkpoint
        checkpoint(f, x)
    """,
}


@pytest.mark.parametrize("source", FLAGGED.values(), ids=FLAGGED.keys())
def test_flagged(source: str) -> None:
    assert [f.code for f in lint(textwrap.dedent(source))] == ["CKP001"]


@pytest.mark.parametrize("source", NOT_FLAGGED.values(), ids=NOT_FLAGGED.keys())
def test_not_flagged(source: str) -> None:
    assert lint(textwrap.dedent(source)) == []


def test_multiline_call_is_reported_at_its_first_line() -> None:
    source = textwrap.dedent(
        """
        import torch.utils.checkpoint

        out = torch.utils.checkpoint.checkpoint(
            block,
            x,
        )
        """
    )
    (finding,) = lint(source)
    assert (finding.line, finding.column, finding.end_line) == (4, 7, 7)


def test_partial_finding_is_at_the_call_of_the_partial() -> None:
    source = FLAGGED["partial without keyword, call without keyword"]
    (finding,) = lint(textwrap.dedent(source))
    assert finding.line == 5  # `run(f, x)`, not the partial on line 4


def test_columns_count_characters_not_bytes() -> None:
    source = 'import torch.utils.checkpoint as cp\ny = "ééé", cp.checkpoint(f, x)\n'
    (finding,) = lint(source)
    assert finding.column == len('y = "ééé", ') + 1


def test_extend_checkpoint_functions() -> None:
    source = "from mylib.memory import ckpt\nckpt(f, x)\n"
    assert lint(source) == []
    assert [f.code for f in lint(source, extend_checkpoint_functions=("mylib.memory.ckpt",))] == [
        "CKP001"
    ]


def test_verdicts_do_not_depend_on_hash_seed(tmp_path) -> None:
    """A try/except import must give the same verdict whatever PYTHONHASHSEED is."""
    module = tmp_path / "model.py"
    module.write_text(
        textwrap.dedent(
            """
            try:
                from deepspeed.checkpointing import checkpoint
            except ImportError:
                from torch.utils.checkpoint import checkpoint
            try:
                from torch.utils.checkpoint import checkpoint_sequential as seq
            except ImportError:
                seq = None
            def forward(x):
                checkpoint(f, x)
                seq(fs, 2, x)
            """
        )
    )
    outputs = set()
    for seed in ("0", "1", "2", "3", "12345"):
        result = subprocess.run(
            # --no-cache: each seed analyses afresh (a cached result would hide a difference)
            [sys.executable, "-m", "ckptlint", "--no-cache", "--format", "json", str(module)],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
            check=False,
        )
        outputs.add(result.stdout)
    assert len(outputs) == 1
    assert outputs.pop().count('"CKP001"') == 2


def test_line_numbers_follow_python_past_form_feeds() -> None:
    """str.splitlines breaks at a form feed; Python's line numbering does not."""
    source = "import torch.utils.checkpoint as cp\n\x0c\ndef f(x):  # \x0c here too\n"
    source += "    return cp.checkpoint(g, x)\n"
    (finding,) = lint(source)
    assert (finding.line, finding.column) == (4, 12)
