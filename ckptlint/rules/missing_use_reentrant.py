"""CKP001: a checkpoint call that does not pass ``use_reentrant``."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ckptlint.resolve import CheckpointCall, Signature
from ckptlint.rules.base import AddKeyword, FileContext, Finding, Fix, ReplaceText, Rule


class MissingUseReentrant(Rule):
    """`torch.utils.checkpoint.checkpoint` and `checkpoint_sequential` called without
    `use_reentrant`.

    PyTorch warns when `use_reentrant` is omitted and has announced that the implicit
    default will change. The implicit value today selects the reentrant implementation,
    which gives parameters no gradients when no input requires grad, ignores keyword
    arguments and does not support nested checkpoints or `torch.autograd.grad`.
    `use_reentrant=False` is the variant PyTorch recommends.

    Pass it explicitly. The autofix adds `use_reentrant=False`; because that switches the
    implementation the code ran with, it is an unsafe fix: apply it with
    `ckptlint --fix --unsafe-fixes` and review the diff.

    `use_reentrant=None` is the same as leaving it out (torch warns and picks the default),
    so it is reported too; the fix replaces `None` with `False`, where the `None` is written
    (in the call, or in the `functools.partial` it goes through).

    Calls passing `**kwargs` are not reported (the keyword may be inside), nor are
    `checkpoint_sequential` calls whose 4th positional argument (`use_reentrant`) is
    given or may come from `*args`.
    """

    code = "CKP001"
    name = "missing-use-reentrant"
    summary = "checkpoint call without `use_reentrant`"

    INVALID = [
        """\
import torch.utils.checkpoint

def forward(self, x):
    return torch.utils.checkpoint.checkpoint(self.block, x)
""",
        """\
from torch.utils.checkpoint import checkpoint as ckpt

def forward(self, x):
    return ckpt(self.block, x, preserve_rng_state=False)
""",
        """\
import torch.utils.checkpoint as cp

def run(functions, x):
    return cp.checkpoint_sequential(functions, 2, x)
""",
        """\
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

def forward(self, x):
    x = checkpoint(self.block, x, use_reentrant=None)
    return checkpoint_sequential(self.layers, 2, x, None)
""",
        """\
import functools
from torch.utils.checkpoint import checkpoint

run_checkpointed = functools.partial(checkpoint, preserve_rng_state=True)

def forward(self, x):
    return run_checkpointed(self.block, x)
""",
        """\
from torch.utils import checkpoint

def forward(self, *inputs):
    return checkpoint.checkpoint(self.block, *inputs)
""",
        """\
try:
    from torch.utils.checkpoint import checkpoint
except ImportError:
    checkpoint = None

def forward(self, x):
    return checkpoint(self.block, x)
""",
    ]
    VALID = [
        """\
import torch.utils.checkpoint

def forward(self, x):
    return torch.utils.checkpoint.checkpoint(self.block, x, use_reentrant=False)
""",
        """\
from torch.utils.checkpoint import checkpoint_sequential

def run(functions, x):
    return checkpoint_sequential(functions, 2, x, False)
""",
        """\
from torch.utils.checkpoint import checkpoint

def forward(self, x, **checkpoint_kwargs):
    return checkpoint(self.block, x, **checkpoint_kwargs)
""",
        """\
import functools
from torch.utils.checkpoint import checkpoint

run_checkpointed = functools.partial(checkpoint, use_reentrant=False)

def forward(self, x):
    return run_checkpointed(self.block, x)
""",
        """\
from torch.utils.checkpoint import checkpoint

def forward(self, x, checkpoint):
    return checkpoint(self.block, x)
""",
        """\
from torch.utils.checkpoint import checkpoint

class Trainer:
    def step(self, trainer, x):
        self.checkpoint(x)
        trainer.save_checkpoint("out")
""",
        """\
import deepspeed
from megatron.core.tensor_parallel import checkpoint

def forward(self, x):
    deepspeed.checkpointing.checkpoint(self.block, x)
    return checkpoint(self.block, False, x)
""",
    ]

    def check(self, context: FileContext) -> Iterator[Finding]:
        for call in context.checkpoint_calls:
            if not call.passes_use_reentrant():
                yield self._finding(context, call.node, f"`{call.name}()` called")
                continue
            none = _explicit_none(call)
            if none is not None:
                yield self._none_finding(context, call, none)
        for partial in context.unconsumed_partials:
            name = partial.target.rsplit(".", 1)[-1]
            yield self._finding(
                context,
                partial.creation,
                f"`functools.partial({name}, ...)` made, and no call of it in this file passes"
                " it either,",
            )

    def _finding(self, context: FileContext, call: ast.Call, what: str) -> Finding:
        column = context.character_column(call.lineno, call.col_offset)
        fix = Fix(AddKeyword(call.lineno, column, "use_reentrant", "False"), "unsafe")
        message = (
            f"{what} without `use_reentrant`; pass `use_reentrant=False` (recommended)"
            " or `use_reentrant=True` explicitly"
        )
        return context.finding(call, self.code, message, fix)

    def _none_finding(self, context: FileContext, call: CheckpointCall, none: ast.expr) -> Finding:
        end_line = none.end_lineno or none.lineno
        edit = ReplaceText(
            none.lineno,
            context.character_column(none.lineno, none.col_offset),
            end_line,
            context.character_column(end_line, none.end_col_offset or 0),
            "False",
        )
        message = (
            f"`{call.name}()` called with `use_reentrant=None`, which torch treats as not"
            " passed; pass `use_reentrant=False` (recommended) or `use_reentrant=True`"
        )
        return context.finding(call.node, self.code, message, Fix(edit, "unsafe"))


def _explicit_none(call: CheckpointCall) -> ast.expr | None:
    """The literal ``None`` given as ``use_reentrant`` (keyword, or 4th positional argument
    of ``checkpoint_sequential``), if it is one."""
    value = call.keywords.get("use_reentrant")
    if value is None and call.signature is Signature.FOURTH_POSITIONAL:
        leading = call.positional[:4]
        if len(leading) == 4 and not any(isinstance(a, ast.Starred) for a in leading):
            value = leading[3]
    if isinstance(value, ast.Constant) and value.value is None:
        return value
    return None
