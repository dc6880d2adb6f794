"""Calls found by a text search for a name, with the context each is evaluated in.

The scopes a module is built with visit only the lines naming a source; a rule that looks
for another API (``create_selective_checkpoint_contexts``, ``DistributedDataParallel``)
finds its lines with ``Module.lines_naming`` and the calls on them here.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ckptlint.project.index import Module
from ckptlint.project.scopes import FUNCTIONS, Scope, statements_at
from ckptlint.resolution.evaluator import Evaluator
from ckptlint.resolution.values import Context


def calls_at(evaluator: Evaluator, module: Module, line: int) -> Iterator[tuple[ast.Call, Context]]:
    """The calls whose span holds ``line``, innermost statement's, with the context of the
    function (or class, or module) holding them."""
    path = statements_at(module.tree.body, line)
    if not path:
        return
    scope: Scope = module.scopes.module
    for statement in path[:-1]:
        if isinstance(statement, (*FUNCTIONS, ast.ClassDef)):
            scope = module.scopes.function_scope(statement) or scope
    context = Context(module, scope)
    for node in ast.walk(path[-1]):
        if isinstance(node, ast.Call) and node.lineno <= line <= (node.end_lineno or node.lineno):
            yield node, context
