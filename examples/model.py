"""A small GPT-style model with the checkpointing mistakes ckptlint finds.

Run ``ckptlint examples/`` to see them; each comment says which finding to expect.
"""

import torch
import torch.nn.functional as F
import torch.utils.checkpoint as cp
from torch import nn
from torch.utils.checkpoint import checkpoint

ATTENTION_SCALE = {"value": 1.0}  # tuned at run time by set_attention_scale()


def set_attention_scale(scale: float) -> None:
    ATTENTION_SCALE["value"] = scale


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden)
        self.attention = nn.MultiheadAttention(hidden, heads, dropout=dropout, batch_first=True)
        self.norm2 = nn.LayerNorm(hidden)
        self.mlp = nn.Sequential(
            nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden)
        )
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = self.norm1(x)
        attended, _ = self.attention(normed, normed, normed, need_weights=False)
        x = x + self.dropout(attended)
        return x + self.dropout(self.mlp(self.norm2(x)))


class Model(nn.Module):
    def __init__(self, vocab: int = 1000, hidden: int = 256, depth: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.blocks = nn.ModuleList(Block(hidden, 4, 0.1) for _ in range(depth))
        self.act = nn.GELU()
        self.head = nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            # CKP001: use_reentrant is not passed.
            x = checkpoint(block, x)
        # CKP101: checkpointing a lone activation saves nothing and adds a recompute.
        x = cp.checkpoint(self.act, x, use_reentrant=False)
        return self.head(x)

    def forward_scaled(self, tokens: torch.Tensor, scales: list[float]) -> torch.Tensor:
        x = self.embed(tokens)
        for block, scale in zip(self.blocks, scales, strict=True):
            # CKP202: the lambda reads `block` and `scale` late; the recompute sees the last ones.
            x = checkpoint(lambda h: block(h) * scale, x, use_reentrant=False)
        return self.head(x)

    def forward_without_rng_state(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        # CKP301: dropout in the region, but the RNG state is not restored for the recompute.
        x = checkpoint(self._dropout_block, x, use_reentrant=False, preserve_rng_state=False)
        return self.head(x)

    def forward_rescaled(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        # CKP201: the region reads ATTENTION_SCALE, which set_attention_scale() mutates;
        # a change between forward and backward makes the recompute differ.
        x = checkpoint(self._rescaled_block, x, use_reentrant=False)
        return self.head(x)

    def _rescaled_block(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks[0](x) * ATTENTION_SCALE["value"]

    def _dropout_block(self, x: torch.Tensor) -> torch.Tensor:
        return F.dropout(self.blocks[0](x), p=0.1, training=self.training)
