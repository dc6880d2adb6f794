"""Selective-checkpoint policies: the functions torch calls once per op of a region.

``create_selective_checkpoint_contexts(policy)`` (usually behind
``context_fn=functools.partial(create_selective_checkpoint_contexts, policy)``) makes torch
call ``policy(ctx, op, *args, **kwargs)`` for every op the region runs, with ``op`` an
``OpOverload`` (``aten.mm.default``) and ``ctx`` a ``SelectiveCheckpointContext``. A
module's policies are the functions it hands to that call (directly, through a partial, as
what a factory returns, or an instance whose ``__call__`` is one) and the functions it
defines that return a ``CheckpointPolicy``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, replace

from ckptlint.project.index import Module
from ckptlint.project.scopes import FUNCTIONS, statements_at
from ckptlint.regions.calls import calls_at
from ckptlint.resolution.bodies import own_nodes
from ckptlint.resolution.calls import PARTIAL
from ckptlint.resolution.evaluator import Evaluator
from ckptlint.resolution.values import (
    ClassValue,
    Context,
    External,
    FunctionValue,
    Instance,
    PartialValue,
    Value,
)

CREATE_CONTEXTS = "torch.utils.checkpoint.create_selective_checkpoint_contexts"
CHECKPOINT_POLICY = "torch.utils.checkpoint.CheckpointPolicy"


@dataclass(frozen=True)
class Policy:
    """A policy function (bound to its closure when a factory made it), and its ``ctx``
    and ``op`` parameters. ``handed_at`` is the call of this module that hands over a
    policy defined in another one, which that module cannot tell is a policy (it returns
    no ``CheckpointPolicy``): findings about it belong at that call."""

    function: FunctionValue
    context: ast.arg
    op: ast.arg
    handed_at: ast.Call | None = None

    def named(self) -> str:
        """How messages name it: with its name and file when reported at ``handed_at``."""
        if self.handed_at is None:
            return "the selective-checkpoint policy"
        node = self.function.node
        name = "lambda" if isinstance(node, ast.Lambda) else f"`{node.name}()`"
        place = self.function.module.cite(node.lineno)
        return f"the selective-checkpoint policy {name} ({place})"

    def report_at(self, node: ast.AST) -> ast.AST:
        """Where a finding about ``node`` of the policy goes in the module reporting it."""
        return node if self.handed_at is None else self.handed_at

    def line_of(self, node: ast.AST) -> str:
        """`` (line 12)`` of a node of the policy, ``(policies.py:12)`` when foreign."""
        if self.handed_at is None:
            return ""
        return f" ({self.function.module.cite(node.lineno)})"  # type: ignore[attr-defined]

    @property
    def body(self) -> list[ast.AST]:
        body = self.function.node.body
        return [body] if isinstance(body, ast.expr) else list(body)


def policies(evaluator: Evaluator, module: Module) -> list[Policy]:
    """The policies ``module`` is to report about, each once, in source order: those it
    defines, and those it hands to torch from modules that cannot tell they are policies."""
    found: dict[int, Policy] = {}
    for call, value in _handed_to_torch(evaluator, module):
        policy = _as_policy(evaluator, value)
        if policy is None:
            continue
        if policy.function.module is not module:
            if _returns_policy_member(evaluator, policy.function):
                continue  # its own module reports it
            policy = replace(policy, handed_at=call)
        found.setdefault(id(policy.function.node), policy)
    for function in _returning_a_policy(evaluator, module):
        policy = _as_policy(evaluator, function)
        if policy is not None:
            found.setdefault(id(policy.function.node), policy)
    return sorted(found.values(), key=_position)


def _position(policy: Policy) -> tuple[int, int]:
    node = policy.handed_at or policy.function.node
    return node.lineno, node.col_offset


def _handed_to_torch(evaluator: Evaluator, module: Module) -> Iterator[tuple[ast.Call, Value]]:
    """What the module passes as the policy of ``create_selective_checkpoint_contexts``,
    with the call passing it."""
    for line in module.lines_naming(CREATE_CONTEXTS.rsplit(".", 1)[1]):
        for call, context in calls_at(evaluator, module, line):
            callee = evaluator.evaluate(call.func, context)
            names = {v.name for v in callee if isinstance(v, External)}
            arguments = call.args
            if PARTIAL in names and arguments:
                inner = evaluator.evaluate(arguments[0], context)
                if any(isinstance(v, External) and v.name == CREATE_CONTEXTS for v in inner):
                    arguments = arguments[1:]
                else:
                    continue
            elif CREATE_CONTEXTS not in names:
                continue
            if arguments and not isinstance(arguments[0], ast.Starred):
                for value in evaluator.evaluate(arguments[0], context):
                    yield call, value


def _returning_a_policy(evaluator: Evaluator, module: Module) -> Iterator[FunctionValue]:
    """Functions of the module with a ``return CheckpointPolicy.<member>`` of their own."""
    seen: set[int] = set()
    for line in module.lines_naming(CHECKPOINT_POLICY.rsplit(".", 1)[1]):
        path = statements_at(module.tree.body, line)
        functions = [s for s in path if isinstance(s, FUNCTIONS)]
        if not functions or id(functions[-1]) in seen:
            continue
        node = functions[-1]
        seen.add(id(node))
        parent = module.scopes.module
        for statement in path:
            if statement is node:
                break
            if isinstance(statement, (*FUNCTIONS, ast.ClassDef)):
                parent = module.scopes.function_scope(statement) or parent
        function = FunctionValue(node, Context(module, parent))
        if _returns_policy_member(evaluator, function):
            yield function


def _returns_policy_member(evaluator: Evaluator, function: FunctionValue) -> bool:
    context = evaluator.bind(function, None)
    for node in own_nodes(function.node.body):
        if isinstance(node, ast.Return) and node.value is not None:
            for value in evaluator.evaluate(node.value, context):
                if isinstance(value, External) and value.name.startswith(CHECKPOINT_POLICY + "."):
                    return True
    return False


def _as_policy(evaluator: Evaluator, value: Value) -> Policy | None:
    """The function torch calls for ``value``, with its ``ctx`` and ``op`` parameters."""
    if isinstance(value, PartialValue):
        if value.call.args[1:]:
            return None  # positional arguments bound ahead: the parameters shift
        inner = [v for v in value.inner if isinstance(v, (FunctionValue, Instance))]
        return _as_policy(evaluator, inner[0]) if len(inner) == 1 else None
    if isinstance(value, Instance) and isinstance(value.cls, ClassValue):
        calls = [v for v in evaluator.member((value,), "__call__") if isinstance(v, FunctionValue)]
        return _as_policy(evaluator, calls[0]) if len(calls) == 1 else None
    if not isinstance(value, FunctionValue):
        return None
    node = value.node
    positional = [*node.args.posonlyargs, *node.args.args]
    if value.bound is not None or _is_method(value):
        positional = positional[1:]
    if len(positional) < 2:
        return None
    return Policy(value, positional[0], positional[1])


def _is_method(function: FunctionValue) -> bool:
    node = function.node
    if function.context.scope.kind != "class" or isinstance(node, ast.Lambda):
        return False
    return not any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in node.decorator_list)
