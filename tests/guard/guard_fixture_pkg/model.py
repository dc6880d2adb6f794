"""A block that reads ``cfg.SCALE`` and calls ``helpers.shift``, both in other modules."""

import torch
import torch.nn as nn

from guard_fixture_pkg import cfg
from guard_fixture_pkg.helpers import shift


class CrossModuleBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(shift(self.fc(x)) * cfg.SCALE)
