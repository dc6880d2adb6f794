"""CKP501: a selective-checkpoint policy that compares the op with something it never is."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass

from ckptlint.rules.base import (
    Context,
    Elements,
    External,
    FileContext,
    Finding,
    Location,
    Mapping,
    Module,
    Policy,
    ProjectAnalysis,
    Rule,
    Sequence,
    Value,
    Values,
    known,
)

# ``torch.<name>`` that are submodules, not the Python functions a policy might confuse
# with ops (``torch.mm``, ``torch.matmul``).
TORCH_SUBMODULES = frozenset(
    "ops nn utils cuda distributed autograd linalg special fft library backends jit fx"
    " compiler amp testing sparse overrides profiler export func masked nested onnx"
    " quantization ao optim mps xpu cpu hub random serialization types version".split()
)
FUNCTION_NAMESPACES = (
    "torch.nn.functional.",
    "torch.linalg.",
    "torch.special.",
    "torch.fft.",
    "torch.Tensor.",
)
EQUALITY = (ast.Eq, ast.NotEq, ast.Is, ast.IsNot)
MEMBERSHIP = (ast.In, ast.NotIn)


class PolicyNeverMatches(Rule):
    """A selective-checkpoint policy compares the op with something torch never passes.

    Reported at the comparison, in any policy the module defines: a function handed to
    `create_selective_checkpoint_contexts` (directly, through `functools.partial`, as a
    factory's product, or an object's `__call__`), or one returning a `CheckpointPolicy`.
    Containers are followed to where they are written (a module-level set of ops).

    ## Why is this bad?

    `create_selective_checkpoint_contexts(policy)` makes torch call `policy(ctx, op, ...)`
    for every op of the region with `op` an `OpOverload`: `torch.ops.aten.mm.default`,
    never the `OpOverloadPacket` `torch.ops.aten.mm`, and never a Python function such as
    `torch.mm` or `F.linear`. An `OpOverload` is not equal to its packet, so `op ==
    torch.ops.aten.mm`, `op in (torch.ops.aten.mm, ...)`, a set or the keys of a dict of
    packets never match (checked on torch 2.13): the policy saves nothing, the region
    recomputes every matmul, and its author believes they are kept. Nothing warns.

    Compare with the overload (`torch.ops.aten.mm.default`), or the op's packet
    (`op.overloadpacket in (torch.ops.aten.mm, ...)`). (The list form,
    `create_selective_checkpoint_contexts([torch.ops.aten.mm])`, is rejected by torch
    itself with a ValueError.)

    ## Not reported

    `torch.ops.higher_order.*` operators: they are passed as they are and compare fine.
    """

    code = "CKP501"
    name = "policy-never-matches"
    summary = "selective-checkpoint policy compares the op with an OpOverloadPacket"

    EXAMPLE = """\
import torch
from torch.utils.checkpoint import CheckpointPolicy

def save_matmuls(ctx, op, *args, **kwargs):
    if op == torch.ops.aten.mm:  # expect: CKP501@8
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE
"""
    CORRECTED = """\
import torch
from torch.utils.checkpoint import CheckpointPolicy

def save_matmuls(ctx, op, *args, **kwargs):
    if op == torch.ops.aten.mm.default:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE
"""

    def check(self, context: FileContext) -> Iterator[Finding]:
        analysis = context.analysis
        for policy in analysis.policies(context.module):
            for compare, mismatch in _never_true(analysis, policy):
                message = (
                    f"{policy.named()} compares the op with {mismatch.what}"
                    f"{policy.line_of(compare)}; torch calls a policy with an OpOverload"
                    " (`torch.ops.aten.mm.default`), so this never matches and the op is"
                    f" recomputed, never saved: {mismatch.fix}"
                )
                yield context.finding(policy.report_at(compare), self.code, message)


@dataclass(frozen=True)
class Mismatch:
    what: str  # "`torch.ops.aten.mm`, an OpOverloadPacket (in the set at line 4)"
    fix: str


def _never_true(
    analysis: ProjectAnalysis, policy: Policy
) -> Iterator[tuple[ast.Compare, Mismatch]]:
    """Comparisons of the op with a packet or a Python function, and what it is."""
    bound = analysis.bind(policy.function, None)
    module = policy.function.module
    for node, scope in analysis.nodes_with_scopes(policy.body, bound.scope, module):
        if not isinstance(node, ast.Compare) or len(node.ops) != 1:
            continue
        here = bound.at(scope)
        operator, left, right = node.ops[0], node.left, node.comparators[0]
        if isinstance(operator, EQUALITY):
            other = (
                right
                if _is_op(left, policy, here)
                else left
                if _is_op(right, policy, here)
                else None
            )
            if other is None:
                continue
            values = known(analysis.evaluate(other, here))
            mismatches = [_not_an_op(v) for v in values]
            if values and all(mismatches):
                yield node, mismatches[0]  # type: ignore[misc]
        elif isinstance(operator, MEMBERSHIP) and _is_op(left, policy, here):
            found = _bad_element(analysis, analysis.evaluate(right, here), node, module)
            if found is not None:
                yield node, found


def _is_op(expression: ast.expr, policy: Policy, context: Context) -> bool:
    if not isinstance(expression, ast.Name) or expression.id != policy.op.arg:
        return False
    bindings = context.scope.lookup(expression.id, (expression.lineno, expression.col_offset))
    return bool(bindings) and all(b.node is policy.op for b in bindings)


def _not_an_op(value: Value) -> Mismatch | None:
    """How a value differs from what torch passes a policy, or None."""
    if not isinstance(value, External):
        return None
    name = value.name
    parts = name.split(".")
    if parts[:2] == ["torch", "ops"] and len(parts) == 4 and parts[2] != "higher_order":
        fix = f"compare with `{name}.default`, or with `op.overloadpacket`"
        return Mismatch(f"`{name}`, an OpOverloadPacket", fix)
    is_function = name.startswith(FUNCTION_NAMESPACES) or (
        len(parts) == 2
        and parts[0] == "torch"
        and parts[1][:1].islower()
        and parts[1] not in TORCH_SUBMODULES
    )
    if not is_function:
        return None
    fix = "compare with the aten overload it runs as (`torch.ops.aten.<op>.default`)"
    return Mismatch(f"`{name}`, a Python function", fix)


def _bad_element(
    analysis: ProjectAnalysis, containers: Values, compare: ast.Compare, module: Module
) -> Mismatch | None:
    """The first packet or Python function among the elements (or dict keys) of
    ``containers``, with where the container is written when not in the comparison."""
    for container in known(containers):
        elements: Values = ()
        node = getattr(container, "node", None)
        if isinstance(container, Mapping) and isinstance(node, ast.Dict):
            elements = tuple(
                v
                for key in node.keys
                if key is not None
                for v in analysis.evaluate(key, container.context)
            )
        elif isinstance(container, (Sequence, Elements)):
            elements = analysis.iterate((container,))
        for element in known(elements):
            mismatch = _not_an_op(element)
            if mismatch is None:
                continue
            where = getattr(container, "context", None)
            if (
                node is None
                or where is None
                or (
                    where.module is module
                    and compare.lineno <= node.lineno <= (compare.end_lineno or 0)
                )
            ):
                return mismatch
            location = Location(where.module, node.lineno).describe(module)
            kind = "dict" if isinstance(container, Mapping) else type(node).__name__.lower()
            return Mismatch(f"{mismatch.what} (in the {kind} at {location})", mismatch.fix)
    return None
