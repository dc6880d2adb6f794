"""The evaluator's imports and module members: what a module's name gives in another module.

Imports are followed into the project's other modules (absolute, relative, re-exports
through ``__init__``, submodules of a package, star imports searched depth first, each
module once, so a cycle of them ends); a module outside the project is an ``External`` by
its canonical name, a folder of the project without ``__init__.py`` a namespace package
whose members are submodules. A name no statement binds is a builtin, else ``UNKNOWN``.
"""

from __future__ import annotations

import builtins
from typing import TYPE_CHECKING

from ckptlint.project.index import Module
from ckptlint.project.scopes import Binding, fold
from ckptlint.resolution.values import UNKNOWN, External, ModuleValue, Value, Values, unique
from ckptlint.torch_catalogue import canonical

if TYPE_CHECKING:
    from ckptlint.resolution.evaluator import Evaluator

_BUILTINS = frozenset(dir(builtins))


class Modules:
    """The evaluator's part that follows imports (see the module docstring)."""

    def __init__(self, evaluator: Evaluator) -> None:
        self.evaluator = evaluator
        self.project = evaluator.project

    def unbound_name(self, name: str, module: Module) -> Values:
        """A name no statement of the module binds: star imports, then builtins.

        Star imports are searched depth first in statement order, each module once, so a
        cycle of them (``a`` imports ``*`` from ``b``, ``b`` from ``a``) ends, however many
        files it spans."""
        visited = {module.path}
        stack = [(module, list(reversed(module.scopes.module.star_imports)))]
        while stack:
            importer, targets = stack[-1]
            if not targets:
                stack.pop()
                continue
            target = targets.pop()
            absolute = importer.resolve_import(target.level, target.module)
            imported = None if absolute is None else self.project.module_named(absolute)
            if imported is not None:
                if imported.path in visited:
                    continue
                visited.add(imported.path)
                bindings = imported.scopes.module.bindings.get(name)
                if bindings:
                    evaluator = self.evaluator
                    context = evaluator.module_context(imported)
                    return unique(
                        v
                        for b in fold(bindings, None)
                        for v in evaluator.binding_values(b, context)
                    )
                stack.append((imported, list(reversed(imported.scopes.module.star_imports))))
            elif absolute is not None and name not in _BUILTINS:
                return (External(f"{absolute}.{name}"),)
        return (External(f"builtins.{name}"),) if name in _BUILTINS else (UNKNOWN,)

    def imported(self, binding: Binding, module: Module) -> Values:
        """What an import statement binds its name to in ``module``."""
        target = binding.imported
        assert target is not None
        absolute = module.resolve_import(target.level, target.module)
        if absolute is None:
            return (UNKNOWN,)
        if target.name is None:  # ``import a.b`` binds ``a``; ``import a.b as c`` binds a.b
            return (self.module_value(absolute),)
        source = self.project.module_named(absolute)
        if source is None:
            if self.project.layout.is_project_package(absolute):
                return (self.module_value(f"{absolute}.{target.name}"),)
            return (External(canonical(f"{absolute}.{target.name}")),)
        return self.module_member(source, target.name) or (UNKNOWN,)

    def module_value(self, name: str) -> Value:
        module = self.project.module_named(name)
        if module is not None:
            return ModuleValue(module)
        if self.project.layout.is_project_package(name):
            return External(name)  # a namespace package: its members are submodules
        return External(canonical(name))

    def module_member(self, module: Module, name: str, *, follow_submodules: bool = True) -> Values:
        evaluator = self.evaluator
        bindings = evaluator.version_tests.live(module.scopes.module.bindings.get(name, []), module)
        if bindings:
            context = evaluator.module_context(module)
            return unique(
                v for b in fold(bindings, None) for v in evaluator.binding_values(b, context)
            )
        if follow_submodules and module.is_package:
            submodule = self.project.module_named(f"{module.name}.{name}")
            if submodule is not None:
                return (ModuleValue(submodule),)
        return self.unbound_name(name, module) if module.scopes.module.star_imports else ()
