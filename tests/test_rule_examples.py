"""Every rule's own VALID and INVALID examples, run through the engine."""

from __future__ import annotations

import pytest

from ckptlint.rules import ALL_RULES
from tests.conftest import codes

CASES = [
    pytest.param(rule.code, example, kind, id=f"{rule.code}-{kind}-{index}")
    for rule in ALL_RULES
    for kind, examples in (("invalid", rule.INVALID), ("valid", rule.VALID))
    for index, example in enumerate(examples)
]


@pytest.mark.parametrize(("code", "example", "kind"), CASES)
def test_rule_example(code: str, example: str, kind: str) -> None:
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
