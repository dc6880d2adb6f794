"""Lexical scopes of a module: which bindings a name may refer to at a given place.

The model is deliberately small. A scope records every binding of every name in source
order; a lookup folds those bindings the way control flow would: an unconditional binding
replaces what came before, a binding under ``if``/``for``/``while``/``except``/``match`` adds
an alternative. Lookups follow Python's rules (function locals, ``global``/``nonlocal``,
class bodies invisible from methods) and are deterministic: results keep source order.
"""

from __future__ import annotations

import ast
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Literal

ScopeKind = Literal["module", "class", "function"]
Position = tuple[int, int]


@dataclass(frozen=True, eq=False)
class Binding:
    """One place where a name is bound.

    ``value`` is the assigned expression for a plain ``name = value`` (or walrus), ``imported``
    the qualified name for an import; both are None for definitions, parameters, loop targets
    and other bindings whose value is not statically known.
    """

    name: str
    node: ast.AST
    scope: Scope
    position: Position
    conditional: bool
    value: ast.expr | None = None
    imported: str | None = None


@dataclass(eq=False)
class Scope:
    kind: ScopeKind
    node: ast.AST
    parent: Scope | None
    bindings: dict[str, list[Binding]] = field(default_factory=dict)
    global_names: set[str] = field(default_factory=set)
    nonlocal_names: set[str] = field(default_factory=set)
    # For class scopes: ``self.<attr> = value`` assignments made in the class's methods.
    instance_attributes: dict[str, list[Binding]] = field(default_factory=dict)
    # For method scopes: the name of the instance parameter (``self``).
    self_name: str | None = None

    @property
    def module(self) -> Scope:
        scope = self
        while scope.parent is not None:
            scope = scope.parent
        return scope

    @property
    def enclosing_class(self) -> Scope | None:
        """The class whose method this scope is, when it is a method."""
        if self.self_name is not None and self.parent is not None:
            return self.parent
        return None

    def lookup(self, name: str, position: Position | None = None) -> list[Binding]:
        """Bindings ``name`` may refer to when used in this scope at ``position``.

        An empty list means the name is not bound in the module (a builtin or undefined).
        """
        scope: Scope | None = self
        from_nested = False
        while scope is not None:
            if name in scope.global_names:
                return _fold(scope.module.bindings.get(name, []), None)
            if name in scope.nonlocal_names:
                scope, from_nested = scope.parent, True
                continue
            if name in scope.bindings and not (from_nested and scope.kind == "class"):
                return _fold(scope.bindings[name], None if from_nested else position)
            from_nested = from_nested or scope.kind != "class"
            scope = scope.parent
        return []


def _fold(bindings: list[Binding], position: Position | None) -> list[Binding]:
    """Fold bindings in source order as control flow would (see module docstring).

    With a position, only bindings before it count, unless none do (a use inside a loop
    may see a binding made later in the loop body).
    """
    if position is not None:
        before = [b for b in bindings if b.position < position]
        if before:
            bindings = before
    possible: list[Binding] = []
    for binding in bindings:
        if binding.conditional:
            possible.append(binding)
        else:
            possible = [binding]
    return possible


@dataclass
class ModuleScopes:
    """Scopes of one module, with the scope each call and each function body runs in.

    Only the parts of the module that can matter are visited (see ``build_scopes``); the
    scope of a function body that was skipped is built on first request.
    """

    module: Scope
    scope_of_call: dict[int, Scope]
    scope_of_function: dict[int, Scope]
    calls: list[ast.Call]
    skipped_functions: dict[int, tuple[ast.AST, Scope]]

    def scope_of(self, call: ast.Call) -> Scope:
        return self.scope_of_call[id(call)]

    def function_scope(self, node: ast.AST) -> Scope | None:
        """The scope of a def, lambda or class body, building it if it was skipped."""
        scope = self.scope_of_function.get(id(node))
        if scope is not None or id(node) not in self.skipped_functions:
            return scope
        _, parent = self.skipped_functions.pop(id(node))
        builder = _ScopeBuilder(self.module, parent, candidate_lines=None)
        builder.visit_definition_body(node)
        self.scope_of_function.update(builder.scope_of_function)
        self.scope_of_call.update(builder.scope_of_call)
        return self.scope_of_function.get(id(node))


def build_scopes(tree: ast.Module, candidate_lines: frozenset[int] | None = None) -> ModuleScopes:
    """Scopes of ``tree``.

    With ``candidate_lines`` (lines where a name of interest appears), expressions and
    function or class bodies that do not touch those lines are not visited: they can hold
    no call of interest, and their local bindings are invisible elsewhere. Binding
    statements are always recorded, so lookups from visited code stay exact.
    """
    module = Scope("module", tree, None)
    builder = _ScopeBuilder(module, module, candidate_lines)
    builder.visit_body(tree.body)
    return ModuleScopes(
        module,
        builder.scope_of_call,
        builder.scope_of_function,
        builder.calls,
        builder.skipped_functions,
    )


def node_position(node: ast.AST) -> Position:
    """Where a node starts, for ordering bindings and uses."""
    return (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))


def touches_lines(node: ast.AST, sorted_lines: list[int]) -> bool:
    """Whether any of ``sorted_lines`` (ascending) falls within the node's line span."""
    start = getattr(node, "lineno", None)
    if start is None:
        return True
    end = getattr(node, "end_lineno", None) or start
    index = bisect_left(sorted_lines, start)
    return index < len(sorted_lines) and sorted_lines[index] <= end


class _ScopeBuilder(ast.NodeVisitor):
    """One pass over the tree that records bindings per scope and the scope of each call."""

    def __init__(self, module: Scope, scope: Scope, candidate_lines: frozenset[int] | None) -> None:
        self.module = module
        self.scope = scope
        self.candidate_lines = None if candidate_lines is None else sorted(candidate_lines)
        self.conditional = False
        self.scope_of_call: dict[int, Scope] = {}
        self.scope_of_function: dict[int, Scope] = {}
        self.skipped_functions: dict[int, tuple[ast.AST, Scope]] = {}
        self.calls: list[ast.Call] = []

    def touches_candidates(self, node: ast.AST) -> bool:
        return self.candidate_lines is None or touches_lines(node, self.candidate_lines)

    def visit(self, node: ast.AST) -> None:
        """Visit statements always; expressions only where they touch candidate lines."""
        if isinstance(node, ast.expr) and not self.touches_candidates(node):
            return
        super().visit(node)

    def visit_definition_body(self, node: ast.AST) -> None:
        """Build the scope of a def, lambda or class whose body was skipped."""
        if isinstance(node, ast.ClassDef):
            scope = Scope("class", node, self.scope)
            self.scope_of_function[id(node)] = scope
            self.run_in(scope, lambda: self.visit_body(node.body))
        elif isinstance(node, ast.Lambda):
            scope = self.enter_function(node, node.args, None)
            self.run_in(scope, lambda: self.visit(node.body))
        else:
            scope = self.enter_function(node, node.args, self._self_name(node))
            self.run_in(scope, lambda: self.visit_body(node.body))

    def skip_body(self, node: ast.AST) -> bool:
        """Remember a definition whose body need not be visited now."""
        if self.touches_candidates(node):
            return False
        self.skipped_functions[id(node)] = (node, self.scope)
        return True

    # -- helpers -------------------------------------------------------------------------
    def bind(
        self,
        name: str,
        node: ast.AST,
        *,
        value: ast.expr | None = None,
        imported: str | None = None,
        scope: Scope | None = None,
    ) -> None:
        target = scope or self.scope
        conditional = self.conditional
        if name in target.global_names and target is not self.module:
            # A function rebinding a global may never run: an alternative, not a replacement.
            target, conditional = self.module, True
        binding = Binding(name, node, target, node_position(node), conditional, value, imported)
        target.bindings.setdefault(name, []).append(binding)

    def visit_body(self, statements: list[ast.stmt], *, conditional: bool | None = None) -> None:
        saved = self.conditional
        if conditional is not None:
            self.conditional = saved or conditional
        for statement in statements:
            self.visit(statement)
        self.conditional = saved

    def bind_target(self, target: ast.expr, value: ast.expr | None) -> None:
        if isinstance(target, ast.Name):
            self.bind(target.id, target, value=value)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self.bind_target(element, None)
        elif isinstance(target, ast.Starred):
            self.bind_target(target.value, None)
        else:
            self.visit(target)
            if isinstance(target, ast.Attribute):
                self.record_instance_attribute(target, value)

    def record_instance_attribute(self, target: ast.Attribute, value: ast.expr | None) -> None:
        owner = self.scope.enclosing_class
        if (
            owner is not None
            and isinstance(target.value, ast.Name)
            and target.value.id == self.scope.self_name
        ):
            binding = Binding(
                target.attr, target, self.scope, node_position(target), True, value, None
            )
            owner.instance_attributes.setdefault(target.attr, []).append(binding)

    def enter_function(self, node: ast.AST, args: ast.arguments, self_name: str | None) -> Scope:
        scope = Scope("function", node, self.scope, self_name=self_name)
        self.scope_of_function[id(node)] = scope
        for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg):
            if arg is not None:
                binding = Binding(arg.arg, arg, scope, node_position(arg), False)
                scope.bindings.setdefault(arg.arg, []).append(binding)
        return scope

    def run_in(self, scope: Scope, action) -> None:
        saved_scope, saved_conditional = self.scope, self.conditional
        self.scope, self.conditional = scope, False
        action()
        self.scope, self.conditional = saved_scope, saved_conditional

    def visit_arguments_outside(self, args: ast.arguments) -> None:
        for default in (*args.defaults, *args.kw_defaults):
            if default is not None:
                self.visit(default)
        for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg):
            if arg is not None and arg.annotation is not None:
                self.visit(arg.annotation)

    # -- definitions ---------------------------------------------------------------------
    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for decorator in node.decorator_list:
            self.visit(decorator)
        self.visit_arguments_outside(node.args)
        if node.returns is not None:
            self.visit(node.returns)
        self.bind(node.name, node)
        if not self.skip_body(node):
            self.visit_definition_body(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def _self_name(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
        if self.scope.kind != "class":
            return None
        if any(
            isinstance(d, ast.Name) and d.id in ("staticmethod", "classmethod")
            for d in node.decorator_list
        ):
            return None
        positional = [*node.args.posonlyargs, *node.args.args]
        return positional[0].arg if positional else None

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self.visit_arguments_outside(node.args)
        self.visit_definition_body(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for expression in (*node.decorator_list, *node.bases, *node.keywords):
            self.visit(expression)
        self.bind(node.name, node)
        if not self.skip_body(node):
            self.visit_definition_body(node)

    def _visit_comprehension(self, node: ast.AST, elements: list[ast.expr]) -> None:
        generators: list[ast.comprehension] = node.generators  # type: ignore[attr-defined]
        self.visit(generators[0].iter)
        scope = Scope("function", node, self.scope)
        self.scope_of_function[id(node)] = scope

        def body() -> None:
            for index, generator in enumerate(generators):
                if index:
                    self.visit(generator.iter)
                self.bind_target(generator.target, None)
                for condition in generator.ifs:
                    self.visit(condition)
            for element in elements:
                self.visit(element)

        self.run_in(scope, body)

    def visit_ListComp(self, node: ast.ListComp) -> None:
        self._visit_comprehension(node, [node.elt])

    visit_SetComp = visit_GeneratorExp = visit_ListComp  # type: ignore[assignment]

    def visit_DictComp(self, node: ast.DictComp) -> None:
        self._visit_comprehension(node, [node.key, node.value])

    # -- bindings ------------------------------------------------------------------------
    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.asname:
                self.bind(alias.asname, node, imported=alias.name)
            else:
                top = alias.name.split(".", 1)[0]
                self.bind(top, node, imported=top)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        for alias in node.names:
            if alias.name == "*":
                continue
            qualified = f"{module}.{alias.name}" if module and not node.level else None
            self.bind(alias.asname or alias.name, node, imported=qualified)

    def visit_Assign(self, node: ast.Assign) -> None:
        self.visit(node.value)
        single = len(node.targets) == 1
        for target in node.targets:
            self.bind_target(target, node.value if single else None)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)
        self.visit(node.annotation)
        if node.value is not None or not isinstance(node.target, ast.Name):
            self.bind_target(node.target, node.value)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self.visit(node.value)
        if isinstance(node.target, ast.Name):
            self.bind(node.target.id, node.target)
        else:
            self.visit(node.target)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self.visit(node.value)
        scope = self.scope
        while scope.parent is not None and isinstance(
            scope.node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
        ):
            scope = scope.parent
        self.bind(node.target.id, node.target, value=node.value, scope=scope)

    def visit_Global(self, node: ast.Global) -> None:
        self.scope.global_names.update(node.names)

    def visit_Nonlocal(self, node: ast.Nonlocal) -> None:
        self.scope.nonlocal_names.update(node.names)

    # -- control flow --------------------------------------------------------------------
    def visit_For(self, node: ast.For | ast.AsyncFor) -> None:
        self.visit(node.iter)
        saved = self.conditional
        self.conditional = True
        self.bind_target(node.target, None)
        self.conditional = saved
        self.visit_body(node.body, conditional=True)
        self.visit_body(node.orelse, conditional=True)

    visit_AsyncFor = visit_For

    def visit_While(self, node: ast.While) -> None:
        self.visit(node.test)
        self.visit_body(node.body, conditional=True)
        self.visit_body(node.orelse, conditional=True)

    def visit_If(self, node: ast.If) -> None:
        self.visit(node.test)
        self.visit_body(node.body, conditional=True)
        self.visit_body(node.orelse, conditional=True)

    def visit_Try(self, node: ast.Try) -> None:
        self.visit_body(node.body)
        for handler in node.handlers:
            if handler.type is not None:
                self.visit(handler.type)
            saved = self.conditional
            self.conditional = True
            if handler.name:
                self.bind(handler.name, handler)
            self.visit_body(handler.body)
            self.conditional = saved
        self.visit_body(node.orelse, conditional=True)
        self.visit_body(node.finalbody)

    visit_TryStar = visit_Try

    def visit_With(self, node: ast.With | ast.AsyncWith) -> None:
        for item in node.items:
            self.visit(item.context_expr)
            if item.optional_vars is not None:
                self.bind_target(item.optional_vars, None)
        self.visit_body(node.body)

    visit_AsyncWith = visit_With

    def visit_match_case(self, node: ast.match_case) -> None:
        saved = self.conditional
        self.conditional = True
        self.visit(node.pattern)
        if node.guard is not None:
            self.visit(node.guard)
        self.visit_body(node.body)
        self.conditional = saved

    def visit_MatchAs(self, node: ast.MatchAs) -> None:
        if node.pattern is not None:
            self.visit(node.pattern)
        if node.name:
            self.bind(node.name, node)

    def visit_MatchStar(self, node: ast.MatchStar) -> None:
        if node.name:
            self.bind(node.name, node)

    def visit_MatchMapping(self, node: ast.MatchMapping) -> None:
        self.generic_visit(node)
        if node.rest:
            self.bind(node.rest, node)

    def visit_Call(self, node: ast.Call) -> None:
        self.scope_of_call[id(node)] = self.scope
        self.calls.append(node)
        self.generic_visit(node)
