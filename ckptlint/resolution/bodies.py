"""Where code lies and what of it runs where, for every layer that walks a body.

``own_nodes``: the nodes a body runs itself, not those of the definitions nested in it (walked
once per body and kept). ``statements_on_line``: the innermost statement at a line and its
scope, for the text searches (``Module.lines_naming``) that find lines before anything is
evaluated. ``line_span``, ``first_parameter``: a definition's lines and its ``self``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ckptlint.memos import process_memo
from ckptlint.project.index import Module
from ckptlint.project.scopes import FUNCTIONS, Body, Scope, body_containing, child_nodes

DEFINITIONS = (*FUNCTIONS, ast.ClassDef, ast.Lambda)


def own_nodes(statements: Body | ast.expr) -> tuple[ast.AST, ...]:
    """Nodes of a body (a lambda's: its expression), not descending into nested definitions
    (their code runs only if called) but including their defaults and decorators.

    Walked once per body and kept: every rule and layer asks for the same bodies, and each
    file's analysis, computed on its own, asks again. The walk depends on the tree alone;
    the body is kept with its nodes, so its id is never reused while the entry lives.
    """
    found = _OWN_NODES.get(id(statements))
    if found is not None and found[0] is statements:
        return found[1]
    nodes = []
    stack: list[ast.AST] = (
        [statements] if isinstance(statements, ast.expr) else list(reversed(statements))
    )
    while stack:
        node = stack.pop()
        nodes.append(node)
        stack.extend(reversed(children_run_here(node)))
    result = tuple(nodes)
    _OWN_NODES[id(statements)] = (statements, result)
    return result


_OWN_NODES: dict[int, tuple[Body | ast.expr, tuple[ast.AST, ...]]] = process_memo()


def children_run_here(node: ast.AST) -> list[ast.AST]:
    """Child nodes evaluated where ``node`` is, leaving out the bodies of definitions."""
    if isinstance(node, (*FUNCTIONS, ast.Lambda)):
        arguments = node.args
        defaults = [d for d in (*arguments.defaults, *arguments.kw_defaults) if d]
        return [*getattr(node, "decorator_list", []), *defaults]
    if isinstance(node, ast.ClassDef):
        return [*node.decorator_list, *node.bases]
    return child_nodes(node)


def statements_on_line(module: Module, line: int) -> Iterator[tuple[ast.stmt, Scope]]:
    """The innermost statement at ``line`` and its scope."""
    body: list[ast.stmt] = module.tree.body
    scope = module.scopes.module
    found: ast.stmt | None = None
    while body:
        candidates = [s for s in body if s.lineno <= line <= (s.end_lineno or s.lineno)]
        if not candidates:
            break
        found = candidates[0]
        if isinstance(found, (*FUNCTIONS, ast.ClassDef)):
            inner = module.scopes.function_scope(found)
            if inner is None:
                return
            scope = inner
        body = body_containing(found, line)
    if found is not None and not isinstance(found, (*FUNCTIONS, ast.ClassDef)):
        yield found, scope


def line_span(node: ast.AST | None) -> tuple[int, int] | None:
    """The lines ``node`` spans (None for none)."""
    if node is None:
        return None
    return node.lineno, node.end_lineno or node.lineno  # type: ignore[attr-defined]


def first_parameter(node: ast.AST) -> ast.arg | None:
    """A definition's first positional parameter (a method's ``self``), if any."""
    args = getattr(node, "args", None)
    if not isinstance(args, ast.arguments):
        return None
    positional = [*args.posonlyargs, *args.args]
    return positional[0] if positional else None
