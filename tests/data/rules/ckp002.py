"""CKP002 fixture: each `# expect: CODE@COLUMN` marks a finding on its line."""

import functools

from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    apply_activation_checkpointing,
    checkpoint_wrapper,
)
from torch.utils.checkpoint import (
    checkpoint,
    checkpoint_sequential,
    create_selective_checkpoint_contexts,
    noop_context_fn,
)

SAVE_NOTHING = functools.partial(create_selective_checkpoint_contexts, [])
reentrant = functools.partial(checkpoint, use_reentrant=True)


def hardwired(function, x):
    return checkpoint(function, x, use_reentrant=True, context_fn=SAVE_NOTHING)  # expect: CKP002@12


def passes_through(function, x, **options):
    return checkpoint(function, x, use_reentrant=True, **options)


def forward(self, x, context_fn):
    x = checkpoint(self.block, x, context_fn=SAVE_NOTHING)  # expect: CKP002@9
    x = checkpoint(self.block, x, use_reentrant=None, debug=True)  # expect: CKP002@9
    x = reentrant(self.block, x, context_fn=SAVE_NOTHING)  # expect: CKP002@9
    x = hardwired(self.block, x)
    x = passes_through(self.block, x, context_fn=SAVE_NOTHING)
    x = checkpoint(  # expect: CKP002@9
        self.block,
        x,
        use_reentrant=False,
        context_fn=SAVE_NOTHING,
        debug=True,
    )
    x = checkpoint_sequential(self.layers, 2, x, False, context_fn=SAVE_NOTHING)  # expect: CKP002@9
    x = checkpoint(self.block, x, use_reentrant=False, context_fn=SAVE_NOTHING)
    x = checkpoint(self.block, x, use_reentrant=True, context_fn=noop_context_fn)
    x = checkpoint(self.block, x, use_reentrant=True, debug=False)
    x = checkpoint(self.block, x, use_reentrant=True, context_fn=context_fn)
    return checkpoint(self.block, x, use_reentrant=False, debug=True)


def wrap(model, block):
    apply_activation_checkpointing(  # expect: CKP002@5
        model,
        checkpoint_wrapper_fn=functools.partial(
            checkpoint_wrapper, checkpoint_impl=CheckpointImpl.REENTRANT, context_fn=SAVE_NOTHING
        ),
    )
    return checkpoint_wrapper(block, context_fn=SAVE_NOTHING)
