"""What a checkpoint call runs, and what that code reads, writes and draws.

A layer between call resolution and the semantic rules. From a ``CheckpointCall``'s region
expression it finds, within the same file, the function, lambda, method, module or torch
function that runs, and follows calls of same-file functions and modules a few levels deep.
Everything that cannot be proven stays unknown, and the rules never report the unknown.

The analysis is lazy and per file: only the regions of checkpoint calls and the code they
reach are visited; a global's changes are found by searching the text for its name first.
"""

from __future__ import annotations

import ast
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass, field

from ckptlint.resolve import (
    CHECKPOINT,
    CHECKPOINT_SEQUENTIAL,
    PARTIAL,
    CheckpointCall,
    Resolution,
)
from ckptlint.scopes import Binding, ModuleScopes, Position, Scope, node_position
from ckptlint.source import lines_with_words

# Calls of same-module functions and modules are followed this many levels below the region.
MAX_CALL_DEPTH = 3

# User wrappers (extend-checkpoint-functions) may take their arguments in any order.
_TORCH_CHECKPOINTS = (CHECKPOINT, CHECKPOINT_SEQUENTIAL)
FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
# Methods that change the object they are called on.
MUTATING_METHODS = frozenset(
    "append extend insert update pop popitem setdefault clear remove discard add sort reverse"
    " __setitem__ __delitem__".split()
)


@dataclass(frozen=True, eq=False)
class Argument:
    """An expression passed to a factory's parameter, evaluated where the factory was called."""

    expression: ast.expr
    scope: Scope
    environment: Environment


# Factory parameters (keyed by the ``ast.arg`` node's id) and the arguments bound to them.
Environment = dict[int, Argument]


@dataclass(frozen=True, eq=False)
class Function:
    """A def or lambda of this file; ``environment`` binds the parameters of its factory."""

    node: FunctionNode
    scope: Scope
    environment: Environment = field(default_factory=dict)

    @property
    def label(self) -> str:
        return "lambda" if isinstance(self.node, ast.Lambda) else f"`{self.node.name}()`"


@dataclass(frozen=True, eq=False)
class TorchFunction:
    """A function of torch (``torch.relu``, ``torch.nn.functional.dropout``)."""

    qualified: str


@dataclass(frozen=True, eq=False)
class TorchModule:
    """A torch ``nn.Module`` built by ``construction``: ``nn.GELU()``, ``nn.Sequential(...)``."""

    qualified: str
    construction: ast.Call
    scope: Scope
    environment: Environment

    @property
    def class_name(self) -> str:
        return self.qualified.rsplit(".", 1)[-1]


@dataclass(frozen=True, eq=False)
class LocalModule:
    """An instance of a class of this file; calling it runs its ``forward``."""

    forward: Function


@dataclass(frozen=True, eq=False)
class Partial:
    """``functools.partial(inner, ...)``."""

    inner: Region


Region = Function | TorchFunction | TorchModule | LocalModule | Partial


@dataclass(frozen=True)
class GlobalRead:
    name: str
    line: int


@dataclass(frozen=True)
class GlobalWrite:
    """A statement of a function that rebinds or mutates a module-level object."""

    name: str
    line: int
    how: str  # "assigns", "mutates"


@dataclass(frozen=True)
class RandomDraw:
    what: str
    line: int


@dataclass
class _FunctionFacts:
    """What one function body does by itself, before following its calls."""

    reads: list[GlobalRead]
    writes: list[GlobalWrite]
    draws: list[RandomDraw]
    calls: list[ast.Call]


@dataclass
class Reach:
    """Everything a region runs, up to ``MAX_CALL_DEPTH`` levels of calls."""

    functions: list[Function] = field(default_factory=list)
    reads: list[GlobalRead] = field(default_factory=list)
    writes: list[GlobalWrite] = field(default_factory=list)
    draws: list[RandomDraw] = field(default_factory=list)


class RegionAnalysis:
    """Per-file region resolution and facts, each computed once on first use."""

    def __init__(self, tree: ast.Module, lines: list[str], resolution: Resolution) -> None:
        self.tree = tree
        self.lines = lines
        self.scopes: ModuleScopes = resolution.scopes
        self._regions: dict[int, Region | None] = {}
        self._reaches: dict[int, Reach] = {}
        self._facts: dict[int, _FunctionFacts] = {}
        self._changes: dict[str, list[GlobalWrite]] = {}
        self._classes_built: set[int] = set()
        self._subclasses_of: dict[int, list[ast.ClassDef]] = {}

    # -- regions -------------------------------------------------------------------------
    def region(self, call: CheckpointCall) -> Region | None:
        """What ``call`` runs, or None when it cannot be known from this file."""
        key = id(call.node)
        if key not in self._regions:
            expression = call.region if call.target in _TORCH_CHECKPOINTS else None
            self._regions[key] = (
                None
                if expression is None
                else self.resolve(expression, call.scope, node_position(expression), {}, 0)
            )
        return self._regions[key]

    def resolve(
        self,
        expression: ast.expr,
        scope: Scope,
        position: Position,
        environment: Environment,
        depth: int,
    ) -> Region | None:
        """The region ``expression`` evaluates to, seen from ``scope``."""
        if depth > 8:
            return None
        if isinstance(expression, ast.Lambda):
            lambda_scope = self.scopes.function_scope(expression)
            return None if lambda_scope is None else Function(expression, lambda_scope, environment)
        if isinstance(expression, ast.Name):
            return self._resolve_name(expression.id, scope, position, environment, depth)
        if isinstance(expression, ast.Attribute):
            return self._resolve_attribute(expression, scope, position, environment, depth)
        if isinstance(expression, ast.Call):
            return self._resolve_call(expression, scope, environment, depth)
        if isinstance(expression, ast.Subscript):
            return self._resolve_element(expression, scope, position, environment, depth)
        return None

    def _resolve_name(
        self, name: str, scope: Scope, position: Position, environment: Environment, depth: int
    ) -> Region | None:
        bindings = scope.lookup(name, position)
        if len(bindings) != 1:
            return None
        return self._resolve_binding(bindings[0], environment, depth)

    def _resolve_binding(
        self, binding: Binding, environment: Environment, depth: int
    ) -> Region | None:
        node = binding.node
        if binding.imported is not None:
            return _torch_function(binding.imported)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.decorator_list:
                return None  # a decorator may replace the function
            function_scope = self.scopes.function_scope(node)
            return None if function_scope is None else Function(node, function_scope)
        if isinstance(node, ast.arg):
            argument = environment.get(id(node))
            if argument is None:
                return None
            return self.resolve(
                argument.expression,
                argument.scope,
                node_position(argument.expression),
                argument.environment,
                depth + 1,
            )
        if binding.value is not None:
            return self.resolve(
                binding.value, binding.scope, binding.position, environment, depth + 1
            )
        return None

    def _resolve_attribute(
        self,
        expression: ast.Attribute,
        scope: Scope,
        position,
        environment: Environment,
        depth: int,
    ) -> Region | None:
        owner = self.class_of_instance(expression.value, scope, position)
        if owner is not None:
            return self._resolve_member(owner, expression.attr, environment, depth)
        qualified = self.qualified_name(expression, scope, position)
        return None if qualified is None else _torch_function(qualified)

    def _resolve_member(
        self, owner: Scope, attribute: str, environment: Environment, depth: int
    ) -> Region | None:
        """``self.<attribute>``: a method of the class, or a module assigned in a method.

        Unknown when a subclass in this file defines or assigns the same attribute.
        """
        if self._overridden(owner, attribute):
            return None
        members = owner.bindings.get(attribute, [])
        if members:
            if len(members) == 1 and isinstance(members[0].node, ast.FunctionDef):
                return self._resolve_binding(members[0], environment, depth)
            return None
        self._build_methods(owner)
        assigned = owner.instance_attributes.get(attribute, [])
        if len(assigned) != 1 or assigned[0].value is None:
            return None
        binding = assigned[0]
        return self.resolve(binding.value, binding.scope, binding.position, {}, depth + 1)

    def _overridden(self, owner: Scope, attribute: str) -> bool:
        """``def <attribute>`` or ``.<attribute> =`` in a subclass of ``owner`` in this file."""
        subclasses = self._subclasses(owner.node)
        if not subclasses:
            return False
        for line in self._lines_naming(attribute):
            if not any(c.lineno <= line <= (c.end_lineno or c.lineno) for c in subclasses):
                continue
            text = self.lines[line - 1]
            if f"def {attribute}(" in text or f".{attribute} =" in text or f".{attribute}:" in text:
                return True
        return False

    def _subclasses(self, node: ast.AST) -> list[ast.ClassDef]:
        """Classes of this module deriving from ``node``, directly or not (by base name)."""
        if not isinstance(node, ast.ClassDef):
            return []
        if id(node) in self._subclasses_of:
            return self._subclasses_of[id(node)]
        found: list[ast.ClassDef] = self._subclasses_of.setdefault(id(node), [])
        names = {node.name}
        grew = True
        while grew:
            grew = False
            for statement in self.tree.body:
                if (
                    isinstance(statement, ast.ClassDef)
                    and statement not in found
                    and statement is not node
                    and any(_base_name(base) in names for base in statement.bases)
                ):
                    found.append(statement)
                    names.add(statement.name)
                    grew = True
        return found

    def _resolve_call(
        self, call: ast.Call, scope: Scope, environment: Environment, depth: int
    ) -> Region | None:
        position = node_position(call)
        qualified = self.qualified_name(call.func, scope, position)
        if qualified == PARTIAL:
            if not call.args or isinstance(call.args[0], ast.Starred):
                return None
            inner = self.resolve(call.args[0], scope, position, environment, depth + 1)
            return None if inner is None else Partial(inner)
        if qualified is not None:
            if qualified.startswith("torch.nn.") and qualified.rsplit(".", 1)[-1][:1].isupper():
                return TorchModule(qualified, call, scope, environment)
            return None
        local_class = self._local_class(call.func, scope, position)
        if local_class is not None:
            return self._instance_of(local_class)
        callee = self.resolve(call.func, scope, position, environment, depth + 1)
        if isinstance(callee, Function):
            return self._product_of_factory(callee, call, scope, environment)
        return None

    def _local_class(
        self, expression: ast.expr, scope: Scope, position: Position
    ) -> ast.ClassDef | None:
        if not isinstance(expression, ast.Name):
            return None
        bindings = scope.lookup(expression.id, position)
        if len(bindings) == 1 and isinstance(bindings[0].node, ast.ClassDef):
            return bindings[0].node
        return None

    def _instance_of(self, node: ast.ClassDef) -> LocalModule | None:
        """Calling an instance of a class of this file runs the ``forward`` it defines (unless
        it defines its own ``__call__``)."""
        class_scope = self.scopes.function_scope(node)
        if node.decorator_list or class_scope is None or "__call__" in class_scope.bindings:
            return None
        methods = class_scope.bindings.get("forward", [])
        if len(methods) != 1 or not isinstance(methods[0].node, ast.FunctionDef):
            return None
        forward = self._resolve_binding(methods[0], {}, 0)
        return LocalModule(forward) if isinstance(forward, Function) else None

    def _resolve_element(
        self,
        expression: ast.Subscript,
        scope: Scope,
        position,
        environment: Environment,
        depth: int,
    ) -> Region | None:
        """An element of ``nn.ModuleList([<module> for ...])``: every element is alike."""
        container = self.resolve(expression.value, scope, position, environment, depth + 1)
        if not isinstance(container, TorchModule) or container.class_name not in (
            "ModuleList",
            "Sequential",
        ):
            return None
        arguments = container.construction.args
        if len(arguments) != 1 or not isinstance(arguments[0], (ast.ListComp, ast.GeneratorExp)):
            return None
        element = arguments[0].elt
        element_scope = self.scopes.function_scope(arguments[0]) or container.scope
        region = self.resolve(
            element, element_scope, node_position(element), container.environment, depth + 1
        )
        return region if isinstance(region, TorchModule) else None

    def _product_of_factory(
        self, factory: Function, call: ast.Call, scope: Scope, environment: Environment
    ) -> Region | None:
        """``make(layer)`` where ``make`` returns a def or lambda it creates: that function,
        with ``make``'s parameters bound to the call's arguments."""
        node = factory.node
        if (
            isinstance(node, ast.Lambda)
            or any(isinstance(a, ast.Starred) for a in call.args)
            or any(k.arg is None for k in call.keywords)
        ):
            return None
        returned = [
            statement.value
            for statement in own_nodes(node.body)
            if isinstance(statement, ast.Return) and statement.value is not None
        ]
        if len(returned) != 1:
            return None
        product = returned[0]
        if isinstance(product, ast.Name):
            bindings = factory.scope.bindings.get(product.id, [])
            if len(bindings) != 1 or not isinstance(
                bindings[0].node, (ast.FunctionDef, ast.AsyncFunctionDef)
            ):
                return None
            product = bindings[0].node
        if not isinstance(product, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return None
        product_scope = self.scopes.function_scope(product)
        if product_scope is None:
            return None
        bound: Environment = {}
        parameters = [*node.args.posonlyargs, *node.args.args]
        if factory.scope.self_name is not None:
            parameters = parameters[1:]  # a method, called bound: ``self`` is not an argument
        for parameter, argument in zip(parameters, call.args, strict=False):
            bound[id(parameter)] = Argument(argument, scope, environment)
        by_name = {p.arg: p for p in (*parameters, *node.args.kwonlyargs)}
        for keyword in call.keywords:
            if keyword.arg in by_name:
                bound[id(by_name[keyword.arg])] = Argument(keyword.value, scope, environment)
        return Function(product, product_scope, bound)

    # -- names ---------------------------------------------------------------------------
    def qualified_name(self, expression: ast.expr, scope: Scope, position: Position) -> str | None:
        """``torch.nn.functional.gelu`` for ``F.gelu`` when ``F`` is imported; else None."""
        if isinstance(expression, ast.Attribute):
            base = self.qualified_name(expression.value, scope, position)
            return None if base is None else f"{base}.{expression.attr}"
        if isinstance(expression, ast.Name):
            bindings = scope.lookup(expression.id, position)
            if len(bindings) == 1 and bindings[0].imported is not None:
                return bindings[0].imported
        return None

    def class_of_instance(
        self, expression: ast.expr, scope: Scope, position: Position
    ) -> Scope | None:
        """The class scope when ``expression`` is a method's instance parameter (``self``)."""
        if not isinstance(expression, ast.Name):
            return None
        bindings = scope.lookup(expression.id, position)
        if len(bindings) != 1 or not isinstance(bindings[0].node, ast.arg):
            return None
        method_scope = bindings[0].scope
        if method_scope.self_name != expression.id:
            return None
        return method_scope.enclosing_class

    def _build_methods(self, owner: Scope) -> None:
        """Visit every method of a class so that its ``self.<attr> = ...`` are recorded."""
        if id(owner) in self._classes_built:
            return
        self._classes_built.add(id(owner))
        for statement in owner.node.body:  # type: ignore[attr-defined]
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.scopes.function_scope(statement)

    def module_binding_kind(self, name: str, scope: Scope, position: Position) -> str | None:
        """ "data" when ``name`` refers only to module-level assignments, "other" when it refers
        to module-level imports, functions or classes, None when it is not a module global."""
        bindings = scope.lookup(name, position)
        if not bindings or any(b.scope.kind != "module" for b in bindings):
            return None
        if any(isinstance(b.node, (*_DEFINITIONS, ast.Import, ast.ImportFrom)) for b in bindings):
            return "other"  # relative imports carry no qualified name: test the statement
        return "data"

    # -- what a region runs --------------------------------------------------------------
    def reach(self, call: CheckpointCall) -> Reach:
        """Functions, modules and effects of the region of ``call`` and of what it calls."""
        key = id(call.node)
        if key not in self._reaches:
            reach = Reach()
            region = self.region(call)
            if region is not None:
                self._collect(region, reach, 0, set())
            self._reaches[key] = reach
        return self._reaches[key]

    def _collect(self, region: Region, reach: Reach, depth: int, seen: set[int]) -> None:
        if depth > MAX_CALL_DEPTH:
            return
        if isinstance(region, Partial):
            self._collect(region.inner, reach, depth, seen)
        elif isinstance(region, TorchFunction):
            draw = _random_function_draw(region.qualified, None)
            if draw is not None:
                reach.draws.append(draw)
        elif isinstance(region, TorchModule):
            if module_draws_random(region):
                line = region.construction.lineno
                reach.draws.append(RandomDraw(f"`nn.{region.class_name}` (line {line})", line))
            if region.class_name in ("Sequential", "ModuleList", "ModuleDict"):
                for element in region.construction.args:
                    inner = self.resolve(
                        element, region.scope, node_position(element), region.environment, 0
                    )
                    if inner is not None:
                        self._collect(inner, reach, depth + 1, seen)
        elif isinstance(region, LocalModule):
            self._collect(region.forward, reach, depth, seen)
        elif isinstance(region, Function):
            if id(region.node) in seen:
                return
            seen.add(id(region.node))
            reach.functions.append(region)
            facts = self.facts(region)
            reach.reads.extend(facts.reads)
            reach.writes.extend(facts.writes)
            reach.draws.extend(facts.draws)
            for called in facts.calls:
                callee = self.resolve(
                    called.func, region.scope, node_position(called), region.environment, 0
                )
                if isinstance(callee, TorchFunction):
                    draw = _random_function_draw(callee.qualified, called)
                    if draw is not None:
                        reach.draws.append(draw)
                elif callee is not None:
                    self._collect(callee, reach, depth + 1, seen)

    def nodes_with_scopes(self, statements: list, scope: Scope) -> Iterator[tuple[ast.AST, Scope]]:
        """Like ``own_nodes``, with the scope each node is evaluated in (comprehensions have
        their own); a comprehension whose scope was never built is left out."""
        stack = [(node, scope) for node in reversed(statements)]
        while stack:
            node, node_scope = stack.pop()
            yield node, node_scope
            if isinstance(node, COMPREHENSIONS):
                inner = self.scopes.scope_of_function.get(id(node))
                if inner is not None:
                    stack.extend((child, inner) for child in reversed(_children_run_here(node)))
                continue
            stack.extend((child, node_scope) for child in reversed(_children_run_here(node)))

    def facts(self, function: Function) -> _FunctionFacts:
        key = id(function.node)
        if key not in self._facts:
            self._facts[key] = self._facts_of(function)
        return self._facts[key]

    def _facts_of(self, function: Function) -> _FunctionFacts:
        body = function.node.body
        statements = [body] if isinstance(body, ast.expr) else body
        facts = _FunctionFacts([], [], [], [])
        for node, scope in self.nodes_with_scopes(statements, function.scope):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                if self.module_binding_kind(node.id, scope, node_position(node)) == "data":
                    facts.reads.append(GlobalRead(node.id, node.lineno))
            elif isinstance(node, ast.Call):
                facts.calls.append(node)
                draw = _random_method_draw(node)
                if draw is not None:
                    facts.draws.append(draw)
            if isinstance(node, ast.stmt):
                facts.writes.extend(
                    write
                    for write in self._global_writes(node, scope)
                    if not _guarded_by_test_of(statements, write)
                )
        return facts

    def _global_writes(self, statement: ast.stmt, scope: Scope) -> Iterator[GlobalWrite]:
        """Rebinding of a ``global`` name, or mutation of a module-level data object."""
        for target in _assigned_targets(statement):
            if isinstance(target, ast.Name):
                if target.id in scope.global_names:
                    yield GlobalWrite(target.id, statement.lineno, "assigns")
                continue
            root = _root_name(target)
            if root is not None and self._is_module_data(root, scope):
                yield GlobalWrite(root.id, statement.lineno, "mutates")
        for node in _header_nodes(statement):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in MUTATING_METHODS
            ):
                root = _root_name(node.func.value)
                if root is not None and self._is_module_data(root, scope):
                    yield GlobalWrite(root.id, node.lineno, "mutates")

    def _is_module_data(self, name: ast.Name, scope: Scope) -> bool:
        return self.module_binding_kind(name.id, scope, node_position(name)) == "data"

    # -- changes of globals anywhere in the file -----------------------------------------
    def changes_of_global(self, name: str) -> list[GlobalWrite]:
        """Where functions of this file rebind or mutate the module global ``name``.

        Module-level statements run once at import, before any checkpoint, so only changes
        made inside functions (which may run between a forward and its backward) count.
        """
        if name not in self._changes:
            self._changes[name] = self._find_changes(name)
        return self._changes[name]

    def _find_changes(self, name: str) -> list[GlobalWrite]:
        changes: list[GlobalWrite] = []
        for line in self._lines_naming(name):
            path = statements_at(self.tree.body, line)
            functions = [n for n in path if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
            if not functions or isinstance(path[-1], _DEFINITIONS):
                continue
            if len(functions) == 1 and self._runs_at_import_only(functions[0], path):
                continue
            scope = None
            for definition in path:  # outermost first: building one builds those inside
                if isinstance(definition, _DEFINITIONS):
                    scope = self.scopes.function_scope(definition)
            if scope is None:
                continue
            for write in self._global_writes(path[-1], scope):
                if (
                    write.name == name
                    and write not in changes
                    and not _guarded_by_test_of(functions[-1].body, write)
                ):
                    changes.append(write)
        return changes

    def _lines_naming(self, name: str) -> list[int]:
        """Lines where ``name`` appears as a whole identifier (a text search, no parsing)."""
        return sorted(lines_with_words(self.lines, [name]))

    def _runs_at_import_only(self, function: ast.AST, path: list[ast.stmt]) -> bool:
        """A module-level function this file uses only at module or class level (a registry's
        ``register`` decorator, a set-up call): it runs at import, before any checkpoint."""
        if path[0] is not function:
            return False
        name = function.name  # type: ignore[attr-defined]
        uses = [line for line in self._lines_naming(name) if line != function.lineno]  # type: ignore[attr-defined]
        return bool(uses) and not any(
            isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef))
            for line in uses
            for statement in statements_at(self.tree.body, line)
        )


def _base_name(base: ast.expr) -> str | None:
    if isinstance(base, ast.Name):
        return base.id
    return base.attr if isinstance(base, ast.Attribute) else None


def _torch_function(qualified: str) -> TorchFunction | None:
    return TorchFunction(qualified) if qualified.split(".", 1)[0] == "torch" else None


RANDOM_FUNCTIONS = frozenset(
    "rand rand_like randn randn_like randint randint_like randperm bernoulli multinomial"
    " normal poisson dropout alpha_dropout feature_alpha_dropout dropout1d dropout2d dropout3d"
    " rrelu rrelu_ gumbel_softmax fractional_max_pool2d fractional_max_pool3d".split()
)
RANDOM_METHODS = frozenset(
    "bernoulli bernoulli_ normal_ uniform_ random_ exponential_ geometric_ cauchy_ log_normal_"
    " multinomial".split()
)
RANDOM_MODULES = frozenset(
    "Dropout Dropout1d Dropout2d Dropout3d AlphaDropout FeatureAlphaDropout RReLU".split()
)
_RANDOM_NAMESPACES = ("torch", "torch.nn.functional", "torch.nn.init")


def _random_function_draw(qualified: str, call: ast.Call | None) -> RandomDraw | None:
    """A call of (or, without ``call``, a region that is) a random torch function."""
    namespace, _, short = qualified.rpartition(".")
    if namespace not in _RANDOM_NAMESPACES:
        return None
    if short not in RANDOM_FUNCTIONS and short not in RANDOM_METHODS:
        return None
    if call is None:
        return RandomDraw(f"`{qualified}`", 0)
    if "dropout" in short and (
        _literal_argument(call, "p", 1) == 0 or _literal_argument(call, "training", 2) is False
    ):
        return None
    return RandomDraw(f"`{qualified}`", call.lineno)


def _random_method_draw(call: ast.Call) -> RandomDraw | None:
    """``tensor.normal_()`` and the like: names no other common type has."""
    if isinstance(call.func, ast.Attribute) and call.func.attr in RANDOM_METHODS:
        return RandomDraw(f"`.{call.func.attr}()`", call.lineno)
    return None


def module_draws_random(module: TorchModule) -> bool:
    """A dropout-like module whose probability is not the literal 0."""
    if module.class_name not in RANDOM_MODULES:
        return False
    return _literal_argument(module.construction, "p", 0) != 0


def _literal_argument(call: ast.Call, keyword: str, index: int) -> object:
    """A constant argument's value, or None when it is absent or not a constant."""
    for given in call.keywords:
        if given.arg == keyword:
            return given.value.value if isinstance(given.value, ast.Constant) else None
    if len(call.args) > index and isinstance(call.args[index], ast.Constant):
        return call.args[index].value  # type: ignore[attr-defined]
    return None


def own_nodes(statements: list) -> Iterator[ast.AST]:
    """Nodes of a body, not descending into nested definitions (their code runs only if
    called) but including their defaults and decorators."""
    stack = list(reversed(statements))
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(_children_run_here(node)))


def own_body(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.stmt]:
    """The statements of a def, without its docstring."""
    body = node.body
    first = body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        return body[1:]
    return body


def _children_run_here(node: ast.AST) -> list[ast.AST]:
    """Child nodes evaluated where ``node`` is, leaving out the bodies of definitions."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        arguments = node.args
        defaults = [d for d in (*arguments.defaults, *arguments.kw_defaults) if d]
        return [*getattr(node, "decorator_list", []), *defaults]
    if isinstance(node, ast.ClassDef):
        return [*node.decorator_list, *node.bases]
    return list(ast.iter_child_nodes(node))


def _assigned_targets(statement: ast.stmt) -> list[ast.expr]:
    if isinstance(statement, ast.Assign):
        targets: list[ast.expr] = []
        for target in statement.targets:
            targets.extend(_flatten_target(target))
        return targets
    if isinstance(statement, (ast.AugAssign, ast.AnnAssign)):
        return (
            [statement.target]
            if statement.value is not None or isinstance(statement, ast.AugAssign)
            else []
        )
    if isinstance(statement, ast.Delete):
        return [t for t in statement.targets if not isinstance(t, ast.Name)]
    return []


def _flatten_target(target: ast.expr) -> list[ast.expr]:
    if isinstance(target, (ast.Tuple, ast.List)):
        return [t for element in target.elts for t in _flatten_target(element)]
    if isinstance(target, ast.Starred):
        return _flatten_target(target.value)
    return [target]


def _root_name(expression: ast.expr) -> ast.Name | None:
    """``CACHE`` in ``CACHE[key].items``; None when the chain goes through a call."""
    while isinstance(expression, (ast.Attribute, ast.Subscript)):
        expression = expression.value
    return expression if isinstance(expression, ast.Name) else None


_BODY_FIELDS = ("body", "orelse", "finalbody", "handlers", "cases")


def _header_nodes(statement: ast.stmt) -> Iterator[ast.AST]:
    """Nodes of a statement outside its nested statement bodies and definitions."""
    if isinstance(statement, _DEFINITIONS):
        return
    stack: list[ast.AST] = []
    for name, value in ast.iter_fields(statement):
        if name in _BODY_FIELDS:
            continue
        if isinstance(value, ast.AST):
            stack.append(value)
        elif isinstance(value, list):
            stack.extend(v for v in value if isinstance(v, ast.AST))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, ast.Lambda):
            stack.extend(ast.iter_child_nodes(node))


def _guarded_by_test_of(body: list[ast.stmt], write: GlobalWrite) -> bool:
    """A write under ``if`` testing the same global (``if key not in CACHE:``, ``if KERNEL is
    None:``): a lazy initialisation or a memo, which a second run leaves as it was."""
    return any(
        isinstance(statement, ast.If)
        and write.line > statement.test.end_lineno  # type: ignore[operator]
        and any(
            isinstance(node, ast.Name) and node.id == write.name
            for node in ast.walk(statement.test)
        )
        for statement in statements_at(body, write.line)
    )


def statements_at(body: list[ast.stmt], line: int) -> list[ast.stmt]:
    """The statements containing ``line``, outermost first, by bisecting bodies."""
    path: list[ast.stmt] = []
    while body:
        index = bisect_right([s.lineno for s in body], line) - 1
        if index < 0:
            break
        statement = body[index]
        if (statement.end_lineno or statement.lineno) < line:
            break
        path.append(statement)
        body = _body_containing(statement, line)
    return path


def _body_containing(statement: ast.stmt, line: int) -> list[ast.stmt]:
    bodies: list[list[ast.stmt]] = []
    for name in ("body", "orelse", "finalbody"):
        value = getattr(statement, name, None)
        if isinstance(value, list):
            bodies.append(value)
    bodies.extend(handler.body for handler in getattr(statement, "handlers", []))
    bodies.extend(case.body for case in getattr(statement, "cases", []))
    for body in bodies:
        if body and body[0].lineno <= line <= (body[-1].end_lineno or body[-1].lineno):
            return body
    return []
