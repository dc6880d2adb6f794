"""Every rule's own VALID and INVALID examples, run through the engine.

Examples are whole modules, except for rules about the file system (CKP902), whose
examples are command lines (``$ ckptlint ...``) followed by lines of their output: those
are run in a folder holding a clean ``src/model.py``.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from ckptlint.rules import ALL_RULES
from tests.conftest import codes, run_cli

CASES = [
    pytest.param(rule.code, example, kind, id=f"{rule.code}-{kind}-{index}")
    for rule in ALL_RULES
    for kind, examples in (("invalid", rule.INVALID), ("valid", rule.VALID))
    for index, example in enumerate(examples)
]


@pytest.mark.parametrize(("code", "example", "kind"), CASES)
def test_rule_example(code: str, example: str, kind: str, tmp_path: Path) -> None:
    if example.startswith("$ "):
        command, *expected = example.splitlines()
        model = tmp_path / "src" / "model.py"
        model.parent.mkdir()
        model.write_text("import torch\n")
        result = run_cli(*shlex.split(command)[2:], cwd=tmp_path)
        assert set(expected) <= set(result.stdout.splitlines()), result.stdout
        assert (code in result.stdout) == (kind == "invalid")
        return
    found = codes(example, select=(code,))
    if kind == "invalid":
        assert code in found, f"{code} should report this example"
    else:
        assert found == [], f"{code} should not report this example"


@pytest.mark.parametrize("rule", ALL_RULES, ids=lambda rule: rule.code)
def test_rule_carries_explanation_and_examples(rule) -> None:
    assert rule.__doc__ and len(rule.__doc__.split()) > 20
    assert rule.INVALID and rule.VALID
    assert rule.code.startswith("CKP") and len(rule.code) == 6
