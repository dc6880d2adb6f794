"""The messages of the rules for the checkpoint mistakes users report (CKP002, CKP401,
CKP402, CKP501-503) on real multi-file packages, where the regions, wrappers and policies
live in other files. The places they are reported at are exact cases in
tests/fixtures/rules (tests/test_rule_fixtures.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ckptlint.config import Settings
from ckptlint.discovery import discover
from ckptlint.engine import Engine
from tests.conftest import run_cli

FIXTURES = Path(__file__).parent / "fixtures" / "rules"


def messages(package: str, root: Path, *codes: str) -> dict[tuple[str, int, str], str]:
    """``(path, line, code)``: message of each finding of a fixture package, linted as the
    only package of a project under ``root``."""
    shutil.copytree(FIXTURES / package, root / "pkg")
    config = Settings(root=root, select=codes)
    paths = [f.path for f in discover([str(root)], config)]
    found = {}
    for result in Engine(config, paths, jobs=1).lint(paths):
        relative = Path(result.path).resolve().relative_to(root.resolve()).as_posix()
        for finding in result.findings:
            found[(relative, finding.line, finding.code)] = finding.message
    return found


def test_reentrant_rules_follow_wrappers_partials_and_classes_across_files(tmp_path: Path) -> None:
    found = messages("CKP401/reentrant_across_files", tmp_path, "CKP002", "CKP401")
    assert (
        "runs `self.block` on every pass of the loop at line 16"
        in found[("pkg/model.py", 17, "CKP401")]
    )
    assert (
        "`self.stack`, which holds one module several times (line 13)"
        in found[("pkg/model.py", 19, "CKP401")]
    )
    rejected = found[("pkg/model.py", 20, "CKP002")]
    assert "`use_reentrant=True`" in rejected and "use_reentrant=False" in rejected


def test_policy_rules_report_where_the_policy_can_be_told_apart(tmp_path: Path) -> None:
    """A policy returning a CheckpointPolicy is reported in its own file; one returning
    bools or ints is known as a policy only where it is handed to torch, and reported
    there, naming its file."""
    found = messages("CKP501/policies_across_files", tmp_path, "CKP501", "CKP502", "CKP503")
    packet = found[("pkg/policies.py", 9, "CKP501")]
    assert "`torch.ops.aten.mm`, an OpOverloadPacket (in the set at line 5)" in packet
    stateful = found[("pkg/train.py", 9, "CKP503")]
    assert f"policy `policy()` ({tmp_path / 'pkg' / 'policies.py'}:15)" in stateful
    assert "changes `counts['mm']`" in stateful


def test_ddp_with_find_unused_parameters_names_the_reentrant_regions_of_its_model(
    tmp_path: Path,
) -> None:
    shutil.copytree(FIXTURES / "CKP402" / "trainer_across_files", tmp_path, dirs_exist_ok=True)
    result = run_cli(
        "--no-cache", "--format", "json", "--select", "CKP402", "train.py", "models", cwd=tmp_path
    )
    [finding] = json.loads(result.stdout)
    assert (finding["path"], finding["line"], finding["column"]) == ("train.py", 8, 13)
    assert "wraps `Net`" in finding["message"]
    assert f"`checkpoint()` region at {Path('models', 'net.py')}:21" in finding["message"]
