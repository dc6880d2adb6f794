"""Write docs/rules.md from the rules themselves: code, name, summary, fix, docstring, what
ckptguard does about the same bug, and the example and its correction (what ``ckptlint
--explain CODE`` prints).

    python docs/generate_rules.py

tests/test_rules_doc.py fails when docs/rules.md is not what this writes.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

from ckptlint.rules import ALL_RULES
from ckptlint.rules.base import Rule, shown

PAGE = Path(__file__).resolve().parent / "rules.md"
COMMAND = "python docs/generate_rules.py"
FIXES = {
    None: "none",
    "safe": "safe (`ckptlint --fix`)",
    "unsafe": "unsafe (`ckptlint --fix --unsafe-fixes`; review the diff)",
}


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
        " text. Every case of a rule, with the exact place of each finding, is under"
        " `tests/fixtures/rules/CODE/`.\n\n"
        "| Code | Name | Summary | Fix |\n|---|---|---|---|\n"
        f"{rows}\n{sections}"
    )


def _section(rule: Rule) -> str:
    language = "console" if rule.EXAMPLE.startswith("$ ") else "python"
    guard = f"**At run time:** {rule.GUARD}\n\n" if rule.GUARD else ""
    return (
        f"## {rule.code}\n\n"
        f"`{rule.name}`: {rule.summary}. Fix: {FIXES[rule.FIX]}.\n\n"
        f"{inspect.cleandoc(rule.__doc__ or '')}\n\n{guard}"
        f"Example that is reported:\n\n```{language}\n{shown(rule.EXAMPLE)}```\n\n"
        f"Written correctly:\n\n```{language}\n{shown(rule.CORRECTED)}```\n"
    )


if __name__ == "__main__":
    PAGE.write_text(render(), encoding="utf-8")
    sys.stdout.write(f"wrote {PAGE}\n")
