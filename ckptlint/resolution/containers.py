"""The evaluator's containers, mappings and subscripts: what a container holds.

A literal holds its elements (``*xs`` spread); torch's containers (``nn.ModuleList``,
``nn.Sequential``, ``nn.ModuleDict``) and mappings (``dict(...)``, ``OrderedDict(...)``, dict
literals and comprehensions) hold what they were made with, and a container also holds what
is added later through the name it was made for (``.append(x)``, ``[key] = x``, ``+= xs``;
see ``added_to``). A subscript or a key read (``m.get("k", d)``) with a constant key gives
the value under that key where ``mappings`` can tell it; ``children()`` of a project module
yields the modules its classes assign to ``self``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING

from ckptlint.project.scopes import Binding
from ckptlint.resolution.bodies import DEFINITIONS, line_span, statements_on_line
from ckptlint.resolution.mappings import Unknown, flows_of, held, may_lack
from ckptlint.resolution.values import (
    UNKNOWN,
    CallKeywords,
    ClassValue,
    Constant,
    Context,
    Elements,
    External,
    Instance,
    Mapping,
    Method,
    Row,
    Sequence,
    Value,
    Values,
    known,
    unique,
)
from ckptlint.torch_catalogue import MAPPING_CONTAINERS, SEQUENTIAL_CONTAINERS

if TYPE_CHECKING:
    from ckptlint.resolution.evaluator import Evaluator

_UNKNOWN: Values = (UNKNOWN,)
# What reads a mapping's key (see ``mappings``): their values come from what it holds there.
KEY_READS = frozenset({"get", "pop", "setdefault"})
_ADDING_METHODS = {"append": False, "extend": True, "insert": False, "add_module": False}


class Containers:
    """The evaluator's part that looks into containers (see the module docstring)."""

    def __init__(self, evaluator: Evaluator) -> None:
        self.evaluator = evaluator

    def elements(self, value: Value) -> Values:
        """What iterating over ``value`` yields."""
        if isinstance(value, Elements):
            return value.of
        if isinstance(value, Sequence):
            return self._sequence_elements(value)
        if isinstance(value, Mapping):
            return (UNKNOWN,)  # keys
        if isinstance(value, Instance) and isinstance(value.cls, External):
            if value.cls.name in SEQUENTIAL_CONTAINERS:
                return self.container_values(value)
            return (UNKNOWN,)
        return (UNKNOWN,)

    def item(self, value: Value, index: int) -> Values:
        """Element ``index`` of a tuple value (a row of ``enumerate``/``zip``, a literal)."""
        if isinstance(value, Row):
            return value.items[index] if index < len(value.items) else (UNKNOWN,)
        if isinstance(value, Sequence) and isinstance(value.node, ast.Tuple):
            return self._indexed(value, index)
        return (UNKNOWN,)

    def subscript(self, node: ast.Subscript, context: Context) -> Iterator[Value]:
        evaluate = self.evaluator.evaluate
        containers = evaluate(node.value, context)
        index = node.slice
        key: Value = UNKNOWN
        if isinstance(index, ast.Constant):
            key = Constant(index.value)
        if isinstance(index, ast.Slice):  # a slice of a container holds the same kind
            yield from containers
            return
        if isinstance(key, Constant) and isinstance(key.value, str):
            if any(isinstance(c, (CallKeywords, Mapping)) for c in containers):
                state = held(self.evaluator, node.value, context, key.value)
                if not may_lack(state, key.value):  # else a registry filled elsewhere
                    for flow in flows_of(state, key.value):
                        yield from evaluate(*flow)
                    return
        for container in containers:
            if isinstance(container, Mapping) or (
                isinstance(container, Instance)
                and isinstance(container.cls, External)
                and container.cls.name in MAPPING_CONTAINERS
            ):
                yield from self.mapping_item(container, key)
            elif isinstance(container, Sequence) and isinstance(key, Constant):
                yield from self._indexed(container, key.value)
            else:
                yield from self.elements(container)

    def key_read(self, call: ast.Call, context: Context) -> Values:
        """``m.get("k", d)``, ``m.pop("k", d)``, ``m.setdefault("k", d)`` of a mapping: what
        it holds under ``k`` there (see ``mappings``), or ``d`` where it may lack it."""
        func = call.func
        key = call.args[0] if call.args else None
        if not isinstance(func, ast.Attribute) or not isinstance(key, ast.Constant):
            return _UNKNOWN
        if not isinstance(key.value, str):
            return _UNKNOWN
        evaluate = self.evaluator.evaluate
        state = held(self.evaluator, func.value, context, key.value)
        results = [v for flow in flows_of(state, key.value) for v in evaluate(*flow)]
        if may_lack(state, key.value):
            results.extend(evaluate(call.args[1], context) if len(call.args) > 1 else ())
            if func.attr == "get" and len(call.args) == 1:
                results.append(Constant(None))
        if any(isinstance(item, Unknown) for item in state):
            results.append(UNKNOWN)
        return unique(results) or _UNKNOWN

    def method_call(self, method: Method) -> Iterator[Value]:
        """``values()``, ``items()``, ``children()``... of a container or a module."""
        receiver, name = method.receiver, method.name
        if name in ("values", "children", "modules"):
            yield Elements(self.container_values(receiver))
        elif name in ("items", "named_children", "named_modules"):
            yield Elements((Row(((UNKNOWN,), self.container_values(receiver))),))
        else:
            yield UNKNOWN

    def added_to(self, origin: Binding, context: Context) -> Values:
        """Values added to a container through the name it was made for: ``.append(x)``,
        ``.extend(xs)``, ``.insert(i, x)``, ``.add_module(n, x)``, ``[key] = x``, ``+= xs``,
        in the function that made it (or, for ``self.<name>``, in its class's methods)."""
        evaluator = self.evaluator
        module = context.module
        owner = origin.scope if origin.scope.kind == "function" else None
        is_attribute = isinstance(origin.node, ast.Attribute)
        span = line_span(owner.node if owner is not None and not is_attribute else None)
        if is_attribute:
            cls = origin.scope.enclosing_class
            span = line_span(cls.node if cls is not None else None)
        results: list[Value] = []
        for line in module.lines_naming(origin.name, within=span):
            for statement, scope in statements_on_line(module, line):
                for expression in _added_expressions(statement, origin, is_attribute):
                    here = Context(module, scope, context.env if scope is owner else ())
                    added, spread = expression
                    values = evaluator.evaluate(added, here)
                    results.extend(evaluator.iterate(values) if spread else values)
        return unique(results)

    def _sequence_elements(self, sequence: Sequence) -> Values:
        values = self._literal_elements(sequence)
        if sequence.origin is None:
            return values
        return unique((*values, *self.added_to(sequence.origin, sequence.context)))

    def _literal_elements(self, sequence: Sequence) -> Values:
        evaluator = self.evaluator
        node, context = sequence.node, sequence.context
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            results: list[Value] = []
            for element in node.elts:
                if isinstance(element, ast.Starred):
                    results.extend(evaluator.iterate(evaluator.evaluate(element.value, context)))
                else:
                    results.extend(evaluator.evaluate(element, context))
            return unique(results) or (UNKNOWN,)
        scope = context.module.scopes.function_scope(node) or context.module.scopes.build_nested(
            node, context.scope
        )
        return evaluator.evaluate(node.elt, context.at(scope))

    def container_values(self, value: Value) -> Values:
        """The modules (or values) a torch container or a mapping holds, also those added
        later through the name it was made for."""
        values = self._constructed_values(value)
        origin = getattr(value, "origin", None)
        context = getattr(value, "context", None)
        if origin is None or context is None:
            return values
        return unique((*known(values), *self.added_to(origin, context))) or (UNKNOWN,)

    def _constructed_values(self, value: Value) -> Values:
        evaluator = self.evaluator
        if isinstance(value, Instance) and isinstance(value.cls, ClassValue):
            return self._submodules(value)
        if isinstance(value, Mapping):
            return self._mapping_values(value.node, value.context)
        if not isinstance(value, Instance) or value.call is None or value.context is None:
            return (UNKNOWN,)
        name = value.cls.name if isinstance(value.cls, External) else ""
        arguments, keywords = call_arguments(value.call)
        context = value.context
        if name in MAPPING_CONTAINERS:
            if not arguments:
                return unique(v for k in keywords.values() for v in evaluator.evaluate(k, context))
            return unique(
                v
                for mapping in evaluator.evaluate(arguments[0], context)
                for v in (
                    self._mapping_values(mapping.node, mapping.context)
                    if isinstance(mapping, Mapping)
                    else (UNKNOWN,)
                )
            )
        if name == "torch.nn.ModuleList":
            if not arguments:
                return (UNKNOWN,)
            return evaluator.iterate(evaluator.evaluate(arguments[0], context))
        if name == "torch.nn.Sequential":
            results: list[Value] = []
            for argument in arguments:
                if isinstance(argument, ast.Starred):
                    results.extend(evaluator.iterate(evaluator.evaluate(argument.value, context)))
                    continue
                for value_of in evaluator.evaluate(argument, context):
                    if isinstance(value_of, Mapping):  # Sequential(OrderedDict(...))
                        results.extend(self._mapping_values(value_of.node, value_of.context))
                    else:
                        results.append(value_of)
            return unique(results) or (UNKNOWN,)
        return (UNKNOWN,)

    def _submodules(self, instance: Instance) -> Values:
        """What ``children()`` of a project module yields: the modules its classes assign to
        ``self`` (any attribute that evaluates to a module instance)."""
        evaluator = self.evaluator
        cls = instance.cls
        if not isinstance(cls, ClassValue):
            return (UNKNOWN,)
        found: list[Value] = []
        for owner in evaluator.mro(cls):
            if not isinstance(owner, ClassValue):
                break
            scope = evaluator.scope_of(owner)
            evaluator.instance_assignments(owner, "")  # every method scoped
            for bindings in scope.instance_attributes.values():
                for binding in bindings:
                    values = evaluator.members.assigned(binding, owner, instance)
                    found.extend(v for v in values if isinstance(v, Instance))
        return unique(found) or (UNKNOWN,)

    def _mapping_values(self, node: ast.AST, context: Context) -> Values:
        evaluator = self.evaluator
        if isinstance(node, ast.Dict):
            return unique(v for value in node.values for v in evaluator.evaluate(value, context))
        if isinstance(node, ast.DictComp):
            scope = context.module.scopes.function_scope(
                node
            ) or context.module.scopes.build_nested(node, context.scope)
            return evaluator.evaluate(node.value, context.at(scope))
        if isinstance(node, ast.Call):
            arguments, keywords = call_arguments(node)
            results = [v for value in keywords.values() for v in evaluator.evaluate(value, context)]
            for argument in arguments:
                for pair in evaluator.iterate(evaluator.evaluate(argument, context)):
                    results.extend(self.item(pair, 1))
            return unique(results) or (UNKNOWN,)
        return (UNKNOWN,)

    def mapping_item(self, value: Value, key: Value) -> Values:
        """``mapping[key]`` or ``module_dict.key``: the value under a constant key, else any."""
        evaluate = self.evaluator.evaluate
        if isinstance(value, Mapping):
            node, context = value.node, value.context
        elif isinstance(value, Instance) and value.call is not None and value.context is not None:
            arguments, keywords = call_arguments(value.call)
            if not arguments:
                if isinstance(key, Constant) and key.value in keywords:
                    return evaluate(keywords[key.value], value.context)
                return self.container_values(value)
            mappings = evaluate(arguments[0], value.context)
            return unique(v for m in mappings for v in self.mapping_item(m, key)) or (UNKNOWN,)
        else:
            return (UNKNOWN,)
        if isinstance(key, Constant):
            if isinstance(node, ast.Dict):
                for item_key, item_value in zip(node.keys, node.values, strict=True):
                    if isinstance(item_key, ast.Constant) and item_key.value == key.value:
                        return evaluate(item_value, context)
            elif isinstance(node, ast.Call):
                _, keywords = call_arguments(node)
                if key.value in keywords:
                    return evaluate(keywords[key.value], context)
        return self._mapping_values(node, context)

    def _indexed(self, sequence: Sequence, index: object) -> Values:
        node = sequence.node
        if isinstance(node, (ast.List, ast.Tuple)) and isinstance(index, int):
            if not any(isinstance(e, ast.Starred) for e in node.elts) and -len(
                node.elts
            ) <= index < len(node.elts):
                return self.evaluator.evaluate(node.elts[index], sequence.context)
        return self.elements(sequence)


def made_for(values: Values, binding: Binding) -> Values:
    """Containers made by ``binding``'s own value remember the name they were made for."""
    node = binding.value
    return tuple(
        replace(value, origin=binding)
        if (isinstance(value, (Sequence, Mapping)) and value.node is node)
        or (isinstance(value, Instance) and value.call is node and isinstance(value.cls, External))
        else value
        for value in values
    )


def call_arguments(call: ast.Call) -> tuple[list[ast.expr], dict[str, ast.expr]]:
    """A call's positional arguments, and its keywords by name (``**`` left out)."""
    return list(call.args), {k.arg: k.value for k in call.keywords if k.arg is not None}


def _added_expressions(
    statement: ast.stmt, origin: Binding, is_attribute: bool
) -> Iterator[tuple[ast.expr, bool]]:
    """Expressions a statement adds to the container named by ``origin`` (and whether they
    are spread: ``extend``, ``+=``)."""

    def names_origin(target: ast.expr) -> bool:
        if is_attribute:
            return isinstance(target, ast.Attribute) and target.attr == origin.name
        return isinstance(target, ast.Name) and target.id == origin.name

    for node in ast.walk(statement) if not isinstance(statement, DEFINITIONS) else ():
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _ADDING_METHODS
            and names_origin(node.func.value)
            and node.args
        ):
            yield node.args[-1], _ADDING_METHODS[node.func.attr]
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Subscript) and names_origin(target.value):
                    yield node.value, False
        elif isinstance(node, ast.AugAssign) and names_origin(node.target):
            yield node.value, True
