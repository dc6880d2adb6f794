"""CKP202: a checkpoint region that reads a loop variable through its closure."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field

from ckptlint.rules.base import (
    COMPREHENSIONS,
    FUNCTIONS,
    MUTATING_METHODS,
    Binding,
    BindNames,
    Context,
    FileContext,
    Finding,
    Fix,
    FunctionValue,
    Loop,
    PartialValue,
    ProjectAnalysis,
    Rule,
    Scope,
    Values,
    assigned_targets,
    callee_label,
    header_nodes,
    loops_around,
    nested_bodies,
)


@dataclass(frozen=True)
class ClosureRead:
    name: str
    read_line: int
    loop_line: int
    changed_line: int | None = None  # an in-place change (``kwargs[k] = v``), not a rebinding
    owner: Scope | None = field(default=None, compare=False)  # the function binding the name


class LateBinding(Rule):
    """A checkpoint region reads a loop variable through its closure (late binding).

    Reported when the region is a lambda or def (directly, through `functools.partial` or
    returned by a factory) that reads a variable of an enclosing function, and the
    checkpoint call sits inside a `for`/`while` loop (or comprehension) of that function
    that rebinds the variable, or changes the part of it the region reads (an item, an
    attribute, or anything for a region that uses the whole object) to a value computed
    from names the loop binds. Through a wrapper of your own the same holds at the
    wrapper's call (`run(lambda h: layer(h), x)` in a loop), also when the wrapper hands the
    function to a closure factory first (`checkpoint(create_custom_forward(fn), ...)`).

    ## Why is this bad?

    A closure reads the variable, not the value it had when the closure was made. The
    checkpoint runs the region once in the forward and again in the backward, and the
    backward usually runs after the loop has moved on: the recompute then sees the
    variable's last value, computes something else than the forward did, and the gradients
    are silently wrong (PyTorch does not notice: shapes agree).

    The same holds for an object the loop changes in place: a dict the region reads
    (`**kwargs`) that the loop updates with each layer's value (`kwargs["window"] = w`) is
    read at its last state by every recompute. Bind a copy (`functools.partial(f,
    **kwargs)`, `dict(kwargs)` as a default argument).

    Bind the value when the region is made: a default argument (`lambda x, i=i: ...`),
    `functools.partial(f, i)`, a factory function's parameter (`make_forward(layer)`), or
    pass it as an input of the checkpoint.

    ## Fix safety

    The fix changes the function's signature: each late-bound name becomes a parameter
    `name=name` of the def or lambda (keyword-only after a `*args`), so the value the
    function is made with, the one the forward reads, is what the recompute reads too. It
    is offered where the function is made anew for the call: a lambda in the call, a def
    made by a factory the call calls (transformers' `create_custom_forward(layer_module)`
    closing over `past_key_value`), or a def made earlier in the same iteration with no
    rebinding of the names in between. A def made once before the loop, or an object
    changed in place (a copy would keep only what a shallow copy keeps), gets no fix:
    rewrite those by hand.

    ## Not reported

    When the loop also runs the backward (`loss.backward()` in the same iteration), when
    the region is the loop variable itself (`checkpoint(layer, x)` passes the current
    value), when the loop only sets the variable to one constant before the call
    (`use_cache = False`), or only remakes a def or lambda under that name (same code, same
    closure cells).
    """

    code = "CKP202"
    FIX = "unsafe"
    GUARD = (
        "At run time, `ckptguard.enable()` raises `CheckpointMismatchError` (kind `closure`) "
        "naming the closure variable and its two values when the loop moved on before the "
        "recompute."
    )
    name = "late-binding"
    summary = "checkpoint region closes over a loop variable"

    EXAMPLE = """\
from torch.utils.checkpoint import checkpoint

def forward(self, x):
    for layer in self.layers:
        x = checkpoint(lambda h: layer(h), x, use_reentrant=False)  # expect: CKP202@13
    return x
"""
    CORRECTED = """\
from torch.utils.checkpoint import checkpoint

def forward(self, x):
    for layer in self.layers:
        x = checkpoint(lambda h, layer=layer: layer(h), x, use_reentrant=False)
    return x
"""

    def check(self, context: FileContext) -> Iterator[Finding]:
        analysis = context.analysis
        for site in analysis.sites(context.module):
            if not isinstance(site.node, ast.Call):
                continue
            for function in _closures_of(analysis.region(site), analysis):
                if function.module is not context.module:
                    continue
                found = late_bindings(function, site.node, analysis)
                if found:
                    message = _message(site.subject, function, found)
                    fix = _binding_fix(context, site.node, site.context, function, found, analysis)
                    yield context.finding(site.node, self.code, message, fix)
                    break


def _message(subject: str, function: FunctionValue, found: list[ClosureRead]) -> str:
    """Names every late-bound variable the region reads, with the loop that changes it."""
    consequence = (
        "the recompute in backward runs after the loop moved on and sees the last {state}, so"
        " gradients are silently wrong"
    )
    if len(found) == 1:
        (read,) = found
        if read.changed_line is None:
            how, state, bind = "rebinds it", "value", f"`{read.name}={read.name}`"
        else:
            how = f"changes it in place (line {read.changed_line})"
            state, bind = "state", f"a copy, `{read.name}=dict({read.name})`"
        return (
            f"{subject} {function.label} reads `{read.name}` (line {read.read_line}) through its"
            f" closure, and the loop at line {read.loop_line} {how}: "
            + consequence.format(state=state)
            + f"; bind it when making the region ({bind} default argument, functools.partial)"
            " or pass it as a checkpoint input"
        )
    parts, binds = [], []
    for read in found:
        if read.changed_line is None:
            how = "rebinds it"
            binds.append(f"`{read.name}={read.name}`")
        else:
            how = f"changes it in place at line {read.changed_line}"
            binds.append(f"`{read.name}=dict({read.name})`")
        parts.append(
            f"`{read.name}` (line {read.read_line}; the loop at line {read.loop_line} {how})"
        )
    return (
        f"{subject} {function.label} reads {_enumerate(parts)} through its closure: "
        + consequence.format(state="values")
        + f"; bind them when making the region ({', '.join(binds)} default arguments,"
        " functools.partial) or pass them as checkpoint inputs"
    )


def _binding_fix(
    context: FileContext,
    call: ast.Call,
    where: Context,
    function: FunctionValue,
    found: list[ClosureRead],
    analysis: ProjectAnalysis,
) -> Fix | None:
    """Bind each late-bound name where the region is made: a parameter ``name=name`` of the
    def or lambda, whose default is the value the forward then reads. Offered only where
    the function is made for this call (in it, by a factory called in it, or in the same
    iteration before it, with no rebinding of the names in between); not for a change in
    place (a copy would keep only what a shallow copy keeps). Unsafe: it changes the
    function's signature."""
    if any(read.changed_line is not None or read.owner is None for read in found):
        return None
    node = function.node
    if not _made_for(call, where, function, found, analysis):
        return None
    end_line = node.end_lineno or node.lineno
    edit = BindNames(
        node.lineno,
        context.character_column(node.lineno, node.col_offset),
        end_line,
        context.character_column(end_line, node.end_col_offset or 0),
        tuple(read.name for read in found),
    )
    return Fix(edit, "unsafe")


def _made_for(
    call: ast.Call,
    where: Context,
    function: FunctionValue,
    found: list[ClosureRead],
    analysis: ProjectAnalysis,
) -> bool:
    """Whether the def or lambda is made anew for this call, after the last rebinding of
    every name it reads late: written in the call, made by a factory the call calls, or
    made before it in the loop's body with no rebinding between."""
    node = function.node
    if _within(node, call):
        return True
    maker = function.context.scope.node
    if isinstance(maker, FUNCTIONS) and not _owns(found, maker):
        for inner in ast.walk(call):
            if isinstance(inner, ast.Call) and inner is not call:
                callees = analysis.evaluate(inner.func, where)
                if any(isinstance(v, FunctionValue) and v.node is maker for v in callees):
                    return True
    made = (node.lineno, node.col_offset)
    if made >= (call.lineno, call.col_offset):
        return False
    for read in found:
        owner = read.owner
        assert owner is not None
        loops = [loop for loop in loops_around(owner.node, call) if loop.lineno == read.loop_line]
        if not loops or not _within(node, loops[0]):
            return False
        between = [
            binding
            for binding in owner.bindings.get(read.name, [])
            if made < binding.position < (call.lineno, call.col_offset)
        ]
        if between:
            return False
    return True


def _owns(found: list[ClosureRead], node: ast.AST) -> bool:
    return any(read.owner is not None and read.owner.node is node for read in found)


def _within(inner: ast.AST, outer: ast.AST) -> bool:
    start = (inner.lineno, inner.col_offset)  # type: ignore[attr-defined]
    end = (inner.end_lineno, inner.end_col_offset)  # type: ignore[attr-defined]
    return (outer.lineno, outer.col_offset) <= start and end <= (  # type: ignore[attr-defined]
        outer.end_lineno,  # type: ignore[attr-defined]
        outer.end_col_offset,  # type: ignore[attr-defined]
    )


def _enumerate(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} and {parts[-1]}"


def _closures_of(region: Values, analysis: ProjectAnalysis) -> Iterator[FunctionValue]:
    """The defs and lambdas a region runs, looking through ``functools.partial`` and through
    closure factories (``create_custom_forward(module)`` returns a def calling ``module``:
    the functions its maker was given run too)."""
    stack = list(region)
    seen: set[FunctionValue] = set()
    while stack and len(seen) < _MAX_CLOSURES:
        value = stack.pop(0)
        if isinstance(value, PartialValue):
            stack.extend(value.inner)
        elif isinstance(value, FunctionValue) and value not in seen:
            seen.add(value)
            yield value
            for _, argument in value.context.env:  # what its maker was given
                stack.extend(
                    given
                    for given in analysis.argument_values(argument)
                    if isinstance(given, (FunctionValue, PartialValue))
                )


# Closures looked into for one region (a factory's factory...).
_MAX_CLOSURES = 8


def late_bindings(
    function: FunctionValue, call: ast.Call, analysis: ProjectAnalysis
) -> list[ClosureRead]:
    """The variables ``function`` reads from an enclosing function whose loop, around
    ``call``, rebinds them or changes what it reads of them: each once, where first read."""
    body = function.node.body
    statements = [body] if isinstance(body, ast.expr) else body
    own_scope = analysis.scope_of(function)
    bound = {id(parameter) for parameter, _ in function.context.env}
    parents = {
        id(child): parent
        for parent in ast.walk(function.node)
        for child in ast.iter_child_nodes(parent)
    }
    found: dict[str, ClosureRead] = {}
    for node, scope in analysis.nodes_with_scopes(statements, own_scope, function.module):
        if not isinstance(node, ast.Name) or not isinstance(node.ctx, ast.Load):
            continue
        if node.id in found:
            continue
        bindings = scope.lookup(node.id, (node.lineno, node.col_offset))
        owners = {id(b.scope): b.scope for b in bindings}
        if len(owners) != 1 or any(id(b.node) in bound for b in bindings):
            continue
        owner = next(iter(owners.values()))
        if owner.kind != "function" or owner is scope or owner is own_scope:
            continue
        loop = _rebinding_loop(owner, node.id, call)
        if loop is not None:
            found[node.id] = ClosureRead(node.id, node.lineno, loop.lineno, owner=owner)
            continue
        changed = _changing_loop(owner, node.id, _part_read(node, parents), call)
        if changed is not None:
            loop, line = changed
            found[node.id] = ClosureRead(node.id, node.lineno, loop.lineno, line, owner)
    return list(found.values())


def _rebinding_loop(owner: Scope, name: str, call: ast.Call) -> ast.expr | ast.stmt | None:
    """The innermost loop of ``owner`` around ``call`` that rebinds ``name`` to values that
    may differ between iterations, and does not also run the backward."""
    if isinstance(owner.node, COMPREHENSIONS):
        inside = owner.node.lineno <= call.lineno <= (owner.node.end_lineno or 0)
        return owner.node if inside else None
    for statement in loops_around(owner.node, call):
        end = statement.end_lineno or statement.lineno
        rebound = [
            binding
            for binding in owner.bindings.get(name, [])
            if statement.lineno <= binding.position[0] <= end and not _is_definition(binding)
        ]
        if rebound and not _same_constant_first(rebound, call) and not _runs_backward(statement):
            return statement
    return None


# The part of an object a read or a change touches: ("attr", name), ("key", constant or None
# for a computed key) or ("whole", None).
Part = tuple[str, object]
_WHOLE: Part = ("whole", None)


def _part_read(name: ast.Name, parents: dict[int, ast.AST]) -> Part:
    """``kwargs["mask"]`` and ``kwargs.get("mask")`` read one item, ``cfg.scale`` one
    attribute; anything else (``**kwargs``, passing it on) may read all of it."""
    parent = parents.get(id(name))
    if isinstance(parent, ast.Attribute):
        call = parents.get(id(parent))
        if parent.attr == "get" and isinstance(call, ast.Call) and call.func is parent:
            return ("key", _constant(call.args[0]) if call.args else None)
        return ("attr", parent.attr)
    if isinstance(parent, ast.Subscript) and parent.value is name:
        return ("key", _constant(parent.slice))
    return _WHOLE


def _constant(node: ast.expr) -> object:
    return node.value if isinstance(node, ast.Constant) else None


def _changing_loop(owner: Scope, name: str, read: Part, call: ast.Call) -> tuple | None:
    """(loop, line) of the innermost loop of ``owner`` around ``call`` that changes, in
    place, the part of ``name`` the region reads, to a value computed from names the loop
    binds (a value that cannot differ between iterations changes nothing the recompute
    sees); None when there is none or the loop also runs the backward."""
    for statement in loops_around(owner.node, call):
        end = statement.end_lineno or statement.lineno
        varying = {
            other
            for other, bindings in owner.bindings.items()
            if any(statement.lineno <= b.position[0] <= end for b in bindings)
        }
        for part, value, line in _in_place_changes(statement, name):
            if _overlaps(part, read) and (value is None or _uses_any(value, varying)):
                return None if _runs_backward(statement) else (statement, line)
    return None


def _in_place_changes(loop: Loop, name: str) -> Iterator[tuple[Part, ast.AST | None, int]]:
    """(part changed, the value or call that changes it, line) for ``name[k] = v``,
    ``name.a = v``, ``del name[k]`` and ``name.update(...)``-style calls in the loop's body,
    outside nested definitions. The value is None where the change builds on the part's own
    previous state (``name[k] += 1``, ``del``): it differs between iterations by itself."""
    for statement in _statements_run_in(loop):
        for target in assigned_targets(statement):
            part = _part_of_target(target, name)
            if part is not None:  # ``+=`` and ``del`` build on the part's previous state
                value = (
                    statement.value if isinstance(statement, (ast.Assign, ast.AnnAssign)) else None
                )
                yield part, value, statement.lineno
        for node in header_nodes(statement):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in MUTATING_METHODS
            ):
                part = _part_of_target(node.func, name)
                if part is not None:
                    yield (_WHOLE if part[0] == "attr" else part), node, node.lineno


def _part_of_target(target: ast.expr, name: str) -> Part | None:
    """The part of ``name`` a target expression (``name[k].x``) lands in, None when it is
    not rooted at ``name`` itself."""
    outer: ast.Attribute | ast.Subscript | None = None
    root: ast.Name | None = None
    while isinstance(target, (ast.Attribute, ast.Subscript)):
        if isinstance(target.value, ast.Name):
            outer, root = target, target.value
            break
        target = target.value
    if outer is None or root is None or root.id != name:
        return None
    if isinstance(outer, ast.Attribute):
        return ("attr", outer.attr)
    return ("key", _constant(outer.slice))


def _overlaps(changed: Part, read: Part) -> bool:
    if changed == _WHOLE or read == _WHOLE:
        return True
    if changed[0] != read[0]:
        return False
    return changed[1] is None or read[1] is None or changed[1] == read[1]


def _uses_any(value: ast.AST, names: set[str]) -> bool:
    return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(value))


def _statements_run_in(loop: Loop) -> Iterator[ast.stmt]:
    """Statements of a loop's body (nested blocks included), not of nested definitions."""
    stack = list(reversed(loop.body))
    while stack:
        statement = stack.pop()
        yield statement
        if not isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for body in nested_bodies(statement):
                stack.extend(reversed(body))


def _is_definition(binding: Binding) -> bool:
    """A def, class or lambda made again in each iteration: same code, same closure cells,
    so the last one behaves like the one the forward called."""
    return isinstance(binding.node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) or (
        isinstance(binding.value, ast.Lambda)
    )


def _same_constant_first(bindings: list[Binding], call: ast.Call) -> bool:
    """Every rebinding sets one and the same constant before the call (``use_cache = False``):
    forward and recompute see the same value."""
    values = {
        repr(binding.value.value) if isinstance(binding.value, ast.Constant) else None
        for binding in bindings
    }
    before = all(binding.position < (call.lineno, call.col_offset) for binding in bindings)
    return before and len(values) == 1 and None not in values


def _runs_backward(loop: ast.AST) -> bool:
    """``loss.backward()`` or ``torch.autograd.grad(...)`` inside the loop (narrower than
    ``regions.steps.runs_backward``: an ``optimizer.zero_grad()`` alone does not count)."""
    for node in ast.walk(loop):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "backward":
                return True
            if node.func.attr == "grad" and "autograd" in callee_label(node.func.value):
                return True
    return False
