"""The rule registry: every rule the linter runs, by code."""

from __future__ import annotations

from ckptlint.rules.base import Rule
from ckptlint.rules.ddp_find_unused import DdpFindUnusedReentrant
from ckptlint.rules.global_side_effect import GlobalSideEffect
from ckptlint.rules.io_error import InaccessiblePath
from ckptlint.rules.late_binding import LateBinding
from ckptlint.rules.missing_use_reentrant import MissingUseReentrant
from ckptlint.rules.mutable_global_read import MutableGlobalRead
from ckptlint.rules.policy_never_matches import PolicyNeverMatches
from ckptlint.rules.policy_return_value import PolicyReturnValue
from ckptlint.rules.reentrant_reuse import ReentrantReuse
from ckptlint.rules.rejected_options import RejectedOptions
from ckptlint.rules.rng_not_preserved import RngNotPreserved
from ckptlint.rules.stateful_policy import StatefulPolicy
from ckptlint.rules.tiny_region import TinyRegion
from ckptlint.rules.unreadable_file import UnreadableFile

ALL_RULES: tuple[Rule, ...] = (
    MissingUseReentrant(),
    RejectedOptions(),
    TinyRegion(),
    MutableGlobalRead(),
    LateBinding(),
    GlobalSideEffect(),
    RngNotPreserved(),
    ReentrantReuse(),
    DdpFindUnusedReentrant(),
    PolicyNeverMatches(),
    PolicyReturnValue(),
    StatefulPolicy(),
    UnreadableFile(),
    InaccessiblePath(),
)
RULES_BY_CODE: dict[str, Rule] = {rule.code: rule for rule in ALL_RULES}
