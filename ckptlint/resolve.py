"""Which calls in a module are calls of torch's checkpoint functions.

A call's callee is evaluated statically through the module's imports and assignments
(``import torch.utils.checkpoint as cp``, ``ckpt = checkpoint``, ``functools.partial``...).
Anything that cannot be proven to be torch's function (a local ``def``, a parameter,
another library's ``checkpoint``, an unknown expression) evaluates to UNKNOWN and is never
reported. When branches disagree (``try``/``except`` imports), a call counts as a checkpoint
call when any branch binds torch's function.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from ckptlint.scopes import Binding, ModuleScopes, Scope, build_scopes, touches_lines
from ckptlint.source import lines_with_words

CHECKPOINT = "torch.utils.checkpoint.checkpoint"
CHECKPOINT_SEQUENTIAL = "torch.utils.checkpoint.checkpoint_sequential"
PARTIAL = "functools.partial"


class Signature(Enum):
    """How a checkpoint function takes ``use_reentrant``."""

    KEYWORD_ONLY = "keyword-only"  # checkpoint(function, *args, use_reentrant=...)
    # checkpoint_sequential(functions, segments, input, use_reentrant)
    FOURTH_POSITIONAL = "4th positional"
    UNKNOWN = "unknown"  # a user's wrapper from extend-checkpoint-functions


@dataclass(frozen=True)
class Targets:
    """The qualified names treated as checkpoint functions."""

    signatures: dict[str, Signature]

    @classmethod
    def with_extensions(cls, extra: Iterable[str] = ()) -> Targets:
        signatures = {name: Signature.UNKNOWN for name in extra}
        signatures[CHECKPOINT] = Signature.KEYWORD_ONLY
        signatures[CHECKPOINT_SEQUENTIAL] = Signature.FOURTH_POSITIONAL
        return cls(signatures)

    @property
    def words(self) -> frozenset[str]:
        """Identifiers any reference to a target must spell (the last part of its name)."""
        return frozenset(name.rsplit(".", 1)[-1] for name in self.signatures)


class _Unknown:
    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN = _Unknown()


@dataclass(frozen=True, eq=False)
class PartialValue:
    """``functools.partial(target, *args, **keywords)``; ``creation`` is the partial call."""

    creation: ast.Call
    target: str
    inner: PartialValue | None = None

    def chain(self) -> list[ast.Call]:
        """Partial calls from the innermost (closest to the target) to the outermost."""
        calls = self.inner.chain() if self.inner else []
        return [*calls, self.creation]


Value = str | PartialValue | _Unknown


@dataclass(frozen=True, eq=False)
class CheckpointCall:
    """A call that runs torch's checkpoint (directly or through a partial)."""

    node: ast.Call
    target: str
    signature: Signature
    scope: Scope
    positional: tuple[ast.expr, ...]
    keywords: dict[str, ast.expr]
    has_double_star: bool
    through_partial: PartialValue | None

    @property
    def name(self) -> str:
        return self.target.rsplit(".", 1)[-1]

    @property
    def region(self) -> ast.expr | None:
        """The expression naming what the checkpoint runs (function or sequence of them)."""
        first = self.positional[0] if self.positional else None
        if first is not None and not isinstance(first, ast.Starred):
            return first
        return self.keywords.get("function") or self.keywords.get("functions")

    def passes_use_reentrant(self) -> bool:
        """True when ``use_reentrant`` is (or may be) passed."""
        if self.has_double_star or "use_reentrant" in self.keywords:
            return True
        if self.signature is Signature.KEYWORD_ONLY:
            return False
        plain_before_star = 0
        for argument in self.positional:
            if isinstance(argument, ast.Starred):
                return True  # a *args may carry it
            plain_before_star += 1
        return self.signature is Signature.FOURTH_POSITIONAL and plain_before_star >= 4


@dataclass(frozen=True)
class Resolution:
    scopes: ModuleScopes
    calls: list[CheckpointCall]
    # Partials of a checkpoint function lacking use_reentrant that no call in the module runs.
    unconsumed_partials: list[PartialValue]


def resolve_checkpoint_calls(tree: ast.Module, lines: list[str], targets: Targets) -> Resolution:
    evaluator = _Evaluator(targets)
    scopes = _scopes_around_candidates(tree, lines, evaluator)
    calls: list[CheckpointCall] = []
    partial_creations: list[tuple[PartialValue, Scope]] = []
    consumed: set[int] = set()
    for call in scopes.calls:
        scope = scopes.scope_of(call)
        values = evaluator.values_of(call.func, scope, (call.lineno, call.col_offset))
        checkpoint_call = _as_checkpoint_call(call, scope, values, targets)
        if checkpoint_call is not None:
            calls.append(checkpoint_call)
            if checkpoint_call.through_partial is not None:
                consumed.update(id(c) for c in checkpoint_call.through_partial.chain())
            continue
        if PARTIAL in values:
            created = evaluator.partial_of(call, scope)
            if created is not None:
                partial_creations.append((created, scope))
    unconsumed = [
        partial
        for partial, scope in partial_creations
        if id(partial.creation) not in consumed
        and not _through_partial(partial, scope, targets).passes_use_reentrant()
    ]
    return Resolution(scopes, calls, unconsumed)


def _scopes_around_candidates(
    tree: ast.Module, lines: list[str], evaluator: _Evaluator
) -> ModuleScopes:
    """Scopes built only around lines that can hold a checkpoint call.

    A call of a target spells the target's own name (``cp.checkpoint(...)``) or a name
    bound to it (``ckpt = checkpoint``; ``self.run = partial(checkpoint)``). Candidate lines
    are those spelling such a name; names that statements on candidate lines bind to a
    target join the set until it stops growing.
    """
    words = set(evaluator.targets.words)
    while True:
        candidate_lines = lines_with_words(lines, sorted(words), skip_assigned=True)
        scopes = build_scopes(tree, candidate_lines)
        aliases = _aliases_of_targets(scopes, candidate_lines, evaluator) - words
        if not aliases:
            return scopes
        words |= aliases


def _aliases_of_targets(
    scopes: ModuleScopes, candidate_lines: frozenset[int], evaluator: _Evaluator
) -> set[str]:
    """Names that a statement on a candidate line binds to a target or a partial of one."""
    names: set[str] = set()
    sorted_lines = sorted(candidate_lines)
    for scope in [scopes.module, *scopes.scope_of_function.values()]:
        for bindings in (*scope.bindings.values(), *scope.instance_attributes.values()):
            for binding in bindings:
                if binding.value is None and binding.imported is None:
                    continue
                source = binding.value if binding.value is not None else binding.node
                if not touches_lines(source, sorted_lines):
                    continue
                if any(evaluator.is_target_like(v) for v in evaluator.value_of(binding)):
                    names.add(binding.name)
    return names


def _as_checkpoint_call(
    call: ast.Call, scope: Scope, values: list[Value], targets: Targets
) -> CheckpointCall | None:
    direct = next((v for v in values if isinstance(v, str) and v in targets.signatures), None)
    if direct is not None:
        return CheckpointCall(
            node=call,
            target=direct,
            signature=targets.signatures[direct],
            scope=scope,
            positional=tuple(call.args),
            keywords={k.arg: k.value for k in call.keywords if k.arg is not None},
            has_double_star=any(k.arg is None for k in call.keywords),
            through_partial=None,
        )
    partial = next((v for v in values if isinstance(v, PartialValue)), None)
    if partial is None:
        return None
    return _through_partial(partial, scope, targets, call)


def _through_partial(
    partial: PartialValue, scope: Scope, targets: Targets, call: ast.Call | None = None
) -> CheckpointCall:
    """What the target finally receives: the partials' arguments, then the call's (if any)."""
    positional: list[ast.expr] = []
    all_keywords: list[ast.keyword] = []
    for creation in partial.chain():
        positional.extend(creation.args[1:])
        all_keywords.extend(creation.keywords)
    if call is not None:
        positional.extend(call.args)
        all_keywords.extend(call.keywords)
    return CheckpointCall(
        node=call or partial.creation,
        target=partial.target,
        signature=targets.signatures[partial.target],
        scope=scope,
        positional=tuple(positional),
        keywords={k.arg: k.value for k in all_keywords if k.arg is not None},
        has_double_star=any(k.arg is None for k in all_keywords),
        through_partial=partial,
    )


class _Evaluator:
    """Static values of expressions: qualified names, partials of targets, or UNKNOWN."""

    def __init__(self, targets: Targets) -> None:
        self.targets = targets
        # Keyed by the binding itself (hashed by identity), never by id(): scopes are rebuilt.
        self.binding_values: dict[Binding, list[Value]] = {}
        self.in_progress: set[Binding] = set()

    def is_target_like(self, value: Value) -> bool:
        return isinstance(value, PartialValue) or value in self.targets.signatures

    def values_of(self, expression: ast.expr, scope: Scope, position) -> list[Value]:
        if isinstance(expression, ast.Name):
            return self._values_of_bindings(scope.lookup(expression.id, position))
        if isinstance(expression, ast.Attribute):
            if (
                isinstance(expression.value, ast.Name)
                and expression.value.id == scope.self_name
                and scope.enclosing_class is not None
            ):
                attributes = scope.enclosing_class.instance_attributes
                return self._values_of_bindings(attributes.get(expression.attr, []))
            bases = self.values_of(expression.value, scope, position)
            return _unique(
                f"{base}.{expression.attr}" if isinstance(base, str) else UNKNOWN for base in bases
            )
        if isinstance(expression, ast.Call):
            partial = self.partial_of(expression, scope)
            return [partial] if partial is not None else [UNKNOWN]
        return [UNKNOWN]

    def partial_of(self, call: ast.Call, scope: Scope) -> PartialValue | None:
        """The PartialValue when ``call`` is ``functools.partial(<checkpoint target>, ...)``."""
        if not call.args or isinstance(call.args[0], ast.Starred):
            return None
        position = (call.lineno, call.col_offset)
        if PARTIAL not in self.values_of(call.func, scope, position):
            return None
        for wrapped in self.values_of(call.args[0], scope, position):
            if isinstance(wrapped, str) and wrapped in self.targets.signatures:
                return PartialValue(call, wrapped)
            if isinstance(wrapped, PartialValue):
                return PartialValue(call, wrapped.target, wrapped)
        return None

    def _values_of_bindings(self, bindings: list[Binding]) -> list[Value]:
        if not bindings:
            return [UNKNOWN]
        return _unique(value for binding in bindings for value in self.value_of(binding))

    def value_of(self, binding: Binding) -> list[Value]:
        if binding.imported is not None:
            return [binding.imported]
        if binding.value is None:
            return [UNKNOWN]
        cached = self.binding_values.get(binding)
        if cached is not None:
            return cached
        if binding in self.in_progress:
            return [UNKNOWN]
        self.in_progress.add(binding)
        values = self.values_of(binding.value, binding.scope, binding.position)
        self.in_progress.discard(binding)
        self.binding_values[binding] = values
        return values


def _unique(values: Iterable[Value]) -> list[Value]:
    """Deduplicate, keeping first-seen (source) order so results never depend on hashing."""
    seen: list[Value] = []
    for value in values:
        if value not in seen:
            seen.append(value)
    return seen
