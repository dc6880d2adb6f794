"""The evaluator's classes: their bases, their subclasses and what their methods store.

A class's MRO is its bases' in order, each once, in any module (an external base ends a
branch, a cycle of bases ends where it closes); its instance attributes are the ``self.<name>
= ...`` of its methods; the subclasses that may stand for a ``self`` are those of its module
deriving from it by base name; the classes a module makes visible are what an unannotated
parameter of its functions most likely is (duck typing, see ``members``).
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from ckptlint.project.index import Module
from ckptlint.project.scopes import FUNCTIONS, Binding, fold
from ckptlint.resolution.values import ClassValue, External

if TYPE_CHECKING:
    from ckptlint.resolution.evaluator import Evaluator


class Classes:
    """The evaluator's part that knows class hierarchies (see the module docstring)."""

    def __init__(self, evaluator: Evaluator) -> None:
        self.evaluator = evaluator
        self._methods_built: set[int] = set()
        self._derived: dict[str, dict[str, list[ast.ClassDef]]] = {}

    def mro(self, cls: ClassValue) -> list[ClassValue | External]:
        """The class and its bases, left to right, each once (external bases end a branch;
        a cycle of bases ends where it closes)."""
        return self.evaluator.ask(("mro", cls), self._mro, cls, fallback=[cls])

    def _mro(self, cls: ClassValue) -> list[ClassValue | External]:
        order: list[ClassValue | External] = [cls]
        outer = cls.context
        for base in cls.node.bases:
            for value in self.evaluator.evaluate(base, outer):
                for ancestor in self.mro(value) if isinstance(value, ClassValue) else [value]:
                    if isinstance(ancestor, (ClassValue, External)) and ancestor not in order:
                        order.append(ancestor)
        return order

    def project_mro(self, cls: ClassValue) -> list[ClassValue]:
        """The MRO's classes defined in the project."""
        return [c for c in self.mro(cls) if isinstance(c, ClassValue)]

    def instance_assignments(self, cls: ClassValue, attribute: str) -> list[Binding]:
        """``self.<attribute> = ...`` in the methods of ``cls`` (every method is scoped)."""
        scope = self.evaluator.scope_of(cls)
        if id(scope) not in self._methods_built:
            self._methods_built.add(id(scope))
            for statement in cls.node.body:
                if isinstance(statement, FUNCTIONS):
                    cls.context.module.scopes.function_scope(statement)
        return scope.instance_attributes.get(attribute, [])

    def subclasses_overriding(self, cls: ClassValue, attribute: str) -> list[ClassValue]:
        """Classes of the same module deriving from ``cls`` (by base name, transitively)
        that define or assign ``attribute``: a ``self`` inside ``cls`` may be one of them."""
        evaluator = self.evaluator
        module = cls.module
        derived = self._derived_by_base_name(module)
        subclasses: list[ast.ClassDef] = []
        names = [cls.node.name]
        while names:
            for statement in derived.get(names.pop(), ()):
                if statement is not cls.node and statement not in subclasses:
                    subclasses.append(statement)
                    names.append(statement.name)
        found: list[ClassValue] = []
        for statement in sorted(subclasses, key=lambda s: s.lineno):
            subclass = ClassValue(statement, evaluator.module_context(module))
            scope = evaluator.scope_of(subclass)
            if attribute in scope.bindings or self.instance_assignments(subclass, attribute):
                found.append(subclass)
        return found

    def _derived_by_base_name(self, module: Module) -> dict[str, list[ast.ClassDef]]:
        """A module's top-level classes by the last names of their bases (built once)."""
        index = self._derived.get(module.path)
        if index is None:
            index = self._derived[module.path] = {}
            for statement in module.tree.body:
                if isinstance(statement, ast.ClassDef):
                    for base in statement.bases:
                        name = _base_name(base)
                        if name is not None:
                            index.setdefault(name, []).append(statement)
        return index

    def visible_classes(self, module: Module) -> list[ClassValue]:
        """Classes a module binds at its top level under a capitalised name (defined or
        imported): what an unannotated parameter of its functions most likely is."""
        return self.evaluator.ask(("visible", module), self._visible_classes, module, fallback=[])

    def _visible_classes(self, module: Module) -> list[ClassValue]:
        evaluator = self.evaluator
        found: list[ClassValue] = []
        context = evaluator.module_context(module)
        for name, bindings in module.scopes.module.bindings.items():
            if not name[:1].isupper():
                continue
            for binding in fold(bindings, None):
                for value in evaluator.binding_values(binding, context):
                    if isinstance(value, ClassValue) and value not in found:
                        found.append(value)
        return found


def _base_name(base: ast.expr) -> str | None:
    if isinstance(base, ast.Name):
        return base.id
    return base.attr if isinstance(base, ast.Attribute) else None
