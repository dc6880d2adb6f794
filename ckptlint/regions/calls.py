"""Calls found by a text search for a name, with the scope or context each is evaluated in.

Sites are calls on the lines naming a word of interest (``calls_on_lines``); a rule that
looks for another API (``create_selective_checkpoint_contexts``, ``DistributedDataParallel``)
finds its lines with ``Module.lines_naming`` and the calls on them with ``calls_at``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence

from ckptlint.memos import process_memo
from ckptlint.project.index import Module
from ckptlint.project.scopes import (
    COMPREHENSIONS,
    FUNCTIONS,
    Scope,
    child_nodes,
    is_type_checking,
    outside_parts,
    statements_at,
    statements_touching,
    touches_lines,
)
from ckptlint.resolution.bodies import children_run_here
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
        stack.extend((child, node_scope) for child in reversed(child_nodes(node)))


def calls_on_lines(module: Module, lines: list[int]) -> list[tuple[ast.Call, Scope]]:
    """The calls in expressions touching ``lines`` (ascending), in source order, each with
    the scope it runs in; definitions are entered only where they touch ``lines``."""
    if not lines:
        return []
    scopes = module.scopes
    found: list[tuple[ast.Call, Scope]] = []
    work: list[tuple[ast.AST, Scope]] = [
        (s, scopes.module) for s in reversed(statements_touching(module.tree.body, lines))
    ]
    while work:
        node, scope = work.pop()
        if not touches_lines(node, lines) and not _decorators_touch(node, lines):
            continue
        if isinstance(node, ast.stmt):
            work.extend(reversed(_statement_parts(node, scope, module, lines)))
            continue
        if isinstance(node, ast.Lambda):
            inner = scopes.function_scope(node) or scopes.build_nested(node, scope)
            work.append((node.body, inner))
            work.extend((part, scope) for part in reversed(outside_parts(node.args)))
            continue
        if isinstance(node, COMPREHENSIONS):
            inner = scopes.function_scope(node) or scopes.build_nested(node, scope)
            work.extend(reversed(_comprehension_parts(node, scope, inner)))
            continue
        if isinstance(node, ast.Call):
            found.append((node, scope))
        work.extend((child, scope) for child in reversed(child_nodes(node)))
    return found


def _decorators_touch(node: ast.AST, lines: list[int]) -> bool:
    """A definition's decorators lie before its ``def`` line."""
    decorators: list[ast.expr] = getattr(node, "decorator_list", None) or []
    return any(touches_lines(d, lines) for d in decorators)


def _statement_parts(
    statement: ast.stmt, scope: Scope, module: Module, lines: list[int]
) -> list[tuple[ast.AST, Scope]]:
    """What of a statement runs where: a definition's decorators, defaults and bases in
    ``scope``, the statements of its body touching ``lines`` in its own; any other
    statement's parts in ``scope``."""
    if isinstance(statement, (*FUNCTIONS, ast.ClassDef)):
        if isinstance(statement, ast.ClassDef):
            header: list[ast.AST] = [*statement.decorator_list, *statement.bases]
            header.extend(k.value for k in statement.keywords)
        else:
            header = [*statement.decorator_list, *outside_parts(statement.args)]
            if statement.returns is not None:
                header.append(statement.returns)
        own = [(part, scope) for part in header]
        inner = module.scopes.function_scope(statement)
        if inner is not None:
            own.extend((child, inner) for child in statements_touching(statement.body, lines))
        return own
    if isinstance(statement, ast.If) and is_type_checking(statement.test):
        return [(child, scope) for child in statement.orelse]  # its body never runs
    parts: list[tuple[ast.AST, Scope]] = []
    for child in child_nodes(statement):
        if isinstance(child, (ast.excepthandler, ast.match_case)):
            parts.extend((part, scope) for part in child_nodes(child))
        else:
            parts.append((child, scope))
    return parts


def _comprehension_parts(node: ast.AST, outer: Scope, inner: Scope) -> list[tuple[ast.AST, Scope]]:
    """A comprehension's first iterable runs outside it; the rest inside."""
    generators: list[ast.comprehension] = node.generators  # type: ignore[attr-defined]
    parts: list[tuple[ast.AST, Scope]] = [(generators[0].iter, outer)]
    for index, generator in enumerate(generators):
        if index:
            parts.append((generator.iter, inner))
        parts.extend((condition, inner) for condition in generator.ifs)
    if isinstance(node, ast.DictComp):
        parts.extend([(node.key, inner), (node.value, inner)])
    else:
        parts.append((node.elt, inner))  # type: ignore[attr-defined]
    return parts


def calls_in_body(
    body: Sequence[ast.AST], scope: Scope, module: Module
) -> list[tuple[ast.Call, Scope]]:
    """The calls a body runs itself (not those of the definitions it holds), each with its
    scope (a comprehension's own, for the calls inside it). The walk depends on the tree
    alone: made once per body and kept (the body with it, so its id is never reused)."""
    key = (id(body), id(scope))
    found = _CALLS_IN_BODY.get(key)
    if found is not None and found[0] is body and found[1] is scope:
        return found[2]
    calls: list[tuple[ast.Call, Scope]] = []
    scopes = module.scopes
    stack = [(node, scope) for node in reversed(body)]
    while stack:
        node, node_scope = stack.pop()
        if isinstance(node, COMPREHENSIONS):
            inner = scopes.function_scope(node) or scopes.build_nested(node, node_scope)
            stack.extend(reversed(_comprehension_parts(node, node_scope, inner)))
            continue
        if isinstance(node, ast.Call):
            calls.append((node, node_scope))
        stack.extend((child, node_scope) for child in reversed(children_run_here(node)))
    _CALLS_IN_BODY[key] = (body, scope, calls)
    return calls


_CALLS_IN_BODY: dict[
    tuple[int, int], tuple[Sequence[ast.AST], Scope, list[tuple[ast.Call, Scope]]]
] = process_memo()
