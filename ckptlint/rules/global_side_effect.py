"""CKP203: a checkpoint region that writes global state."""

from __future__ import annotations

from collections.abc import Iterator

from ckptlint.rules.base import (
    FileContext,
    Finding,
    Rule,
)


class GlobalSideEffect(Rule):
    """A checkpoint region assigns a module global or mutates a module-level object.

    Reported for `global X` followed by an assignment, and for item or attribute
    assignment, `del`, and mutating methods (`append`, `extend`, `update`, `pop`,
    `setdefault`, `clear`, `__setitem__`, ...) on a module-level object, in the region's
    own code or in what it calls directly, in any module of the tree, through every
    region source (for transformers' `GradientCheckpointingLayer` subclasses, at their
    `def forward`).

    ## Why is this bad?

    The checkpoint runs the region once in the forward and again in the backward, so its
    side effects happen twice: a step counter counts double, a list of recorded
    activations gets every entry twice, a running statistic is updated twice (and the
    recompute may read the value the forward just wrote).

    Move the side effect out of the checkpointed function (do it before or after the
    `checkpoint(...)` call), or return the value from the region and store it outside.

    ## Not reported

    A write after a test of the same global, or of a "loaded" flag the
    function keeps (`if key not in CACHE:`, `if KERNEL is None:`), is a memo or a lazy
    initialisation that the second run leaves as it was; so are the
    other memo forms: a lookup and a write when it found nothing (`m = CACHE.get(key)`,
    then `if m is None: CACHE[key] = build(key)`), `CACHE.setdefault(key, build(key))`
    (not with an empty container as the value: that entry is there to be filled) and
    `try: return CACHE[key]` with the write in its `except KeyError:`. (A memo is no
    side effect that changes gradients: the forward fills the entry, the recompute finds
    it and writes nothing, and both compute with the same value as long as it is built
    from the key alone. What is appended to the entry, `CACHE.setdefault(key,
    []).append(h)`, is written by each run and is reported.) A write the code puts back
    leaves no net change and is not reported either: set and restored in a `finally`
    (`previous = FAST; FAST = True; try: ... finally: FAST = previous`, `DEPTH += 1` ...
    `DEPTH -= 1`, `STACK.append(x)` ... `STACK.pop()`), or by a `@contextmanager` the region
    enters, which restores it after its `yield`. A write
    behind a switch that defaults to off (`if force_reset:` with `force_reset=False`) is
    reported only where the region's call passes the switch; neither are
    writes deep inside what the region calls (a framework's trackers and caches made on
    first use), nor what cannot be resolved statically.
    """

    code = "CKP203"
    GUARD = (
        "At run time, ckptguard warns (kind `side_effect`, once per module) when a recompute "
        "updates a module's buffers or attributes again (a BatchNorm's running statistics); a "
        "module global the region writes is not watched at run time, which is why this rule "
        "looks for it."
    )
    name = "global-side-effect"
    summary = "checkpoint region writes global state"

    EXAMPLE = """\
from torch.utils.checkpoint import checkpoint

RECORDED = []

def record(h):
    RECORDED.append(h.detach())

def block(x):
    h = x.relu()
    record(h)
    return h * 2

def forward(x):
    return checkpoint(block, x, use_reentrant=False)  # expect: CKP203@12
"""
    CORRECTED = """\
from torch.utils.checkpoint import checkpoint

RECORDED = []

def block(x):
    h = x.relu()
    return h * 2, h.detach()

def forward(x):
    out, h = checkpoint(block, x, use_reentrant=False)
    RECORDED.append(h)
    return out
"""

    def check(self, context: FileContext) -> Iterator[Finding]:
        analysis = context.analysis
        for site in analysis.sites(context.module):
            writes = analysis.near_reach(site).writes
            if not writes:
                continue
            first = writes[0]
            message = (
                f"{site.subject} {first.how} module global `{first.name}`"
                f" ({first.where.describe(context.module)}): the recompute in backward runs the"
                " side effect a second time; move it out of the checkpointed function, before"
                " or after the checkpoint call"
            )
            yield context.finding(site.node, self.code, message)
