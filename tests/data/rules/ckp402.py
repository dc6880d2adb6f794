"""CKP402 fixture: each `# expect: CODE@COLUMN` marks a finding on its line."""

import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint


class Reentrant(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.GELU()

    def forward(self, x):
        x = checkpoint(self.act, x, use_reentrant=True)
        return self.helper(x)

    def helper(self, x):
        return checkpoint(self.fc, x)


class NonReentrant(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return checkpoint(self.fc, x, use_reentrant=False)


def build(kind):
    return Reentrant() if kind == "reentrant" else NonReentrant()


def wrap(rank, model_factory):
    model = build("reentrant")
    model = DDP(model, device_ids=[rank], find_unused_parameters=True)  # expect: CKP402@13
    plain = DDP(Reentrant(), device_ids=[rank])
    static = DDP(Reentrant(), find_unused_parameters=True, static_graph=True)
    other = DDP(NonReentrant(), find_unused_parameters=True)
    unknown = DDP(model_factory(), find_unused_parameters=True)
    return model, plain, static, other, unknown
