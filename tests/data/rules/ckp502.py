"""CKP502 fixture: each `# expect: CODE@COLUMN` marks a finding on its line."""

import functools

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

SAVE = {torch.ops.aten.mm.default}


def as_int(ctx, op, *args, **kwargs):
    if op in SAVE:
        return 1  # expect: CKP502@9
    return 0


def as_value(ctx, op, *args, **kwargs):
    if op in SAVE:
        return CheckpointPolicy.MUST_SAVE.value  # expect: CKP502@9
    return CheckpointPolicy.PREFER_RECOMPUTE


def forgot_return(ctx, op, *args, **kwargs):  # expect: CKP502@1
    CheckpointPolicy.MUST_SAVE if op in SAVE else CheckpointPolicy.PREFER_RECOMPUTE


def as_bool(ctx, op, *args, **kwargs):
    return op in SAVE


def falls_through(ctx, op, *args, **kwargs):
    if op in SAVE:
        return CheckpointPolicy.MUST_SAVE


def recompute_everything(ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_RECOMPUTE


contexts = [
    functools.partial(create_selective_checkpoint_contexts, policy)
    for policy in (as_int, forgot_return, as_bool, falls_through)
]
