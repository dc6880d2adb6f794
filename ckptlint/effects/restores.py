"""Writes a function puts back: state set for a while and restored, which leaves no net change.

``global FAST; previous = FAST; FAST = True; try: ... finally: FAST = previous`` changes
``FAST`` only until the ``finally`` runs; a ``@contextmanager`` that sets it before its
``yield`` and restores it in a ``finally`` (or after the ``yield``) changes it only inside the
caller's ``with`` block. A region that does either leaves the global as it found it, and so
does its recompute: no side effect runs twice (CKP203). A read of the global sees the set
value only within that extent: the change matters to a region only where its forward runs
inside the extent and its backward outside (CKP201 asks ``extent``).

A restore is a write of the same place after the first: an assignment (``X = old``,
``cfg.X = old``, ``TABLE[k] = old``), ``del TABLE[k]`` or ``TABLE.pop(k)`` for an item,
the inverse augmented assignment (``DEPTH += 1`` ... ``DEPTH -= 1``), and for a container
the method that takes back what was added (``STACK.append(x)`` ... ``STACK.pop()``).
Only the syntax of one function body is read.
"""

from __future__ import annotations

import ast
from bisect import bisect_left
from collections.abc import Iterator, Sequence

from ckptlint.lazy_tree import mark_read
from ckptlint.memos import process_memo
from ckptlint.resolution.bodies import children_run_here

Function = ast.FunctionDef | ast.AsyncFunctionDef

# What a later call on the same container takes back of a method's change.
_UNDOING = {
    "append": frozenset({"pop", "remove", "clear"}),
    "extend": frozenset({"pop", "remove", "clear"}),
    "insert": frozenset({"pop", "remove", "clear"}),
    "add": frozenset({"remove", "discard", "clear"}),
    "update": frozenset({"update", "clear"}),
    "setdefault": frozenset({"pop", "clear"}),
    "__setitem__": frozenset({"pop", "__delitem__", "clear"}),
}
_INVERSE = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult}
_MANAGERS = frozenset({"contextmanager", "asynccontextmanager"})


def restored(function: ast.AST, node: ast.AST) -> ast.AST | None:
    """Where the write ``node`` (an assignment statement or a mutating call) of ``function``
    is undone: the ``try`` statement whose ``finally`` restores it (the change lasts while
    it runs), ``function`` itself when it is a ``@contextmanager`` that restores it after its
    ``yield`` (the change lasts while the caller's ``with`` block runs), else None."""
    if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    return _restorations(function).get(id(node))


def is_context_manager(function: Function) -> bool:
    """A generator decorated with ``@contextmanager`` (by its last name)."""
    return any(_last_name(d) in _MANAGERS for d in function.decorator_list)


def _restorations(function: Function) -> dict[int, ast.AST]:
    """The restored writes of a function (and the writes restoring them), by node id, each
    with its extent; in time linear in the body: each write is matched once, with the
    nearest restore after it."""
    found = _CACHE.get(id(function))
    if found is not None and found[0] is function:
        mark_read(function)
        return found[1]
    nodes = _nodes_of(function.body)
    if not any(isinstance(n, ast.Try) and n.finalbody for n in nodes) and not (
        is_context_manager(function)
    ):
        _CACHE[id(function)] = (function, _NONE)
        return _NONE
    writes: dict[tuple[str, str], list[tuple[int, ast.AST]]] = {}
    for node in nodes:
        for key in dict.fromkeys(_undone_by(node)):
            writes.setdefault(key, []).append((node.lineno, node))  # type: ignore[attr-defined]
    for listed in writes.values():
        listed.sort(key=lambda item: item[0])
    manager = is_context_manager(function)
    yields = sorted(n.lineno for n in nodes if isinstance(n, (ast.Yield, ast.YieldFrom)))
    ends: list[tuple[int, tuple[ast.AST, ...], ast.AST]] = []  # a restore's line, its nodes
    for node in nodes:
        if isinstance(node, ast.Try) and node.finalbody:
            first = node.finalbody[0].lineno
            index = bisect_left(yields, node.lineno)
            keeps = manager and index < len(yields) and yields[index] < first
            ends.append((first, _nodes_of(node.finalbody), function if keeps else node))
    if manager and yields:
        after = [s for s in function.body if s.lineno > yields[0]]
        if after:
            ends.append((yields[0], _nodes_of(after), function))
    restorations: dict[int, ast.AST] = {}
    marked: dict[tuple[str, str], int] = {}  # how many of a key's writes are matched
    for first, restorers, extent in sorted(ends, key=lambda end: end[0]):
        for restorer in restorers:
            restores = False
            for key in dict.fromkeys(_undoings(restorer)):
                listed = writes.get(key, [])
                restores = restores or bool(listed) and listed[0][0] < first
                index = marked.get(key, 0)
                while index < len(listed) and listed[index][0] < first:
                    restorations.setdefault(id(listed[index][1]), extent)
                    index += 1
                marked[key] = index
            if restores:
                restorations.setdefault(id(restorer), extent)
    _CACHE[id(function)] = (function, restorations)
    return restorations


def _nodes_of(statements: list[ast.stmt]) -> tuple[ast.AST, ...]:
    """The nodes of a body, not those of nested definitions (as ``own_nodes``, but not
    kept: most bodies asked about restore nothing)."""
    nodes: list[ast.AST] = []
    stack: list[ast.AST] = list(reversed(statements))
    while stack:
        node = stack.pop()
        nodes.append(node)
        stack.extend(reversed(children_run_here(node)))
    return tuple(nodes)


def _undone_by(node: ast.AST) -> Iterator[tuple[str, str]]:
    """What would undo the write ``node`` makes: ``("assign", place)`` (assigning the place
    again), ``("aug", place, op)``, ``("call", container, method)``."""
    if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in _flattened(targets):
            yield ("assign", ast.dump(target))
            if isinstance(target, ast.Subscript):  # an item added, taken out again
                yield ("drop", _item(target.value, target.slice))
    elif isinstance(node, ast.AugAssign):
        place = ast.dump(node.target)
        yield ("assign", place)
        inverse = _INVERSE.get(type(node.op))
        if inverse is not None:
            yield ("aug", f"{place} {inverse.__name__}")
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in _UNDOING
    ):
        container = ast.dump(node.func.value)
        for undoing in _UNDOING[node.func.attr]:
            yield ("call", f"{container}.{undoing}")
        yield ("assign", container)


def _undoings(node: ast.AST) -> Iterator[tuple[str, str]]:
    """What a statement or call of a ``finally`` (or after a ``yield``) restores."""
    if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in _flattened(targets):
            yield ("assign", ast.dump(target))
    elif isinstance(node, ast.AugAssign):
        yield ("aug", f"{ast.dump(node.target)} {type(node.op).__name__}")
    elif isinstance(node, ast.Delete):
        for target in node.targets:
            if isinstance(target, ast.Subscript):
                yield ("drop", _item(target.value, target.slice))
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        container = ast.dump(node.func.value)
        yield ("call", f"{container}.{node.func.attr}")
        if node.func.attr == "pop" and node.args:
            yield ("drop", _item(node.func.value, node.args[0]))


def _item(container: ast.expr, key: ast.expr) -> str:
    return f"{ast.dump(container)}[{ast.dump(key)}]"


def _flattened(targets: Sequence[ast.expr]) -> Iterator[ast.expr]:
    stack: list[ast.expr] = list(reversed(targets))
    while stack:
        target = stack.pop()
        if isinstance(target, (ast.Tuple, ast.List)):
            stack.extend(reversed(target.elts))
        elif isinstance(target, ast.Starred):
            stack.append(target.value)
        else:
            yield target


def _last_name(expression: ast.expr) -> str:
    if isinstance(expression, ast.Call):
        expression = expression.func
    if isinstance(expression, ast.Attribute):
        return expression.attr
    return expression.id if isinstance(expression, ast.Name) else ""


# function id -> (the function, its restored writes by node id, each with its extent)
_CACHE: dict[int, tuple[Function, dict[int, ast.AST]]] = process_memo()
_NONE: dict[int, ast.AST] = {}  # what a function without a finally or a yield restores
