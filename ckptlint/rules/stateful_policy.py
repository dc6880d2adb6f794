"""CKP503: a selective-checkpoint policy that counts calls without ``ctx.is_recompute``."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ckptlint.rules.base import (
    MUTATING_METHODS,
    FileContext,
    Finding,
    Policy,
    ProjectAnalysis,
    Rule,
    Scope,
    assigned_targets,
    root_name,
)


class StatefulPolicy(Rule):
    """A selective-checkpoint policy keeps state between calls and ignores `ctx.is_recompute`.

    Reported at the statement that changes the state (an augmented assignment, an item or
    attribute assignment, `append`/`update`/...; on a closure variable, a global or the
    policy object's own attribute) when the policy also reads that state and never
    mentions `is_recompute`.

    ## Why is this bad?

    Policies that decide by position ("save every second matmul") keep a counter outside
    the call: a closure's dict, a global, an attribute of the policy object. Up to torch
    2.12, torch calls the policy once per op in the forward and again per op in the
    recompute (with `ctx.is_recompute=True`), and the recompute takes a saved output
    wherever the policy then says "save". A counter that goes on counting in the recompute
    makes other decisions there: the recompute takes the saved output of another call of
    the op (silently wrong gradients when the shapes agree; on torch 2.12's selective
    checkpointing a parity counter over three matmuls gave gradients off by 28) or fails
    with `... encountered during backward, but not found in storage`. torch 2.13 calls the
    policy in the forward only (`is_recompute` is always False there), so the same code
    is right on 2.13 and wrong on the releases before it.

    Count the forward and the recompute apart (`mode = "recompute" if ctx.is_recompute
    else "forward"`, as torchtitan does), or decide from the op and its arguments alone.

    ## Not reported

    A list the policy only appends to (a log of ops): it decides nothing.
    """

    code = "CKP503"
    name = "stateful-policy"
    summary = "selective-checkpoint policy keeps state without reading `ctx.is_recompute`"

    EXAMPLE = """\
import collections
import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

def make_policy(counts):
    def policy(ctx, op, *args, **kwargs):
        if op == torch.ops.aten.mm.default:
            counts["mm"] += 1  # expect: CKP503@13
            if counts["mm"] % 2 == 0:
                return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE
    return policy

def context_fn():
    return create_selective_checkpoint_contexts(make_policy(collections.defaultdict(int)))
"""
    CORRECTED = """\
import collections
import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

def make_policy(counts):
    def policy(ctx, op, *args, **kwargs):
        mode = "recompute" if ctx.is_recompute else "forward"
        if op == torch.ops.aten.mm.default:
            counts[mode] += 1
            if counts[mode] % 2 == 0:
                return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE
    return policy

def context_fn():
    return create_selective_checkpoint_contexts(make_policy(collections.defaultdict(int)))
"""

    def check(self, context: FileContext) -> Iterator[Finding]:
        analysis = context.analysis
        for policy in analysis.policies(context.module):
            found = _state_change(analysis, policy)
            if found is None:
                continue
            statement, state = found
            message = (
                f"{policy.named()} changes `{state}`{policy.line_of(statement)} between calls"
                " and decides by it, but never reads `ctx.is_recompute`: torch 2.12 and earlier"
                " call the policy again during the recompute, where the count has moved on, so the"
                " recompute makes other save decisions than the forward and takes another"
                " call's saved output (silently wrong gradients) or fails ('not found in"
                " storage'); count forward and recompute apart (`ctx.is_recompute`) or"
                " decide from the op alone"
            )
            yield context.finding(policy.report_at(statement), self.code, message)


def _state_change(analysis: ProjectAnalysis, policy: Policy) -> tuple[ast.stmt, str] | None:
    """The first statement changing state that outlives the call and that the policy reads
    elsewhere, with the state's expression; None when it reads ``is_recompute``."""
    node = policy.function.node
    if any(_mentions_is_recompute(n) for n in ast.walk(node)):
        return None
    bound = analysis.bind(policy.function, None)
    own = bound.scope
    module = policy.function.module
    nodes = list(analysis.nodes_with_scopes(policy.body, own, module))
    instance = _instance_parameter(policy)
    for statement, scope in nodes:
        if not isinstance(statement, ast.stmt):
            continue
        for state in _changed_state(statement, scope, own, instance):
            text = ast.unparse(state)
            if any(_reads(other, text) and not _within(other, statement) for other, _ in nodes):
                return statement, text
    return None


def _mentions_is_recompute(node: ast.AST) -> bool:
    if isinstance(node, ast.Attribute):
        return node.attr == "is_recompute"
    return isinstance(node, ast.Constant) and node.value == "is_recompute"


def _instance_parameter(policy: Policy) -> str | None:
    """``self`` of a policy that is a method (``__call__``): its attributes outlive calls."""
    node = policy.function.node
    positional = [*node.args.posonlyargs, *node.args.args]
    if positional and positional[0] is not policy.context:
        return positional[0].arg
    return None


def _changed_state(
    statement: ast.stmt, scope: Scope, own: Scope, instance: str | None
) -> Iterator[ast.expr]:
    """What the statement changes that is not a local of the call."""
    targets = list(assigned_targets(statement))
    if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
        func = statement.value.func
        if isinstance(func, ast.Attribute) and func.attr in MUTATING_METHODS:
            targets.append(func.value)
    for target in targets:
        if isinstance(target, ast.Name):
            if target.id in scope.global_names or target.id in scope.nonlocal_names:
                yield target
            continue
        root = root_name(target)
        if root is None:
            continue
        if root.id == instance and root is not target:
            yield target
            continue
        bindings = scope.lookup(root.id, (root.lineno, root.col_offset))
        if bindings and all(b.scope is not own and b.scope is not scope for b in bindings):
            yield target


def _reads(node: ast.AST, text: str) -> bool:
    """A read of the state (``counts["mm"]``, ``self.seen``, a global name)."""
    if isinstance(node, (ast.Name, ast.Attribute, ast.Subscript)):
        return isinstance(node.ctx, ast.Load) and ast.unparse(node) == text
    return False


def _within(node: ast.AST, statement: ast.stmt) -> bool:
    start = (statement.lineno, statement.col_offset)
    end = (statement.end_lineno or statement.lineno, statement.end_col_offset or 0)
    return start <= (node.lineno, node.col_offset) <= end  # type: ignore[attr-defined]
