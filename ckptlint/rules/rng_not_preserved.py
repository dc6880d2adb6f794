"""CKP301: ``preserve_rng_state=False`` around a region that draws random numbers."""

from __future__ import annotations

from collections.abc import Iterator

from ckptlint.rules.base import (
    Constant,
    FileContext,
    Finding,
    ProjectAnalysis,
    Rule,
    Site,
)


class RngNotPreserved(Rule):
    """`preserve_rng_state=False` and the region draws random numbers.

    `preserve_rng_state=False` counts wherever it reaches torch's checkpoint: in the call,
    in a `functools.partial`, through `checkpoint_wrapper(module, preserve_rng_state=False)`,
    `apply_activation_checkpointing(checkpoint_wrapper_fn=partial(...))`, the composable
    `checkpoint(module, ...)`, or a wrapper of your own that passes it on. A
    `torch.autograd.Function` of your own that runs a function again in its `backward`
    counts as well when its code does not save the RNG state in `forward` and set it back
    in `backward`.

    Random ops are dropout in any form (`nn.Dropout` and its variants, including modules
    assigned in `__init__`, in a parent's `__init__` or in another file, `F.dropout`,
    `torch.dropout`), `torch.rand*`, `bernoulli`, `multinomial`, `normal`, `rrelu`, and
    in-place samplers such as `.normal_()` and `.uniform_()`, anywhere in the code the
    region runs, in any module of the tree (8 levels of calls). A dropout probability only
    known at run time counts as random.

    ## Why is this bad?

    With `preserve_rng_state=False` the checkpoint does not save and restore the RNG state
    around the recompute. Dropout masks (and anything else drawn from torch's RNG) in the
    recompute then differ from the ones the forward used, so the backward differentiates a
    different function: the gradients are silently wrong.

    Remove `preserve_rng_state=False` (the default, True, restores the RNG state), or keep
    the random op outside the checkpointed region.

    ## Not reported

    Dropout with a literal `p=0` or `training=False` (not random). Megatron, DeepSpeed,
    fairscale and Transformer Engine restore their RNG states themselves.
    """

    code = "CKP301"
    GUARD = (
        "At run time, `ckptguard.enable()` raises (kind `rng_device`) when a region run with "
        "`preserve_rng_state=False` draws random numbers, and names the op in strict mode."
    )
    name = "rng-not-preserved"
    summary = "`preserve_rng_state=False` with a region that draws random numbers"

    EXAMPLE = """\
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(64, 64)
        self.dropout = nn.Dropout(0.1)

    def _block(self, x):
        return self.dropout(self.linear(x).relu())

    def forward(self, x):
        return checkpoint(  # expect: CKP301@16
            self._block, x, use_reentrant=False, preserve_rng_state=False
        )
"""
    CORRECTED = """\
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(64, 64)
        self.dropout = nn.Dropout(0.1)

    def _block(self, x):
        return self.dropout(self.linear(x).relu())

    def forward(self, x):
        return checkpoint(self._block, x, use_reentrant=False)
"""

    def check(self, context: FileContext) -> Iterator[Finding]:
        analysis = context.analysis
        for site in analysis.sites(context.module):
            switch = _rng_switch(analysis, site)
            if switch is None:
                continue
            draws = analysis.reach(site).draws
            if not draws:
                continue
            first = draws[0]
            where = f" at {first.where.describe(context.module)}" if first.where else ""
            consequence = (
                f" and draws random numbers ({first.what}{where}): the recompute draws"
                " different ones than the forward, so gradients are silently wrong;"
            )
            if switch.endswith("=False`"):
                message = (
                    f"{site.subject} runs with `preserve_rng_state=False`{consequence} remove"
                    " `preserve_rng_state=False` or move the random op out of the region"
                )
            else:  # a hand-written recompute that never restores the RNG state
                message = (
                    f"{site.subject} runs under {switch}{consequence} save the RNG state in its"
                    " forward and set it back in its backward (torch.get_rng_state,"
                    " torch.set_rng_state), or move the random op out of the region"
                )
            yield context.finding(site.node, self.code, message)


def _rng_switch(analysis: ProjectAnalysis, site: Site) -> str | None:
    """What turns RNG restoring off on some path of the site, as messages say it:
    ``preserve_rng_state=False`` (or its library's switch), or the source that never
    restores it (a project's ``autograd.Function`` that does not)."""
    for path in analysis.effective_paths(site):
        source = path.source
        if not source.restores_rng:
            return f"`{source.label}`, which does not restore the RNG state,"
        keyword = source.rng_keyword
        flow = analysis.keyword(path, keyword) if keyword else None
        if flow is None and source.rng_position is not None:
            flow = path.arguments.get(source.rng_position, None)
        if flow is not None and any(
            isinstance(value, Constant) and value.value is False
            for value in analysis.evaluate(*flow)
        ):
            return f"`{keyword or 'preserve_rng_state'}=False`"
    return None
