"""The rule registry: every rule the linter runs, by code."""

from __future__ import annotations

from ckptlint.rules.base import Rule
from ckptlint.rules.missing_use_reentrant import MissingUseReentrant
from ckptlint.rules.unreadable_file import UnreadableFile

ALL_RULES: tuple[Rule, ...] = (MissingUseReentrant(), UnreadableFile())
RULES_BY_CODE: dict[str, Rule] = {rule.code: rule for rule in ALL_RULES}
