"""CKP501 fixture: each `# expect: CODE@COLUMN` marks a finding on its line."""

import functools

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

aten = torch.ops.aten
PACKETS = {aten.mm, aten.bmm}
OVERLOADS = {aten.mm.default, aten.bmm.default}
BY_OP = {aten.mm: CheckpointPolicy.MUST_SAVE}


def packet_equality(ctx, op, *args, **kwargs):
    if op == torch.ops.aten.mm:  # expect: CKP501@8
        return CheckpointPolicy.MUST_SAVE
    if torch.ops.aten.addmm is op:  # expect: CKP501@8
        return CheckpointPolicy.MUST_SAVE
    if op == aten.mm.default or op == torch.ops.higher_order.flex_attention:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def membership(ctx, func, *args, **kwargs):
    if func in PACKETS:  # expect: CKP501@8
        return CheckpointPolicy.MUST_SAVE
    if func in BY_OP:  # expect: CKP501@8
        return BY_OP[func]
    if func in (torch.mm, F.linear):  # expect: CKP501@8
        return CheckpointPolicy.MUST_SAVE
    if func in OVERLOADS or func.overloadpacket in PACKETS:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


class SaveMatmuls:
    def __call__(self, ctx, op, *args, **kwargs):
        return op in [aten.mm, aten.addmm]  # expect: CKP501@16


def context_fn():
    return create_selective_checkpoint_contexts(SaveMatmuls())


sac = functools.partial(create_selective_checkpoint_contexts, lambda ctx, op, *a, **k: op == aten.mm)  # expect: CKP501@88


def not_a_policy(op):
    return op == aten.mm
