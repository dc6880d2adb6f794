"""Calls found by a text search for a name, with the context each is evaluated in.

The scopes a module is built with visit only the lines naming a source; a rule that looks
for another API (``create_selective_checkpoint_contexts``, ``DistributedDataParallel``)
finds its lines with ``Module.lines_naming`` and the calls on them here.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ckptlint.project.index import Module
from ckptlint.project.scopes import COMPREHENSIONS, FUNCTIONS, Scope, statements_at
from ckptlint.resolution.evaluator import Evaluator
from ckptlint.resolution.values import Context


def calls_at(evaluator: Evaluator, module: Module, line: int) -> Iterator[tuple[ast.Call, Context]]:
    """The calls whose span holds ``line``, in the innermost statement there, each with the
    context it is evaluated in (its function, lambda or comprehension)."""
    path = statements_at(module.tree.body, line)
    if not path:
        return
    scopes = module.scopes
    scope: Scope = scopes.module
    for statement in path[:-1]:
        if isinstance(statement, (*FUNCTIONS, ast.ClassDef)):
            scope = scopes.function_scope(statement) or scope
    stack: list[tuple[ast.AST, Scope]] = [(path[-1], scope)]
    while stack:
        node, node_scope = stack.pop()
        if isinstance(node, (ast.Lambda, *COMPREHENSIONS)):
            node_scope = scopes.function_scope(node) or scopes.build_nested(node, node_scope)
        elif isinstance(node, ast.Call) and node.lineno <= line <= (node.end_lineno or node.lineno):
            yield node, Context(module, node_scope)
        stack.extend((child, node_scope) for child in reversed(list(ast.iter_child_nodes(node))))
