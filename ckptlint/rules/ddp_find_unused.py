"""CKP402: DDP with ``find_unused_parameters=True`` around a model with reentrant regions."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ckptlint.rules.base import (
    ClassValue,
    Constant,
    Context,
    External,
    FileContext,
    Finding,
    Instance,
    Location,
    Module,
    ProjectAnalysis,
    Rule,
    Site,
    Values,
    known,
    statements_at,
)

DDP = frozenset(
    {
        "torch.nn.parallel.DistributedDataParallel",
        "torch.nn.parallel.distributed.DistributedDataParallel",
    }
)
MAX_NAMED = 3


class DdpFindUnusedReentrant(Rule):
    """`DistributedDataParallel(..., find_unused_parameters=True)` wraps a model that runs
    reentrant checkpoint regions.

    Reported at the DDP call when its model (the first argument) resolves to a class of the
    project, naming the reentrant regions it runs (found as CKP301 follows a region: the
    model's `forward` and what it calls, in any file). Every file naming
    `find_unused_parameters` is analysed for it, whether or not it names a checkpoint
    function, from every entry point (folder walks, pre-commit, flake8).

    ## Why is this bad?

    A reentrant region (`use_reentrant=True`, or `use_reentrant` left out: torch 2.13 still
    defaults to the reentrant variant) runs its forward under `no_grad`, so when the forward
    ends DDP's search for unused parameters does not find the region's parameters in the
    graph and marks them ready. The region's backward then produces their gradients and
    marks them ready again: `RuntimeError: Expected to mark a variable ready only once ...
    Reused parameters in multiple reentrant backward passes` at the first backward
    (measured on torch 2.13, gloo, 2 ranks, with a module checkpointed once). This is the
    error accelerate, ms-swift, FocalNet, FlagEmbedding and openvla users report.

    Pass `use_reentrant=False` to those checkpoints (gradients identical to the unchecked
    model), or build DDP with `static_graph=True`, or drop `find_unused_parameters` if
    every parameter is used (see CKP401 for a module checkpointed twice).

    ## Not reported

    A model built where the analysis cannot see (a factory keyed by a config string,
    `accelerator.prepare`).
    """

    code = "CKP402"
    name = "ddp-find-unused-with-reentrant"
    summary = "DDP with `find_unused_parameters=True` around a model with reentrant regions"

    EXAMPLE = """\
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import checkpoint

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = nn.Sequential(nn.Linear(64, 64), nn.GELU())

    def forward(self, x):
        return checkpoint(self.block, x, use_reentrant=True)

def build(rank):
    return DistributedDataParallel(  # expect: CKP402@12
        Net(), device_ids=[rank], find_unused_parameters=True
    )
"""
    CORRECTED = """\
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import checkpoint

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = nn.Sequential(nn.Linear(64, 64), nn.GELU())

    def forward(self, x):
        return checkpoint(self.block, x, use_reentrant=False)

def build(rank):
    return DistributedDataParallel(
        Net(), device_ids=[rank], find_unused_parameters=True
    )
"""

    TRIGGERS = frozenset({"find_unused_parameters"})

    def check(self, context: FileContext) -> Iterator[Finding]:
        analysis = context.analysis
        module = context.module
        seen: set[int] = set()
        for line in module.lines_naming("find_unused_parameters"):
            for call, where in analysis.calls_at(module, line):
                if id(call) in seen or not _builds_ddp_finding_unused(analysis, call, where):
                    continue
                seen.add(id(call))
                model = call.args[0] if call.args else _keyword(call, "module")
                if model is None or isinstance(model, ast.Starred):
                    continue
                classes = [
                    v.cls
                    for v in _model_values(analysis, model, call, where)
                    if isinstance(v, Instance) and isinstance(v.cls, ClassValue)
                ]
                if not classes:
                    continue
                by_class = {cls: _reentrant_regions(analysis, [cls]) for cls in classes}
                named = [cls for cls, regions in by_class.items() if regions]
                if named:
                    regions = sorted(
                        {id(site): site for cls in named for site in by_class[cls]}.values(),
                        key=lambda s: (s.module.path, s.node.lineno),  # type: ignore[attr-defined]
                    )
                    yield context.finding(call, self.code, _message(named, regions, module))


def _model_values(
    analysis: ProjectAnalysis, model: ast.expr, call: ast.Call, where: Context
) -> Values:
    """What the model argument may be. In ``model = DDP(model, ...)`` the name is the one
    bound before that statement (a lookup at the argument would find the DDP itself)."""
    values = known(analysis.evaluate(model, where))
    if not isinstance(model, ast.Name) or not any(
        isinstance(v, Instance) and v.call is call for v in values
    ):
        return values
    statement = statements_at(where.module.tree.body, call.lineno)[-1]
    bindings = where.scope.lookup(model.id, (statement.lineno, statement.col_offset))
    earlier = [b for b in bindings if b.position < (statement.lineno, statement.col_offset)]
    return known(tuple(v for b in earlier for v in analysis.binding_values(b, where)))


def _builds_ddp_finding_unused(analysis: ProjectAnalysis, call: ast.Call, where: Context) -> bool:
    callee = analysis.evaluate(call.func, where)
    if not any(isinstance(v, External) and v.name in DDP for v in callee):
        return False
    return _is_true(analysis, call, "find_unused_parameters", where) and not _is_true(
        analysis, call, "static_graph", where
    )


def _is_true(analysis: ProjectAnalysis, call: ast.Call, keyword: str, where: Context) -> bool:
    value = _keyword(call, keyword)
    if value is None:
        return False
    values = analysis.evaluate(value, where)
    return all(isinstance(v, Constant) and v.value is True for v in values)


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _reentrant_regions(analysis: ProjectAnalysis, classes: list[ClassValue]) -> list[Site]:
    """The reentrant regions with parameters that the models' code makes."""
    reach = analysis.reach_of(tuple(Instance(cls, exact=False) for cls in classes))
    found: dict[int, Site] = {}
    for function in reach.functions:
        node = function.node
        first, last = node.lineno, node.end_lineno or node.lineno
        for site in analysis.sites(function.module):
            if not isinstance(site.node, ast.Call) or site.delegates:
                continue
            if not first <= site.node.lineno <= last or id(site) in found:
                continue
            reentrant = any(analysis.reentrancy(p) for p in analysis.effective_paths(site))
            if reentrant and analysis.holds_parameters(analysis.region(site)):
                found[id(site)] = site
    return list(found.values())


def _message(classes: list[ClassValue], regions: list[Site], module: Module) -> str:
    names = " or ".join(f"`{cls.node.name}`" for cls in dict.fromkeys(classes))
    places = ", ".join(
        f"{site.subject} at {Location(site.module, site.node.lineno).describe(module)}"  # type: ignore[attr-defined]
        for site in regions[:MAX_NAMED]
    )
    more = f" and {len(regions) - MAX_NAMED} more" if len(regions) > MAX_NAMED else ""
    return (
        f"`DistributedDataParallel(..., find_unused_parameters=True)` wraps {names}, which runs"
        f" reentrant checkpoint regions ({places}{more}): their forward runs under no_grad, so"
        " DDP marks their parameters ready as unused when the forward ends, and again when"
        " their backward produces the gradients: `RuntimeError: Expected to mark a variable"
        " ready only once`; pass `use_reentrant=False` there (or build DDP with"
        " `static_graph=True`)"
    )
