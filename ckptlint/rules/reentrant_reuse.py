"""CKP401: a reentrant region whose module runs more than once in one step."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field

from ckptlint.rules.base import (
    COMPREHENSIONS,
    FUNCTIONS,
    SEQUENTIAL_CONTAINERS,
    External,
    FileContext,
    Finding,
    Flow,
    FunctionValue,
    Instance,
    Parameter,
    ProjectAnalysis,
    Rule,
    Scope,
    Sequence,
    Site,
    SourceCall,
    Value,
    Values,
    header_nodes,
    known,
    loops_around,
    node_position,
    own_nodes,
    root_name,
    runs_backward,
    statements_at,
)

TWICE = (
    "its parameters get gradients in several reentrant backward passes of one step, which"
    " DistributedDataParallel cannot reduce: it raises `Expected to mark a variable ready only"
    " once`, or (without `find_unused_parameters`) may raise nothing and leave each rank with"
    " gradients that differ from the true average"
)
OUTSIDE = (
    "its parameters get gradients in the region's own backward pass and in the outer one:"
    " DistributedDataParallel raises `Expected to mark a variable ready only once`, or (when"
    " the outer use comes first) may raise nothing and average the gradients wrongly"
)
OUTSIDE_MARK = ", outside the region"
FIX = "pass `use_reentrant=False` (or build DDP with `static_graph=True`)"


class ReentrantReuse(Rule):
    """A reentrant checkpoint region whose module runs more than once per step.

    Reported when the same module (by the same expression: `self.block`) is checkpointed
    reentrantly (`use_reentrant=True`, or `use_reentrant` left out)
    - inside a `for`/`while` loop or a comprehension that does not rebind anything the
      region expression uses, and does not also run the backward (`loss.backward()`);
    - twice in one block of statements, or checkpointed and called directly in it (not in
      exclusive `if`/`else` branches);
    - once per element of an `nn.ModuleList`/`nn.Sequential` that holds one module several
      times (`nn.ModuleList([block] * n)`, `[block for _ in range(n)]`, or filled in a loop
      that adds the same module each pass: `self.layers.append(self.block)`,
      `layers.extend([block] * n)`).

    ## Why is this bad?

    A reentrant region (`use_reentrant=True`, or `use_reentrant` left out: torch 2.13
    still defaults to the reentrant variant) computes its gradients in a backward pass of
    its own. A module checkpointed twice in one forward therefore gets its parameters'
    gradients in two such passes, and `DistributedDataParallel` reduces a parameter's
    gradient as soon as its first pass produces it. With `find_unused_parameters`, DDP raises
    `RuntimeError: Expected to mark a variable ready only once ... Reused parameters in
    multiple reentrant backward passes`; without it, it raises the same error or nothing at
    all, depending on the model (measured on torch 2.13, gloo, 2 ranks: a block applied
    twice raised nothing and each rank kept gradients off the true average by up to 0.4; an
    encoder checkpointed per mini-batch, as RetriBERT does, raised). A module that runs
    inside a reentrant region and again outside it raises the error in both cases.

    `use_reentrant=False` handles all of these (gradients identical to the unchecked model);
    so does DDP's `static_graph=True` for a model whose graph never changes.

    ## Not reported

    Regions without parameters: only a module of the project, a method of one, or a torch
    layer with weights (`nn.Linear`...) counts, also through `functools.partial` or a
    factory such as `create_custom_forward(self.block)`. A loop that runs the backward in
    each iteration checkpoints each module once per step. A region that picks its module by
    an argument the loop rebinds (`self._run_block` running `self.blocks[key]` or
    `getattr(self, name)`, called with the loop's `key`) checkpoints another module on each
    pass: it is reported only for a loop around that one that runs it again.
    """

    code = "CKP401"
    name = "reentrant-region-reused"
    summary = "reentrant region whose module runs more than once per step (DDP gradients)"

    EXAMPLE = """\
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

class Recurrent(nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = nn.Sequential(nn.Linear(64, 64), nn.Tanh())

    def forward(self, x):
        for _ in range(4):
            x = checkpoint(self.cell, x, use_reentrant=True)  # expect: CKP401@17
        return x
"""
    CORRECTED = """\
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

class Recurrent(nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = nn.Sequential(nn.Linear(64, 64), nn.Tanh())

    def forward(self, x):
        for _ in range(4):
            x = checkpoint(self.cell, x, use_reentrant=False)
        return x
"""

    def check(self, context: FileContext) -> Iterator[Finding]:
        analysis = context.analysis
        sites = analysis.sites(context.module)
        blocks = _Blocks({id(site.node) for site in sites})
        for site in sites:
            reason = self._reuse(analysis, site, blocks)
            if reason is not None:
                how = _reentrant_how(analysis, site)
                effect = OUTSIDE if reason.endswith(OUTSIDE_MARK) else TWICE
                message = f"{site.subject} is reentrant ({how}) and {reason}: {effect}; {FIX}"
                yield context.finding(site.node, self.code, message)

    def _reuse(self, analysis: ProjectAnalysis, site: Site, blocks: _Blocks) -> str | None:
        """How the site's module runs again in the same step, or None."""
        if not isinstance(site.node, ast.Call) or site.delegates:
            return None
        expression = _region_expression(analysis, site)
        if expression is None:
            return None
        parameters = _has_parameters(analysis, site, expression)
        if parameters is False:
            return None
        label = ast.unparse(expression)
        scope = site.context.scope
        if isinstance(scope.node, COMPREHENSIONS):
            if parameters and not _uses_names(expression, set(scope.bindings)):
                return f"runs `{label}` for every element of the comprehension at line" + (
                    f" {scope.node.lineno}"
                )
            return None
        owner = _enclosing_function(scope)
        if owner is None:
            return None
        certain = parameters is True
        selectors = _selector_arguments(analysis, site)
        inner: list[ast.AST] = []
        for loop in loops_around(owner.node, site.node):
            if runs_backward(loop):
                break  # one step per iteration, here and in the loops around it
            if any(_varies(loop, inner, owner, selector) for selector in selectors):
                inner.append(loop)
                continue  # each pass picks its own module (``self.blocks[key]``)
            inner.append(loop)
            if not _rebinds(loop, owner, expression):
                if not certain:
                    return None
                return f"runs `{label}` on every pass of the loop at line {loop.lineno}"
            repeated = _repeating_container(analysis, site, loop, expression)
            if repeated is not None:
                return (
                    f"runs `{label}` for every element of `{ast.unparse(loop.iter)}`, which"  # type: ignore[union-attr]
                    f" holds one module several times (line {repeated})"
                )
        return blocks.again_in_block(site, owner, expression, label) if certain else None


def _reentrant_how(analysis: ProjectAnalysis, site: Site) -> str:
    kinds = {analysis.reentrancy(path) for path in analysis.effective_paths(site)}
    if "explicit" in kinds:
        return "`use_reentrant=True`"
    return "no `use_reentrant`: torch's default is the reentrant variant"


def _region_expression(analysis: ProjectAnalysis, site: Site) -> ast.expr | None:
    """The region argument as written at the site (followed back through the parameters
    of the wrappers it passes), when every reentrant path takes it from there."""
    found: ast.expr | None = None
    for path in analysis.effective_paths(site):
        if analysis.reentrancy(path) is None:
            continue
        flow = path.region_flow()
        expression = None if flow is None else _written_at(site, flow)
        if expression is None or (found is not None and found is not expression):
            return None
        found = expression
    return found


def _written_at(site: Site, flow: Flow) -> ast.expr | None:
    """The expression at the site that a flow's value comes from: a wrapper's parameter
    is followed to the argument its caller passed, through any number of wrappers."""
    node = site.node
    followed: set[int] = set()  # a wrapper calling itself ends the search
    while id(flow[0]) not in followed:
        followed.add(id(flow[0]))
        expression, context = flow
        if context.module is site.module and (
            node.lineno <= expression.lineno <= (node.end_lineno or node.lineno)  # type: ignore[attr-defined]
        ):
            return expression
        if not isinstance(expression, ast.Name):
            return None
        bindings = context.scope.lookup(expression.id, node_position(expression))
        if len(bindings) != 1 or not isinstance(bindings[0].node, ast.arg):
            return None
        argument = context.argument(bindings[0].node)
        if argument is None or argument.expression is None or argument.context is None:
            return None
        flow = (argument.expression, argument.context)
    return None


def _selector_arguments(analysis: ProjectAnalysis, site: Site) -> list[ast.expr]:
    """The arguments written at the site that the region uses to pick the module it runs:
    passed to a parameter it indexes a container with (``self.blocks[key]``) or names an
    attribute with (``getattr(self, name)``). A loop that rebinds one checkpoints another
    module on each pass. Where the region's parameters cannot be matched with the arguments
    (a ``*args`` on the way), every argument may be one."""
    found: list[ast.expr] = []
    for path in analysis.effective_paths(site):
        if analysis.reentrancy(path) is None:
            continue
        for function in _region_functions(analysis, analysis.region(site)):
            selecting = _selecting_parameters(function)
            if not selecting:
                continue
            passed = _passed_to(path, function, selecting)
            flows = passed if passed is not None else _region_inputs(path)
            for flow in flows:
                expression = _written_at(site, flow)
                if expression is not None:
                    found.append(expression)
    return found


def _region_functions(analysis: ProjectAnalysis, region: Values) -> Iterator[FunctionValue]:
    """The functions a region's call runs first: a function, or a module's ``forward``."""
    for value in region:
        if isinstance(value, FunctionValue):
            yield value
        elif isinstance(value, Instance) and not isinstance(value.cls, External):
            for forward in analysis.member((value,), "forward"):
                if isinstance(forward, FunctionValue):
                    yield forward


def _selecting_parameters(function: FunctionValue) -> set[str]:
    """Parameters of ``function`` used as a key into a container or as an attribute name:
    ``self.blocks[key]``, ``self.layers[index - 1]``, ``getattr(self, name)``."""
    node = function.node
    arguments = node.args
    names = {a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)}
    found: set[str] = set()
    for inner in own_nodes(node.body):
        keys: list[ast.expr] = []
        if isinstance(inner, ast.Subscript):
            keys.append(inner.slice)
        elif (
            isinstance(inner, ast.Call)
            and isinstance(inner.func, ast.Name)
            and inner.func.id == "getattr"
            and len(inner.args) >= 2
        ):
            keys.append(inner.args[1])
        for key in keys:
            found.update(n.id for n in ast.walk(key) if isinstance(n, ast.Name) and n.id in names)
    return found


def _passed_to(path: SourceCall, function: FunctionValue, names: set[str]) -> list[Flow] | None:
    """The arguments the source hands on to the parameters ``names`` of the region's
    function (after the region itself); None when positions cannot be matched."""
    node = function.node
    positional = [a.arg for a in (*node.args.posonlyargs, *node.args.args)]
    if function.bound is not None:
        positional = positional[1:]
    inputs = path.arguments.positional[path.source.region[0] + 1 :]
    found: list[Flow] = []
    for index, name in enumerate(positional):
        if name not in names:
            continue
        if index >= len(inputs):
            flow = path.arguments.keywords.get(name)
            if flow is None and (None in inputs or path.arguments.double_star):
                return None
        else:
            if None in inputs[: index + 1]:
                return None
            flow = inputs[index]
        if flow is not None:
            found.append(flow)
    for name in names - set(positional):
        flow = path.arguments.keywords.get(name)
        if flow is not None:
            found.append(flow)
    return found


def _region_inputs(path: SourceCall) -> list[Flow]:
    """Every argument the source hands on to the region."""
    inputs = path.arguments.positional[path.source.region[0] + 1 :]
    return [flow for flow in inputs if flow is not None] + list(path.arguments.keywords.values())


def _has_parameters(analysis: ProjectAnalysis, site: Site, expression: ast.expr) -> bool | None:
    """The region is (or wraps) a module with parameters, or a method of one: True; known
    and without any: False; None when nothing says (elements of a container unseen)."""
    region = analysis.region(site)
    if analysis.holds_parameters(region):
        return True
    for call in ast.walk(expression):  # ``create_custom_forward(self.block)``
        if not isinstance(call, ast.Call):
            continue
        for argument in (*call.args, *(k.value for k in call.keywords)):
            values = analysis.evaluate(argument, site.context)
            if analysis.holds_parameters(values):
                return True
    if any(_calls_an_enclosing_module(analysis, f) for f in region if isinstance(f, FunctionValue)):
        return True
    return False if known(region) else None


def _calls_an_enclosing_module(analysis: ProjectAnalysis, function: FunctionValue) -> bool:
    """A def or lambda that calls a module it reaches through an enclosing function's name:
    ``sent_encoder.encoder(...)`` with ``sent_encoder`` a parameter of the method around
    it, ``self.conv1(x)`` in a closure of ``forward`` (the module's own parameters run in
    the region even where the analysis cannot tell its class)."""
    if function.bound is not None:
        return False
    body = function.node.body
    statements = [body] if isinstance(body, ast.expr) else body
    own = analysis.scope_of(function)
    context = analysis.bind(function, None)
    for node, scope in analysis.nodes_with_scopes(statements, own, function.module):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        root = root_name(node.func)
        if root is None:
            continue
        bindings = scope.lookup(root.id, node_position(root))
        if not bindings or any(b.scope.kind != "function" or b.scope is own for b in bindings):
            continue  # a global, an import, or the region's own variable (its inputs)
        receiver = [
            v
            for v in known(analysis.evaluate(node.func.value, context.at(scope)))
            if not isinstance(v, Parameter)  # what the caller passes: not known here
        ]
        if not receiver or analysis.holds_parameters(tuple(receiver)):
            return True
    return False


def _enclosing_function(scope: Scope | None) -> Scope | None:
    while scope is not None and not isinstance(scope.node, FUNCTIONS):
        if scope.kind != "function":
            return None  # a class body or the module: no function runs it repeatedly
        scope = scope.parent
    return scope


def _uses_names(expression: ast.expr, names: set[str]) -> bool:
    return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(expression))


def _rebinds(loop: ast.AST, owner: Scope, expression: ast.expr) -> bool:
    """Whether the loop binds a name the expression uses, or assigns the expression or a
    part of it (``self.current = ...``): the region may be another module each pass."""
    first, last = loop.lineno, loop.end_lineno or loop.lineno  # type: ignore[attr-defined]
    names = {n.id for n in ast.walk(expression) if isinstance(n, ast.Name)}
    for name in names:
        if any(first <= b.position[0] <= last for b in owner.bindings.get(name, [])):
            return True
    parts = {
        ast.dump(n) for n in ast.walk(expression) if isinstance(n, (ast.Attribute, ast.Subscript))
    }
    for node in ast.walk(loop):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        if any(ast.dump(t) in parts for t in targets):
            return True
    return False


def _varies(loop: ast.AST, inner: list[ast.AST], owner: Scope, expression: ast.expr) -> bool:
    """Whether a pass of ``loop`` binds a name of ``expression`` anew, outside the loops
    ``inner`` nested in it (``for _ in range(2): for key in keys:`` gives each key twice)."""
    first, last = loop.lineno, loop.end_lineno or loop.lineno  # type: ignore[attr-defined]
    spans = [(n.lineno, n.end_lineno or n.lineno) for n in inner]  # type: ignore[attr-defined]
    names = {n.id for n in ast.walk(expression) if isinstance(n, ast.Name)}
    return any(
        first <= binding.position[0] <= last
        and not any(start <= binding.position[0] <= end for start, end in spans)
        for name in names
        for binding in owner.bindings.get(name, [])
    )


def _repeating_container(
    analysis: ProjectAnalysis, site: Site, loop: ast.AST, expression: ast.expr
) -> int | None:
    """The line of ``nn.ModuleList([block] * n)`` (one module held several times) when the
    loop iterates over it and the region is the loop's element."""
    if not isinstance(loop, (ast.For, ast.AsyncFor)) or not isinstance(loop.target, ast.Name):
        return None
    if not _uses_names(expression, {loop.target.id}):
        return None
    for value in analysis.evaluate(loop.iter, site.context):
        if not (
            isinstance(value, Instance)
            and isinstance(value.cls, External)
            and value.cls.name in SEQUENTIAL_CONTAINERS
            and value.call is not None
        ):
            continue
        arguments = [a.value if isinstance(a, ast.Starred) else a for a in value.call.args]
        if any(_repeats_one_object(argument) for argument in arguments):
            return value.call.lineno
        made: list[Value] = [value]
        if arguments and value.context is not None:  # ``nn.ModuleList(layers)``, filled before
            made.extend(analysis.evaluate(arguments[0], value.context))
        for container in made:
            added = _added_several_times(container)
            if added is not None:
                return added
    return None


def _added_several_times(container: Value) -> int | None:
    """The line of ``self.layers.append(self.block)`` in a loop that does not make
    ``self.block`` anew (or ``.extend([block] * n)``, ``+= [block] * n``): one module added
    to the container several times, through the name it was made for."""
    origin = container.origin if isinstance(container, (Instance, Sequence)) else None
    if origin is None:
        return None
    is_attribute = isinstance(origin.node, ast.Attribute)
    cls = origin.scope.enclosing_class
    holder = cls.node if is_attribute and cls is not None else origin.scope.node
    for function in ast.walk(holder):
        if not isinstance(function, FUNCTIONS):
            continue
        for node in own_nodes(function.body):
            for added, spread in _added_to(node, origin.name, is_attribute):
                if spread:
                    if _repeats_one_object(added):
                        return node.lineno  # type: ignore[attr-defined]
                elif isinstance(added, (ast.Name, ast.Attribute)) and any(
                    not _binds_any(loop, added) for loop in loops_around(function, node)
                ):
                    return node.lineno  # type: ignore[attr-defined]
    return None


def _added_to(node: ast.AST, name: str, is_attribute: bool) -> Iterator[tuple[ast.expr, bool]]:
    """What ``node`` adds to the container named ``name`` (``self.name`` when
    ``is_attribute``), and whether it is spread (``extend``, ``+=``)."""

    def names_it(target: ast.expr) -> bool:
        if is_attribute:
            return isinstance(target, ast.Attribute) and target.attr == name
        return isinstance(target, ast.Name) and target.id == name

    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("append", "insert", "extend")
        and names_it(node.func.value)
        and node.args
    ):
        yield node.args[-1], node.func.attr == "extend"
    elif isinstance(node, ast.AugAssign) and names_it(node.target):
        yield node.value, True


def _binds_any(loop: ast.AST, expression: ast.expr) -> bool:
    """Whether the loop binds a name ``expression`` uses, or assigns ``expression``
    itself (``self.block = Block()`` in the loop makes a new one each pass)."""
    names = {n.id for n in ast.walk(expression) if isinstance(n, ast.Name)}
    wanted = ast.dump(expression)
    for node in ast.walk(loop):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id in names:
            return True
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            if ast.dump(node, annotate_fields=True).replace("Store", "Load") == wanted:
                return True
    return False


def _repeats_one_object(node: ast.expr) -> bool:
    """``[block] * n``, or ``[block for _ in range(n)]`` whose element is no new object."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        return any(isinstance(side, (ast.List, ast.Tuple)) for side in (node.left, node.right))
    if isinstance(node, (ast.ListComp, ast.GeneratorExp)):
        targets = {
            n.id
            for generator in node.generators
            for n in ast.walk(generator.target)
            if isinstance(n, ast.Name)
        }
        element = node.elt
        return isinstance(element, (ast.Name, ast.Attribute)) and not _uses_names(element, targets)
    return False


@dataclass
class _BlockCalls:
    """The calls of a block of statements (outside their nested bodies), each with its
    place (statement, then node, in the order they are walked), found by what they call and
    by their first argument."""

    statement_of: dict[int, int] = field(default_factory=dict)  # id(node): its statement
    either_or: set[int] = field(default_factory=set)  # statements with `if`-`else` or and/or
    by_callee: dict[str, list[tuple[int, int, ast.Call]]] = field(default_factory=dict)
    by_first_argument: dict[str, list[tuple[int, int, ast.Call]]] = field(default_factory=dict)

    @classmethod
    def of(cls, block: list[ast.stmt]) -> _BlockCalls:
        calls = cls()
        for index, statement in enumerate(block):
            nodes = [statement, *header_nodes(statement)]
            if any(isinstance(n, (ast.IfExp, ast.BoolOp)) for n in nodes):
                calls.either_or.add(index)
            for order, node in enumerate(nodes):
                calls.statement_of[id(node)] = index
                if not isinstance(node, ast.Call):
                    continue
                place = (index, order, node)
                calls.by_callee.setdefault(ast.dump(node.func), []).append(place)
                if node.args:
                    calls.by_first_argument.setdefault(ast.dump(node.args[0]), []).append(place)
        return calls


@dataclass
class _Blocks:
    """One file's sites, and the calls of each block holding one: indexed once, so that
    each site looks up its module's other calls instead of walking its block again (a
    forward of a thousand checkpointed layers)."""

    site_nodes: set[int]
    calls: dict[int, _BlockCalls] = field(default_factory=dict)

    def again_in_block(
        self, site: Site, owner: Scope, expression: ast.expr, label: str
    ) -> str | None:
        """A direct call of the same module, or an earlier site of it, in the block of
        statements that holds the site (not in a branch of its own, which may be
        exclusive)."""
        node = site.node
        block = _block_of(owner.node, node)
        if block is None:
            return None
        calls = self.calls.get(id(block))
        if calls is None:
            calls = self.calls[id(block)] = _BlockCalls.of(block)
        own = calls.statement_of.get(id(node))
        skipped = own if own in calls.either_or else None  # ``checkpoint(...) if c else m(x)``
        wanted = ast.dump(expression)
        start = (node.lineno, node.col_offset)  # type: ignore[attr-defined]
        runs = next(
            (
                (index, order, inner)
                for index, order, inner in calls.by_callee.get(wanted, ())
                if inner is not node and index != skipped
            ),
            None,
        )
        checkpointed = next(
            (
                (index, order, inner)
                for index, order, inner in calls.by_first_argument.get(wanted, ())
                if inner is not node
                and index != skipped
                and id(inner) in self.site_nodes
                and (inner.lineno, inner.col_offset) < start
            ),
            None,
        )
        if runs is not None and (checkpointed is None or runs[:2] <= checkpointed[:2]):
            return f"`{label}` also runs at line {runs[2].lineno}{OUTSIDE_MARK}"
        if checkpointed is not None:
            return f"`{label}` is also checkpointed at line {checkpointed[2].lineno}"
        return None


def _block_of(function: ast.AST, node: ast.AST) -> list[ast.stmt] | None:
    """The statement list that directly holds the statement containing ``node``."""
    path = statements_at(function.body, node.lineno)  # type: ignore[attr-defined]
    if not path:
        return None
    if len(path) == 1:
        return function.body  # type: ignore[attr-defined]
    parent = path[-2]
    for body in (
        getattr(parent, "body", []),
        getattr(parent, "orelse", []),
        getattr(parent, "finalbody", []),
    ):
        if path[-1] in body:
            return body
    for handler in getattr(parent, "handlers", []):
        if path[-1] in handler.body:
            return handler.body
    return None
