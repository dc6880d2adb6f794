"""CKP202: a checkpoint region that reads a loop variable through its closure."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass

from ckptlint.analysis import ProjectAnalysis
from ckptlint.core import Finding
from ckptlint.effects.changes import statements_at
from ckptlint.project.scopes import COMPREHENSIONS, Binding, Scope
from ckptlint.regions.sites import callee_label
from ckptlint.resolution.values import FunctionValue, PartialValue, Values
from ckptlint.rules.base import FileContext, Rule


@dataclass(frozen=True)
class ClosureRead:
    name: str
    read_line: int
    loop_line: int


class LateBinding(Rule):
    """A checkpoint region reads a loop variable through its closure (late binding).

    A closure reads the variable, not the value it had when the closure was made. The
    checkpoint runs the region once in the forward and again in the backward, and the
    backward usually runs after the loop has moved on: the recompute then sees the
    variable's last value, computes something else than the forward did, and the gradients
    are silently wrong (PyTorch does not notice: shapes agree).

    Bind the value when the region is made: a default argument (`lambda x, i=i: ...`),
    `functools.partial(f, i)`, a factory function's parameter (`make_forward(layer)`), or
    pass it as an input of the checkpoint.

    Reported when the region is a lambda or def (directly, through `functools.partial` or
    returned by a factory) that reads a variable of an enclosing function, and the
    checkpoint call sits inside a `for`/`while` loop (or comprehension) of that function
    that rebinds the variable. Not reported when the loop also runs the backward
    (`loss.backward()` in the same iteration), when the region is the loop variable
    itself (`checkpoint(layer, x)` passes the current value), when the loop only sets the
    variable to one constant before the call (`use_cache = False`), or only remakes a
    def or lambda under that name (same code, same closure cells). Through a wrapper of
    your own the same holds at the wrapper's call (`run(lambda h: layer(h), x)` in a loop).
    """

    code = "CKP202"
    name = "late-binding"
    summary = "checkpoint region closes over a loop variable"

    INVALID = [
        """\
from torch.utils.checkpoint import checkpoint

def forward(self, x):
    for layer in self.layers:
        x = checkpoint(lambda h: layer(h), x, use_reentrant=False)
    return x
""",
        """\
from torch.utils.checkpoint import checkpoint

def forward(self, x, past_key_values):
    for i, layer in enumerate(self.layers):
        past = past_key_values[i]

        def make_forward(module):
            def custom_forward(*inputs):
                return module(*inputs, past)

            return custom_forward

        x = checkpoint(make_forward(layer), x, use_reentrant=False)
    return x
""",
        """\
import functools
from torch.utils.checkpoint import checkpoint

def forward(self, x):
    scale = 1.0
    while scale < 8:
        def block(h, bias):
            return self.layer(h) * scale + bias
        x = checkpoint(functools.partial(block, bias=0.5), x, use_reentrant=False)
        scale *= 2
    return x
""",
    ]
    VALID = [
        """\
from torch.utils.checkpoint import checkpoint

def forward(self, x):
    for layer in self.layers:
        x = checkpoint(lambda h, layer=layer: layer(h), x, use_reentrant=False)
    return x
""",
        """\
from torch.utils.checkpoint import checkpoint

def forward(self, x):
    for layer in self.layers:
        x = checkpoint(layer, x, use_reentrant=False)
    return x
""",
        """\
from torch.utils.checkpoint import checkpoint

def create_custom_forward(module):
    def custom_forward(*inputs):
        return module(*inputs)

    return custom_forward

def forward(self, x):
    for layer in self.layers:
        x = checkpoint(create_custom_forward(layer), x, use_reentrant=False)
    return x
""",
        """\
from torch.utils.checkpoint import checkpoint

def train(model, batches):
    for batch in batches:
        loss = checkpoint(lambda h: model(h, batch.mask), batch.x, use_reentrant=False)
        loss.backward()
""",
    ]

    def check(self, context: FileContext) -> Iterator[Finding]:
        analysis = context.analysis
        for site in analysis.sites(context.module):
            if not isinstance(site.node, ast.Call):
                continue
            for function in _closures_of(analysis.region(site)):
                if function.module is not context.module:
                    continue
                found = late_binding(function, site.node, analysis)
                if found is None:
                    continue
                message = (
                    f"{site.subject} {function.label} reads `{found.name}` (line"
                    f" {found.read_line}) through its closure, and the loop at line"
                    f" {found.loop_line} rebinds it: the recompute in backward runs after the"
                    " loop moved on and sees the last value, so gradients are silently wrong;"
                    f" bind it when making the region (`{found.name}={found.name}` default"
                    " argument, functools.partial) or pass it as a checkpoint input"
                )
                yield context.finding(site.node, self.code, message)
                break


def _closures_of(region: Values) -> Iterator[FunctionValue]:
    """The defs and lambdas a region runs, looking through ``functools.partial``."""
    stack = list(region)
    while stack:
        value = stack.pop(0)
        if isinstance(value, PartialValue):
            stack.extend(value.inner)
        elif isinstance(value, FunctionValue):
            yield value


def late_binding(
    function: FunctionValue, call: ast.Call, analysis: ProjectAnalysis
) -> ClosureRead | None:
    """The first variable ``function`` reads from an enclosing function whose loop, around
    ``call``, rebinds it."""
    body = function.node.body
    statements = [body] if isinstance(body, ast.expr) else body
    own_scope = analysis.evaluator.scope_of(function)
    bound = {id(parameter) for parameter, _ in function.context.env}
    for node, scope in analysis.reaches.nodes_with_scopes(statements, own_scope, function.module):
        if not isinstance(node, ast.Name) or not isinstance(node.ctx, ast.Load):
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
            return ClosureRead(node.id, node.lineno, loop.lineno)
    return None


def _rebinding_loop(owner: Scope, name: str, call: ast.Call) -> ast.AST | None:
    """The innermost loop of ``owner`` around ``call`` that rebinds ``name`` to values that
    may differ between iterations, and does not also run the backward."""
    if isinstance(owner.node, COMPREHENSIONS):
        inside = owner.node.lineno <= call.lineno <= (owner.node.end_lineno or 0)
        return owner.node if inside else None
    if not isinstance(owner.node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    path = statements_at(owner.node.body, call.lineno)
    for statement in reversed(path):
        if not isinstance(statement, (ast.For, ast.AsyncFor, ast.While)):
            continue
        if not statement.body or call.lineno < statement.body[0].lineno:
            continue  # the call is in the loop's header
        end = statement.end_lineno or statement.lineno
        rebound = [
            binding
            for binding in owner.bindings.get(name, [])
            if statement.lineno <= binding.position[0] <= end and not _is_definition(binding)
        ]
        if rebound and not _same_constant_first(rebound, call) and not _runs_backward(statement):
            return statement
    return None


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
    """``loss.backward()`` or ``torch.autograd.grad(...)`` inside the loop."""
    for node in ast.walk(loop):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "backward":
                return True
            if node.func.attr == "grad" and "autograd" in callee_label(node.func.value):
                return True
    return False
