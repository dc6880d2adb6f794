"""The evaluator's tests of the torch version: which versions a branch runs on.

``versions_at`` intersects the targeted torch with the tests of the ``if`` statements and
``x if test else y`` around a node; ``test_versions`` evaluates one test (``and``, ``or``,
``not``, comparisons of ``torch.__version__``, ``is_torch_version(...)``) into the ranges of
``versions`` on which it may be true and may be false; ``live`` keeps the bindings made in
code that runs on the targeted torch.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from typing import TYPE_CHECKING

from packaging.version import Version

from ckptlint.project.index import Module
from ckptlint.project.scopes import FUNCTIONS, Binding, node_position, statements_at
from ckptlint.resolution.bodies import DEFINITIONS
from ckptlint.resolution.values import (
    UNKNOWN,
    Constant,
    Context,
    External,
    Sequence,
    TorchVersionTest,
    Value,
    Values,
)
from ckptlint.resolution.versions import (
    EVERY_VERSION,
    NO_VERSION,
    TORCH_VERSION,
    VersionRange,
    at_least,
    names_torch_version,
    parse_version,
)

if TYPE_CHECKING:
    from ckptlint.resolution.evaluator import Evaluator


class VersionTests:
    """The evaluator's part that decides branches by the torch version (see the module
    docstring); ``evaluator.target_torch`` is the oldest torch the project runs on."""

    def __init__(self, evaluator: Evaluator) -> None:
        self.evaluator = evaluator
        self.targeted = at_least(evaluator.target_torch)

    def versions_at(self, module: Module, node: ast.AST) -> VersionRange:
        """The torch versions ``node`` runs on: the targeted ones, as far as the ``if`` and
        ``x if test else y`` around it that test the torch version allow."""
        versions = self.targeted
        if not module.tests_versions:
            return versions
        line = node.lineno  # type: ignore[attr-defined]
        scope = module.scopes.module
        innermost: ast.stmt | None = None
        for statement in statements_at(module.tree.body, line):
            if isinstance(statement, ast.If) and statement is not node:
                taken = _branch_taken(statement.body, statement.orelse, line)
                if taken is not None:
                    true, false = self.test_versions(statement.test, Context(module, scope))
                    versions = versions.intersect(true if taken else false)
            if isinstance(statement, (*FUNCTIONS, ast.ClassDef)) and statement is not node:
                scope = module.scopes.function_scope(statement) or scope
            innermost = statement
        if innermost is not None and innermost is not node:
            for branch in _branches_around(innermost, node):
                test, taken = branch
                true, false = self.test_versions(test, Context(module, scope))
                versions = versions.intersect(true if taken else false)
        return versions

    def test_versions(self, test: ast.expr, context: Context) -> tuple[VersionRange, VersionRange]:
        """The torch versions on which ``test`` may be true, and those on which it may be
        false (every version for a test that does not look at the torch version)."""
        return self.evaluator.ask(
            ("versions", test, context),
            self._test_versions,
            test,
            context,
            fallback=(EVERY_VERSION, EVERY_VERSION),
        )

    def _test_versions(self, test: ast.expr, context: Context) -> tuple[VersionRange, VersionRange]:
        found = None
        if isinstance(test, ast.BoolOp):
            parts = [self.test_versions(value, context) for value in test.values]
            true, false = parts[0]
            for part_true, part_false in parts[1:]:
                if isinstance(test.op, ast.And):
                    true, false = true.intersect(part_true), false.union(part_false)
                else:
                    true, false = true.union(part_true), false.intersect(part_false)
            found = (true, false)
        elif isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            found = self.test_versions(test.operand, context)[::-1]
        elif _mentions_a_version(test):
            values = self.evaluator.evaluate(test, context)
            if all(isinstance(value, TorchVersionTest) for value in values):
                true, false = NO_VERSION, NO_VERSION
                for value in values:
                    true = true.union(value.versions)  # type: ignore[union-attr]
                    false = false.union(value.versions.complement())  # type: ignore[union-attr]
                found = (true, false)
        return found or (EVERY_VERSION, EVERY_VERSION)

    def live(self, bindings: list[Binding], module: Module) -> list[Binding]:
        """Bindings made in code that runs on the targeted torch (all, with no target)."""
        if self.evaluator.target_torch is None or not module.tests_versions:
            return bindings
        return [b for b in bindings if not self.versions_at(module, b.node).empty]

    def comparison(self, node: ast.Compare, context: Context) -> Value:
        """``torch.__version__ >= "1.11"`` (torch's version compares as a version, also
        with a tuple) or ``version.parse(torch.__version__) < version.parse("2.0")``."""
        operator = _COMPARISONS.get(type(node.ops[0]))
        if operator is None or not _mentions_a_version(node):
            return UNKNOWN
        evaluate = self.evaluator.evaluate
        left = evaluate(node.left, context)
        right = evaluate(node.comparators[0], context)
        if not _is_torch_version(left):
            left, right, operator = right, left, _MIRRORED[operator]
        version = _version_literal(right) if _is_torch_version(left) else None
        if version is None:
            return UNKNOWN
        return TorchVersionTest(VersionRange.compared(operator, version))

    def parsed(self, values: Values) -> Iterator[Value]:
        """``version.parse(x)``: torch's version stays torch's, a literal becomes a version."""
        for value in values:
            if _is_torch_version((value,)):
                yield External(TORCH_VERSION)
            elif isinstance(value, Constant) and parse_version(value.value) is not None:
                yield Constant(parse_version(value.value))
            else:
                yield UNKNOWN


def constant_value(node: ast.expr | None) -> object:
    """The value of a literal (None for anything else): the arguments of version tests."""
    return node.value if isinstance(node, ast.Constant) else None


def _branch_taken(body: list[ast.stmt], orelse: list[ast.stmt], line: int) -> bool | None:
    """True when ``line`` lies in ``body``, False in ``orelse``, None in neither (the test)."""
    for statements, taken in ((body, True), (orelse, False)):
        if statements and statements[0].lineno <= line <= _last_line(statements):
            return taken
    return None


def _last_line(statements: list[ast.stmt]) -> int:
    return statements[-1].end_lineno or statements[-1].lineno


def _branches_around(statement: ast.stmt, node: ast.AST) -> Iterator[tuple[ast.expr, bool]]:
    """The ``x if test else y`` of a statement's own expressions that hold ``node``: each
    test, and whether ``node`` is on its true side."""
    start = node_position(node)
    for candidate in ast.walk(statement) if not isinstance(statement, DEFINITIONS) else ():
        if isinstance(candidate, ast.IfExp):
            for side, taken in ((candidate.body, True), (candidate.orelse, False)):
                end = (side.end_lineno or side.lineno, side.end_col_offset or 0)
                if node_position(side) <= start and start < end:
                    yield candidate.test, taken


def _mentions_a_version(test: ast.expr) -> bool:
    """Only tests naming a version are evaluated (``is_torch_version``, ``__version__``,
    ``is_torch_greater_or_equal_than_1_13``): others cannot decide a torch version."""
    for node in ast.walk(test):
        name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
        if isinstance(name, str) and ("version" in name or name.startswith("is_torch_")):
            return True
    return False


_COMPARISONS: dict[type, str] = {
    ast.GtE: ">=",
    ast.Gt: ">",
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Eq: "==",
    ast.NotEq: "!=",
}
_MIRRORED = {">=": "<=", ">": "<", "<": ">", "<=": ">=", "==": "==", "!=": "!="}


def _is_torch_version(values: Values) -> bool:
    return bool(values) and all(
        isinstance(v, External) and names_torch_version(v.name) for v in values
    )


def _version_literal(values: Values) -> Version | None:
    """The one version ``values`` spell: ``"1.11"``, ``version.parse("1.11")``, ``(1, 11)``."""
    if len(values) != 1:
        return None
    value = values[0]
    if isinstance(value, Constant):
        return value.value if isinstance(value.value, Version) else parse_version(value.value)
    if isinstance(value, Sequence) and isinstance(value.node, ast.Tuple):
        return parse_version(tuple(constant_value(e) for e in value.node.elts))
    return None
