"""Write docs/rules.md from the rules themselves: each rule's documentation under ruff's
headings (``ckptlint.report.rule_markdown``: what ``ckptlint --explain CODE`` prints and the
language server shows on hover).

    python docs/generate_rules.py

tests/test_rules_doc.py fails when docs/rules.md is not what this writes.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ckptlint.report import rule_markdown
from ckptlint.rules import ALL_RULES
from ckptlint.rules.base import Rule

PAGE = Path(__file__).resolve().parent / "rules.md"
COMMAND = "python docs/generate_rules.py"


def render() -> str:
    """The whole page."""
    rows = "".join(
        f"| [{rule.code}](#{rule.code.lower()}) | `{rule.name}` | {rule.summary} "
        f"| {rule.FIX or ''} |\n"
        for rule in ALL_RULES
    )
    sections = "\n".join(_section(rule) for rule in ALL_RULES)
    return (
        "# ckptlint rules\n\n"
        f"<!-- Generated from the rules' docstrings by `{COMMAND}`: edit the rule, not this"
        " page. -->\n\n"
        "Each rule is one file under `ckptlint/rules/`; `ckptlint --explain CODE` prints the same"
        " text, and the language server (`ckptlint server`) shows it on hover, under ruff's"
        " headings. Every case of a rule, with the exact place of each finding, is under"
        " `tests/fixtures/rules/CODE/`.\n\n"
        "| Code | Name | Summary | Fix |\n|---|---|---|---|\n"
        f"{rows}\n{sections}"
    )


def _section(rule: Rule) -> str:
    """The rule's documentation as ``--explain`` prints it, one heading level down."""
    return rule_markdown(rule, level=3)


if __name__ == "__main__":
    PAGE.write_text(render(), encoding="utf-8")
    sys.stdout.write(f"wrote {PAGE}\n")
