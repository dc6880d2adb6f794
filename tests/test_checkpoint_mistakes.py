"""The rules for the checkpoint mistakes users report (CKP002, CKP401, CKP402, CKP501-503):
exact places in fixture files through the CLI and flake8, and real multi-file packages."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import lint_tree, messages_of, run_cli

FIXTURES = Path(__file__).parent / "data" / "rules"
EXPECTATION = re.compile(r"# expect: ((?:[A-Z]+[0-9]+@[0-9]+\s*)+)$")


def expected_findings(path: Path) -> list[tuple[int, int, str]]:
    """``(line, column, code)`` of every ``# expect: CODE@COLUMN`` comment of a fixture."""
    found = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        match = EXPECTATION.search(line)
        if match:
            for item in match.group(1).split():
                code, column = item.split("@")
                found.append((number, int(column), code))
    return found


@pytest.mark.parametrize("fixture", sorted(FIXTURES.glob("ckp*.py")), ids=lambda p: p.stem)
def test_cli_and_flake8_report_exactly_the_marked_places(fixture: Path, tmp_path: Path) -> None:
    code = fixture.stem.upper()
    shutil.copy(fixture, tmp_path / "model.py")
    expected = expected_findings(fixture)
    assert expected and all(found_code == code for *_, found_code in expected)
    cli = run_cli(
        "--isolated", "--no-cache", "--format", "json", "--select", code, "model.py", cwd=tmp_path
    )
    assert cli.returncode == 1, cli.stderr
    from_cli = [(item["line"], item["column"], item["code"]) for item in json.loads(cli.stdout)]
    assert from_cli == expected
    result = subprocess.run(
        [sys.executable, "-m", "flake8", "--isolated", "--select", code, "model.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    from_flake8 = []
    for line in result.stdout.splitlines():
        place, found_code = line.split(" ", 2)[:2]
        _, row, column, _ = place.split(":")
        from_flake8.append((int(row), int(column), found_code))
    assert from_flake8 == expected, result.stderr


# -- packages whose regions, wrappers and policies live in other files -------------------

REENTRANT_PACKAGE = {
    "pkg/__init__.py": "",
    "pkg/memory.py": """
        import functools
        from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

        from .policies import save_matmuls

        reentrant = functools.partial(checkpoint, use_reentrant=True)
        SAC = functools.partial(create_selective_checkpoint_contexts, save_matmuls)


        def recompute(function, *args):
            return reentrant(function, *args)
        """,
    "pkg/policies.py": """
        import torch
        from torch.utils.checkpoint import CheckpointPolicy


        def save_matmuls(ctx, op, *args, **kwargs):
            return op in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
        """,
    "pkg/blocks.py": """
        import torch.nn as nn


        class Block(nn.Module):
            def __init__(self, width):
                super().__init__()
                self.fc = nn.Linear(width, width)

            def forward(self, x):
                return self.fc(x).relu()
        """,
    "pkg/model.py": """
        import torch.nn as nn

        from . import memory
        from .blocks import Block
        from .memory import SAC, recompute


        class Universal(nn.Module):
            def __init__(self, width, depth):
                super().__init__()
                self.depth = depth
                self.block = Block(width)
                self.stack = nn.ModuleList([Block(width)] * depth)

            def forward(self, x):
                for _ in range(self.depth):
                    x = recompute(self.block, x)
                for layer in self.stack:
                    x = memory.reentrant(layer, x)
                return memory.reentrant(self.block, x, context_fn=SAC)
        """,
}


def test_reentrant_rules_follow_wrappers_partials_and_classes_across_files(tmp_path: Path) -> None:
    found = lint_tree(tmp_path, REENTRANT_PACKAGE, select=("CKP002", "CKP401"))
    assert found == [
        ("pkg/model.py", 18, 17, "CKP401"),
        ("pkg/model.py", 20, 17, "CKP401"),
        ("pkg/model.py", 21, 16, "CKP002"),
    ]
    messages = messages_of(tmp_path, REENTRANT_PACKAGE, select=("CKP002", "CKP401"))
    assert "runs `self.block` on every pass of the loop at line 17" in messages[0]
    assert "`self.stack`, which holds one module several times (line 14)" in messages[1]
    assert "`use_reentrant=True`" in messages[2] and "use_reentrant=False" in messages[2]


POLICY_PACKAGE = {
    "sac/__init__.py": "",
    "sac/policies.py": """
        import torch
        from torch.utils.checkpoint import CheckpointPolicy

        aten = torch.ops.aten
        KEEP = {aten.mm, aten.addmm}


        def keep_matmuls(ctx, op, *args, **kwargs):
            if op in KEEP:
                return CheckpointPolicy.MUST_SAVE
            return CheckpointPolicy.PREFER_RECOMPUTE


        def first_matmul(counts):
            def policy(ctx, op, *args, **kwargs):
                if op == aten.mm.default:
                    counts["mm"] += 1
                return op == aten.mm.default and counts["mm"] == 1
            return policy


        def as_int(ctx, op, *args, **kwargs):
            return 1 if op == aten.mm else 0
        """,
    "sac/train.py": """
        import collections
        import functools
        from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

        from .policies import as_int, first_matmul, keep_matmuls


        def contexts():
            return create_selective_checkpoint_contexts(first_matmul(collections.Counter()))


        def forward(block, x):
            x = checkpoint(block, x, use_reentrant=False, context_fn=contexts)
            keep = functools.partial(create_selective_checkpoint_contexts, keep_matmuls)
            x = checkpoint(block, x, use_reentrant=False, context_fn=keep)
            odd = functools.partial(create_selective_checkpoint_contexts, as_int)
            return checkpoint(block, x, use_reentrant=False, context_fn=odd)
        """,
}


def test_policy_rules_report_where_the_policy_can_be_told_apart(tmp_path: Path) -> None:
    """A policy returning a CheckpointPolicy is reported in its own file; one returning
    bools or ints is known as a policy only where it is handed to torch, and reported
    there, naming its file."""
    codes = ("CKP501", "CKP502", "CKP503")
    found = lint_tree(tmp_path, POLICY_PACKAGE, select=codes)
    assert found == [
        ("sac/policies.py", 10, 8, "CKP501"),
        ("sac/train.py", 10, 12, "CKP503"),
        ("sac/train.py", 17, 11, "CKP501"),
        ("sac/train.py", 17, 11, "CKP502"),
    ]
    messages = messages_of(tmp_path, POLICY_PACKAGE, select=codes)
    assert "`torch.ops.aten.mm`, an OpOverloadPacket (in the set at line 6)" in messages[0]
    policies = Path("sac", "policies.py")
    assert f"policy `policy()` ({tmp_path / policies}:16)" in messages[1]
    assert "changes `counts['mm']`" in messages[1]


TRAINER_PACKAGE = {
    "models/__init__.py": "",
    "models/net.py": """
        import torch.nn as nn
        from torch.utils import checkpoint


        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(8, 8)

            def forward(self, x):
                return self.fc(x).relu()


        class Net(nn.Module):
            def __init__(self, depth):
                super().__init__()
                self.blocks = nn.ModuleList([Block() for _ in range(depth)])

            def forward(self, x):
                for block in self.blocks:
                    x = checkpoint.checkpoint(block, x)
                return x
        """,
    "models/build.py": """
        from .net import Net


        def build_model(cfg):
            if cfg.kind == "net":
                return Net(cfg.depth)
            raise ValueError(cfg.kind)
        """,
    "train.py": """
        from torch.nn.parallel import DistributedDataParallel as DDP

        from models.build import build_model


        def main(cfg, rank):
            model = build_model(cfg)
            model = DDP(
                model,
                device_ids=[rank],
                find_unused_parameters=True,
            )
            return model
        """,
}


def test_ddp_with_find_unused_parameters_names_the_reentrant_regions_of_its_model(
    tmp_path: Path,
) -> None:
    lint_tree(tmp_path, TRAINER_PACKAGE)  # writes the files
    result = run_cli(
        "--no-cache", "--format", "json", "--select", "CKP402", "train.py", "models", cwd=tmp_path
    )
    [finding] = json.loads(result.stdout)
    assert (finding["path"], finding["line"], finding["column"]) == ("train.py", 9, 13)
    assert "wraps `Net`" in finding["message"]
    assert f"`checkpoint()` region at {Path('models', 'net.py')}:22" in finding["message"]
