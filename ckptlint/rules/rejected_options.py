"""CKP002: checkpoint options torch rejects at the first step (``context_fn``, ``debug``)."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ckptlint.rules.base import (
    CHECKPOINT,
    CHECKPOINT_SEQUENTIAL,
    CHECKPOINT_WRAPPER,
    CHECKPOINT_WRAPPERS,
    UNKNOWN,
    Constant,
    External,
    FileContext,
    Finding,
    Flow,
    Location,
    Parameter,
    ProjectAnalysis,
    Rule,
    Site,
    SourceCall,
)

NOOP_CONTEXT_FN = "torch.utils.checkpoint.noop_context_fn"
REENTRANT_ERROR = (
    "ValueError: Passing context_fn or debug is only supported when use_reentrant=False"
)


class RejectedOptions(Rule):
    """`context_fn=` or `debug=True` where torch's checkpoint rejects them.

    Keywords are followed where they are written: in the call, a `functools.partial`, a
    `checkpoint_wrapper` applied by `apply_activation_checkpointing`, or a wrapper of your
    own that passes them on.

    ## Why is this bad?

    Selective activation checkpointing (`context_fn=partial(create_selective_checkpoint_contexts,
    policy)`) and `debug=True` exist only in the non-reentrant implementation. With
    `use_reentrant=True`, or without `use_reentrant` (torch 2.13 still defaults to the
    reentrant variant), the first forward raises `ValueError: Passing context_fn or debug
    is only supported when use_reentrant=False`. The same holds through
    `checkpoint_wrapper(module, checkpoint_impl=CheckpointImpl.REENTRANT, context_fn=...)`
    and the class it builds, `CheckpointWrapper(module, CheckpointImpl.REENTRANT, ...)`.

    `checkpoint_sequential` passes no keyword on but `use_reentrant` and
    `preserve_rng_state`: `context_fn` or `debug` there raise `ValueError: Unexpected
    keyword arguments`. And `debug=True` together with a `context_fn` raises `ValueError:
    debug=True is incompatible with non-default context_fn` in either variant.

    Pass `use_reentrant=False` (it is what PyTorch recommends anyway); for a sequence,
    checkpoint its segments with `checkpoint(..., use_reentrant=False, context_fn=...)`.

    ## Not reported

    `context_fn=noop_context_fn` (torch's default), and a value only known at run time (a
    parameter of yours).
    """

    code = "CKP002"
    name = "rejected-checkpoint-options"
    summary = "`context_fn` or `debug` where torch's checkpoint raises ValueError"

    EXAMPLE = """\
import functools
from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

from .policies import save_matmuls

def forward(self, x):
    context_fn = functools.partial(create_selective_checkpoint_contexts, save_matmuls)
    return checkpoint(self.block, x, use_reentrant=True, context_fn=context_fn)  # expect: CKP002@12
"""
    CORRECTED = """\
import functools
from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

from .policies import save_matmuls

def forward(self, x):
    context_fn = functools.partial(create_selective_checkpoint_contexts, save_matmuls)
    return checkpoint(self.block, x, use_reentrant=False, context_fn=context_fn)
"""

    def check(self, context: FileContext) -> Iterator[Finding]:
        analysis = context.analysis
        for site in analysis.sites(context.module):
            if not isinstance(site.node, ast.Call):
                continue
            for path in analysis.effective_paths(site):
                message = self._problem(analysis, site, path, context)
                if message is not None:
                    yield context.finding(site.node, self.code, message)
                    break

    def _problem(
        self, analysis: ProjectAnalysis, site: Site, path: SourceCall, context: FileContext
    ) -> str | None:
        name = path.source.names[0]
        if name in CHECKPOINT_WRAPPERS:
            name = CHECKPOINT_WRAPPER  # the class takes what its factory takes
        if name not in (CHECKPOINT, CHECKPOINT_SEQUENTIAL, CHECKPOINT_WRAPPER):
            return None
        context_flow = path.keyword("context_fn")
        passes_context = context_flow is not None and _sets_a_context(analysis, context_flow)
        debug_flow = path.keyword("debug")
        passes_debug = debug_flow is not None and _may_be_true(analysis, debug_flow)
        if not (passes_context or passes_debug):
            return None
        given = [
            ("`context_fn`", context_flow, passes_context),
            ("`debug=True`", debug_flow, passes_debug),
        ]
        if path.wrappers and all(_inside_any(flow, path) for _, flow, on in given if on and flow):
            return None  # written in the wrapper: reported at the call inside it
        what = " and ".join(
            _where(label, flow, site, context) for label, flow, on in given if on and flow
        )
        if name == CHECKPOINT_SEQUENTIAL:
            return (
                f"`checkpoint_sequential()` is given {what}: it passes on no keyword but"
                " `use_reentrant` and `preserve_rng_state`, so torch raises `ValueError:"
                " Unexpected keyword arguments` at the first step; checkpoint each segment"
                " with `checkpoint(..., use_reentrant=False, ...)` instead"
            )
        reentrancy = analysis.reentrancy(path)
        if reentrancy is not None:
            how = {
                ("explicit", CHECKPOINT): "`use_reentrant=True`",
                ("default", CHECKPOINT): "no `use_reentrant` (torch's default is the"
                " reentrant variant)",
                ("explicit", CHECKPOINT_WRAPPER): "`checkpoint_impl=CheckpointImpl.REENTRANT`",
            }[(reentrancy, name)]
            fix = (
                "`checkpoint_impl=CheckpointImpl.NO_REENTRANT`"
                if name == CHECKPOINT_WRAPPER
                else "`use_reentrant=False`"
            )
            return (
                f"{site.subject} is given {what} with {how}: torch raises `{REENTRANT_ERROR}`"
                f" at the first step; pass {fix}"
            )
        if passes_context and passes_debug:
            return (
                f"{site.subject} is given {what}: torch raises `ValueError: debug=True is"
                " incompatible with non-default context_fn` at the first step; drop one of them"
            )
        return None


def _sets_a_context(analysis: ProjectAnalysis, flow: Flow) -> bool:
    """A ``context_fn`` that is known and not torch's default (a parameter passed in from
    outside, or an unresolved name, may well be ``noop_context_fn``)."""
    for value in analysis.evaluate(*flow):
        if value is UNKNOWN or isinstance(value, (Parameter, Constant)):
            continue
        if isinstance(value, External) and value.name == NOOP_CONTEXT_FN:
            continue
        return True
    return False


def _may_be_true(analysis: ProjectAnalysis, flow: Flow) -> bool:
    return any(
        isinstance(value, Constant) and value.value is True for value in analysis.evaluate(*flow)
    )


def _inside_any(flow: Flow, path: SourceCall) -> bool:
    """Whether a keyword is written inside one of the wrappers the path goes through."""
    expression, where = flow
    return any(
        wrapper.module is where.module
        and wrapper.node.lineno <= expression.lineno <= (wrapper.node.end_lineno or 0)
        for wrapper in path.wrappers
    )


def _where(keyword: str, flow: Flow, site: Site, context: FileContext) -> str:
    """The keyword, with where it is written when not in the call itself."""
    expression, where = flow
    node = site.node
    inside = where.module is site.module and (
        node.lineno <= expression.lineno <= (node.end_lineno or node.lineno)  # type: ignore[attr-defined]
    )
    if inside:
        return keyword
    return f"{keyword} ({Location(where.module, expression.lineno).describe(context.module)})"
