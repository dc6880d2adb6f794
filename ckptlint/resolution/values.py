"""Static values: what an expression may evaluate to, as far as the project's source shows.

An expression evaluates to a tuple of possible values, in source order (one per branch that
may bind it). ``UNKNOWN`` stands for anything the analysis cannot see; it is a value like the
others, so "any branch" and "exactly one" are decisions of the caller (see ``evaluator``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import TypeVar

from ckptlint.project.index import Module
from ckptlint.project.scopes import Binding, Scope
from ckptlint.resolution.versions import VersionRange

_T = TypeVar("_T")


def _cached_hash(cls: type[_T]) -> type[_T]:
    """Values nest (a context holds the arguments of its callers, which hold contexts):
    compute each hash once, not on every dictionary lookup."""
    compute = cls.__hash__

    def __hash__(self: object) -> int:  # noqa: N807
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = compute(self)
            object.__setattr__(self, "_hash", cached)
        return cached

    cls.__hash__ = __hash__  # type: ignore[method-assign]
    return cls


@_cached_hash
@dataclass(frozen=True)
class Argument:
    """What a parameter is bound to: an expression evaluated where the call was written,
    or values known already (``self`` of a bound method)."""

    expression: ast.expr | None
    context: Context | None
    values: tuple[Value, ...] = ()
    default: bool = False  # the parameter's default: the call left it out
    # For a default: the parameter and its function (which call left it out).
    parameter: ast.arg | None = None
    function: ast.AST | None = None


Environment = tuple[tuple[ast.arg, Argument], ...]


@_cached_hash
@dataclass(frozen=True)
class Context:
    """Where code is evaluated: its module, scope and the parameters bound by its callers."""

    module: Module
    scope: Scope
    env: Environment = ()

    def argument(self, parameter: ast.arg) -> Argument | None:
        for bound, argument in reversed(self.env):
            if bound is parameter:
                return argument
        return None

    def at(self, scope: Scope) -> Context:
        """The same activation, in another (enclosing or nested) scope of the module."""
        if scope.kind != "function":
            return Context(self.module, scope)
        return Context(self.module, scope, self.env)


Flow = tuple[ast.expr, Context]


@dataclass(frozen=True)
class Arguments:
    """The arguments a callee receives, each with the context it is evaluated in (a
    ``functools.partial`` adds its own before the call's). ``None`` in ``positional`` marks
    a ``*args``: what follows is not known by position."""

    positional: tuple[Flow | None, ...]
    keywords: dict[str, Flow]
    double_star: bool  # some keywords are not known by name (``**kwargs``, or unseen)
    # The calls that supplied them, outermost first (where they come from, not what they
    # bind: arguments equal but for their calls bind a function's parameters alike).
    calls: tuple[ast.Call, ...] = field(compare=False)
    spread: tuple[Flow, ...] = ()  # the ``**mapping`` expressions among them

    @classmethod
    def of(cls, call: ast.Call, context: Context) -> Arguments:
        return cls((), {}, False, ()).then(call, context, skip=0)

    def then(self, call: ast.Call, context: Context, *, skip: int) -> Arguments:
        """These arguments followed by ``call``'s (less its first ``skip`` positionals)."""
        positional = list(self.positional)
        for argument in call.args[skip:]:
            positional.append(None if isinstance(argument, ast.Starred) else (argument, context))
        keywords = dict(self.keywords)
        keywords.update({k.arg: (k.value, context) for k in call.keywords if k.arg is not None})
        spread = (*self.spread, *((k.value, context) for k in call.keywords if k.arg is None))
        double_star = self.double_star or len(spread) > len(self.spread)
        return Arguments(tuple(positional), keywords, double_star, (*self.calls, call), spread)

    def __hash__(self) -> int:
        cached = self.__dict__.get("_hash")
        if cached is None:
            items = (self.positional, tuple(self.keywords.items()), self.double_star, self.spread)
            cached = hash(items)
            object.__setattr__(self, "_hash", cached)
        return cached

    def get(self, index: int, keyword: str | None) -> Flow | None:
        """The argument at ``index`` or passed as ``keyword``; None when absent or unknown."""
        if keyword is not None and keyword in self.keywords:
            return self.keywords[keyword]
        for position, flow in enumerate(self.positional):
            if flow is None:
                return None
            if position == index:
                return flow
        return None


class _Unknown:
    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN = _Unknown()


@_cached_hash
@dataclass(frozen=True)
class Constant:
    value: object


@_cached_hash
@dataclass(frozen=True)
class External:
    """An object outside the linted code, by qualified name (``torch.nn.Dropout``)."""

    name: str


@_cached_hash
@dataclass(frozen=True)
class ModuleValue:
    module: Module


@_cached_hash
@dataclass(frozen=True)
class FunctionValue:
    """A def or lambda; ``context`` is where it was made (closures see its bindings).
    ``bound`` holds the instance of a bound method."""

    node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
    context: Context
    bound: tuple[Value, ...] | None = None

    @property
    def module(self) -> Module:
        return self.context.module

    @property
    def label(self) -> str:
        return "lambda" if isinstance(self.node, ast.Lambda) else f"`{self.node.name}()`"


@_cached_hash
@dataclass(frozen=True)
class ClassValue:
    node: ast.ClassDef
    context: Context

    @property
    def module(self) -> Module:
        return self.context.module


@_cached_hash
@dataclass(frozen=True)
class Instance:
    """An instance of a class, made by ``call`` evaluated in ``context`` when known.

    ``exact`` is False for ``self`` inside a class's own methods: the object may be of a
    subclass that overrides what the method uses.
    """

    cls: ClassValue | External
    call: ast.Call | None = None
    context: Context | None = None
    exact: bool = True
    origin: Binding | None = None  # the variable a container was made for (see Sequence)


@_cached_hash
@dataclass(frozen=True)
class PartialValue:
    """``functools.partial(inner, *args, **keywords)``: ``call`` is the partial call."""

    inner: tuple[Value, ...]
    call: ast.Call
    context: Context


@_cached_hash
@dataclass(frozen=True)
class Sequence:
    """A list, tuple or set: literal elements, or a comprehension's element expression.

    ``origin`` is the variable (or ``self.<attribute>``) the container was made for: what
    is later added to it through that name (``layers.append(block)``) is an element too.
    """

    node: ast.List | ast.Tuple | ast.Set | ast.ListComp | ast.SetComp | ast.GeneratorExp
    context: Context
    origin: Binding | None = None


@_cached_hash
@dataclass(frozen=True)
class Mapping:
    """A dict literal or ``dict(...)`` call."""

    node: ast.Dict | ast.Call | ast.DictComp
    context: Context
    origin: Binding | None = None


@_cached_hash
@dataclass(frozen=True)
class Elements:
    """What iterating ``of`` yields (``enumerate``/``zip`` give ``tuple_of`` rows)."""

    of: tuple[Value, ...]


@_cached_hash
@dataclass(frozen=True)
class Row:
    """A tuple whose positions hold the given values (one row of ``enumerate``/``zip``)."""

    items: tuple[tuple[Value, ...], ...]


@_cached_hash
@dataclass(frozen=True)
class Parameter:
    """A parameter no caller bound: what a wrapper receives and passes on."""

    node: ast.arg
    function: ast.AST
    module: Module


@_cached_hash
@dataclass(frozen=True)
class CallKeywords:
    """What a ``**kwargs`` parameter holds at a call: the keywords ``arguments`` passes that
    no named parameter (``taken``) takes, and whatever its own ``**`` spreads carry.
    ``owner``: the function whose ``**kwargs`` the call that wrote them bound (keywords
    handed on unchanged through further ``**kwargs`` keep the first)."""

    arguments: Arguments
    taken: frozenset[str]
    owner: ast.AST | None = None

    def keyword(self, name: str) -> Flow | None:
        return None if name in self.taken else self.arguments.keywords.get(name)


@_cached_hash
@dataclass(frozen=True)
class TorchVersionTest:
    """A test of the installed torch's version: true on ``versions``."""

    versions: VersionRange


@_cached_hash
@dataclass(frozen=True)
class Method:
    """A method of a value the evaluator models (``ModuleDict.items``, ``dict.values``)."""

    receiver: Value
    name: str


@_cached_hash
@dataclass(frozen=True)
class Super:
    """``super()`` in a method of ``cls``: members are looked up after ``cls`` in the MRO."""

    cls: ClassValue
    instance: tuple[Value, ...]


Value = (
    _Unknown
    | Constant
    | External
    | ModuleValue
    | FunctionValue
    | ClassValue
    | Instance
    | PartialValue
    | Sequence
    | Mapping
    | Elements
    | Row
    | Parameter
    | CallKeywords
    | TorchVersionTest
    | Method
    | Super
)
Values = tuple[Value, ...]


# -- bounded contexts -------------------------------------------------------------------------
# A context binds parameters to arguments written in the callers' contexts, which bind their
# own: a call chain of any length nests contexts that deep, and recursion through arguments
# (``first(region.inner)``) makes a new context at every level. Contexts are kept at most
# CONTEXT_DEPTH deep: below that, an argument is evaluated where it was written with its
# own parameters unbound (what any caller may pass). The questions the analysis can ask are
# then finitely many, so every computation ends.
CONTEXT_DEPTH = 4


def context_depth(context: Context | None) -> int:
    """How deeply the arguments a context binds nest contexts (0: binds nothing)."""
    if context is None or not context.env:
        return 0
    cached = context.__dict__.get("_depth")
    if cached is None:
        cached = 1 + max((context_depth(c) for c in _bound_contexts(context)), default=0)
        object.__setattr__(context, "_depth", cached)
    return cached


def activations(context: Context) -> frozenset[Scope]:
    """The scopes of the contexts a context holds, its own included: a function whose scope
    is among its arguments' is called from (an activation of) itself, recursively."""
    cached = context.__dict__.get("_activations")
    if cached is None:
        cached = frozenset({context.scope})
        for inner in _bound_contexts(context):
            cached |= activations(inner)
        object.__setattr__(context, "_activations", cached)
    return cached


def _bound_contexts(context: Context) -> Iterator[Context]:
    """The contexts the arguments a context binds hold."""
    for _, argument in context.env:
        if argument.context is not None:
            yield argument.context
        for value in argument.values:
            yield from held_contexts(value)


def held_contexts(value: Value) -> Iterator[Context]:
    """The contexts a value holds (where its code runs, where it was made)."""
    if isinstance(value, (FunctionValue, ClassValue, Sequence, Mapping)):
        yield value.context
        if isinstance(value, FunctionValue) and value.bound:
            for bound in value.bound:
                yield from held_contexts(bound)
    elif isinstance(value, Instance):
        if value.context is not None:
            yield value.context
        if isinstance(value.cls, ClassValue):
            yield value.cls.context
    elif isinstance(value, PartialValue):
        yield value.context
        for inner in value.inner:
            yield from held_contexts(inner)
    elif isinstance(value, Elements):
        for inner in value.of:
            yield from held_contexts(inner)
    elif isinstance(value, Row):
        for item in value.items:
            for inner in item:
                yield from held_contexts(inner)
    elif isinstance(value, CallKeywords):
        arguments = value.arguments
        for flow in (*arguments.positional, *arguments.keywords.values(), *arguments.spread):
            if flow is not None:
                yield flow[1]
    elif isinstance(value, Method):
        yield from held_contexts(value.receiver)
    elif isinstance(value, Super):
        yield value.cls.context
        for inner in value.instance:
            yield from held_contexts(inner)


def value_depth(value: Value) -> int:
    """The deepest context a value holds."""
    return max((context_depth(c) for c in held_contexts(value)), default=0)


def _argument_depth(argument: Argument) -> int:
    found = context_depth(argument.context)
    for value in argument.values:
        found = max(found, value_depth(value))
    return found


def limit_context(context: Context, depth: int = CONTEXT_DEPTH) -> Context:
    """``context`` with what it binds nested at most ``depth`` deep (see CONTEXT_DEPTH)."""
    if context_depth(context) <= depth:
        return context
    if depth <= 0:
        return Context(context.module, context.scope)
    env = tuple(
        (parameter, _limit_argument(argument, depth - 1)) for parameter, argument in context.env
    )
    return Context(context.module, context.scope, env)


def _limit_argument(argument: Argument, depth: int) -> Argument:
    if _argument_depth(argument) <= depth:
        return argument
    context = None if argument.context is None else limit_context(argument.context, depth)
    values = tuple(limit_value(value, depth) for value in argument.values)
    return replace(argument, context=context, values=values)


def limit_value(value: Value, depth: int) -> Value:
    """``value`` with the contexts it holds at most ``depth`` deep."""
    if value_depth(value) <= depth:
        return value
    if isinstance(value, FunctionValue):
        bound = None if value.bound is None else tuple(limit_value(v, depth) for v in value.bound)
        return FunctionValue(value.node, limit_context(value.context, depth), bound)
    if isinstance(value, ClassValue):
        return ClassValue(value.node, limit_context(value.context, depth))
    if isinstance(value, (Sequence, Mapping)):
        return replace(value, context=limit_context(value.context, depth))
    if isinstance(value, Instance):
        cls = limit_value(value.cls, depth) if isinstance(value.cls, ClassValue) else value.cls
        context = None if value.context is None else limit_context(value.context, depth)
        return replace(value, cls=cls, context=context)  # type: ignore[arg-type]
    if isinstance(value, PartialValue):
        inner = tuple(limit_value(v, depth) for v in value.inner)
        return PartialValue(inner, value.call, limit_context(value.context, depth))
    if isinstance(value, Elements):
        return Elements(tuple(limit_value(v, depth) for v in value.of))
    if isinstance(value, Row):
        return Row(tuple(tuple(limit_value(v, depth) for v in item) for item in value.items))
    if isinstance(value, CallKeywords):
        return CallKeywords(_limit_arguments(value.arguments, depth), value.taken, value.owner)
    if isinstance(value, Method):
        return Method(limit_value(value.receiver, depth), value.name)
    if isinstance(value, Super):
        cls = limit_value(value.cls, depth)
        return Super(cls, tuple(limit_value(v, depth) for v in value.instance))  # type: ignore[arg-type]
    return value


def _limit_arguments(arguments: Arguments, depth: int) -> Arguments:
    def flow(item: Flow) -> Flow:
        return item[0], limit_context(item[1], depth)

    return Arguments(
        tuple(None if item is None else flow(item) for item in arguments.positional),
        {name: flow(item) for name, item in arguments.keywords.items()},
        arguments.double_star,
        arguments.calls,
        tuple(flow(item) for item in arguments.spread),
    )


def unique(values: Iterable[Value]) -> Values:
    """Deduplicate, keeping first-seen (source) order so results never depend on hashing."""
    seen: dict = {}
    for value in values:
        seen.setdefault(value, None)
    return tuple(seen)


def known(values: Values) -> Values:
    """The values the analysis can see ("any branch" policy)."""
    return tuple(v for v in values if v is not UNKNOWN)
