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
from dataclasses import dataclass

from ckptlint.project.index import Module
from ckptlint.project.scopes import FUNCTIONS, statements_at
from ckptlint.regions.calls import calls_at
from ckptlint.resolution.evaluator import PARTIAL, Evaluator, own_nodes
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
    and ``op`` parameters."""

    function: FunctionValue
    context: ast.arg
    op: ast.arg

    @property
    def body(self) -> list[ast.AST]:
        body = self.function.node.body
        return [body] if isinstance(body, ast.expr) else list(body)


def policies(evaluator: Evaluator, module: Module) -> list[Policy]:
    """The policies defined in ``module``, each once, in source order."""
    found: dict[int, Policy] = {}
    for value in _handed_to_torch(evaluator, module):
        policy = _as_policy(evaluator, value)
        if policy is not None and policy.function.module is module:
            found.setdefault(id(policy.function.node), policy)
    for function in _returning_a_policy(evaluator, module):
        policy = _as_policy(evaluator, function)
        if policy is not None:
            found.setdefault(id(policy.function.node), policy)
    return sorted(
        found.values(), key=lambda p: (p.function.node.lineno, p.function.node.col_offset)
    )


def _handed_to_torch(evaluator: Evaluator, module: Module) -> Iterator[Value]:
    """What the module passes as the policy of ``create_selective_checkpoint_contexts``."""
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
                yield from evaluator.evaluate(arguments[0], context)


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
    for node in own_nodes(function.node.body):  # type: ignore[arg-type]
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
