"""CKP001: a checkpoint call that does not pass ``use_reentrant``."""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from packaging.version import Version

from ckptlint.rules.base import (
    ABSENT,
    CHECKPOINT,
    FUNCTIONS,
    PARTIAL,
    Absent,
    AddKeyword,
    Argument,
    Arguments,
    Binding,
    ClassValue,
    Context,
    External,
    FileContext,
    Finding,
    Fix,
    Flow,
    FunctionValue,
    Given,
    Instance,
    Module,
    PartialValue,
    Passed,
    ProjectAnalysis,
    ReentrantArgument,
    ReplaceText,
    Rule,
    Site,
    SourceCall,
    Unknown,
    VersionRange,
    callee_label,
    node_position,
    with_default,
)


class MissingUseReentrant(Rule):
    """`torch.utils.checkpoint.checkpoint` and `checkpoint_sequential` called without
    `use_reentrant`.

    `use_reentrant=None` is the same as leaving it out (torch warns and picks the default),
    so it is reported too; the fix replaces `None` with `False`, where the `None` is written
    (in the call, or in the `functools.partial` it goes through).

    Through your own wrappers the finding goes to the call that decides: a wrapper that
    hands `use_reentrant` on to torch (its own parameter, defaulting to `None`, or
    `**kwargs` forwarded to `checkpoint`) leaves it to its callers, so the calls that leave
    it unset are reported, and the fix adds the keyword the wrapper takes. A wrapper that
    cannot take it (`def run(fn, *args)`) is reported at its own `checkpoint` call, never at
    its callers, also when it is declared in `extend-checkpoint-functions`.

    ## Why is this bad?

    PyTorch warns when `use_reentrant` is omitted and has announced that the implicit
    default will change. The implicit value today selects the reentrant implementation,
    which gives parameters no gradients when no input requires grad, ignores keyword
    arguments and does not support nested checkpoints or `torch.autograd.grad`.
    `use_reentrant=False` is the variant PyTorch recommends: pass it explicitly.

    A call that also passes keyword arguments for the region (`checkpoint(fn, x,
    mask=m)`) does not run at all: torch's reentrant variant takes no keywords for the
    function and raises `ValueError: Unexpected keyword arguments: mask` at the first
    forward (torch 2.13, also with `use_reentrant=None` or `True`). The finding says so;
    its fix makes the call run, since the non-reentrant variant passes those keywords on
    to the function.

    ## Fix safety

    The fix adds `use_reentrant=False`, which switches the implementation the code ran with
    (the reentrant one, torch's implicit default) to the one PyTorch recommends.

    ## Not reported

    A `**mapping` is read for what it holds under `use_reentrant`: a `**kwargs` parameter
    holds what its callers pass, and the edits a wrapper makes apply in order
    (`setdefault`, `update`, `m["use_reentrant"] = ...`, `pop`, `del`, `{**m, ...}`,
    `dict(m, ...)`); where the analysis cannot tell what a mapping holds, the call is not
    reported. Neither are `checkpoint_sequential` calls whose 4th positional argument
    (`use_reentrant`) is given or may come from `*args`. A value first read into a name
    (`reentrant = kwargs.get("use_reentrant")`) is followed to that one assignment; a
    conditional expression leaves it unset only where both branches do.
    """

    code = "CKP001"
    name = "missing-use-reentrant"
    summary = "checkpoint call without `use_reentrant`"
    FIX = "unsafe"

    EXAMPLE = """\
import torch.utils.checkpoint

def forward(self, x):
    return torch.utils.checkpoint.checkpoint(self.block, x)  # expect: CKP001@12
"""
    CORRECTED = """\
import torch.utils.checkpoint

def forward(self, x):
    return torch.utils.checkpoint.checkpoint(self.block, x, use_reentrant=False)
"""

    def check(self, context: FileContext) -> Iterator[Finding]:
        module = context.module
        analysis = context.analysis
        sites = analysis.sites(module)
        consumed: set[int] = set()
        for site in sites:
            paths = [p for p in site.paths if p.source.reentrant is not None]
            for path in paths:
                consumed.update(id(partial.call) for partial in path.partials)
            # A partial made in another module is reported where it is made.
            paths = [
                path
                for path in paths
                if path.wrappers or all(p.context.module is module for p in path.partials)
            ]
            if not isinstance(site.node, ast.Call) or not paths:
                continue
            failing = _decided_here(context, paths, site.torch)
            if failing is not None:
                yield self._finding(context, site.node, *failing)
        made = list(_partials_made(analysis, module, sites))
        for partial, _ in made:
            consumed.update(id(inner.call) for inner in _inner_partials(partial))
        for partial, paths in made:
            if id(partial.call) in consumed:
                continue
            paths = [p for p in paths if p.source.reentrant is not None]
            torch = analysis.versions_at(module, partial.call)
            failing = _decided_here(context, paths, torch)
            if failing is not None:
                yield self._finding(context, partial.call, *failing, made=True)

    def _finding(
        self,
        context: FileContext,
        call: ast.Call,
        path: SourceCall,
        decision: Decision,
        torch: VersionRange,
        *,
        made: bool = False,
    ) -> Finding:
        name = path.source.label
        keyword = decision.keyword
        callee = callee_label(path.partials[0].call.args[0]) if made else callee_label(call.func)
        if not path.wrappers:
            callee = name
        what = (
            f"`functools.partial({callee}, ...)` made, and no call of it in this file passes it"
            " either,"
            if made
            else f"`{callee}()` called"
        )
        via = ""
        if path.wrappers:
            as_keyword = "" if keyword == "use_reentrant" else " as `use_reentrant`"
            via = f" (`{callee}()` passes it on to `{name}()`{as_keyword})"
        if decision.written is not None:
            none = decision.written
            end_line = none.end_lineno or none.lineno
            edit: AddKeyword | ReplaceText = ReplaceText(
                none.lineno,
                context.character_column(none.lineno, none.col_offset),
                end_line,
                context.character_column(end_line, none.end_col_offset or 0),
                "False",
            )
            message = (
                f"{what} with `{keyword}=None`{via}, which torch treats as not passed; pass"
                f" `{keyword}=False` (recommended) or `{keyword}=True`"
            )
        else:
            column = context.character_column(call.lineno, call.col_offset)
            edit = AddKeyword(call.lineno, column, keyword, "False")
            message = (
                f"{what} without `{keyword}`{via}; pass `{keyword}=False` (recommended)"
                f" or `{keyword}=True` explicitly"
            )
        crash = _region_keywords(context.analysis, path)
        if crash:
            given = (
                f"with `{keyword}=None`" if decision.written is not None else f"without `{keyword}`"
            )
            message = (
                f"{what} {given}{via} and with keyword arguments for the region"
                f" ({', '.join(f'`{k}`' for k in crash)}): torch takes its reentrant variant,"
                f" which raises `{REGION_KEYWORDS_ERROR}{','.join(crash)}`"
                f" at the first forward, so this call never runs; pass `{keyword}=False`,"
                " whose variant passes the keywords on to the region"
            )
        oldest = torch.lower()
        since = path.source.reentrant_since
        if since is not None and oldest is not None and oldest < Version(since):
            message += (
                f"; no fix is offered: this code also runs on torch {oldest}, whose"
                f" `{name}()` has no `use_reentrant` (added in {since})"
            )
            return context.finding(call, self.code, message)
        return context.finding(call, self.code, message, Fix(edit, "unsafe"))


# What torch's reentrant ``checkpoint`` raises for keywords meant for the region (2.13; the
# names follow, joined by commas). tests/test_rule_claims.py checks it on the installed torch.
REGION_KEYWORDS_ERROR = "ValueError: Unexpected keyword arguments: "
# Keywords torch's ``checkpoint`` takes itself; any other goes to the region, which only the
# non-reentrant variant accepts (``preserve_rng_state`` is popped before the check).
_CHECKPOINT_KEYWORDS = frozenset(
    "use_reentrant preserve_rng_state context_fn determinism_check debug early_stop".split()
)


def _region_keywords(analysis: ProjectAnalysis, path: SourceCall) -> list[str]:
    """The keywords ``checkpoint`` receives for the region, in the order written (also those
    a wrapper's ``**kwargs`` hands on); only for torch's ``checkpoint`` itself
    (``checkpoint_sequential`` rejects any in both variants)."""
    if path.source.names[0] != CHECKPOINT:
        return []
    wrappers = [wrapper.node for wrapper in path.wrappers]
    names = list(path.arguments.keywords)
    spreads = list(path.arguments.spread)
    for _ in range(64):  # callers spread into callers: followed this far
        if not spreads:
            break
        expression, context = spreads.pop(0)
        for held in analysis.held(expression, context, ""):
            if isinstance(held, Passed) and held.owner in wrappers:
                keywords = held.keywords
                names.extend(k for k in keywords.arguments.keywords if k not in keywords.taken)
                spreads.extend(keywords.arguments.spread)
    return [name for name in dict.fromkeys(names) if name not in _CHECKPOINT_KEYWORDS]


def _decided_here(
    context: FileContext, paths: list[SourceCall], torch: VersionRange
) -> tuple[SourceCall, Decision, VersionRange] | None:
    """The first path on which the call itself leaves ``use_reentrant`` unset (or None),
    with that decision and the torch versions it runs on; None when every path gets it
    from elsewhere (the call passes it, a wrapper decides it, a ``**mapping`` may hold it)
    or runs only on a torch without ``use_reentrant`` (a branch for older releases)."""
    analysis = context.analysis
    for path in paths:
        decision = _decision(analysis, path)
        if decision.level != 0 or decision.state not in ("none", "omitted"):
            continue
        versions = torch
        if path.wrappers:  # the source call itself may sit in a branch of the wrapper
            inner = path.wrappers[-1].module
            versions = versions.intersect(analysis.versions_at(inner, path.call))
        since = path.source.reentrant_since
        if since is not None and versions.below(Version(since)):
            continue
        return path, decision, versions
    return None


# -- who decides use_reentrant -------------------------------------------------------------
@dataclass(frozen=True)
class Decision:
    """Who decides the value a source receives for a keyword, seen from a site.

    ``level`` is the call that decides it: 0 the site's own call, ``i`` the call written in
    the ``i``-th wrapper of the path (the source call itself is at ``len(wrappers)``).
    ``state``: ``given`` a value other than a literal None is passed; ``none`` a literal
    ``None`` (``written``) is; ``omitted`` the call at ``level`` leaves it out, and would
    pass it as ``keyword`` (the parameter of the wrapper it calls that carries it on);
    ``unknown`` a ``*args`` or a ``**mapping`` the analysis cannot see may carry it.
    """

    state: Literal["given", "none", "omitted", "unknown"]
    level: int
    keyword: str
    written: ast.expr | None = None


def _decision(analysis: ProjectAnalysis, path: SourceCall) -> Decision:
    """Which call decides what the source receives as ``use_reentrant`` (a keyword-only
    parameter, or ``checkpoint_sequential``'s 4th positional), and how; see Decision."""
    name = "use_reentrant"
    wrappers = [wrapper.node for wrapper in path.wrappers]
    arguments = path.arguments
    level = len(wrappers)
    flow = arguments.keywords.get(name)
    if flow is None and path.source.reentrant is ReentrantArgument.FOURTH_POSITIONAL:
        leading = arguments.positional[:4]
        if any(f is None for f in leading):
            return Decision("unknown", level, name)  # a *args may carry it
        if len(leading) == 4:
            flow = leading[3]
    if flow is not None:
        return _follow(analysis, flow, level, name, wrappers)
    if arguments.double_star:
        return _through_spread(analysis, arguments, level, name, wrappers)
    if path.source.reentrant is ReentrantArgument.UNKNOWN and None in arguments.positional:
        return Decision("unknown", level, name)  # a configured function: maybe in *args
    return Decision("omitted", level, name)


# How many steps one decision may take (a name to its assignment, a parameter to its
# argument, each branch of a conditional expression), so that a chain of them generated
# thousands long costs a bounded amount and never the stack: then it is not reported.
_FOLLOW_STEPS = 64


def _follow(
    analysis: ProjectAnalysis,
    flow: Flow,
    level: int,
    keyword: str,
    wrappers: Sequence[ast.AST],
    steps: list[int] | None = None,
) -> Decision:
    """Follow a value through the wrappers' parameters it is passed on by (and the
    attributes a wrapper class stores them in), to the call that writes it or leaves it to a
    parameter's default. ``steps``: what is left of the decision's budget (shared by the
    branches of a conditional expression)."""
    context: Context | None
    expression, context = flow
    steps = [_FOLLOW_STEPS] if steps is None else steps
    followed: set[int] = set()  # the assignments followed (``a = b`` and ``b = a`` end)
    while True:
        steps[0] -= 1
        if steps[0] < 0:
            return Decision("given", level, keyword)
        if isinstance(expression, ast.Constant) and expression.value is None:
            return Decision("none", level, keyword, expression)
        if context is None:
            return Decision("given", level, keyword)
        if isinstance(expression, ast.IfExp):  # unset only where both branches leave it so
            branches = [
                _follow(analysis, (branch, context), level, keyword, wrappers, steps)
                for branch in (expression.body, expression.orelse)
            ]
            unset = [d for d in branches if d.state in ("none", "omitted")]
            return unset[0] if len(unset) == 2 else Decision("given", level, keyword)
        if isinstance(expression, ast.Call):
            return _read_from_mapping(analysis, expression, context, level, keyword, wrappers)
        if isinstance(expression, ast.Attribute):
            found = _stored_by_constructor(analysis, expression, context, wrappers)
            if found is None:
                return Decision("given", level, keyword)
            argument, level, keyword = found
        elif isinstance(expression, ast.Name):
            bindings = context.scope.lookup(expression.id, node_position(expression))
            assigned = _assigned_once(bindings)
            if assigned is not None and id(assigned[1]) not in followed:
                followed.add(id(assigned[1]))  # ``r = kwargs.get("use_reentrant")``, then ``r``
                expression, context = assigned[0], context.at(assigned[1].scope)
                continue
            if len(bindings) != 1 or not isinstance(bindings[0].node, ast.arg):
                return Decision("given", level, keyword)
            parameter, owner = bindings[0].node, bindings[0].scope.node
            bound = context.argument(parameter)
            if bound is None or owner not in wrappers:
                return Decision("given", level, keyword)  # decided where the wrapper is made
            argument, keyword = bound, parameter.arg
            # Handed on unchanged, it is what the call that wrote it passed (see ``_written_at``).
            level = _written_at(argument, wrappers, wrappers.index(owner))
        else:
            return Decision("given", level, keyword)
        if argument.expression is None:
            return Decision("given", level, keyword)
        if argument.default:
            if argument.parameter is not None and argument.function in wrappers:
                keyword = argument.parameter.arg  # the parameter the call at ``level`` left out
            if isinstance(argument.expression, ast.Constant) and argument.expression.value is None:
                return Decision("omitted", level, keyword)
            return Decision("given", level, keyword)
        expression, context = argument.expression, argument.context


def _written_at(argument: Argument, wrappers: Sequence[ast.AST], owner: int) -> int:
    """The level of the call that wrote what a wrapper's parameter holds: a default belongs
    to the call into its function that left it out; an expression to the call written in
    the wrapper whose body holds it (``i + 1`` for ``wrappers[i]``), or to the site (0).
    ``owner``: the level of the call into the parameter's own function, where nothing
    tells more."""
    if argument.default:
        return wrappers.index(argument.function) if argument.function in wrappers else owner
    scope = argument.context.scope if argument.context is not None else None
    while scope is not None:
        if scope.node in wrappers:
            return wrappers.index(scope.node) + 1
        scope = scope.parent
    return 0 if argument.context is not None else owner


def _assigned_once(bindings: list[Binding]) -> tuple[ast.expr, Binding] | None:
    """The value of the one plain assignment (``name = value``) a name read has, if that is
    all it has."""
    if len(bindings) != 1:
        return None
    (binding,) = bindings
    value = binding.value
    if value is None or binding.iterated or binding.path or binding.conditional:
        return None
    return (value, binding) if isinstance(binding.node, ast.Name) else None


def _stored_by_constructor(
    analysis: ProjectAnalysis,
    expression: ast.Attribute,
    context: Context,
    wrappers: Sequence[ast.AST],
) -> tuple[Argument, int, str] | None:
    """``self.use_reentrant`` in the ``forward`` of a wrapper class, stored once by its
    ``__init__`` from a parameter: that parameter as the constructor call binds it,
    with the level of that call and the parameter's name."""
    receivers = analysis.evaluate(expression.value, context)
    instance = receivers[0] if len(receivers) == 1 else None
    if not isinstance(instance, Instance) or not isinstance(instance.cls, ClassValue):
        return None
    if instance.call is None or instance.context is None:
        return None
    owners = [c for c in analysis.mro(instance.cls) if isinstance(c, ClassValue)]
    methods = {id(s) for owner in owners for s in owner.node.body}
    level = next((i for i, w in enumerate(wrappers) if id(w) in methods), None)
    stores = [b for owner in owners for b in analysis.instance_assignments(owner, expression.attr)]
    if level is None or len(stores) != 1:
        return None
    store = stores[0]
    stored, method = store.value, store.scope.node
    if not isinstance(stored, ast.Name) or not isinstance(method, FUNCTIONS):
        return None
    if method.name != "__init__" or store.scope.parent is None:
        return None
    parameters = store.scope.lookup(stored.id, node_position(stored))
    if len(parameters) != 1 or not isinstance(parameters[0].node, ast.arg):
        return None
    module = next(o.module for o in owners if any(s is method for s in o.node.body))
    owner_context = Context(module, store.scope.parent)
    initialiser = FunctionValue(method, owner_context, (instance,))
    made = analysis.bind(initialiser, Arguments.of(instance.call, instance.context))
    argument = made.argument(parameters[0].node)
    return None if argument is None else (argument, level, parameters[0].node.arg)


def _through_spread(
    analysis: ProjectAnalysis,
    arguments: Arguments,
    level: int,
    name: str,
    wrappers: Sequence[ast.AST],
) -> Decision:
    """``name`` looked for in what ``**`` spreads into a call: a wrapper's ``**kwargs``
    holds its callers' keywords, as the wrapper edited them (``setdefault``, ``update``,
    ``pop``, ``{**kwargs, ...}``); anything else may hold it (unknown)."""
    if not arguments.spread:
        return Decision("unknown", level, name)
    decisions = []
    for expression, context in arguments.spread:
        for held in analysis.held(expression, context, name):
            decisions.append(_held_decision(analysis, held, level, name, wrappers))
    return _first_decided(decisions)


def _held_decision(
    analysis: ProjectAnalysis,
    held: Given | Absent | Passed | Unknown,
    level: int,
    name: str,
    wrappers: Sequence[ast.AST],
) -> Decision:
    """Who decides ``name`` when a mapping spread at ``level`` holds ``held`` for it."""
    if isinstance(held, Given):
        return _follow(analysis, held.flow, level, name, wrappers)
    if isinstance(held, Absent):
        return Decision("omitted", level, name)
    if isinstance(held, Unknown) or held.owner not in wrappers:
        return Decision("unknown", level, name)
    owner = wrappers.index(held.owner)  # the level of the call passing the keywords
    keywords = held.keywords
    flow = keywords.keyword(name)
    if flow is not None:
        return _follow(analysis, flow, owner, name, wrappers)
    if name in keywords.taken:
        return Decision("given", owner, name)  # a named parameter takes it there
    if keywords.arguments.double_star:
        caller = _through_spread(analysis, keywords.arguments, owner, name, wrappers)
    else:
        caller = Decision("omitted", owner, name)
    if caller.state != "omitted" or held.otherwise == ABSENT:
        return caller
    # Where the callers leave it out, what the wrapper put there itself decides.
    own = [_held_decision(analysis, h, level, name, wrappers) for h in held.otherwise]
    return _first_decided([d for d in own if d.state != "omitted"] or [caller])


def _read_from_mapping(
    analysis: ProjectAnalysis,
    call: ast.Call,
    context: Context,
    level: int,
    keyword: str,
    wrappers: Sequence[ast.AST],
) -> Decision:
    """``kwargs.get("use_reentrant", default)`` (or ``pop``) passed on: what the mapping
    holds there, the default where it lacks it; any other call decides itself."""
    func = call.func
    if not isinstance(func, ast.Attribute) or func.attr not in ("get", "pop"):
        return Decision("given", level, keyword)
    if not call.args or not isinstance(call.args[0], ast.Constant):
        return Decision("given", level, keyword)
    key = call.args[0].value
    if not isinstance(key, str):
        return Decision("given", level, keyword)
    default = (call.args[1], context) if len(call.args) > 1 else None
    state = with_default(analysis.held(func.value, context, key), default)
    return _first_decided([_held_decision(analysis, h, level, key, wrappers) for h in state])


def _first_decided(decisions: list[Decision]) -> Decision:
    """A value given, or one that may be, decides; else the outermost call leaving it out."""
    decided = [d for d in decisions if d.state in ("given", "unknown")]
    return decided[0] if decided else min(decisions, key=lambda d: d.level)


def _partials_made(
    analysis: ProjectAnalysis, module: Module, sites: list[Site]
) -> Iterator[tuple[PartialValue, list[SourceCall]]]:
    """``functools.partial(<source>, ...)`` written in the module outside its sites, with the
    source calls that calling the partial makes."""
    site_calls = {id(site.node) for site in sites}
    for call, context in analysis.calls_of_interest(module):
        if id(call) in site_calls:
            continue
        callee = analysis.evaluate(call.func, context)
        if not any(isinstance(v, External) and v.name == PARTIAL for v in callee):
            continue
        for value in analysis.evaluate(call, context):
            if isinstance(value, PartialValue):
                paths = analysis.paths((value,), _no_arguments(value.call))
                if paths:
                    yield value, paths


def _inner_partials(partial: PartialValue) -> Iterator[PartialValue]:
    """The partials a partial wraps (``partial(partial(checkpoint), ...)``)."""
    stack = list(partial.inner)
    while stack:
        value = stack.pop()
        if isinstance(value, PartialValue):
            yield value
            stack.extend(value.inner)


def _no_arguments(call: ast.Call) -> Arguments:
    return Arguments((), {}, False, (call,))
