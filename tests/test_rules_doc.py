"""docs/rules.md is what docs/generate_rules.py writes from the rules (no stale page)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "docs" / "generate_rules.py"


def generator():
    spec = importlib.util.spec_from_file_location("generate_rules", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_rules_page_is_up_to_date() -> None:
    docs = generator()
    written = docs.PAGE.read_text(encoding="utf-8") if docs.PAGE.exists() else ""
    assert written == docs.render(), f"docs/rules.md is stale: run `{docs.COMMAND}`"
