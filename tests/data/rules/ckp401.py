"""CKP401 fixture: each `# expect: CODE@COLUMN` marks a finding on its line."""

import functools

import torch.nn as nn
from torch.utils.checkpoint import checkpoint


def create_custom_forward(module):
    def custom_forward(*inputs):
        return module(*inputs)

    return custom_forward


def reentrant(function, *args):
    return checkpoint(function, *args, use_reentrant=True)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(x).relu()


class Universal(nn.Module):
    """One block applied at every depth (weights shared across layers)."""

    def __init__(self, depth):
        super().__init__()
        self.depth = depth
        self.block = Block()
        self.act = nn.GELU()
        shared = Block()
        self.tied = nn.ModuleList([shared for _ in range(depth)])
        self.repeated = nn.ModuleList([Block()] * depth)
        self.layers = nn.ModuleList([Block() for _ in range(depth)])

    def forward(self, x):
        for _ in range(self.depth):
            x = checkpoint(create_custom_forward(self.block), x)  # expect: CKP401@17
            x = checkpoint(self.act, x, use_reentrant=True)
            x = checkpoint(self.block, x, use_reentrant=False)
        for layer in self.tied:
            x = reentrant(functools.partial(layer), x)  # expect: CKP401@17
        for layer in self.repeated:
            x = checkpoint(layer, x, use_reentrant=True)  # expect: CKP401@17
        for layer in self.layers:
            x = checkpoint(layer, x, use_reentrant=True)
        for index in range(self.depth):
            x = checkpoint(self.layers[index], x, use_reentrant=True)
        outputs = [checkpoint(self.block, h, use_reentrant=True) for h in x.chunk(2)]  # expect: CKP401@20
        return outputs

    def twice(self, x):
        x = checkpoint(self.block, x, use_reentrant=True)
        return checkpoint(self.block, x, use_reentrant=True)  # expect: CKP401@16

    def inside_and_outside(self, x):
        x = reentrant(self.block, x)  # expect: CKP401@13
        return self.block(x)

    def one_or_the_other(self, x):
        if self.training:
            x = checkpoint(self.block, x, use_reentrant=True)
        else:
            x = self.block(x)
        return checkpoint(self.block, x, use_reentrant=True) if self.training else self.block(x)


def train(model, batches, optimizer, update):
    for batch in batches:
        loss = checkpoint(model.block, batch, use_reentrant=True)
        loss.backward()
        optimizer.step()
    for batch in batches:
        optimizer.zero_grad()
        update(checkpoint(model.block, batch, use_reentrant=True))


def embed_in_chunks(encoder, embeddings, chunk):
    """RetriBERT's pattern: one encoder checkpointed once per mini-batch."""

    def encode(*inputs):
        return encoder.layers(inputs[0])

    outputs = []
    for start in range(0, embeddings.shape[0], chunk):
        outputs.append(checkpoint(encode, embeddings[start : start + chunk]))  # expect: CKP401@24
    return outputs


def activations_in_chunks(embeddings, chunk):
    def activate(*inputs):
        return inputs[0].relu().tanh()

    return [checkpoint(activate, embeddings[i : i + chunk]) for i in range(0, len(embeddings), chunk)]
