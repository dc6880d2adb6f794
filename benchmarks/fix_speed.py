"""``ckptlint --fix`` against plain linting on one 50,000-line model file.

The file repeats a transformer-style layer (a class with an ``__init__``, a helper and a
``forward`` whose checkpoint call lacks ``use_reentrant``), so it has one fixable CKP001
finding every ~50 lines (about 1,000 in all), plus correct calls and unrelated code.

Interleaved repetitions, each in a fresh process on a fresh copy of the file, both without
the results cache: ``ckptlint FILE`` and ``ckptlint --fix --unsafe-fixes FILE``. Prints the
medians, their ratio and the median ratio of the interleaved pairs (the promise: at most
3x), and the peak memory of the largest run.

Usage: python benchmarks/fix_speed.py [--lines N] [--repeat N]
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEADER = '''\
"""A generated model file for the fix benchmark."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

'''

LAYER = '''\

class Layer{index}(nn.Module):
    """Layer {index}: attention and MLP, checkpointed when training."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.output = nn.Linear(config.intermediate_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.gradient_checkpointing = False

    def attention(self, hidden_states, mask=None):
        query = self.query(hidden_states)
        key = self.key(hidden_states)
        value = self.value(hidden_states)
        scores = torch.matmul(query, key.transpose(-1, -2))
        scores = scores / math.sqrt(query.size(-1))
        if mask is not None:
            scores = scores + mask
        probabilities = self.dropout(F.softmax(scores, dim=-1))
        return torch.matmul(probabilities, value)

    def block(self, hidden_states, mask=None):
        attended = self.norm(hidden_states + self.attention(hidden_states, mask))
        expanded = F.gelu(self.dense(attended))
        return self.norm(attended + self.dropout(self.output(expanded)))

    def forward(self, hidden_states, mask=None):
        if self.gradient_checkpointing and self.training:
            hidden_states = checkpoint(
                self.block,
                hidden_states,
                mask,
            )
        else:
            hidden_states = self.block(hidden_states, mask)
        extra = checkpoint(self.block, hidden_states, mask, use_reentrant=False)
        return hidden_states, extra
'''


def build(lines: int) -> str:
    parts, count, index = [HEADER], HEADER.count("\n"), 0
    while count < lines:
        layer = LAYER.format(index=index)
        parts.append(layer)
        count += layer.count("\n")
        index += 1
    return "".join(parts)


def timed(command: list[str], cwd: Path) -> tuple[float, int, str]:
    start = time.perf_counter()
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if result.returncode not in (0, 1):
        raise SystemExit(f"{command} failed ({result.returncode}): {result.stderr[-2000:]}")
    return elapsed, result.returncode, result.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=5)
    arguments = parser.parse_args()

    source = build(arguments.lines)
    ckptlint = [sys.executable, "-m", "ckptlint", "--no-cache"]  # the work, not the cache
    times: dict[str, list[float]] = {"lint": [], "fix": []}
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        pristine = work / "pristine.py"
        pristine.write_text(source)
        target = work / "model.py"
        for _ in range(arguments.repeat):
            shutil.copyfile(pristine, target)
            elapsed, code, lint_output = timed([*ckptlint, "model.py"], work)
            times["lint"].append(elapsed)
            elapsed, code, fix_output = timed(
                [*ckptlint, "--fix", "--unsafe-fixes", "model.py"], work
            )
            times["fix"].append(elapsed)
        fixed = target.read_text()
        compile(fixed, "model.py", "exec")
        peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss

    lines = source.count("\n")
    findings = lint_output.count(": CKP001 ")
    print(f"file: {lines:,} lines, {findings} CKP001 findings, {len(source) / 1e6:.1f} MB")
    print(f"fix output: {fix_output.strip().splitlines()[0]}")
    print(f"fixed file compiles; {fixed.count('use_reentrant=False')} calls now pass it")
    lint, fix = statistics.median(times["lint"]), statistics.median(times["fix"])
    print(f"\n{'command':<40}{'median s':>10}   (all runs)")
    print(f"{'ckptlint model.py':<40}{lint:>10.2f}   {[round(t, 2) for t in times['lint']]}")
    print(
        f"{'ckptlint --fix --unsafe-fixes model.py':<40}{fix:>10.2f}   "
        f"{[round(t, 2) for t in times['fix']]}"
    )
    pairs = [f / plain for f, plain in zip(times["fix"], times["lint"], strict=True)]
    print(f"\nfix / lint: {fix / lint:.2f}x from the medians, {statistics.median(pairs):.2f}x")
    print(f"median of the interleaved pairs {[round(r, 2) for r in pairs]} (promise: at most 3x)")
    print(f"peak memory of the largest run: {peak_kib / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
