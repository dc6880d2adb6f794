"""The project index: the modules of the project, read, parsed and scoped on first use.

The index knows every file of the project (``paths``) and reads their bytes through the run's
``Snapshot``; a module is parsed when the analysis first asks for it, once a run. Parsing is
lazy twice over: definition bodies that touch no line naming one of ``eager_words`` are
parsed when first read (``lazy_tree``), and scopes are built when first asked for
(``scopes``). Neither depends on what the analysis looks for later (the words discovery
learns): a module is the same object for the whole run, so every answer computed on it can
be shared by every question asked of it.

Everything a computation reads of the project is recorded with the ``Recorder`` (the run's
solver) as one of the records of ``project.facts``: the modules handed out, what was read of
them, the names resolved, the folders asked about and the text searches run over the
project's files.
"""

from __future__ import annotations

import ast
import os
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ckptlint.lazy_tree import LAZY_DEFINITIONS
from ckptlint.project.dependencies import ScanKey
from ckptlint.project.facts import (
    ModuleRead,
    NamesRead,
    PartRead,
    Recorder,
    ScanRead,
    SkeletonRead,
    VersionsRead,
    WholeRead,
)
from ckptlint.project.files import Snapshot
from ckptlint.project.layout import Layout, resolve_relative
from ckptlint.project.scopes import ModuleScopes, build_scopes, lines_binding_outward
from ckptlint.project.search import matches
from ckptlint.project.shapes import Shape, shape_of
from ckptlint.source import (
    DEFAULT_MAX_FILE_SIZE,
    UnreadableSource,
    decode,
    lines_with_words,
    may_name,
    parse,
    token_limit,
)


@dataclass(eq=False)
class Module:
    """One parsed file."""

    path: str
    name: str
    is_package: bool
    text: str = field(repr=False)
    lines: list[str] = field(repr=False)
    tree: ast.Module = field(repr=False)
    scopes: ModuleScopes = field(repr=False)
    shape: Shape = field(repr=False)
    names: frozenset[bytes] = field(repr=False)  # the file's ``names_in_bytes``
    digest: str = field(repr=False)  # the file's bytes' (``Snapshot.digest``)
    recorder: Recorder | None = field(default=None, repr=False)
    _candidates: dict[frozenset[str], list[int]] = field(default_factory=dict, repr=False)

    @property
    def tests_versions(self) -> bool:
        """Whether the text may test a version (``is_torch_version``, ``__version__``...):
        only then can a branch of it be decided by the torch the project targets."""
        if self.recorder is not None:
            self.recorder.read(VersionsRead(self.path, self.shape.versions))
        return self.shape.versions

    @property
    def display_path(self) -> str:
        """The path as messages show it: relative to the working folder when inside it."""
        relative = os.path.relpath(self.path)
        return self.path if relative.startswith("..") else relative

    def resolve_import(self, level: int, module: str) -> str | None:
        return resolve_relative(self.name, self.is_package, level, module)

    def lines_naming(self, name: str, within: tuple[int, int] | None = None) -> Sequence[int]:
        """Lines (ascending) where ``name`` appears as a whole identifier (a text search, no
        parsing); ``within``, those among the lines first to last of a span (found by
        bisection: a module's every function asking costs no pass over every line)."""
        if self.recorder is not None:
            self.recorder.read(NamesRead(self.path, name, self.shape.naming(name)))
        found = self.shape.lines_naming(name)
        if within is None:
            return found
        return found[bisect_left(found, within[0]) : bisect_right(found, within[1])]

    def line_text(self, number: int) -> str:
        """The text of line ``number`` (1-based), read as a part of the module: the body of
        the definition holding it, or the skeleton."""
        if self.recorder is not None:
            key = self.shape.key_at(number)
            if key:
                self.recorder.read(PartRead(self.path, key, self.shape.part(key) or ""))
            else:
                self.recorder.read(SkeletonRead(self.path, self.shape.skeleton))
        return self.lines[number - 1]

    def cite(self, line: int) -> str:
        """How a message names line ``line`` of this module (``path:line``): where the
        lines are then matters, so the module is read whole."""
        self.read_whole()
        return f"{self.display_path}:{line}"

    def read_whole(self) -> None:
        if self.recorder is not None:
            self.recorder.read(WholeRead(self.path, self.digest, self.name))

    def candidate_lines(self, words: frozenset[str]) -> list[int]:
        """Lines naming one of ``words`` (ascending), where calls of interest can be; a
        line that only assigns to such a name does not count. A search of the whole text:
        it reads the module whole."""
        self.read_whole()
        found = self._candidates.get(words)
        if found is None:
            named = may_name(words, self.names)
            found = sorted(lines_with_words(self.lines, named, skip_assigned=True, text=self.text))
            self._candidates[words] = found
        return found


class Project:
    """Modules by path and by name, loaded on demand and kept for the run."""

    def __init__(
        self,
        layout: Layout,
        files: Snapshot | None = None,
        paths: Sequence[str] = (),
        eager_words: Iterable[str] = (),
        *,
        lazy: bool = True,
        recorder: Recorder | None = None,
        max_tokens: int = token_limit(DEFAULT_MAX_FILE_SIZE),
    ) -> None:
        self.layout = layout
        self.files = files or Snapshot()
        self.paths = tuple(os.path.abspath(p) for p in paths)  # every file of the project
        self.eager_words = frozenset(eager_words)
        self.lazy = lazy  # parse definition bodies on first read (see lazy_tree)
        self.max_tokens = max_tokens  # a file holding more is not parsed (see source.parse)
        self.recorder = recorder
        layout.recorder = recorder
        self._modules: dict[str, Module | None] = {}
        # Definitions parsed with their module (not lazily): read whenever the module is.
        self._always_read: dict[str, list[str]] = {}
        self._loading: dict[str, None] | None = None  # of the module being loaded
        self._errors: dict[str, UnreadableSource] = {}
        self._scans: dict[ScanKey, tuple[str, ...]] = {}

    def attach(self, recorder: Recorder) -> None:
        """Record what is read of the project with ``recorder`` from now on."""
        self.recorder = self.layout.recorder = recorder

    # -- modules ---------------------------------------------------------------------------
    def module_named(self, name: str) -> Module | None:
        path = self.layout.find(name)
        return None if path is None else self.module_at(path)

    def module_at(self, path: str) -> Module | None:
        """The module of a file; None when it cannot be read or parsed (see ``error``)."""
        path = os.path.abspath(path)
        modules = self._modules
        if path in modules:
            module = modules[path]
        else:
            module = modules[path] = self._load(path)
        if self.recorder is not None:
            name = self.layout.module_name(path)
            self.recorder.read(ModuleRead(path, self.files.digest(path), name))
            if module is None:  # what it gives once readable cannot be told from its shape
                self.recorder.read(WholeRead(path, self.files.digest(path), name))
            else:
                self.recorder.read(SkeletonRead(path, module.shape.skeleton))
                for key in self._always_read.get(path, ()):
                    self.recorder.read(PartRead(path, key, module.shape.part(key) or ""))
        return module

    def error(self, path: str) -> UnreadableSource | None:
        """Why ``module_at`` gave None for this file."""
        return self._errors.get(os.path.abspath(path))

    def _load(self, path: str) -> Module | None:
        try:
            data = self.files.data(path)
            text = decode(data)
            parsed = parse(text, path, self.eager_words if self.lazy else None, self.max_tokens)
        except UnreadableSource as error:
            self._errors[path] = error
            return None
        except (RecursionError, MemoryError):
            self._errors[path] = UnreadableSource("cannot parse file: too deeply nested")
            return None
        lines, tree = parsed.lines, parsed.tree
        name = self.layout.module_name(path)
        is_package = self.layout.is_package(path)
        shape = shape_of(lines, text, parsed.chunks)
        # The bodies the scopes are built from now are read with the module too.
        always = self._loading = self._watch_reads(path, tree, shape)
        try:
            scopes = build_scopes(tree, lines_binding_outward(lines, text))
        finally:
            self._loading = None
            self._always_read[path] = list(always)
        names = self.files.names(path)
        digest = self.files.digest(path)
        return Module(
            path, name, is_package, text, lines, tree, scopes, shape, names, digest, self.recorder
        )

    def _watch_reads(self, path: str, tree: ast.Module, shape: Shape) -> dict[str, None]:
        """Have each lazily parsed definition tell the recorder when its body is read; the
        others count as read with their module: their keys, as an ordered set (a module may
        hold thousands of definitions)."""
        always: dict[str, None] = {}
        for statement in tree.body:
            key = shape.key_at(statement.lineno)
            if not key:
                continue
            if isinstance(statement, LAZY_DEFINITIONS):
                statement.on_read = _PartWatch(self, path, key, shape)
            else:
                always.setdefault(key)
        return always

    def _read(self, fact: PartRead) -> None:
        if self._loading is not None:
            self._loading.setdefault(fact.key)
        if self.recorder is not None:
            self.recorder.read(fact)

    # -- text searches over every file of the project ----------------------------------------
    def files_matching(self, kind: str, word: str) -> tuple[str, ...]:
        """The project's files whose bytes match ``kind`` for ``word`` (``search.KINDS``)."""
        key = (kind, word)
        found = self._scans.get(key)
        if found is None:
            found = self._scans[key] = scan(self.files, self.paths, kind, word)
        if self.recorder is not None:
            self.recorder.read(ScanRead(key, found))
        return found

    def seed_scans(self, scans: Mapping[ScanKey, tuple[str, ...]]) -> None:
        """Searches already known to hold for this run's files (an earlier run's, updated)."""
        self._scans.update(scans)


class _PartWatch:
    """Told each time a lazily parsed definition's body is read: records it as read (its
    fact, and so its digest, made on the first read)."""

    __slots__ = ("project", "path", "key", "shape", "fact")

    def __init__(self, project: Project, path: str, key: str, shape: Shape) -> None:
        self.project, self.path, self.key, self.shape = project, path, key, shape
        self.fact: PartRead | None = None

    def __call__(self) -> None:
        fact = self.fact
        if fact is None:
            fact = self.fact = PartRead(self.path, self.key, self.shape.part(self.key) or "")
        self.project._read(fact)


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
