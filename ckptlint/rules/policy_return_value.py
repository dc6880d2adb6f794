"""CKP502: a selective-checkpoint policy returns what torch reads as "recompute"."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ckptlint.rules.base import (
    CHECKPOINT_POLICY,
    Constant,
    External,
    FileContext,
    Finding,
    Policy,
    ProjectAnalysis,
    Rule,
    known,
    own_nodes,
)


class PolicyReturnValue(Rule):
    """A selective-checkpoint policy returns a value torch silently reads as "recompute".

    Reported at a `return` of a truthy int, float, string or bytes constant, or of a
    `CheckpointPolicy` member's `.value`/`.name`; and at the `def` of a policy that returns
    None on every path. Policies are found as CKP501 finds them.

    ## Why is this bad?

    torch saves an op's output when the policy returns `CheckpointPolicy.MUST_SAVE` or
    `PREFER_SAVE`, or `True` (a bool is accepted for backward compatibility: `True` is
    `MUST_SAVE`, `False` is `PREFER_RECOMPUTE`). Anything else is read as "recompute",
    without a warning (checked on torch 2.12 and 2.13): `return 1`, `return "save"`,
    `return CheckpointPolicy.MUST_SAVE.value` (an int), or a policy that returns nothing
    at all, saves nothing. The region then recomputes everything while its author believes
    the chosen ops are kept.

    Return a `CheckpointPolicy` member (or a bool).

    ## Not reported

    A policy returning `False`, `0` or `None` on some paths only: torch reads those as
    "recompute", which is what they say.
    """

    code = "CKP502"
    name = "policy-return-value"
    summary = "selective-checkpoint policy returns a value torch reads as recompute"

    EXAMPLE = """\
import torch
from torch.utils.checkpoint import create_selective_checkpoint_contexts

SAVE = {torch.ops.aten.mm.default}

def policy(ctx, op, *args, **kwargs):
    return 1 if op in SAVE else 0  # expect: CKP502@5

def context_fn():
    return create_selective_checkpoint_contexts(policy)
"""
    CORRECTED = """\
import torch
from torch.utils.checkpoint import create_selective_checkpoint_contexts

SAVE = {torch.ops.aten.mm.default}

def policy(ctx, op, *args, **kwargs):
    return op in SAVE

def context_fn():
    return create_selective_checkpoint_contexts(policy)
"""

    def check(self, context: FileContext) -> Iterator[Finding]:
        analysis = context.analysis
        for policy in analysis.policies(context.module):
            finding = self._check(analysis, policy, context)
            if finding is not None:
                yield finding

    def _check(
        self, analysis: ProjectAnalysis, policy: Policy, context: FileContext
    ) -> Finding | None:
        function = policy.function
        node = function.node
        bound = analysis.bind(function, None)
        if isinstance(node, ast.Lambda):
            returns: list[tuple[ast.AST, ast.expr | None]] = [(node, node.body)]
        else:
            returns = [(n, n.value) for n in own_nodes(node.body) if isinstance(n, ast.Return)]
            if any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in own_nodes(node.body)):
                return None
        every_none = True
        for statement, expression in returns:
            values = (
                (Constant(None),)
                if expression is None
                else known(analysis.evaluate(expression, bound))
            )
            for value in values:
                misread = _misread(value)
                if misread is not None:
                    message = (
                        f"{policy.named()} returns {misread}{policy.line_of(statement)}: torch"
                        " saves only"
                        " for `CheckpointPolicy.MUST_SAVE`/`PREFER_SAVE` or `True` and reads"
                        " anything else as recompute, so this op is never saved; return a"
                        " `CheckpointPolicy` member"
                    )
                    return context.finding(policy.report_at(statement), self.code, message)
            if not values or any(not (isinstance(v, Constant) and v.value is None) for v in values):
                every_none = False
        if every_none:
            message = (
                f"{policy.named()} returns None for every op (no `return` of a value): torch"
                " reads None as recompute, so the policy saves nothing; return a"
                " `CheckpointPolicy` member"
            )
            return context.finding(policy.report_at(node), self.code, message)
        return None


def _misread(value: object) -> str | None:
    """How a returned value reads, when torch takes it for "recompute" against its look."""
    if isinstance(value, Constant):
        constant = value.value
        if isinstance(constant, (int, float, str, bytes)) and not isinstance(constant, bool):
            return f"`{constant!r}` ({type(constant).__name__})" if constant else None
        return None
    if isinstance(value, External) and value.name.startswith(CHECKPOINT_POLICY + "."):
        member = value.name[len(CHECKPOINT_POLICY) + 1 :]
        if member.endswith((".value", ".name")):
            return f"`CheckpointPolicy.{member}`, not the member itself"
    return None
