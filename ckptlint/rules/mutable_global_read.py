"""CKP201: a checkpoint region that reads a module global the module changes."""

from __future__ import annotations

from collections.abc import Iterator

from ckptlint.rules.base import (
    FileContext,
    Finding,
    GlobalWrite,
    Reach,
    Rule,
)


class MutableGlobalRead(Rule):
    """A checkpoint region reads a module global that is changed at run time.

    Every region source counts (torch's checkpoint, checkpoint_wrapper, transformers'
    layers, timm, Megatron, DeepSpeed, your own wrappers...). The state searched is what
    the region's own code reads, and the code it calls directly, in any module of the
    tree: a global (`SCALE`), a module's attribute (`config.SCALE`, also `import
    pkg.cfg as cfg` and `getattr(cfg, "SCALE", default)`), a name imported from another
    module (`from .registry import ACTIVATIONS`), and a class attribute used as
    configuration (`Config.scale`, assigned in the class body). A change is a statement in
    a function of any module that rebinds or mutates it, and the message gives its file and
    line: `global X; X = ...` in the global's module, `cfg.X = ...`, `setattr(cfg, "X",
    v)`, `vars(cfg)["X"] = v` or `del cfg.X` elsewhere (also in a lambda the function
    makes), `Config.scale = ...` or `cls.scale *= ...` in a classmethod, and for a
    container used as a registry an item written (`REGISTRY[name] = fn`, also through a
    local alias `table = REGISTRY`), `setdefault`, `update`, or a `register(name,
    fn)`-style function that writes it and runs after set-up. A name imported with `from ... import
    X` keeps the object it was bound to: for it only changes of that object's content
    count (`cfg.X = ...` elsewhere rebinds the module's name, not the importer's).

    ## Why is this bad?

    The checkpoint runs the region once in the forward and again in the backward. A global
    read by the region is read twice, and if anything changes it in between (a function
    with `global X; X = ...`, `X += ...`, `X[key] = ...`, `X.append(...)`,
    `X.update(...)`...), the recompute computes with another value than the forward did:
    the gradients are silently wrong, with no error from PyTorch.

    Pass the value as an input of the checkpoint, or bind it when making the region
    (`functools.partial(block, scale=SCALE)`), so both runs see the same value.

    ## Not reported

    Set-up, not run-time changes: constants bound once,
    imports, functions and classes; module-level statements (they run at import); a
    function used only at import (a registry's `register` decorator, decorator
    factories) or only from constructors (`__init__`, `reset_parameters`,
    `_init_weights`, and functions only they call); functions named for seeding or
    initialisation (`manual_seed`, `init_*`, `initialize_*`, `setup*`); a lazy
    initialisation or memo (a write after a test of the same global, or of a "loaded"
    flag the function keeps: `if KERNEL is None: KERNEL = load()`; a lookup then a write
    where it found nothing; `CACHE.setdefault(key, build(key))`, a value built from the
    key), since a memo only adds the value its key decides; a global set and put back
    (`try: ... finally: X = previous`, a `@contextmanager` restoring it after its `yield`)
    where the extent also runs the backward (`with fast_path(): loss.backward()` at every
    use of the manager), so that a forward and its recompute see the same value. Set and
    put back around the forward alone, the backward's recompute sees the restored value:
    that is reported. Globals read only
    deep inside what the region calls (a framework's accessors: a process group set up
    once) are not searched, and what cannot be resolved statically (a region passed in
    from outside the tree) stays silent. Changes made by the region itself are CKP203.
    """

    code = "CKP201"
    GUARD = (
        "At run time, `ckptguard.enable()` fingerprints every global the region reads and "
        "raises `CheckpointMismatchError` (kind `global`) naming the global and its two values "
        "when it changed before the recompute."
    )
    name = "mutable-global-read"
    summary = "checkpoint region reads a module global that is changed"

    EXAMPLE = """\
from torch.utils.checkpoint import checkpoint

SCALE = 1.0

def set_scale(value):
    global SCALE
    SCALE = value

def block(x):
    return x.relu() * SCALE + 1

def forward(x):
    return checkpoint(block, x, use_reentrant=False)  # expect: CKP201@12
"""
    CORRECTED = """\
import functools
from torch.utils.checkpoint import checkpoint

SCALE = 1.0

def set_scale(value):
    global SCALE
    SCALE = value

def block(x, scale):
    return x.relu() * scale + 1

def forward(x):
    return checkpoint(functools.partial(block, scale=SCALE), x, use_reentrant=False)
"""

    def check(self, context: FileContext) -> Iterator[Finding]:
        analysis = context.analysis
        for site in analysis.sites(context.module):
            reach = analysis.near_reach(site)
            here = context.module
            reported: set[tuple[str, str]] = set()
            for read in reach.reads:
                key = (read.module.path, read.name)
                if key in reported:
                    continue
                changes = analysis.changes_of(read.module, read.name)
                if read.imported:  # the import bound the object: only its content changes
                    changes = [c for c in changes if c.how == "mutates"]
                change = _change_outside(reach, changes)
                if change is None:
                    continue
                reported.add(key)
                message = (
                    f"{site.subject} reads {read.what} `{read.name}`"
                    f" ({read.where.describe(here)}), which is changed at"
                    f" {change.where.describe(here)}: the recompute in backward may see another"
                    " value than the forward did, so gradients are silently wrong; pass"
                    f" `{read.name}` as a checkpoint input or bind it with functools.partial"
                )
                yield context.finding(site.node, self.code, message)


def _change_outside(reach: Reach, changes: list[GlobalWrite]) -> GlobalWrite | None:
    """The first change not made by the region's own code (that is CKP203)."""
    for change in changes:
        if not reach.runs_code_of(change.where):
            return change
    return None
