"""The evaluator's calls: what a call gives, and the context a called function runs in.

A call of a project function gives what its ``return`` statements give in the context
``bind`` makes: its parameters bound to the call's arguments (an argument that is itself a
parameter handed on unchanged is followed to where it was first written, ``passed_on``), a
``**kwargs`` parameter holding the keywords passed (through any chain of wrappers that hand
their own ``**kwargs`` on unchanged, the keywords of the call that wrote them). ``return
g(...)`` chains are answered from the deepest link up, so their length costs no depth. A
class called makes an instance; torch's and Python's functions the analysis knows
(``functools.partial``, ``getattr``, ``enumerate``, ``super()``, version parsers and
tests...) give what they are known to; a container's methods give its elements (see
``containers``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING

from ckptlint.lazy_tree import mark_read
from ckptlint.memos import process_memo
from ckptlint.project.scopes import FUNCTIONS, node_position, parameter_defaults, parameters
from ckptlint.resolution.bodies import first_parameter, own_nodes
from ckptlint.resolution.containers import KEY_READS, call_arguments
from ckptlint.resolution.values import (
    UNKNOWN,
    Argument,
    Arguments,
    CallKeywords,
    ClassValue,
    Constant,
    Context,
    Elements,
    External,
    Flow,
    FunctionValue,
    Instance,
    Mapping,
    Method,
    PartialValue,
    Row,
    Super,
    TorchVersionTest,
    Value,
    Values,
    unique,
)
from ckptlint.resolution.version_tests import constant_value
from ckptlint.resolution.versions import (
    DISTRIBUTION_VERSIONS,
    TEST_HELPERS,
    TORCH_VERSION,
    VERSION_PARSERS,
    helper_test,
)
from ckptlint.torch_catalogue import RETURNS_ITS_MODULE

if TYPE_CHECKING:
    from ckptlint.resolution.evaluator import Evaluator

PARTIAL = "functools.partial"
_ITERATION_BUILTINS = frozenset({"list", "tuple", "iter", "reversed", "sorted", "set", "frozenset"})


class Calls:
    """The evaluator's part that calls functions (see the module docstring)."""

    def __init__(self, evaluator: Evaluator) -> None:
        self.evaluator = evaluator

    # -- what a call gives ---------------------------------------------------------------------
    def call_result(self, callee: Values, call: ast.Call, context: Context) -> Values:
        return unique(v for value in callee for v in self._call(value, call, context)) or (UNKNOWN,)

    def call_expression(self, call: ast.Call, context: Context) -> Values:
        callee = self.evaluator.evaluate(call.func, context)
        return self.call_result(callee, call, context)

    def _call(self, callee: Value, call: ast.Call, context: Context) -> Iterator[Value]:
        name = _called_name(callee)
        test = helper_test(name, [constant_value(a) for a in call.args]) if name else None
        if test is not None:  # ``is_torch_version(">=", "1.11.0")``
            yield TorchVersionTest(test)
        elif isinstance(callee, External):
            yield from self._external_call(callee.name, call, context)
        elif isinstance(callee, ClassValue):
            yield Instance(callee, call, context)
        elif isinstance(callee, FunctionValue):
            yield from self.returned(callee, Arguments.of(call, context))
        elif isinstance(callee, Method) and callee.name in KEY_READS:
            yield from self.evaluator.containers.key_read(call, context)
        elif isinstance(callee, Method):
            yield from self.evaluator.containers.method_call(callee)
        else:
            yield UNKNOWN

    def _external_call(self, name: str, call: ast.Call, context: Context) -> Iterator[Value]:
        evaluator = self.evaluator
        evaluate = evaluator.evaluate
        arguments, keywords = call_arguments(call)
        first = arguments[0] if arguments and not isinstance(arguments[0], ast.Starred) else None
        if name == PARTIAL and first is not None:
            yield PartialValue(evaluate(first, context), call, context)
        elif name in VERSION_PARSERS and first is not None:
            yield from evaluator.version_tests.parsed(evaluate(first, context))
        elif name in DISTRIBUTION_VERSIONS and constant_value(first) == "torch":
            yield External(TORCH_VERSION)
        elif name in RETURNS_ITS_MODULE and first is not None:  # ``weight_norm(conv)``
            yield from evaluate(first, context)
        elif name in ("builtins.staticmethod", "builtins.classmethod") and first is not None:
            yield from evaluate(first, context)
        elif name == "builtins.getattr" and len(arguments) >= 2:
            attribute = arguments[1]
            if isinstance(attribute, ast.Constant) and isinstance(attribute.value, str):
                yield from evaluator.member(evaluate(arguments[0], context), attribute.value)
                if len(arguments) > 2:
                    yield from evaluate(arguments[2], context)
            else:
                yield UNKNOWN
        elif name == "builtins.super":
            yield from self._super(context)
        elif name == "builtins.dict":
            yield Mapping(call, context)
        elif name in ("builtins.enumerate", "builtins.zip") and first is not None:
            columns = [evaluator.iterate(evaluate(a, context)) for a in arguments]
            if name == "builtins.enumerate":
                columns = [(UNKNOWN,), columns[0]]
            yield Elements((Row(tuple(columns)),))
        elif name.removeprefix("builtins.") in _ITERATION_BUILTINS and first is not None:
            yield Elements(evaluator.iterate(evaluate(first, context)))
        elif name.rpartition(".")[2][:1].isupper():  # a class, by convention
            yield Instance(External(name), call, context)
        elif name == "collections.OrderedDict":
            yield Mapping(call, context)
        else:
            yield UNKNOWN

    def _super(self, context: Context) -> Iterator[Value]:
        scope = context.scope
        while scope.parent is not None and scope.enclosing_class is None:
            scope = scope.parent
        owner = scope.enclosing_class
        if owner is None or owner.parent is None:
            yield UNKNOWN
            return
        cls = ClassValue(owner.node, context.at(owner.parent))  # type: ignore[arg-type]
        self_parameter = first_parameter(scope.node)
        instance: Values = (UNKNOWN,)
        if self_parameter is not None:
            binding = scope.bindings[self_parameter.arg][0]
            instance = self.evaluator.parameter_values(self_parameter, binding, context.at(scope))
        yield Super(cls, instance)

    # -- the context a called function runs in --------------------------------------------------
    def bind(self, function: FunctionValue, arguments: Arguments | None) -> Context:
        """The context ``function``'s body runs in when it receives ``arguments`` (None: a
        call the analysis does not see, parameters unbound)."""
        node = function.node
        scope = self.evaluator.scope_of(function)
        # What the enclosing functions' parameters are bound to. A nested function that
        # calls itself was defined in an activation of its own: that activation's
        # parameters are not this one's (kept, they grew the context at every level).
        own = set(parameters(node.args))
        env = [(p, a) for p, a in function.context.env if p not in own]
        positional = [*node.args.posonlyargs, *node.args.args]
        if function.bound is not None and positional:
            env.append((positional[0], Argument(None, None, function.bound)))
            positional = positional[1:]
        if arguments is not None:
            supplied: set[str] = set()
            for parameter, flow in zip(positional, arguments.positional, strict=False):
                if flow is None:  # a *args: the rest is not known
                    break
                env.append((parameter, passed_on(Argument(*flow))))
                supplied.add(parameter.arg)
            by_name = {p.arg: p for p in (*positional, *node.args.kwonlyargs)}
            for name, flow in arguments.keywords.items():
                if name in by_name:
                    env.append((by_name[name], passed_on(Argument(*flow))))
                    supplied.add(name)
            for parameter, default in parameter_defaults(node.args).items():
                if parameter.arg not in supplied and not arguments.double_star:
                    left_out = Argument(default, function.context, (), True, parameter, node)
                    env.append((parameter, left_out))
            if node.args.kwarg is not None:
                taken = frozenset(p.arg for p in (*node.args.posonlyargs, *node.args.args))
                held = self._keywords(node, arguments, taken | frozenset(by_name))
                env.append((node.args.kwarg, Argument(None, None, (held,))))
        return self.evaluator.context(function.module, scope, tuple(env))

    def _keywords(self, node: ast.AST, arguments: Arguments, taken: frozenset[str]) -> CallKeywords:
        """What ``node``'s ``**kwargs`` holds: the keywords ``arguments`` pass by name and
        spread. A caller's own ``**kwargs`` handed on unchanged (used only as ``**kw``) is
        replaced by what its caller passed, so a chain of wrappers forwarding ``**kwargs``
        binds the keywords of the call that wrote them, whatever its length."""
        spread: list[Flow] = []
        keywords: dict[str, Flow] = {}
        owner: ast.AST | None = node
        for flow in arguments.spread:
            passed = _handed_on(*flow) if len(arguments.spread) == 1 else None
            if passed is None:
                spread.append(flow)
                continue
            inner = passed.arguments
            keywords.update((k, v) for k, v in inner.keywords.items() if k not in passed.taken)
            spread.extend(inner.spread)
            owner = passed.owner
        if owner is node:
            spread = [_canonical(flow) for flow in arguments.spread]
            if spread != list(arguments.spread):
                arguments = replace(arguments, spread=tuple(spread))
            return CallKeywords(arguments, taken, node)
        keywords.update(arguments.keywords)
        merged = Arguments((), keywords, bool(spread), arguments.calls, tuple(spread))
        return CallKeywords(merged, taken, owner)

    # -- what a called function returns ---------------------------------------------------------
    def returned(self, function: FunctionValue, arguments: Arguments | None) -> Values:
        """What calling ``function`` returns (union over its ``return`` statements)."""
        return self.returned_in(function, self.bind(function, arguments))

    def returned_in(self, function: FunctionValue, inner: Context) -> Values:
        """The union over the ``return`` statements, asked once per function and context.
        Before a function is asked, the functions its ``return g(...)`` statements call are
        (``_settle_tail_calls``), so a chain of wrappers each returning the next one's
        result costs no depth, and each link is computed once whichever link is asked
        first."""
        if isinstance(function.node, ast.Lambda):
            return self.evaluator.evaluate(function.node.body, inner)
        return self._answer(function, inner) or (Constant(None),)

    def _answer(self, function: FunctionValue, inner: Context) -> Values:
        """``_ask_returned``, its tail callees settled first unless it is known."""
        if not self.evaluator.settled(("returned", function, inner)):
            self._settle_tail_calls(function, inner)
        return self._ask_returned(function, inner)

    def _ask_returned(self, function: FunctionValue, inner: Context) -> Values:
        """What ``function``'s returns give; nothing where asked within its own answer (a
        tail call back into a function still being answered adds no value of its own)."""
        return self.evaluator.ask(
            ("returned", function, inner), self._returned, function, inner, fallback=(), flat=True
        )

    def _returned(self, function: FunctionValue, inner: Context) -> Values:
        results: list[Value] = []
        returns = False
        for node in own_nodes(function.node.body):
            if isinstance(node, (ast.Yield, ast.YieldFrom)):
                return (UNKNOWN,)  # a generator
            if not isinstance(node, ast.Return):
                continue
            returns = True
            if node.value is None:
                results.append(Constant(None))
                continue
            tail = self._tail_call(node.value, inner)
            if tail is None:
                results.extend(self.evaluator.evaluate(node.value, inner))
                continue
            for called, context in tail:
                if isinstance(called.node, ast.Lambda):
                    results.extend(self.evaluator.evaluate(called.node.body, context))
                else:  # a cycle back into a function being answered adds nothing
                    results.extend(self._answer(called, context))
        return unique(results) if returns else (Constant(None),)

    def _settle_tail_calls(self, function: FunctionValue, inner: Context) -> None:
        """Ask what the functions ``function`` reaches through ``return g(...)`` return, each
        after the functions it tail-calls (an iterative walk in post-order, each function
        once, in the context it is first reached in), so that every answer finds the next
        link's already known."""
        seen = {function.node}
        stack = [(function, inner, iter(self._tail_callees(function, inner)))]
        while stack:
            current, context, callees = stack[-1]
            for called, called_in in callees:
                if called.node in seen or self.evaluator.settled(("returned", called, called_in)):
                    continue
                seen.add(called.node)
                stack.append((called, called_in, iter(self._tail_callees(called, called_in))))
                break
            else:
                stack.pop()
                if stack:
                    self._ask_returned(current, context)

    def _tail_callees(
        self, function: FunctionValue, inner: Context
    ) -> Iterator[tuple[FunctionValue, Context]]:
        """The project functions ``function``'s ``return g(...)`` statements call, lambdas
        left out (their body is evaluated where they are called)."""
        if isinstance(function.node, ast.Lambda):
            return
        for node in own_nodes(function.node.body):
            if isinstance(node, (ast.Yield, ast.YieldFrom)):
                return
            if isinstance(node, ast.Return) and node.value is not None:
                for called, context in self._tail_call(node.value, inner) or ():
                    if not isinstance(called.node, ast.Lambda):
                        yield called, context

    def _tail_call(
        self, expression: ast.expr, context: Context
    ) -> list[tuple[FunctionValue, Context]] | None:
        """For ``return g(...)`` where ``g`` may only be project functions (no version test
        known by name): each with the context the call runs its body in."""
        if not isinstance(expression, ast.Call):
            return None
        evaluate = self.evaluator.evaluate
        functions = [v for v in evaluate(expression.func, context) if isinstance(v, FunctionValue)]
        callee = evaluate(expression.func, context)
        if len(functions) != len(callee) or any(_called_name(v) in TEST_HELPERS for v in callee):
            return None
        arguments = Arguments.of(expression, context)
        return [(function, self.bind(function, arguments)) for function in functions]


def _called_name(callee: Value) -> str:
    """The last name of a callee (``is_torch_version``), for helpers known by name."""
    if isinstance(callee, External):
        return callee.name.rpartition(".")[2]
    if isinstance(callee, FunctionValue) and not isinstance(callee.node, ast.Lambda):
        return callee.node.name
    return ""


def _handed_on(expression: ast.expr, context: Context) -> CallKeywords | None:
    """The keywords a ``**kwargs`` parameter holds when ``expression`` is that parameter
    of the function ``context`` runs, which uses it only to spread it (no edit)."""
    if not isinstance(expression, ast.Name):
        return None
    bindings = context.scope.lookup(expression.id, node_position(expression))
    if len(bindings) != 1 or bindings[0].scope is not context.scope:
        return None
    function = context.scope.node
    if not isinstance(function, FUNCTIONS) or bindings[0].node is not function.args.kwarg:
        return None
    argument = context.argument(bindings[0].node)
    if argument is None or len(argument.values) != 1:
        return None
    (held,) = argument.values
    if not isinstance(held, CallKeywords) or not only_spread(function, expression.id):
        return None
    return held


def only_spread(function: ast.FunctionDef | ast.AsyncFunctionDef, name: str) -> bool:
    """Whether ``function`` uses ``name`` only as ``**name`` in calls (kept, once per body)."""
    found = _ONLY_SPREAD.get(id(function))
    if found is not None and found[0] is function and name in found[1]:
        mark_read(function)
        return found[1][name]
    loads = spreads = 0
    for node in ast.walk(function):
        if isinstance(node, ast.Name) and node.id == name:
            loads += 1
        elif isinstance(node, ast.keyword) and node.arg is None:
            spreads += isinstance(node.value, ast.Name) and node.value.id == name
    answer = loads == spreads
    names = found[1] if found is not None and found[0] is function else {}
    names[name] = answer
    _ONLY_SPREAD[id(function)] = (function, names)
    return answer


_ONLY_SPREAD: dict[int, tuple[ast.AST, dict[str, bool]]] = process_memo()


def passed_on(argument: Argument) -> Argument:
    """Where an argument that is itself a parameter passed on unchanged (``fn`` handed from
    wrapper to wrapper) was first written: followed in a loop, so a chain of any length
    costs no evaluation depth."""
    while isinstance(argument.expression, ast.Name) and argument.context is not None:
        name = argument.expression
        context = argument.context
        bindings = context.scope.lookup(name.id, node_position(name))
        if len(bindings) != 1 or not isinstance(bindings[0].node, ast.arg):
            break
        parameter = bindings[0].node
        outer = context.argument(parameter)
        if outer is None:
            if bindings[0].scope.bindings.get(name.id) == bindings:
                # Never rebound: every read of it is one expression, wherever written, so
                # calls handing it on alike bind alike.
                return replace(argument, expression=_read_of(parameter))
            break
        argument = outer
    return argument


def _canonical(flow: Flow) -> Flow:
    """A flow as ``passed_on`` leaves it where it names a parameter no call bound."""
    argument = passed_on(Argument(*flow))
    if argument.expression is None or argument.context is None:
        return flow
    return argument.expression, argument.context


def _read_of(parameter: ast.arg) -> ast.Name:
    """One ``Name`` reading ``parameter``, placed at the parameter (kept, once per node)."""
    found = _READS.get(id(parameter))
    if found is not None and found[0] is parameter:
        return found[1]
    read = ast.Name(parameter.arg, ast.Load())
    ast.copy_location(read, parameter)
    _READS[id(parameter)] = (parameter, read)
    return read


_READS: dict[int, tuple[ast.arg, ast.Name]] = process_memo()
