"""The evaluator's callers of private functions: every call, where all can be seen.

A private function (``_name``) is by convention used in its own module only, so its calls
can all be found there: by a text search for its name, then the statements on those lines.
Each reference is a call (with its arguments), a ``functools.partial`` of it (more may come
later), an introspection that does not call it (``inspect.signature``), or an escape (handed
on, stored): then its callers are not known. What the calls pass is what an unannotated
parameter of it may hold (``passed_by_callers``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from typing import TYPE_CHECKING, TypeGuard

from ckptlint.resolution.bodies import statements_on_line
from ckptlint.resolution.calls import PARTIAL
from ckptlint.resolution.values import (
    UNKNOWN,
    Arguments,
    Context,
    External,
    FunctionValue,
    Value,
    Values,
    known,
)

if TYPE_CHECKING:
    from ckptlint.resolution.evaluator import Evaluator

Callers = list[tuple[FunctionValue, Arguments]]


class PrivateCallers:
    """The evaluator's part that finds the calls of private functions (see the module
    docstring)."""

    def __init__(self, evaluator: Evaluator) -> None:
        self.evaluator = evaluator

    def passed_by_callers(self, function: FunctionValue, parameter: ast.arg) -> Values:
        """What the calls of a private function pass as ``parameter`` (its default where a
        call leaves it out); UNKNOWN when some call may be unseen or pass it in ``**``."""
        evaluator = self.evaluator
        callers = self.callers(function)
        if callers is None:
            return (UNKNOWN,)
        values: list[Value] = []
        for callee, arguments in callers:
            argument = evaluator.bind(callee, arguments).argument(parameter)
            if argument is None:
                return (UNKNOWN,)
            values.extend(evaluator.argument_values(argument))
        return tuple(values)

    def callers(self, function: FunctionValue) -> Callers | None:
        """The calls of a function, each with the callee as called (bound to its instance)
        and its arguments, when all can be seen: a private function (``_name``) of which
        every use in its module is a call, a ``functools.partial`` or an introspection
        (``inspect.signature``). A call that cannot bind (a keyword the function does not
        take) raises, so it passes nothing. None: a public function, or one that escapes."""
        node = function.node
        if isinstance(node, ast.Lambda) or not _is_private(node.name):
            return None
        key = ("callers", node, function.module)
        return self.evaluator.ask(key, self._find_callers, function, fallback=None)

    def _find_callers(self, function: FunctionValue) -> Callers | None:
        node = function.node
        module = function.module
        found: Callers = []
        seen: set[int] = set()
        for line in module.lines_naming(node.name):  # type: ignore[union-attr]
            for statement, scope in statements_on_line(module, line):
                context = Context(module, scope)
                parents = {
                    id(child): parent
                    for parent in _statement_nodes(statement)
                    for child in ast.iter_child_nodes(parent)
                }
                for reference in _statement_nodes(statement):
                    if id(reference) in seen or not _refers_to(reference, node.name):  # type: ignore[union-attr]
                        continue
                    seen.add(id(reference))
                    use = self._use(reference, parents.get(id(reference)), context, node)
                    if use is None:
                        return None
                    found.extend(use)
        return found

    def _use(
        self, reference: ast.expr, parent: ast.AST | None, context: Context, node: ast.AST
    ) -> Callers | None:
        """How one reference uses the function: the calls it makes ([] when it is not the
        function, or only looks at it); None when it lets the function escape."""
        evaluate = self.evaluator.evaluate
        values = evaluate(reference, context)
        ours = [v for v in values if isinstance(v, FunctionValue) and v.node is node]
        if not ours:
            return [] if known(values) == values else None
        if isinstance(parent, ast.Call) and parent.func is reference:
            arguments = Arguments.of(parent, context)
        elif isinstance(parent, ast.Call) and parent.args and parent.args[0] is reference:
            called = _names(evaluate(parent.func, context))
            if any(name in _INTROSPECTION for name in called):
                return []
            if called != [PARTIAL]:
                return None
            partial = Arguments((), {}, False, ()).then(parent, context, skip=1)
            # what the partial is called with later is not known: more may come
            arguments = Arguments((*partial.positional, None), partial.keywords, True, ())
        elif isinstance(parent, ast.Call) and any(a is reference for a in parent.args):
            called = _names(evaluate(parent.func, context))
            return [] if called and all(name in _INTROSPECTION for name in called) else None
        else:
            return None
        return [(callee, arguments) for callee in ours if _accepts(callee, arguments)]


# Functions that look at a function without calling it.
_INTROSPECTION = frozenset(
    {
        "inspect.signature",
        "inspect.getfullargspec",
        "inspect.getsource",
        "inspect.isfunction",
        "inspect.ismethod",
        "builtins.callable",
        "builtins.id",
        "builtins.isinstance",
        "builtins.repr",
    }
)


def _is_private(name: str) -> bool:
    """``_name``: by convention used in its own module only (dunder names are Python's)."""
    return name.startswith("_") and not name.endswith("__")


def _refers_to(node: ast.AST, name: str) -> TypeGuard[ast.Name | ast.Attribute]:
    return (isinstance(node, ast.Name) and node.id == name) or (
        isinstance(node, ast.Attribute) and node.attr == name
    )


def _statement_nodes(statement: ast.stmt) -> Iterator[ast.AST]:
    """A statement's own nodes, not those of the statements nested in it."""
    stack: list[ast.AST] = [statement]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, ast.stmt):
                stack.append(child)


def _accepts(function: FunctionValue, arguments: Arguments) -> bool:
    """Whether ``function`` can take ``arguments`` (a keyword it has no parameter for,
    without ``**kwargs``, or too many positionals, without ``*args``, is a TypeError)."""
    node = function.node.args
    positional = [*node.posonlyargs, *node.args]
    if function.bound is not None:
        positional = positional[1:]
    names = {p.arg for p in (*positional, *node.kwonlyargs)}
    if node.kwarg is None and any(name not in names for name in arguments.keywords):
        return False
    known_count = 0
    for flow in arguments.positional:
        if flow is None:
            break
        known_count += 1
    return node.vararg is not None or known_count <= len(positional)


def _names(values: Values) -> list[str]:
    return [v.name for v in values if isinstance(v, External)]
