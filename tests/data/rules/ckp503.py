"""CKP503 fixture: each `# expect: CODE@COLUMN` marks a finding on its line."""

import collections

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

MATMULS = 0
SEEN = []


def every_second_matmul(counts):
    def policy(ctx, op, *args, **kwargs):
        if op == torch.ops.aten.mm.default:
            counts["mm"] += 1  # expect: CKP503@13
            if counts["mm"] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def keyed_by_mode(counts):
    def policy(ctx, op, *args, **kwargs):
        mode = "recompute" if ctx.is_recompute else "forward"
        if op == torch.ops.aten.mm.default:
            counts[mode] += 1
            if counts[mode] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def first_matmul_only(ctx, op, *args, **kwargs):
    global MATMULS
    if op != torch.ops.aten.mm.default:
        return CheckpointPolicy.PREFER_RECOMPUTE
    MATMULS += 1  # expect: CKP503@5
    return CheckpointPolicy.MUST_SAVE if MATMULS == 1 else CheckpointPolicy.PREFER_RECOMPUTE


def logs_ops(ctx, op, *args, **kwargs):
    SEEN.append(op)
    local = collections.Counter()
    local[op] += 1
    return CheckpointPolicy.MUST_SAVE if local[op] == 1 else CheckpointPolicy.PREFER_RECOMPUTE


class SaveSecondMatmul:
    def __init__(self):
        self.seen = 0

    def __call__(self, ctx, op, *args, **kwargs):
        if op == torch.ops.aten.mm.default:
            self.seen += 1  # expect: CKP503@13
        return op == torch.ops.aten.mm.default and self.seen == 2


def context_fn():
    first = create_selective_checkpoint_contexts(every_second_matmul(collections.defaultdict(int)))
    return first, create_selective_checkpoint_contexts(SaveSecondMatmul())
