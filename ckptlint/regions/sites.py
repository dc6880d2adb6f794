"""Region sites: the places in a module where code is handed to a recompute mechanism.

A site is a call of a region source (directly, through ``functools.partial`` chains, through
a project's own wrapper functions at any depth and in any module) or a class deriving from a
``layer`` source (transformers' ``GradientCheckpointingLayer``: its ``forward`` is the
region). For each site the layer records what the source finally receives, with every
argument paired with the context it is evaluated in, so the region and keywords such as
``preserve_rng_state`` are evaluated where they were written, through every wrapper.

Wrappers are found, not configured: a function whose source call's region depends on its
own parameters (or on those of the functions it is nested in) hands its callers' argument
on; a call of it is a site, its inner call only a delegation.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass

from ckptlint.lazy_tree import mark_read
from ckptlint.memos import process_memo
from ckptlint.project.index import Module
from ckptlint.project.scopes import (
    FUNCTIONS,
    Scope,
    nested_bodies,
    statements_at,
    statements_touching,
    touches_lines,
)
from ckptlint.regions.calls import calls_in_body, calls_on_lines
from ckptlint.regions.custom import recompute_function
from ckptlint.regions.sources import RegionSource, SourceTable
from ckptlint.regions.summaries import MAX_TRANSFERS, HandOn, as_defined, enclosing_functions
from ckptlint.resolution.bodies import own_nodes
from ckptlint.resolution.evaluator import Evaluator
from ckptlint.resolution.mappings import Passed, flows_of, held
from ckptlint.resolution.values import (
    UNKNOWN,
    Argument,
    Arguments,
    ClassValue,
    Context,
    External,
    Flow,
    FunctionValue,
    Instance,
    Method,
    Parameter,
    PartialValue,
    Values,
    known,
)
from ckptlint.resolution.versions import EVERY_VERSION, VersionRange


@dataclass(frozen=True)
class SourceCall:
    """What one region source finally receives on one path from a site."""

    source: RegionSource
    arguments: Arguments
    wrappers: tuple[FunctionValue, ...] = ()  # project wrappers passed through, outermost first
    partials: tuple[PartialValue, ...] = ()  # partials passed through, outermost first

    @property
    def call(self) -> ast.Call:
        """The call of the source itself (innermost)."""
        return self.arguments.calls[-1]

    def region_flow(self) -> Flow | None:
        index, keyword = self.source.region
        return self.arguments.get(index, keyword)

    def keyword(self, name: str) -> Flow | None:
        return self.arguments.keywords.get(name)


@dataclass(eq=False)
class Site:
    """A place in ``module`` that makes code a region.

    ``node`` is where findings are reported: the call, or a layer's ``def forward``.
    ``paths`` are the source calls it may reach (several when branches or wrappers differ);
    a layer site has none, but ``layer`` (the class) and ``layer_source``.
    ``delegates``: the call is inside a wrapper and its region is the wrapper's argument,
    so its callers are the sites that matter.
    """

    module: Module
    node: ast.AST
    context: Context
    paths: tuple[SourceCall, ...] = ()
    layer: ClassValue | None = None
    layer_source: RegionSource | None = None
    delegates: bool = False
    torch: VersionRange = EVERY_VERSION  # the torch versions the site's code runs on
    decorator: str = ""  # a def put under checkpoint by this decorator (``checkpoint_method``)

    @property
    def sources(self) -> list[RegionSource]:
        if self.layer_source is not None:
            return [self.layer_source]
        return list(dict.fromkeys(path.source for path in self.paths))

    @property
    def subject(self) -> str:
        """How messages name the region: "`checkpoint()` region", or for a layer
        "`Block.forward` (recomputed by `GradientCheckpointingLayer`)"."""
        if self.layer is not None and self.layer_source is not None:
            return f"`{self.layer.node.name}.forward` (recomputed by `{self.layer_source.label}`)"
        if self.decorator:
            owner = self.context.scope.node
            name = self.node.name  # type: ignore[attr-defined]
            if isinstance(owner, ast.ClassDef):
                name = f"{owner.name}.{name}"
            return f"`{name}` (recomputed by `@{self.decorator}`)"
        if all(not path.wrappers for path in self.paths):
            return f"`{self.paths[0].source.label}()` region"
        return f"`{callee_label(self.node.func)}()` region"  # type: ignore[attr-defined]


class SiteFinder:
    """Finds the sites of modules and tells which functions are wrappers (memoised)."""

    def __init__(self, evaluator: Evaluator, table: SourceTable) -> None:
        self.evaluator = evaluator
        self.solver = evaluator.solver
        self.guesser = Evaluator(
            evaluator.project,
            duck_typing=True,
            target_torch=evaluator.target_torch,
            solver=evaluator.solver,
        )
        self.table = table
        # Last names of the layer sources: a class naming one as a base may derive from it.
        self.layer_words = frozenset(
            name.rsplit(".", 1)[-1] for name, s in table.by_name.items() if s.kind == "layer"
        )
        self._recomputes: dict[int, RegionSource | None] = {}
        self.hand_on = HandOn(self)

    # -- what a callee is ------------------------------------------------------------------
    def paths(
        self,
        callee: Values,
        arguments: Arguments,
        func: ast.expr | None = None,
        where: Context | None = None,
    ) -> list[SourceCall]:
        """The source calls reached by calling any of ``callee`` with ``arguments`` (at the
        call written in ``where``, when known: a class called there makes an instance)."""
        found: list[SourceCall] = []
        for value in callee:
            found.extend(self._paths_of(value, arguments, where))
        if isinstance(func, ast.Attribute) and func.attr in self.table.by_attribute:
            source = self.table.by_attribute[func.attr]
            if not any(path.source is source for path in found):
                found.append(SourceCall(source, arguments))
        return found

    def _paths_of(
        self, value: object, arguments: Arguments, where: Context | None = None
    ) -> list[SourceCall]:
        source = self.source_of(value)
        if source is not None and isinstance(value, FunctionValue) and source.configured:
            # A configured function the project defines: its own body says what it does
            # with the region and with ``use_reentrant``, as for any project wrapper.
            return self._wrapper_paths(value, arguments) or [
                SourceCall(as_defined(source, value), arguments)
            ]
        if source is not None:
            return [SourceCall(source, arguments)]
        if isinstance(value, PartialValue):
            merged = Arguments((), {}, False, ()).then(value.call, value.context, skip=1)
            merged = Arguments(
                (*merged.positional, *arguments.positional),
                {**merged.keywords, **arguments.keywords},
                merged.double_star or arguments.double_star,
                arguments.calls,
            )
            return [
                SourceCall(p.source, p.arguments, p.wrappers, (value, *p.partials))
                for p in self.paths(value.inner, merged)
            ]
        if isinstance(value, FunctionValue):
            return self._wrapper_paths(value, arguments)
        if isinstance(value, ClassValue) and where is not None and arguments.calls:
            return self.class_paths(value, Instance(value, arguments.calls[-1], where))
        return []

    def _wrapper_paths(self, value: FunctionValue, arguments: Arguments) -> list[SourceCall]:
        """The source calls a project wrapper makes when called with ``arguments``: its
        summary applied to them."""
        found: list[SourceCall] = []
        for transfer in self.hand_on.summary(value):
            found.extend(self.hand_on.resolve(transfer, arguments, value))
        return found[:MAX_TRANSFERS]

    def class_paths(self, cls: ClassValue, instance: Instance) -> list[SourceCall]:
        """The source calls an instance of a module class makes when its ``forward``
        checkpoints what its constructor was given (MONAI's ActivationCheckpointWrapper)."""
        inner_calls = self.wrapper_class_calls(cls)
        if not inner_calls:
            return []
        found: list[SourceCall] = []
        with self.solver.guard(("expanding", cls.node)) as entered:
            if not entered:
                return []
            for forward in self.evaluator.member((instance,), "forward"):
                if not isinstance(forward, FunctionValue):
                    continue
                context = self.evaluator.bind(forward, None)
                for call in inner_calls:
                    callee = self.evaluator.evaluate(call.func, context)
                    arguments = Arguments.of(call, context)
                    for path in self.paths(callee, arguments, call.func, context):
                        found.append(
                            SourceCall(
                                path.source,
                                path.arguments,
                                (forward, *path.wrappers),
                                path.partials,
                            )
                        )
        return found[:MAX_TRANSFERS]

    def wrapper_class_calls(self, cls: ClassValue) -> list[ast.Call]:
        """The calls in a class's ``forward`` whose region is what its ``__init__`` was
        given (``self.module = module`` ... ``checkpoint(self.module, x)``); empty for a
        class that is no such wrapper."""
        key = ("wrapper class calls", cls.node, cls.context.module)
        return self.solver.ask(key, self._wrapper_class_calls, cls, fallback=[])

    def _wrapper_class_calls(self, cls: ClassValue) -> list[ast.Call]:
        found: list[ast.Call] = []
        owners = [c for c in self.evaluator.mro(cls) if isinstance(c, ClassValue)]
        if not _may_wrap(owners):
            return found
        initialisers = {
            id(statement)
            for owner in self.evaluator.mro(cls)
            if isinstance(owner, ClassValue)
            for statement in owner.node.body
            if isinstance(statement, FUNCTIONS) and statement.name == "__init__"
        }
        forwards = self.evaluator.member((Instance(cls),), "forward")
        for forward in forwards if initialisers else ():
            if not isinstance(forward, FunctionValue) or isinstance(forward.node, ast.Lambda):
                continue
            bound = self.evaluator.bind(forward, None)
            for node, scope in calls_in_body(forward.node.body, bound.scope, forward.module):
                context = bound.at(scope)
                callee = self.evaluator.evaluate(node.func, context)
                for path in self.paths(callee, Arguments.of(node, context), node.func, context):
                    flow = path.region_flow()
                    values = self.evaluator.evaluate(*flow) if flow is not None else ()
                    if any(
                        isinstance(v, Parameter) and id(v.function) in initialisers for v in values
                    ):
                        found.append(node)
                        break
        return found

    # -- keywords a source receives ----------------------------------------------------------
    def keyword(self, path: SourceCall, name: str) -> Flow | None:
        """What the source receives as ``name``: passed by name, or inside a ``**mapping``
        (a wrapper's ``**kwargs`` from its callers' keywords, as the wrapper edited it, or a
        dict; see ``resolution.mappings``)."""
        found = path.arguments.keywords.get(name)
        pending = list(path.arguments.spread)
        for _ in range(MAX_TRANSFERS):
            if found is not None or not pending:
                break
            expression, context = pending.pop(0)
            state = held(self.evaluator, expression, context, name)
            flows = flows_of(state, name)
            found = flows[0] if flows else None
            for item in state:  # what the callers spread into the keywords they pass
                if isinstance(item, Passed):
                    pending.extend(item.keywords.arguments.spread)
        return found

    def source_of(self, value: object) -> RegionSource | None:
        """The table row a value is, by its qualified name; for ``C.apply`` of a project's
        own ``torch.autograd.Function`` that recomputes, the row it makes (memoised)."""
        if isinstance(value, External):
            return self.table.by_name.get(value.name)
        if isinstance(value, FunctionValue):
            return self.table.by_name.get(qualified_name(value))
        if isinstance(value, ClassValue):
            return self.table.by_name.get(qualified_name(value))
        if isinstance(value, Method) and isinstance(value.receiver, ClassValue):
            if value.name == "apply":
                return self.recompute_function(value.receiver)
        return None

    def recompute_function(self, cls: ClassValue) -> RegionSource | None:
        key = id(cls.node)
        mark_read(cls.node)  # the row is made from the class body
        if key not in self._recomputes:
            self._recomputes[key] = recompute_function(cls, qualified_name(cls))
        return self._recomputes[key]

    def wrapper_calls(self, function: FunctionValue) -> list[ast.Call]:
        """The calls in ``function``'s body that hand a parameter on as a region (empty for a
        function that is not a wrapper), from its summary."""
        return list(dict.fromkeys(t.call for t in self.hand_on.summary(function)))

    def delegates(self, path: SourceCall, scope: Scope) -> bool:
        """Whether the region is code the caller passes in: a parameter (or a partial of one,
        or a closure calling one) of the function making the call at ``scope`` or of one
        around it, also when it reaches the source through wrappers."""
        flow = path.region_flow()
        if flow is None:
            return False
        values = self.evaluator.evaluate(*flow)
        return bool(self.hand_on.parameters_in(values, enclosing_functions(scope)))

    # -- sites of a module -----------------------------------------------------------------
    def sites(
        self, module: Module, lines: list[int], layer_words: frozenset[str]
    ) -> Iterator[Site]:
        """Sites at the calls on ``lines`` (those naming a word of interest), at the
        ``forward`` of classes deriving from a layer source (a base named by one of
        ``layer_words``), and at definitions a decorator on ``lines`` checkpoints."""
        for call, scope in calls_on_lines(module, lines):
            site = self.solver.ask(
                ("call site", call), self._call_site, module, call, scope, fallback=None
            )
            if site is not None:
                yield site
        yield from self.layer_sites(module, layer_words)
        yield from self.decorated_sites(module, lines)

    def _call_site(self, module: Module, call: ast.Call, scope: Scope) -> Site | None:
        """The site a call is, if any: what it reaches does not depend on which words led
        to its line, so each call is looked at once a run."""
        context = Context(module, scope)
        flags = _flags_tested_true(module, call)
        if flags:  # ``if self.enabled: self._ckpt_fn(...)``
            receiver = self.evaluator.evaluate(call.func.value, context)  # type: ignore[attr-defined]
            callee = self.evaluator.member_under(receiver, call.func.attr, flags)  # type: ignore[attr-defined]
        else:
            callee = self.evaluator.evaluate(call.func, context)
        paths = self.paths(callee, Arguments.of(call, context), call.func, context)
        if not paths:
            return None
        torch = self.evaluator.versions_at(module, call)
        if torch.empty:
            return None  # a branch that never runs on the torch the project targets
        delegates = any(self.delegates(path, scope) for path in paths)
        return Site(module, call, context, tuple(paths), delegates=delegates, torch=torch)

    def decorated_sites(self, module: Module, lines: list[int]) -> Iterator[Site]:
        """Definitions (at module level or in a class) whose decorator runs them under a
        region source: nanotron's ``@checkpoint_method(attr_name=...)`` returns a function
        that calls ``checkpoint(func, ...)`` on the method it decorates."""
        for node, owner in _definitions_at_top(module, lines):
            for decorator in node.decorator_list:
                if not touches_lines(decorator, lines):
                    continue
                scope = module.scopes.function_scope(owner) if owner is not None else None
                context = Context(module, scope or module.scopes.module)
                decorated = FunctionValue(node, context)
                paths = [
                    path
                    for value in self.evaluator.evaluate(decorator, context)
                    if isinstance(value, FunctionValue)
                    for path in self.decorator_paths(value, decorated)
                ]
                torch = self.evaluator.versions_at(module, node)
                if paths and not torch.empty:
                    label = callee_label(
                        decorator.func if isinstance(decorator, ast.Call) else decorator
                    )
                    yield Site(module, node, context, tuple(paths), torch=torch, decorator=label)
                    break

    def decorator_paths(
        self, decorator: FunctionValue, decorated: FunctionValue
    ) -> list[SourceCall]:
        """The source calls of the functions ``decorator`` returns when it decorates
        ``decorated`` whose region is ``decorated`` itself."""
        node = decorator.node
        parameters = [*node.args.posonlyargs, *node.args.args]
        if isinstance(node, ast.Lambda) or not parameters or decorator.bound is not None:
            return []
        given = (parameters[0], Argument(None, None, (decorated,)))
        inner = self.evaluator.context(
            decorator.module, self.evaluator.scope_of(decorator), (*decorator.context.env, given)
        )
        found: list[SourceCall] = []
        for statement in own_nodes(node.body):
            if not isinstance(statement, ast.Return) or statement.value is None:
                continue
            for returned in self.evaluator.evaluate(statement.value, inner):
                if not isinstance(returned, FunctionValue) or returned.node is node:
                    continue
                context = self.evaluator.bind(returned, None)
                body = returned.node.body
                for call in own_nodes(body):
                    if not isinstance(call, ast.Call):
                        continue
                    callee = self.evaluator.evaluate(call.func, context)
                    arguments = Arguments.of(call, context)
                    for path in self.paths(callee, arguments, call.func, context):
                        flow = path.region_flow()
                        if flow is not None and decorated in self.evaluator.evaluate(*flow):
                            found.append(
                                SourceCall(
                                    path.source,
                                    path.arguments,
                                    (returned, *path.wrappers),
                                    path.partials,
                                )
                            )
        return found[:MAX_TRANSFERS]

    def layer_sites(self, module: Module, layer_words: frozenset[str]) -> Iterator[Site]:
        """Classes a base of which is named by one of ``layer_words`` (the last names of
        layer sources and of the project's classes found deriving from one) and that do
        derive from a layer source."""
        context = self.evaluator.module_context(module)
        for node in classes_at_top(module.tree.body):
            if not may_derive_from_a_layer(node, layer_words):
                continue
            cls = ClassValue(node, context)
            source = self.layer_source(cls)
            forward = _own_method(node, "forward")
            if source is None or forward is None:
                continue
            torch = self.evaluator.versions_at(module, node)
            if not torch.empty:
                yield Site(module, forward, context, layer=cls, layer_source=source, torch=torch)

    def layer_source(self, cls: ClassValue) -> RegionSource | None:
        """The ``layer`` row a class derives from, if any."""
        for ancestor in self.evaluator.mro(cls)[1:]:
            source = self.source_of(ancestor)
            if source is not None and source.kind == "layer":
                return source
        return None

    def region_values(self, site: Site) -> Values:
        """What the site makes a region: functions, modules, partials (UNKNOWN if unseen)."""
        if site.layer is not None:
            forward = _own_method(site.layer.node, "forward")
            scope = self.evaluator.scope_of(site.layer)
            function = FunctionValue(forward, Context(site.module, scope))  # type: ignore[arg-type]
            return (
                FunctionValue(
                    function.node, function.context, (Instance(site.layer, exact=False),)
                ),
            )
        values: list[object] = []
        for path in site.paths:
            flow = path.region_flow()
            if flow is None:
                values.append(UNKNOWN)
            elif path.source.kind == "apply":
                values.extend(self._selected_modules(path))
            else:
                found = self.evaluator.evaluate(*flow)
                if not known(found):  # nothing says what it is: guess from its attributes
                    found = self.guesser.evaluate(*flow)
                values.extend(found)
        return tuple(dict.fromkeys(values))  # type: ignore[arg-type]

    def _selected_modules(self, path: SourceCall) -> Values:
        """``apply_activation_checkpointing``: instances of the classes its ``check_fn``
        tests with ``isinstance`` or its ``auto_wrap_policy`` names; UNKNOWN otherwise."""
        classes: list[object] = []
        check = path.arguments.get(2, "check_fn")
        if check is not None:
            for function in self.evaluator.evaluate(*check):
                if isinstance(function, FunctionValue):
                    classes.extend(self._isinstance_types(function))
        policy = path.arguments.get(3, "auto_wrap_policy")
        if policy is not None:
            for value in self.evaluator.evaluate(*policy):
                classes.extend(self._policy_types(value))
        instances = [
            Instance(cls, exact=False) for cls in classes if isinstance(cls, (ClassValue, External))
        ]
        return tuple(dict.fromkeys(instances)) or (UNKNOWN,)

    def _isinstance_types(self, function: FunctionValue) -> Iterator[object]:
        context = self.evaluator.bind(function, None)
        body = function.node.body
        for node in own_nodes(body):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "isinstance"
                and len(node.args) == 2
            ):
                yield from self._types(self.evaluator.evaluate(node.args[1], context))

    def _policy_types(self, value: object) -> Iterator[object]:
        """``partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})`` or
        ``ModuleWrapPolicy({Block})``."""
        if isinstance(value, PartialValue):
            arguments = Arguments.of(value.call, value.context)
            for name in ("transformer_layer_cls", "module_classes"):
                flow = arguments.keywords.get(name)
                if flow is not None:
                    yield from self._types(self.evaluator.evaluate(*flow))
        elif isinstance(value, Instance) and value.call is not None and value.context is not None:
            if value.call.args:
                yield from self._types(self.evaluator.evaluate(value.call.args[0], value.context))

    def _types(self, values: Values) -> Iterator[object]:
        for value in values:
            if isinstance(value, (ClassValue, External)):
                yield value
            elif value is not UNKNOWN:
                yield from (
                    v
                    for v in self.evaluator.iterate((value,))
                    if isinstance(v, (ClassValue, External))
                )


def _may_wrap(owners: list[ClassValue]) -> bool:
    """Whether a class's ``forward`` reads ``self.<name>`` for a ``<name>`` its ``__init__``
    stores a parameter in (``self.module = module``): what a class must do to checkpoint
    what it was made with (a syntactic test, so no other class's body is evaluated)."""
    stored: set[str] = set()
    for owner in owners:
        for statement in owner.node.body:
            if isinstance(statement, FUNCTIONS) and statement.name == "__init__":
                stored.update(_parameters_stored(statement))
    if not stored:
        return False
    for owner in owners:
        for statement in owner.node.body:
            if isinstance(statement, FUNCTIONS) and statement.name == "forward":
                self_name = _first_parameter_name(statement)
                for node in own_nodes(statement.body):
                    if (
                        isinstance(node, ast.Attribute)
                        and node.attr in stored
                        and isinstance(node.value, ast.Name)
                        and node.value.id == self_name
                    ):
                        return True
    return False


def _parameters_stored(initialiser: ast.FunctionDef | ast.AsyncFunctionDef) -> Iterator[str]:
    """``<name>`` of each ``self.<name> = <parameter>`` in an ``__init__``."""
    arguments = initialiser.args
    names = {a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)}
    self_name = _first_parameter_name(initialiser)
    for node in own_nodes(initialiser.body):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name):
            if node.value.id not in names:
                continue
            for target in node.targets:
                if (
                    isinstance(target, ast.Attribute)
                    and isinstance(target.value, ast.Name)
                    and target.value.id == self_name
                ):
                    yield target.attr


def _first_parameter_name(function: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    positional = [*function.args.posonlyargs, *function.args.args]
    return positional[0].arg if positional else None


def may_derive_from_a_layer(node: ast.ClassDef, layer_words: frozenset[str]) -> bool:
    """A base names a layer class (by its last name): worth resolving the bases."""
    return any(
        (base.id if isinstance(base, ast.Name) else getattr(base, "attr", None)) in layer_words
        for base in node.bases
    )


def _flags_tested_true(module: Module, call: ast.Call) -> frozenset[str]:
    """For ``x.f(...)``: the attributes ``x.<flag>`` that the ``if`` statements around the
    call require to be true (conjuncts of their tests, the call in their body)."""
    func = call.func
    if not isinstance(func, ast.Attribute) or not isinstance(func.value, ast.Name):
        return frozenset()
    receiver = func.value.id
    flags: set[str] = set()
    for statement in statements_at(module.tree.body, call.lineno):
        if not isinstance(statement, ast.If) or not statement.body:
            continue
        first, last = statement.body[0], statement.body[-1]
        if not first.lineno <= call.lineno <= (last.end_lineno or last.lineno):
            continue
        test = statement.test
        parts = (
            test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]
        )
        for part in parts:
            if (
                isinstance(part, ast.Attribute)
                and isinstance(part.value, ast.Name)
                and part.value.id == receiver
            ):
                flags.add(part.attr)
    return frozenset(flags)


def qualified_name(value: FunctionValue | ClassValue) -> str:
    """``package.module.Class.method`` of a definition at module or class level."""
    parts = [value.node.name] if not isinstance(value.node, ast.Lambda) else ["<lambda>"]
    scope: Scope | None = value.context.scope
    while scope is not None and scope.kind == "class":
        parts.insert(0, scope.node.name)  # type: ignore[attr-defined]
        scope = scope.parent
    if scope is None or scope.kind != "module":
        return ""
    return ".".join([value.context.module.name, *parts])


def classes_at_top(statements: list[ast.stmt]) -> tuple[ast.ClassDef, ...]:
    """Classes at module level, also under ``if``/``try`` (not inside functions); found
    once a body (every discovery round of a module asks)."""
    known = _CLASSES_AT_TOP.get(id(statements))
    if known is not None and known[0] is statements and known[1] == len(statements):
        return known[2]
    found = []
    stack = list(reversed(statements))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.ClassDef):
            found.append(node)
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            for body in nested_bodies(node):
                stack.extend(reversed(body))
    _CLASSES_AT_TOP[id(statements)] = (statements, len(statements), tuple(found))
    return tuple(found)


# body id: (the body, kept so that its id is never reused while the entry lives; its length;
# its classes)
_CLASSES_AT_TOP: dict[int, tuple[list[ast.stmt], int, tuple[ast.ClassDef, ...]]] = process_memo()


def _definitions_at_top(
    module: Module, lines: list[int]
) -> Iterator[tuple[FunctionDefinition, ast.ClassDef | None]]:
    """Functions defined at module level and methods of classes there (under ``if`` and
    ``try`` too), each with the class it is a method of, where they touch ``lines`` (else
    no decorator of theirs can matter)."""
    stack = list(reversed(statements_touching(module.tree.body, lines)))
    while stack:
        node = stack.pop()
        if isinstance(node, FUNCTIONS):
            yield node, None
        elif isinstance(node, ast.ClassDef):
            for statement in statements_touching(node.body, lines):
                if isinstance(statement, FUNCTIONS):
                    yield statement, node
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            for body in nested_bodies(node):
                stack.extend(reversed(statements_touching(body, lines)))


FunctionDefinition = ast.FunctionDef | ast.AsyncFunctionDef


def _own_method(node: ast.ClassDef, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    found = [s for s in node.body if isinstance(s, FUNCTIONS) and s.name == name]
    return found[-1] if found else None


def callee_label(func: ast.expr) -> str:
    """``self._ckpt`` for the callee of ``self._ckpt(...)``; ``...`` for computed parts."""
    parts = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    parts.append(func.id if isinstance(func, ast.Name) else "...")
    return ".".join(reversed(parts))
