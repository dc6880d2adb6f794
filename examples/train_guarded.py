"""Train a tiny transformer with activation checkpointing, optionally under ckptguard.

    python examples/train_guarded.py                        # clean run
    python examples/train_guarded.py --inject global        # plain torch: silently wrong grads
    python examples/train_guarded.py --inject global --guard  # ckptguard names the change

Each --inject makes one change between a step's forward and its backward, the kind of mistake
that plain PyTorch lets through because the backward recomputes checkpointed blocks from the
*current* state: a rebound global, a late-bound loop variable, a train/eval switch, a changed
module attribute, an optimizer step, a cast, a monkeypatch, unpreserved RNG, a hook registered
mid-step, or a process-wide torch setting (the default dtype, which the blocks' position ramp
is made in). Without --guard the script compares step 2's gradients with a clean run's and
says whether they changed; plain PyTorch's own error ends the run where it raises one.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import ckptguard

TEMPERATURE = 1.0  # read by every block: rebinding it mid-step is the "global" mistake
INJECTIONS = (
    "global",
    "closure",
    "training",
    "attribute",
    "tensor",
    "placement",
    "function",
    "rng_device",
    "hook",
    "torch_state",
)


class Block(nn.Module):
    def __init__(self, hidden: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.residual_scale = 1.0
        self.norm1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.norm2 = nn.LayerNorm(hidden)
        self.mlp = nn.Sequential(
            nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden)
        )
        self.dropout = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        ramp = torch.linspace(0.0, 1.0, seq)  # made in the default dtype
        x = x + 0.1 * ramp.to(x.dtype)[:, None]
        q, k, v = self.qkv(self.norm1(x)).view(batch, seq, 3, self.heads, -1).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        attn = F.scaled_dot_product_attention(q / TEMPERATURE, k, v, is_causal=True)
        x = x + self.dropout(self.proj(attn.transpose(1, 2).reshape(batch, seq, hidden)))
        return x + self.dropout(self.mlp(self.norm2(x) * self.residual_scale))


def patched_forward(self: Block, x: torch.Tensor) -> torch.Tensor:
    """A 'hot fix' applied mid-step: same block, attention turned off."""
    return x + self.dropout(self.mlp(self.norm2(x) * self.residual_scale))


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 128, hidden: int = 64, blocks: int = 3) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.blocks = nn.ModuleList(Block(hidden) for _ in range(blocks))
        self.head = nn.Linear(hidden, vocab)
        self.late_binding = False  # --inject closure: the classic lambda-in-a-loop form
        self.preserve_rng_state = True  # --inject rng_device

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            if self.late_binding:
                x = checkpoint(lambda t: block(t), x, use_reentrant=False)  # noqa: B023, CKP202
            else:
                x = checkpoint(
                    block, x, use_reentrant=False, preserve_rng_state=self.preserve_rng_state
                )
        return self.head(x)


def inject(name: str, model: TinyLM) -> None:
    """The mistake, made between forward and backward."""
    global TEMPERATURE
    if name == "global":
        TEMPERATURE = 2.0
    elif name == "training":
        model.eval()  # e.g. a validation hook that forgets to wait for backward
    elif name == "attribute":
        model.blocks[0].residual_scale = 0.5
    elif name == "tensor":
        with torch.no_grad():  # hand-rolled weight decay, applied before this step's backward
            for parameter in model.blocks.parameters():
                parameter.mul_(0.99)
    elif name == "placement":
        model.double()
    elif name == "function":
        Block.forward = patched_forward
    elif name == "hook":  # e.g. a debugging hook added by a callback mid-step
        model.blocks[0].norm2.register_forward_hook(lambda module, args, out: out * 0.5)
    elif name == "torch_state":
        torch.set_default_dtype(torch.float64)


def train(
    steps: int,
    mistake: str | None = None,
    guard: bool = False,
    strict: bool = False,
    log: Callable[[str], None] = print,
) -> list[torch.Tensor]:
    """Train from a fixed seed, making ``mistake`` at step 2; returns step 2's gradients."""
    torch.manual_seed(0)
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, 128, (8, 33))
    original_forward, original_dtype = Block.forward, torch.get_default_dtype()
    step_two: list[torch.Tensor] = []
    if guard or strict:
        ckptguard.enable(strict=strict)
    try:
        for step in range(steps):
            injected = mistake if step == 2 else None
            model.late_binding = injected == "closure"
            model.preserve_rng_state = injected != "rng_device"
            logits = model(data[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1).float(), data[:, 1:].flatten())
            if injected:
                inject(injected, model)
            loss.backward()
            if step == 2:
                step_two = [p.grad.clone() for p in model.parameters()]
            optimizer.step()
            optimizer.zero_grad()
            log(
                f"step {step}: loss {loss.item():.4f}"
                + (f"  (injected: {injected})" * bool(injected))
            )
    finally:
        Block.forward = original_forward
        torch.set_default_dtype(original_dtype)
        global TEMPERATURE
        TEMPERATURE = 1.0
        if guard or strict:
            ckptguard.disable()
    return step_two


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--guard", action="store_true", help="run under ckptguard.enable()")
    parser.add_argument(
        "--strict", action="store_true", help="also compare the values backward uses"
    )
    parser.add_argument("--inject", choices=INJECTIONS, help="make this mistake at step 2")
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    gradients = train(args.steps, args.inject, args.guard, args.strict)
    if not args.inject or args.steps < 3:
        print("finished without an error")
        return
    clean = train(args.steps, log=lambda line: None)
    same = all(torch.equal(a, b) for a, b in zip(gradients, clean, strict=True))
    print(
        "finished without an error; step 2's gradients "
        + (
            "are identical to a clean run's (this change did not reach them)"
            if same
            else "differ from a clean run's: they were wrong"
        )
    )


if __name__ == "__main__":
    main()
