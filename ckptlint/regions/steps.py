"""Where a region's call runs again within one training step: the loops around it.

A loop that also runs the backward (``loss.backward()`` in the same iteration) makes one
step per iteration; any other loop runs its body several times before the backward.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ckptlint.project.scopes import FUNCTIONS, statements_at
from ckptlint.regions.sites import callee_label

Loop = ast.For | ast.AsyncFor | ast.While


def loops_around(function: ast.AST, call: ast.AST) -> Iterator[Loop]:
    """The loops of a function's body whose body holds ``call``, innermost first."""
    if not isinstance(function, FUNCTIONS):
        return
    line = call.lineno  # type: ignore[attr-defined]
    for statement in reversed(statements_at(function.body, line)):
        if not isinstance(statement, (ast.For, ast.AsyncFor, ast.While)):
            continue
        if statement.body and statement.body[0].lineno <= line:  # not in the header
            yield statement


def runs_backward(node: ast.AST) -> bool:
    """``loss.backward()``, ``torch.autograd.grad(...)`` or ``optimizer.zero_grad()`` (a
    training loop whose backward a helper runs) inside ``node``."""
    for inner in ast.walk(node):
        if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute):
            if inner.func.attr in ("backward", "zero_grad"):
                return True
            if inner.func.attr == "grad" and "autograd" in callee_label(inner.func.value):
                return True
    return False
