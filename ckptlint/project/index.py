"""The project index: the modules of the linted tree, read, parsed and scoped on first use.

Only the files a run lints are read up front; a module another file imports is loaded when
the analysis first follows an import into it. Parsing is lazy twice over: definition bodies
that touch no line of interest are parsed when first read (``lazy_tree``), and their scopes
are built when first asked for (``scopes``).
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from ckptlint.project.layout import Layout, resolve_relative
from ckptlint.project.scopes import ModuleScopes, build_scopes
from ckptlint.source import UnreadableSource, decode, lines_with_words, parse, read_bytes


@dataclass(eq=False)
class Module:
    """One parsed file. ``words`` are the identifiers whose lines were scoped in full."""

    path: str
    name: str
    is_package: bool
    text: str = field(repr=False)
    lines: list[str] = field(repr=False)
    tree: ast.Module = field(repr=False)
    words: frozenset[str] = field(repr=False)
    candidate_lines: list[int] = field(repr=False)  # lines naming one of ``words``, ascending
    scopes: ModuleScopes = field(repr=False)
    _lines_naming: dict[str, list[int]] = field(default_factory=dict, repr=False)

    @property
    def display_path(self) -> str:
        """The path as messages show it: relative to the working folder when inside it."""
        relative = os.path.relpath(self.path)
        return self.path if relative.startswith("..") else relative

    def resolve_import(self, level: int, module: str) -> str | None:
        return resolve_relative(self.name, self.is_package, level, module)

    def lines_naming(self, name: str) -> list[int]:
        """Lines where ``name`` appears as a whole identifier (a text search, no parsing)."""
        found = self._lines_naming.get(name)
        if found is None:
            found = sorted(lines_with_words(self.lines, [name])) if name in self.text else []
            self._lines_naming[name] = found
        return found


class Project:
    """Modules by path and by name, loaded on demand and kept for the run."""

    def __init__(self, layout: Layout, words: Iterable[str] = (), *, lazy: bool = True) -> None:
        self.layout = layout
        self.words = frozenset(words)
        self.lazy = lazy  # parse definition bodies on first read (see lazy_tree)
        self._modules: dict[str, Module | None] = {}

    def _key(self, path: str) -> str:
        """A file is keyed by itself, not by its module name: two trees in one run may both
        hold ``transformers/models/llama/modeling_llama.py`` (imports find the first)."""
        return os.path.abspath(path)

    def read_paths(self) -> set[str]:
        """Every file the analysis read (parsed or not): what its results depend on."""
        return set(self._modules)

    def loaded_modules(self) -> list[Module]:
        return [module for module in self._modules.values() if module is not None]

    def module_named(self, name: str) -> Module | None:
        path = self.layout.find(name)
        return None if path is None else self.module_at(path)

    def module_at(self, path: str, text: str | None = None) -> Module | None:
        """The module of a file (``text`` when already read); None when it cannot be parsed."""
        key = self._key(path)
        if key not in self._modules:
            self._modules[key] = self._load(key, text)
        return self._modules[key]

    def adopt(self, path: str, text: str, tree: ast.Module, lines: list[str]) -> Module:
        """Index a file its caller already parsed (the flake8 plugin's tree)."""
        name = self.layout.module_name(path)
        key = self._key(path)
        module = self._build(key, name, text, lines, tree)
        self._modules[key] = module
        return module

    def rescope(self, module: Module, words: frozenset[str]) -> Module:
        """The module scoped again for a larger set of words of interest."""
        rebuilt = self._build(
            module.path, module.name, module.text, module.lines, module.tree, words
        )
        self._modules[module.path] = rebuilt
        return rebuilt

    def _load(self, path: str, text: str | None) -> Module | None:
        try:
            if text is None:
                text = decode(read_bytes(path))
            parsed = parse(text, path, self.words if self.lazy else None)
        except (UnreadableSource, RecursionError, MemoryError):
            return None
        name = self.layout.module_name(path)
        return self._build(path, name, text, parsed.lines, parsed.tree)

    def _build(
        self,
        path: str,
        name: str,
        text: str,
        lines: list[str],
        tree: ast.Module,
        words: frozenset[str] | None = None,
    ) -> Module:
        words = self.words if words is None else words
        candidates = lines_with_words(lines, sorted(words), skip_assigned=True)
        walrus = (
            frozenset(n for n, line in enumerate(lines, 1) if ":=" in line)
            if ":=" in text
            else frozenset()
        )
        scopes = build_scopes(tree, candidates, walrus)
        is_package = self.layout.is_package(path)
        return Module(path, name, is_package, text, lines, tree, words, sorted(candidates), scopes)
