"""The rule registry: every rule the linter runs, by code.

Like ruff's table of codes, the registry names each rule's code, its file and its class, so
that what a run needs before it analyses anything (the codes a configuration may name, the
words that make a file worth reading) costs no import of the analysis the rules are built
on: ``--version``, ``clean`` and a warm run where nothing changed never load it. The rules
themselves (``ALL_RULES``, ``RULES_BY_CODE``) are imported on first use. Everything else
about a rule lives in its file; tests/test_rule_surface.py checks that the two agree.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ckptlint.rules.base import Rule

# code: (module under ckptlint.rules, class), in the order rules run and are listed.
REGISTRY: dict[str, tuple[str, str]] = {
    "CKP001": ("missing_use_reentrant", "MissingUseReentrant"),
    "CKP002": ("rejected_options", "RejectedOptions"),
    "CKP101": ("tiny_region", "TinyRegion"),
    "CKP201": ("mutable_global_read", "MutableGlobalRead"),
    "CKP202": ("late_binding", "LateBinding"),
    "CKP203": ("global_side_effect", "GlobalSideEffect"),
    "CKP301": ("rng_not_preserved", "RngNotPreserved"),
    "CKP401": ("reentrant_reuse", "ReentrantReuse"),
    "CKP402": ("ddp_find_unused", "DdpFindUnusedReentrant"),
    "CKP501": ("policy_never_matches", "PolicyNeverMatches"),
    "CKP502": ("policy_return_value", "PolicyReturnValue"),
    "CKP503": ("stateful_policy", "StatefulPolicy"),
    "CKP901": ("unreadable_file", "UnreadableFile"),
    "CKP902": ("io_error", "InaccessiblePath"),
}
CODES: frozenset[str] = frozenset(REGISTRY)
UNREADABLE_FILE = "CKP901"
INACCESSIBLE_PATH = "CKP902"
# The union of the rules' ``Rule.TRIGGERS``: identifiers that make a file worth analysing
# wherever they appear, also in a file whose text names no region source.
TRIGGERS: tuple[str, ...] = ("find_unused_parameters",)

ALL_RULES: tuple[Rule, ...]
RULES_BY_CODE: dict[str, Rule]


def __getattr__(name: str) -> object:
    """``ALL_RULES`` and ``RULES_BY_CODE``, importing the rules on first use."""
    if name not in ("ALL_RULES", "RULES_BY_CODE"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    rules = tuple(
        getattr(importlib.import_module(f"{__name__}.{module}"), cls)()
        for module, cls in REGISTRY.values()
    )
    globals().update(ALL_RULES=rules, RULES_BY_CODE={rule.code: rule for rule in rules})
    return globals()[name]
