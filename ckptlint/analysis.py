"""The pipeline's middle for one run: resolution, regions and effects over the project.

``ProjectAnalysis`` wires the layers together and keeps what they compute for the whole run,
shared by discovery, every file's findings and every rule: the sites of each module, the
region of each site and what it reaches, and the names through which other files reach a
region source through this one (``exports``: a project's wrappers, layer subclasses,
attributes holding partials of ``checkpoint``), so that the engine can analyse every file
using one. Everything it keeps goes through the run's ``Solver``, so an answer is the same
whichever file asked first (see ``resolution.solver``).

What discovery has learned so far (``use``: the names that reach a source, the classes that
derive from a layer source) decides only which calls and classes of a module are looked at
as sites; what a value is never depends on it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from typing import Literal, NamedTuple

from packaging.version import Version

from ckptlint.effects.changes import ChangeFinder
from ckptlint.effects.reach import GlobalWrite, Reach, ReachAnalysis
from ckptlint.project.index import Module, Project
from ckptlint.project.scopes import (
    FUNCTIONS,
    Binding,
    Body,
    Scope,
    nested_bodies,
    statements_touching,
    touches_lines,
)
from ckptlint.regions.calls import calls_at, calls_on_lines
from ckptlint.regions.policies import Policy, policies
from ckptlint.regions.sites import (
    Site,
    SiteFinder,
    SourceCall,
    classes_at_top,
    may_derive_from_a_layer,
)
from ckptlint.regions.sources import (
    CHECKPOINT,
    CHECKPOINT_SEQUENTIAL,
    CHECKPOINT_WRAPPERS,
    ReentrantArgument,
    SourceTable,
)
from ckptlint.resolution.bodies import own_nodes
from ckptlint.resolution.evaluator import Evaluator, place_of
from ckptlint.resolution.mappings import Held, held
from ckptlint.resolution.members import AUTOGRAD_FUNCTIONS
from ckptlint.resolution.solver import Solver
from ckptlint.resolution.values import (
    Argument,
    Arguments,
    ClassValue,
    Constant,
    Context,
    External,
    Flow,
    FunctionValue,
    Instance,
    Method,
    PartialValue,
    Value,
    Values,
)
from ckptlint.resolution.versions import VersionRange
from ckptlint.torch_catalogue import SEQUENTIAL_CONTAINERS, is_parameter_module_class

Reentrancy = Literal["explicit", "default"]


class Exports(NamedTuple):
    calls: frozenset[str]
    classes: frozenset[str]

    @property
    def names(self) -> frozenset[str]:
        return self.calls | self.classes


class ProjectAnalysis:
    def __init__(
        self, project: Project, table: SourceTable, *, target_torch: Version | None = None
    ) -> None:
        """``target_torch``: the oldest torch the project runs on (``target-torch``, or the
        lower bound of its ``torch`` requirement); branches that test the torch version are
        decided against it. None: not known, no branch is decided."""
        self.project = project
        self.table = table
        self.target_torch = target_torch
        self.solver = Solver(place=place_of)
        project.attach(self.solver)
        self.evaluator = Evaluator(project, target_torch=target_torch, solver=self.solver)
        self.finder = SiteFinder(self.evaluator, table)
        self.reaches = ReachAnalysis(self.evaluator)
        self.changes = ChangeFinder(project, self.evaluator)
        self.use(frozenset(table.words))

    def use(self, words: frozenset[str], layer_classes: frozenset[str] = frozenset()) -> None:
        """What discovery knows now: the names that reach a region source (``words``), and
        the project's classes deriving from a layer source (``layer_classes``)."""
        self.words = words | layer_classes
        self.layer_words = self.finder.layer_words | layer_classes
        self._words_key = (self.words, self.layer_words)

    # -- per module ------------------------------------------------------------------------
    def sites(self, module: Module) -> list[Site]:
        return self._sites(module, self.module_words(module))

    def _sites(self, module: Module, words: frozenset[str]) -> list[Site]:
        key = ("sites", module, words, self.layer_words)
        return self.solver.ask(key, self._find_sites, module, words, fallback=[])

    def _find_sites(self, module: Module, words: frozenset[str]) -> list[Site]:
        lines = module.candidate_lines(words)
        return list(self.finder.sites(module, lines, self.layer_words))

    def module_words(self, module: Module) -> frozenset[str]:
        """The words the module's sites are found by: the run's, and the names it binds
        to a source itself (``ckpt = checkpoint`` ... ``ckpt(f, x)``), to a fixed point."""
        key = ("module words", module, self._words_key)
        return self.solver.ask(key, self._module_words, module, fallback=self.words)

    def _module_words(self, module: Module) -> frozenset[str]:
        """Each round looks at the lines naming the names the last one added: what a line
        gives does not depend on the words that led to it, so no line is looked at, and no
        word searched for, twice (a chain of wrappers in one file costs its length, not its
        square)."""
        words = new = self.words
        seen: set[int] = set()
        found = self._recompute_classes(module)
        while True:  # each round scopes more of the module's own names, so it ends
            lines = [line for line in module.candidate_lines(new) if line not in seen]
            seen.update(lines)
            new = frozenset((found | self._aliases_on(module, lines)) - words)
            if not new:
                return words
            words = words | new
            found = set()

    def calls_of_interest(self, module: Module) -> list[tuple[ast.Call, Context]]:
        """The calls on the lines naming one of the module's words, with their contexts."""
        lines = module.candidate_lines(self.module_words(module))
        return [(call, Context(module, scope)) for call, scope in calls_on_lines(module, lines)]

    def policies(self, module: Module) -> list[Policy]:
        """The selective-checkpoint policies the module defines (see ``regions.policies``)."""
        return self.solver.ask(("policies", module), policies, self.evaluator, module, fallback=[])

    def region(self, site: Site) -> Values:
        return self.solver.ask(("region", site), self.finder.region_values, site, fallback=())

    def reach(self, site: Site) -> Reach:
        """Everything the site's region runs (random draws count at any depth): the same
        for every site of the same region, so computed once for them all."""
        region = self.region(site)
        return self.solver.ask(("reach", region), self.reaches.reach, region, fallback=Reach())

    def near_reach(self, site: Site) -> Reach:
        """What the region's own code, and the code it calls directly, reads and writes
        (global state set up far below by a framework is not the region's business); once
        for the sites of a module that checkpoint the same region (``checkpoint(block, x)``
        in each branch, in each model of a file)."""
        region, home = self.region(site), site.module
        key = ("near reach", region, home)
        return self.solver.ask(key, self.reaches.near, region, home, fallback=Reach())

    def effective_paths(self, site: Site) -> list[SourceCall]:
        """The site's source calls; an ``apply`` call counts as the wrapper it applies."""
        found: list[SourceCall] = []
        for path in site.paths:
            if path.source.kind != "apply":
                found.append(path)
                continue
            flow = path.arguments.get(1, "checkpoint_wrapper_fn")
            if flow is None:
                continue
            applied = Arguments((), {}, False, path.arguments.calls)
            found.extend(self.finder.paths(self.evaluator.evaluate(*flow), applied))
        return found

    def reentrancy(self, path: SourceCall) -> Reentrancy | None:
        """How a source call selects torch's reentrant checkpoint: ``"explicit"``
        (``use_reentrant=True``, ``checkpoint_impl=CheckpointImpl.REENTRANT``), ``"default"``
        (``use_reentrant`` not passed or None: torch 2.13 still defaults to reentrant), or
        None when it is not reentrant, not torch's, or cannot be told."""
        name = path.source.names[0]
        arguments = path.arguments
        if name in CHECKPOINT_WRAPPERS:
            if "checkpoint_fn" in arguments.keywords:
                return None  # a checkpoint function of the caller's: its own rules
            flow = arguments.get(1, "checkpoint_impl")
            reentrant = flow is not None and all(
                isinstance(v, External) and v.name.endswith("CheckpointImpl.REENTRANT")
                for v in self.evaluator.evaluate(*flow)
            )
            return "explicit" if reentrant else None
        if name not in (CHECKPOINT, CHECKPOINT_SEQUENTIAL):
            return None
        flow = arguments.keywords.get("use_reentrant")
        if flow is None and path.source.reentrant is ReentrantArgument.FOURTH_POSITIONAL:
            leading = arguments.positional[:4]
            if None in leading:
                return None  # a *args may carry it
            flow = leading[3] if len(leading) == 4 else None
        if flow is None:
            return None if arguments.double_star else "default"
        values = self.evaluator.evaluate(*flow)
        if all(isinstance(v, Constant) and v.value is None for v in values):
            return "default"
        if all(isinstance(v, Constant) and v.value in (True, None) for v in values):
            return "explicit"
        return None

    def holds_parameters(self, values: Values) -> bool:
        """Whether a region's values include a module with parameters: a project module (or
        a method of one), a torch layer with weights, a container of such, a partial of
        one."""
        stack = list(values)
        for _ in range(64):
            if not stack:
                break
            value = stack.pop()
            if isinstance(value, PartialValue):
                stack.extend(value.inner)
            elif isinstance(value, FunctionValue) and value.bound is not None:
                stack.extend(v for v in value.bound if isinstance(v, Instance))
            elif isinstance(value, Instance):
                if isinstance(value.cls, ClassValue):
                    return True
                if is_parameter_module_class(value.cls.name):
                    return True
                if value.cls.name in SEQUENTIAL_CONTAINERS:
                    stack.extend(self.evaluator.iterate((value,)))
        return False

    # -- what the evaluator, the site finder and the effects say, as rules ask it ------------
    def evaluate(self, expression: ast.expr, context: Context) -> Values:
        """The values ``expression`` may have where ``context`` evaluates it."""
        return self.evaluator.evaluate(expression, context)

    def member(self, values: Values, attribute: str) -> Values:
        """What ``<value>.<attribute>`` may be for any of ``values``."""
        return self.evaluator.member(values, attribute)

    def iterate(self, values: Values) -> Values:
        """What iterating over any of ``values`` yields."""
        return self.evaluator.iterate(values)

    def argument_values(self, argument: Argument) -> Values:
        """What a parameter bound to ``argument`` holds (followed to where it was written)."""
        return self.evaluator.argument_values(argument)

    def binding_values(self, binding: Binding, context: Context) -> Values:
        """The values a binding (an assignment, parameter, import...) gives its name."""
        return self.evaluator.binding_values(binding, context)

    def bind(self, function: FunctionValue, arguments: Arguments | None) -> Context:
        """The context ``function``'s body runs in when it receives ``arguments`` (None: a
        call the analysis does not see, parameters unbound)."""
        return self.evaluator.bind(function, arguments)

    def scope_of(self, function: FunctionValue | ClassValue) -> Scope:
        """The scope of a function's (or class's) body."""
        return self.evaluator.scope_of(function)

    def mro(self, cls: ClassValue) -> list[ClassValue | External]:
        """The class and its bases, left to right, each once."""
        return self.evaluator.mro(cls)

    def instance_assignments(self, cls: ClassValue, attribute: str) -> list[Binding]:
        """``self.<attribute> = ...`` in the methods of ``cls``."""
        return self.evaluator.instance_assignments(cls, attribute)

    def versions_at(self, module: Module, node: ast.AST) -> VersionRange:
        """The torch versions ``node`` runs on (see ``Evaluator.versions_at``)."""
        return self.evaluator.versions_at(module, node)

    def calls_at(self, module: Module, line: int) -> Iterator[tuple[ast.Call, Context]]:
        """The calls of the innermost statement at ``line``, each with its context."""
        return calls_at(self.evaluator, module, line)

    def paths(self, callee: Values, arguments: Arguments) -> list[SourceCall]:
        """The source calls that calling ``callee`` with ``arguments`` makes."""
        return self.finder.paths(callee, arguments)

    def keyword(self, path: SourceCall, name: str) -> Flow | None:
        """What the source receives as ``name``, also through ``**kwargs`` (see
        ``SiteFinder.keyword``)."""
        return self.finder.keyword(path, name)

    def held(self, mapping: ast.expr, context: Context, key: str) -> tuple[Held, ...]:
        """What the mapping ``mapping`` may hold under ``key`` where it is written (a
        ``**kwargs`` as the function edited it; see ``resolution.mappings``)."""
        return held(self.evaluator, mapping, context, key)

    def reach_of(self, region: Values) -> Reach:
        """What calling any of ``region`` runs, to the depth ``reach`` follows."""
        return self.reaches.reach(region)

    def nodes_with_scopes(
        self, statements: Body, scope: Scope, module: Module
    ) -> Iterator[tuple[ast.AST, Scope]]:
        """The nodes of a body with the scope each is evaluated in, not descending into
        nested definitions (see ``ReachAnalysis.nodes_with_scopes``)."""
        return self.reaches.nodes_with_scopes(statements, scope, module)

    def changes_of(self, module: Module, name: str) -> list[GlobalWrite]:
        """Run-time rebinding or mutation of ``module.name`` anywhere the run can see."""
        return self.changes.changes_of(module, name)

    def _reaches_source(self, partial: PartialValue) -> bool:
        return bool(self.finder.paths((partial,), Arguments((), {}, False, (partial.call,))))

    # -- names that reach a source, across files --------------------------------------------
    def exports(self, module: Module) -> Exports:
        """Names other modules may use to reach a source through this one: layer
        subclasses (``classes``), and wrappers and module, class or instance attributes bound
        to a source (``calls``)."""
        key = ("exports", module, self._words_key)
        return self.solver.ask(
            key, self._exports, module, fallback=Exports(frozenset(), frozenset())
        )

    def _exports(self, module: Module) -> Exports:
        words = self.module_words(module)
        lines = module.candidate_lines(words)
        calls: set[str] = set()
        for site in self._sites(module, words):
            if site.delegates:
                calls.update(_enclosing_function_names(site.context.scope))
        known = self.words  # names every module already looks for: nothing new
        for binding, visible in self._bindings_on_lines(module, lines):
            if visible and binding.name not in known and self._binds_source(module, binding):
                calls.add(binding.name)
        calls.update(name for name, visible in self._factories(module, lines) if visible)
        calls.update(self._recompute_classes(module))
        calls.update(self._wrapper_classes(module, lines))
        return Exports(frozenset(calls), frozenset(self._layer_classes(module)))

    def _aliases_on(self, module: Module, lines: list[int]) -> set[str]:
        """Names a module binds (at any level) to a source on ``lines``: its lines using
        them are looked at too."""
        names = {
            binding.name
            for binding, _ in self._bindings_on_lines(module, lines)
            if self._binds_source(module, binding)
        }
        names.update(name for name, _ in self._factories(module, lines))
        names.update(self._wrapper_classes(module, lines))
        for site in self.finder.sites(module, lines, self.layer_words):
            if site.delegates:
                names.update(_enclosing_function_names(site.context.scope))
        return names

    def _factories(self, module: Module, lines: list[int]) -> Iterable[tuple[str, bool]]:
        """Functions returning a source (``return partial(checkpoint, ...)``), and whether
        other modules can see them (module-level functions and methods)."""
        for node, _, parent in _definitions_touching(module, lines):
            if not isinstance(node, FUNCTIONS):
                continue
            results = [
                n.value
                for n in own_nodes(node.body)
                if isinstance(n, ast.Return) and n.value is not None
            ]
            if not any(touches_lines(result, lines) for result in results):
                continue
            function = FunctionValue(node, Context(module, parent))
            key = ("factory", function)
            if self.solver.ask(key, self._returns_a_source, function, fallback=False):
                yield node.name, parent.kind != "function"

    def _returns_a_source(self, function: FunctionValue) -> bool:
        """Whether calling ``function`` may give a source (asked once a run, whatever the
        words that led to it). One that only returns what sources and wrappers return (a
        region's output: ``return checkpoint(...)``, ``return wrapper(...)``) gives none,
        whatever chain of wrappers is below."""
        if self._returns_region_outputs(function):
            return False
        returned = self.evaluator.returned(function, None)
        return any(self.is_source_like(value) for value in returned)

    def _returns_region_outputs(self, function: FunctionValue) -> bool:
        node = function.node
        if isinstance(node, ast.Lambda):
            return False
        context = self.evaluator.bind(function, None)
        returns = [n.value for n in own_nodes(node.body) if isinstance(n, ast.Return)]
        if not returns:
            return False
        for value in returns:
            if not isinstance(value, ast.Call):
                return False
            callee = self.evaluator.evaluate(value.func, context)
            if not callee or not all(self._runs_a_region(v) for v in callee):
                return False
        return True

    def _runs_a_region(self, value: Value) -> bool:
        source = self.finder.source_of(value)
        if source is not None:
            return source.kind != "layer"
        return isinstance(value, FunctionValue) and bool(self.finder.wrapper_calls(value))

    def _binds_source(self, module: Module, binding: Binding) -> bool:
        key = ("binds source", binding)
        return self.solver.ask(key, self._bound_to_a_source, module, binding, fallback=False)

    def _bound_to_a_source(self, module: Module, binding: Binding) -> bool:
        context = Context(module, binding.scope)
        value = binding.value
        if isinstance(value, ast.Call) and not binding.path and not binding.iterated:
            callee = self.evaluator.evaluate(value.func, context)
            if any(self.is_source_like(v) for v in callee):
                return False  # what a region returns (``x = checkpoint(f, x)``) is no source
        values = self.evaluator.binding_values(binding, context)
        return any(self.is_source_like(value) for value in values)

    def is_source_like(self, value: Value) -> bool:
        if self.finder.source_of(value) is not None:
            return True
        if isinstance(value, PartialValue):
            return self._reaches_source(value)
        if isinstance(value, FunctionValue):
            return bool(self.finder.wrapper_calls(value))
        if isinstance(value, ClassValue):
            return self.finder.layer_source(value) is not None
        return False

    def _recompute_classes(self, module: Module) -> set[str]:
        """Classes that recompute a function they are given (``autograd.Function``
        subclasses, see ``regions.custom``): ``C.apply(...)`` anywhere is a site."""
        context = self.evaluator.module_context(module)
        found = set()
        for node in classes_at_top(module.tree.body):
            if not any(_last_name(base) == "Function" for base in node.bases):
                continue  # (and its body stays unparsed)
            cls = ClassValue(node, context)
            if self.finder.source_of(Method(cls, "apply")) is not None and any(
                isinstance(owner, External) and owner.name in AUTOGRAD_FUNCTIONS
                for owner in self.evaluator.mro(cls)
            ):
                found.add(node.name)
        return found

    def _wrapper_classes(self, module: Module, lines: list[int]) -> set[str]:
        """Module classes whose ``forward`` checkpoints what their constructor was given:
        constructing one (``ActivationCheckpointWrapper(block)``) anywhere is a site."""
        context = self.evaluator.module_context(module)
        found = set()
        for node in classes_at_top(module.tree.body):
            if not touches_lines(node, lines):
                continue  # names no source (and its body stays unparsed)
            forward = [s for s in node.body if isinstance(s, FUNCTIONS) and s.name == "forward"]
            if forward and touches_lines(forward[-1], lines):
                if self.finder.wrapper_class_calls(ClassValue(node, context)):
                    found.add(node.name)
        return found

    def _layer_classes(self, module: Module) -> set[str]:
        context = self.evaluator.module_context(module)
        return {
            node.name
            for node in classes_at_top(module.tree.body)
            if may_derive_from_a_layer(node, self.layer_words)
            and self.finder.layer_source(ClassValue(node, context)) is not None
        }

    def _bindings_on_lines(
        self, module: Module, lines: list[int]
    ) -> Iterable[tuple[Binding, bool]]:
        """Bindings whose value is written on one of ``lines``, and whether other modules
        can see them (module and class attributes, ``self.<name>``), unlike function
        locals."""
        groups = [(module.scopes.module.bindings_near(lines), True)]
        for _, scope, _ in _definitions_touching(module, lines):
            groups.extend((b, scope.kind != "function") for b in scope.bindings.values())
            groups.extend((b, True) for b in scope.instance_attributes.values())
        for bindings, visible in groups:
            for binding in bindings:
                node = binding.node
                if isinstance(node, FUNCTIONS) and node.decorator_list:
                    # a decorated ``def`` binds what its decorators make of it
                    if any(touches_lines(d, lines) for d in node.decorator_list):
                        yield binding, visible
                    continue
                if binding.value is None and binding.imported is None:
                    continue
                source = binding.value if binding.value is not None else node
                if touches_lines(source, lines):
                    yield binding, visible


Definition = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


def _definitions_touching(
    module: Module, lines: list[int]
) -> list[tuple[Definition, Scope, Scope]]:
    """The functions and classes (at any depth) whose span holds one of ``lines``, in
    source order, each with its own scope and the scope it is defined in. A class's methods
    come after it, so its instance attributes are all known once they are."""
    scopes = module.scopes
    stack = [(s, scopes.module) for s in reversed(statements_touching(module.tree.body, lines))]
    found: list[tuple[Definition, Scope, Scope]] = []
    while stack:
        statement, parent = stack.pop()
        if not touches_lines(statement, lines):
            continue
        if isinstance(statement, (*FUNCTIONS, ast.ClassDef)):
            scope = scopes.function_scope(statement)
            if scope is None:
                continue
            found.append((statement, scope, parent))
            stack.extend((s, scope) for s in reversed(statements_touching(statement.body, lines)))
        else:
            for body in reversed(nested_bodies(statement)):
                stack.extend((s, parent) for s in reversed(statements_touching(body, lines)))
    return found


def _enclosing_function_names(scope: Scope | None) -> list[str]:
    names = []
    while scope is not None:
        if isinstance(scope.node, FUNCTIONS):
            names.append(scope.node.name)
        scope = scope.parent
    return names


def _last_name(expression: ast.expr) -> str:
    """``Function`` for ``torch.autograd.Function`` or ``Function``."""
    if isinstance(expression, ast.Attribute):
        return expression.attr
    return expression.id if isinstance(expression, ast.Name) else ""
