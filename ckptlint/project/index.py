"""The project index: the modules of the project, read, parsed and scoped on first use.

The index knows every file of the project (``paths``) and reads their bytes through the run's
``Snapshot``; a module is parsed when the analysis first asks for it. Parsing is lazy twice
over: definition bodies that touch no line of interest are parsed when first read
(``lazy_tree``), and their scopes are built when first asked for (``scopes``).

A module is scoped for the words of interest the project holds now (``words``): the lines
naming one are where calls of interest can be. Two views share the parsed modules: the
*base* view scopes each module for those words alone; the default view also scopes it for
the names it binds to a region source itself (``ckpt = checkpoint``), which the analysis
computes on the base view (``aliaser``). Both depend only on the files and the words, never
on what was asked before, so a result computed for one file is the same whichever other
files the run computed first.

Everything a computation asks is recorded in the active ``Dependencies`` (see
``recording``): the modules handed out, the names resolved, the folders asked about and the
text searches run over the project's files.
"""

from __future__ import annotations

import ast
import contextlib
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from ckptlint.project.dependencies import Dependencies, ScanKey
from ckptlint.project.files import Snapshot
from ckptlint.project.layout import Layout, resolve_relative
from ckptlint.project.scopes import ModuleScopes, build_scopes
from ckptlint.project.search import matches
from ckptlint.source import UnreadableSource, decode, lines_with_words, parse


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


# Scopes a module for the names it binds to a source, reading other modules in the base view.
Aliaser = Callable[["Module", "Project"], "Module"]


class _Store:
    """What the views share: the files, the words, and the modules parsed so far."""

    def __init__(
        self, layout: Layout, files: Snapshot, paths: Sequence[str], words: frozenset[str]
    ) -> None:
        self.layout = layout
        self.files = files
        self.paths = tuple(os.path.abspath(p) for p in paths)
        self.words = words
        self.base: dict[str, Module | None] = {}
        self.aliased: dict[str, Module | None] = {}
        self.alias_dependencies: dict[str, Dependencies] = {}
        self.errors: dict[str, UnreadableSource] = {}
        self.full_parse: set[str] = set()  # files a lazy split misread
        self.scans: dict[ScanKey, tuple[str, ...]] = {}
        self.recorder: Dependencies | None = None


class Project:
    """Modules by path and by name, loaded on demand and kept for the run."""

    def __init__(
        self,
        layout: Layout,
        files: Snapshot | None = None,
        paths: Sequence[str] = (),
        words: Iterable[str] = (),
        *,
        lazy: bool = True,
        aliaser: Aliaser | None = None,
    ) -> None:
        self._store = _Store(layout, files or Snapshot(), paths, frozenset(words))
        self.lazy = lazy  # parse definition bodies on first read (see lazy_tree)
        self._aliaser = aliaser

    @property
    def layout(self) -> Layout:
        return self._store.layout

    @property
    def files(self) -> Snapshot:
        return self._store.files

    @property
    def paths(self) -> tuple[str, ...]:
        """Every file of the project, whether or not the analysis reads it."""
        return self._store.paths

    @property
    def words(self) -> frozenset[str]:
        return self._store.words

    @property
    def base(self) -> Project:
        """The view that scopes modules for the project's words alone."""
        view = Project.__new__(Project)
        view._store, view.lazy, view._aliaser = self._store, self.lazy, None
        return view

    def set_words(self, words: frozenset[str]) -> None:
        """Scope for more words: modules naming a new one are scoped again."""
        store = self._store
        added = words - store.words
        store.words = words
        if not added:
            return
        rescoped = set()
        for path, module in list(store.base.items()):
            if module is not None and names_any(module, added - module.words):
                store.base[path] = self.rescope(module, module.words | added)
                rescoped.add(path)
        # A module's aliases were computed from its own scoping and the base scoping of the
        # modules they read (learned layer classes act only through the modules naming
        # them): they hold while none of those was scoped again.
        for path in list(store.aliased):
            dependencies = store.alias_dependencies.get(path)
            if path in rescoped or (
                dependencies is not None and not rescoped.isdisjoint(dependencies.modules)
            ):
                store.aliased.pop(path)
                store.alias_dependencies.pop(path, None)

    # -- recording what a computation reads ----------------------------------------------
    @contextlib.contextmanager
    def recording(self) -> Iterator[Dependencies]:
        """Record what the block reads of the project (nested blocks record into both)."""
        store = self._store
        outer = store.recorder
        dependencies = Dependencies()
        store.recorder = store.layout.recorder = dependencies
        try:
            yield dependencies
        finally:
            store.recorder = store.layout.recorder = outer
            if outer is not None:
                outer.merge(dependencies)

    def _record(self, path: str, module: Module | None) -> None:
        recorder = self._store.recorder
        if recorder is None or path in recorder.modules:
            return
        recorder.modules[path] = (self.files.digest(path), self.layout.module_name(path))
        extra = self._store.alias_dependencies.get(path) if self._aliaser else None
        if extra is not None:
            recorder.merge(extra)

    # -- modules ---------------------------------------------------------------------------
    def module_named(self, name: str) -> Module | None:
        path = self.layout.find(name)
        return None if path is None else self.module_at(path)

    def module_at(self, path: str) -> Module | None:
        """The module of a file; None when it cannot be read or parsed (see ``error``)."""
        path = os.path.abspath(path)
        store = self._store
        if self._aliaser is None:
            module = self._base_module(path)
        elif path in store.aliased:
            module = store.aliased[path]
        else:
            module = store.aliased[path] = self._aliased_module(path)
        self._record(path, module)
        return module

    def error(self, path: str) -> UnreadableSource | None:
        """Why ``module_at`` gave None for this file."""
        return self._store.errors.get(os.path.abspath(path))

    def reparse_in_full(self, path: str) -> None:
        """A lazy split misread the file: parse it whole from now on."""
        store = self._store
        path = os.path.abspath(path)
        store.full_parse.add(path)
        store.base.pop(path, None)
        store.aliased.clear()
        store.alias_dependencies.clear()

    def rescope(self, module: Module, words: frozenset[str]) -> Module:
        """The module scoped again for a larger set of words of interest."""
        return self._build(module.path, module.text, module.lines, module.tree, words)

    def _base_module(self, path: str) -> Module | None:
        store = self._store
        if path not in store.base:
            store.base[path] = self._load(path)
        return store.base[path]

    def _aliased_module(self, path: str) -> Module | None:
        module = self._base_module(path)
        if module is None or not module.candidate_lines or self._aliaser is None:
            return module
        with self.recording() as dependencies:
            aliased = self._aliaser(module, self.base)
        self._store.alias_dependencies[path] = dependencies
        return aliased

    def _load(self, path: str) -> Module | None:
        store = self._store
        try:
            text = decode(store.files.data(path))
            lazy = self.lazy and path not in store.full_parse
            parsed = parse(text, path, store.words if lazy else None)
        except UnreadableSource as error:
            store.errors[path] = error
            return None
        except (RecursionError, MemoryError):
            store.errors[path] = UnreadableSource("cannot parse file: too deeply nested")
            return None
        return self._build(path, text, parsed.lines, parsed.tree)

    def _build(
        self,
        path: str,
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
        name = self.layout.module_name(path)
        is_package = self.layout.is_package(path)
        return Module(path, name, is_package, text, lines, tree, words, sorted(candidates), scopes)

    # -- text searches over every file of the project ----------------------------------------
    def files_matching(self, kind: str, word: str) -> tuple[str, ...]:
        """The project's files whose bytes match ``kind`` for ``word`` (``search.KINDS``)."""
        store = self._store
        key = (kind, word)
        found = store.scans.get(key)
        if found is None:
            found = store.scans[key] = scan(store.files, store.paths, kind, word)
        if store.recorder is not None:
            store.recorder.scans[key] = found
        return found

    def seed_scans(self, scans: Mapping[ScanKey, tuple[str, ...]]) -> None:
        """Searches already known to hold for this run's files (an earlier run's, updated)."""
        self._store.scans.update(scans)


def scan(files: Snapshot, paths: Iterable[str], kind: str, word: str) -> tuple[str, ...]:
    found = []
    for path in paths:
        try:
            data = files.data(path)
        except UnreadableSource:
            continue
        if word.encode() in data and matches(kind, word, data):
            found.append(path)
    return tuple(found)


def names_any(module: Module, words: frozenset[str]) -> bool:
    """Whether the module's text names one of ``words`` as an identifier."""
    return bool(words) and bool(lines_with_words(module.lines, sorted(words)))
