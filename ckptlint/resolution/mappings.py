"""What a mapping holds under a key: ``**kwargs`` as real code edits it before handing it on.

One model for every rule that asks what ``**mapping`` carries (``use_reentrant``,
``preserve_rng_state``, ``context_fn``) and for the evaluator's ``kwargs.get("k", d)``:

- a ``**kwargs`` parameter holds what its caller passes (``Passed``: the caller's keyword
  when it gives one, else what the function put there itself);
- a dict literal holds its entries, later ones winning, ``{**a, "k": v}`` and
  ``{"k": v, **a}`` alike; ``dict(a, k=v)`` likewise;
- edits between where the name is bound and where it is used apply in source order:
  ``m["k"] = v``, ``m.setdefault("k", v)``, ``m.update(k=v)`` / ``m.update({...})`` /
  ``m |= {...}``, ``m.pop("k", ...)``, ``del m["k"]``, ``m.clear()``; an edit under a
  branch or loop that does not hold the use may or may not have run (both are kept);
- anything else is ``Unknown``: it may hold the key.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ckptlint.project.scopes import (
    FUNCTIONS,
    Binding,
    nested_bodies,
    node_position,
    statements_at,
)
from ckptlint.resolution.values import (
    CallKeywords,
    Context,
    Flow,
    Instance,
    Mapping,
    Value,
)

if TYPE_CHECKING:
    from ckptlint.resolution.evaluator import Evaluator

# Mappings nest (``{**a}`` where ``a = {**b}``...): followed this deep, then Unknown.
_MAX_NESTING = 8


@dataclass(frozen=True)
class Given:
    """The key holds what ``flow`` evaluates to."""

    flow: Flow


@dataclass(frozen=True)
class Absent:
    """The key is not there."""


@dataclass(frozen=True)
class Passed:
    """The key as the call of ``owner`` passes it, in ``keywords`` (``owner``'s ``**kwargs``
    parameter holds them); where the call does not pass it, ``otherwise``."""

    keywords: CallKeywords
    owner: ast.AST
    otherwise: tuple[Held, ...]


@dataclass(frozen=True)
class Unknown:
    """Anything, the key included."""


Held = Given | Absent | Passed | Unknown
ABSENT: tuple[Held, ...] = (Absent(),)
UNKNOWN_HELD: tuple[Held, ...] = (Unknown(),)


def held(
    evaluator: Evaluator, expression: ast.expr, context: Context, key: str
) -> tuple[Held, ...]:
    """What the mapping ``expression`` (evaluated in ``context``) may hold under ``key``
    where it is written: each possibility once, in source order."""
    return _held(evaluator, expression, context, key, 0)


def _held(
    evaluator: Evaluator, expression: ast.expr, context: Context, key: str, depth: int
) -> tuple[Held, ...]:
    if depth > _MAX_NESTING:
        return UNKNOWN_HELD
    if isinstance(expression, ast.Dict):
        return _dict_literal(evaluator, expression, context, key, depth)
    if isinstance(expression, ast.Name):
        bindings = context.scope.lookup(expression.id, node_position(expression))
        if bindings:
            found: list[Held] = []
            for binding in bindings:
                state = _bound(evaluator, binding, context, key, depth)
                found.extend(_edited(evaluator, binding, expression, context, key, state, depth))
            return _unique(found)
    return _values_held(evaluator, evaluator.evaluate(expression, context), key, depth)


def _values_held(
    evaluator: Evaluator,
    values: tuple[Value, ...],
    key: str,
    depth: int,
    owner: ast.AST | None = None,
) -> tuple[Held, ...]:
    found: list[Held] = []
    for value in values:
        if isinstance(value, CallKeywords) and owner is not None:
            found.append(Passed(value, value.owner or owner, ABSENT))
        elif isinstance(value, Mapping) and isinstance(value.node, ast.Dict):
            found.extend(_dict_literal(evaluator, value.node, value.context, key, depth + 1))
        elif isinstance(value, Mapping) and isinstance(value.node, ast.Call):
            found.extend(_dict_call(evaluator, value.node, value.context, key, depth + 1))
        elif isinstance(value, Instance) and value.call is not None and _is_dict(value):
            found.extend(_dict_call(evaluator, value.call, value.context, key, depth + 1))  # type: ignore[arg-type]
        else:
            return UNKNOWN_HELD
    return _unique(found) or UNKNOWN_HELD


def _is_dict(value: Instance) -> bool:
    name = getattr(value.cls, "name", "")
    return name in ("builtins.dict", "collections.OrderedDict")


def _bound(
    evaluator: Evaluator, binding: Binding, context: Context, key: str, depth: int
) -> tuple[Held, ...]:
    """What a name holds right after ``binding``."""
    node = binding.node
    if isinstance(node, ast.arg):
        argument = context.argument(node)
        if argument is None:
            return UNKNOWN_HELD
        if argument.expression is None:
            return _values_held(evaluator, argument.values, key, depth, binding.scope.node)
        return _held(evaluator, argument.expression, argument.context, key, depth + 1)  # type: ignore[arg-type]
    if binding.value is None or binding.path or binding.iterated or binding.imported:
        return UNKNOWN_HELD
    return _held(evaluator, binding.value, context.at(binding.scope), key, depth + 1)


def _dict_literal(
    evaluator: Evaluator, node: ast.Dict, context: Context, key: str, depth: int
) -> tuple[Held, ...]:
    state: tuple[Held, ...] = ABSENT
    for item_key, item_value in zip(node.keys, node.values, strict=True):
        if item_key is None:  # ``**spread``: what it holds wins where it holds the key
            state = _over(_held(evaluator, item_value, context, key, depth + 1), state)
        elif isinstance(item_key, ast.Constant):
            if item_key.value == key:
                state = (Given((item_value, context)),)
        else:
            state = _unique((*state, Unknown()))  # a computed key may be this one
    return state


def _dict_call(
    evaluator: Evaluator, call: ast.Call, context: Context, key: str, depth: int
) -> tuple[Held, ...]:
    """``dict(mapping, k=v, **more)``: the mapping, then the keywords over it."""
    return _dict_arguments(evaluator, call.args, call.keywords, context, key, depth)


def _dict_arguments(
    evaluator: Evaluator,
    arguments: list[ast.expr],
    keywords: list[ast.keyword],
    context: Context,
    key: str,
    depth: int,
) -> tuple[Held, ...]:
    """What ``dict(*arguments, **keywords)`` (or ``m.update(...)``) puts under ``key``."""
    state: tuple[Held, ...] = ABSENT
    if arguments:
        first = arguments[0]
        if isinstance(first, ast.Starred) or len(arguments) > 1:
            return UNKNOWN_HELD
        state = _held(evaluator, first, context, key, depth + 1)
    for keyword in keywords:
        if keyword.arg is None:
            state = _over(_held(evaluator, keyword.value, context, key, depth + 1), state)
        elif keyword.arg == key:
            state = (Given((keyword.value, context)),)
    return state


def _over(new: tuple[Held, ...], old: tuple[Held, ...]) -> tuple[Held, ...]:
    """A mapping spread (or ``update``-d) over another: where ``new`` may lack the key,
    what ``old`` held stays. Also ``setdefault`` (``_over(state, value)``: where the key is
    missing, it now holds ``value``)."""
    found: list[Held] = []
    for item in new:
        if isinstance(item, Absent):
            found.extend(old)
        elif isinstance(item, Passed):
            found.append(Passed(item.keywords, item.owner, _over(item.otherwise, old)))
        else:
            found.append(item)
    return _unique(found)


def with_default(state: tuple[Held, ...], flow: Flow | None) -> tuple[Held, ...]:
    """What ``m.get(key, default)`` gives where ``m`` holds ``state``: the default (``flow``)
    where the key is missing; missing stays missing without one."""
    return state if flow is None else _over(state, (Given(flow),))


def _unique(items: list[Held] | tuple[Held, ...]) -> tuple[Held, ...]:
    return tuple(dict.fromkeys(items))


# -- edits between a binding and a use ---------------------------------------------------
def _edited(
    evaluator: Evaluator,
    binding: Binding,
    use: ast.Name,
    context: Context,
    key: str,
    state: tuple[Held, ...],
    depth: int,
) -> tuple[Held, ...]:
    """``state`` after the edits of the name made between ``binding`` and ``use`` in the
    binding's scope, in source order."""
    scope = binding.scope
    function = scope.node
    if not isinstance(function, FUNCTIONS):
        return state  # a module- or class-level mapping: edits elsewhere are not ordered
    start, end = binding.position, node_position(use)
    module = context.module
    name = use.id
    seen: set[int] = set()
    for line in module.lines_naming(name, within=(start[0], end[0])):
        path = statements_at(function.body, line)
        if not path or any(isinstance(s, (*FUNCTIONS, ast.ClassDef)) for s in path):
            continue
        statement = path[-1]
        if id(statement) in seen or node_position(statement) < start:
            continue
        seen.add(id(statement))
        if node_position(statement) >= end or _holds(statement, use):
            continue
        edit = _edit(evaluator, statement, name, context.at(scope), key, state, depth)
        if edit is None:
            continue
        conditional = any(_branches(s) and not _holds(s, use) for s in path[:-1])
        state = _unique((*state, *edit)) if conditional else edit
    return state


def _holds(statement: ast.AST, node: ast.AST) -> bool:
    start, end = (
        node_position(statement),
        (
            getattr(statement, "end_lineno", 0) or 0,
            getattr(statement, "end_col_offset", 0) or 0,
        ),
    )
    return start <= node_position(node) < end


def _branches(statement: ast.stmt) -> bool:
    return bool(nested_bodies(statement)) and not isinstance(statement, (ast.With, ast.AsyncWith))


def _edit(
    evaluator: Evaluator,
    statement: ast.stmt,
    name: str,
    context: Context,
    key: str,
    state: tuple[Held, ...],
    depth: int,
) -> tuple[Held, ...] | None:
    """``state`` after ``statement`` when it edits the mapping ``name``; None when it does
    not touch it."""
    if isinstance(statement, ast.Assign):
        for target in statement.targets:
            subscript = _subscript_of(target, name)
            if subscript is not None:
                return (
                    (Given((statement.value, context)),)
                    if subscript == key
                    else (state if isinstance(subscript, str) else _unique((*state, Unknown())))
                )
    if isinstance(statement, ast.Delete):
        for target in statement.targets:
            if _subscript_of(target, name) == key:
                return ABSENT
    if isinstance(statement, ast.AugAssign) and _is_name(statement.target, name):
        if isinstance(statement.op, ast.BitOr):
            return _over(_held(evaluator, statement.value, context, key, depth + 1), state)
    for node in ast.walk(statement):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        if not _is_name(node.func.value, name):
            continue
        method, arguments = node.func.attr, node.args
        given_key = _constant(arguments[0]) if arguments else None
        if method == "setdefault" and given_key == key and len(arguments) > 1:
            return _over(state, (Given((arguments[1], context)),))
        if method == "setdefault":
            return state
        if method == "pop" and given_key == key:
            return ABSENT
        if method == "clear":
            return ABSENT
        if method == "update":
            update = _dict_arguments(evaluator, arguments, node.keywords, context, key, depth + 1)
            return _over(update, state)
        if method in ("get", "pop", "items", "keys", "values", "copy", "__getitem__"):
            return state
        return _unique((*state, Unknown()))  # a method that may change anything
    return None


def _subscript_of(target: ast.expr, name: str) -> str | object | None:
    """For ``name[<key>]``: the key when it is a constant string, else a marker; None when
    ``target`` is not a subscript of ``name``."""
    if isinstance(target, ast.Subscript) and _is_name(target.value, name):
        key = _constant(target.slice)
        return key if isinstance(key, str) else _COMPUTED
    return None


_COMPUTED = object()


def _is_name(node: ast.expr, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _constant(node: ast.expr) -> object:
    return node.value if isinstance(node, ast.Constant) else None


def flows_of(state: tuple[Held, ...], key: str) -> list[Flow]:
    """Every expression the key may hold, what callers pass included (for rules that only
    need a value: ``preserve_rng_state=False`` passed through ``**kwargs``)."""
    found: list[Flow] = []
    for item in state:
        if isinstance(item, Given):
            found.append(item.flow)
        elif isinstance(item, Passed):
            flow = item.keywords.keyword(key)
            if flow is not None:
                found.append(flow)
            found.extend(flows_of(item.otherwise, key))
    return found


def may_lack(state: tuple[Held, ...], key: str) -> bool:
    """Whether the key may be missing (a default then applies)."""
    for item in state:
        if isinstance(item, (Absent, Unknown)):
            return True
        if isinstance(item, Passed) and item.keywords.keyword(key) is None:
            if key in item.keywords.taken or may_lack(item.otherwise, key):
                return True
    return False
