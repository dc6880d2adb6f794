"""CKP001: a checkpoint call that does not pass ``use_reentrant``."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ckptlint.core import AddKeyword, Finding, Fix, ReplaceText
from ckptlint.regions.sites import SourceCall
from ckptlint.regions.sources import ReentrantArgument
from ckptlint.resolution.values import Arguments, PartialValue
from ckptlint.rules.base import FileContext, Rule


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
        module = context.module
        regions = context.analysis.regions_of(module)
        consumed: set[int] = set()
        for site in regions.sites:
            direct = [p for p in site.paths if p.source.reentrant is not None and not p.wrappers]
            for path in direct:
                consumed.update(id(partial.call) for partial in path.partials)
            if not isinstance(site.node, ast.Call) or not direct:
                continue
            if any(p.context.module is not module for path in direct for p in path.partials):
                continue  # a partial made in another module is reported where it is made
            failing = next((p for p in direct if not passes_use_reentrant(p)), None)
            if failing is not None:
                yield self._finding(context, site.node, failing)
        for creation in regions.partials:
            consumed.update(id(inner.call) for inner in _inner_partials(creation.value))
        for creation in regions.partials:
            partial = creation.value
            if id(partial.call) in consumed:
                continue
            paths = context.analysis.finder.paths((partial,), _no_arguments(partial.call))
            direct = [p for p in paths if p.source.reentrant is not None and not p.wrappers]
            failing = next((p for p in direct if not passes_use_reentrant(p)), None)
            if failing is not None:
                yield self._finding(context, partial.call, failing, made=True)

    def _finding(
        self, context: FileContext, call: ast.Call, path: SourceCall, *, made: bool = False
    ) -> Finding:
        name = path.source.label
        what = (
            f"`functools.partial({name}, ...)` made, and no call of it in this file passes it"
            " either,"
            if made
            else f"`{name}()` called"
        )
        none = explicit_none(path)
        if none is not None:
            end_line = none.end_lineno or none.lineno
            edit: AddKeyword | ReplaceText = ReplaceText(
                none.lineno,
                context.character_column(none.lineno, none.col_offset),
                end_line,
                context.character_column(end_line, none.end_col_offset or 0),
                "False",
            )
            message = (
                f"{what} with `use_reentrant=None`, which torch treats as not passed; pass"
                " `use_reentrant=False` (recommended) or `use_reentrant=True`"
            )
        else:
            column = context.character_column(call.lineno, call.col_offset)
            edit = AddKeyword(call.lineno, column, "use_reentrant", "False")
            message = (
                f"{what} without `use_reentrant`; pass `use_reentrant=False` (recommended)"
                " or `use_reentrant=True` explicitly"
            )
        return context.finding(call, self.code, message, Fix(edit, "unsafe"))


def passes_use_reentrant(path: SourceCall) -> bool:
    """True when ``use_reentrant`` is (or may be) passed with a value other than None."""
    arguments = path.arguments
    if explicit_none(path) is not None:
        return False
    if "use_reentrant" in arguments.keywords or arguments.double_star:
        return True
    reentrant = path.source.reentrant
    if reentrant is ReentrantArgument.KEYWORD_ONLY:
        return False
    for index, flow in enumerate(arguments.positional):
        if flow is None:
            return True  # a *args may carry it
        if index == 3 and reentrant is ReentrantArgument.FOURTH_POSITIONAL:
            return True
    return False


def explicit_none(path: SourceCall) -> ast.expr | None:
    """The literal ``None`` given as ``use_reentrant`` (keyword, or the 4th positional
    argument of ``checkpoint_sequential``), where it is written."""
    flow = path.arguments.keywords.get("use_reentrant")
    if flow is None and path.source.reentrant is ReentrantArgument.FOURTH_POSITIONAL:
        leading = path.arguments.positional[:4]
        if len(leading) == 4 and all(f is not None for f in leading):
            flow = leading[3]
    if flow is not None and _is_none(flow[0]):
        return flow[0]
    return None


def _is_none(expression: ast.expr) -> bool:
    return isinstance(expression, ast.Constant) and expression.value is None


def _inner_partials(partial: PartialValue) -> Iterator[PartialValue]:
    """The partials a partial wraps (``partial(partial(checkpoint), ...)``)."""
    stack = list(partial.inner)
    while stack:
        value = stack.pop()
        if isinstance(value, PartialValue):
            yield value
            stack.extend(value.inner)


def _no_arguments(call: ast.Call) -> Arguments:
    return Arguments((), {}, False, (call,))
