"""What a run knows of the project, and whether what an earlier run stored still holds.

``ProjectState`` is one view of the project: its files as this run reads them
(``Snapshot``), their module names (``Layout``), discovery's rounds, the searches run so far
and the words each file names. ``holds`` decides whether a stored result may be reused:
every fact it read (``Dependencies``) gives the same answer now, and a changed file of which
only the shape was read is compared by its shape, not its bytes (early cutoff: an edit to a
method body leaves the exports read from the rest of the module valid).

``StoredResults`` is the store's side of a run: each file's findings, one entry each, and
the project entry (``project.json``), loaded, written and saved (merged with what a
concurrent run stored meanwhile).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ckptlint.core import Finding
from ckptlint.project import cache
from ckptlint.project.dependencies import Dependencies, ScanKey, ShapeRead
from ckptlint.project.files import Snapshot
from ckptlint.project.index import scan
from ckptlint.project.layout import Layout
from ckptlint.project.shapes import Shape, shape_of
from ckptlint.project.stored import (
    Analysed,
    Exported,
    Round,
    StoredProject,
    Words,
    decode_project,
    encode_project,
    file_words,
)
from ckptlint.source import UnreadableSource, decode, split_lines

PROJECT_ENTRY = "project.json"


@dataclass
class ProjectState:
    """What a run knows of the project: its files, the discovery, the searches run so far.

    ``changed``: the files whose bytes differ from those the ``earlier`` discovery (the
    stored one, or the disk state an override differs from) was made of.
    """

    paths: list[str]
    snapshot: Snapshot
    layout: Layout
    changed: set[str]
    scans: dict[ScanKey, tuple[str, ...]]
    words: Words
    rounds: list[Round] = field(default_factory=list)
    exported: dict[tuple[str, str], Exported] = field(default_factory=dict)
    # (file digest, words digest): ``file_words``, kept so a warm run reads no file for it
    named: dict[tuple[str, str], str] = field(default_factory=dict)
    shapes: dict[str, Shape] = field(default_factory=dict)  # of changed files, as checked
    analysed: set[str] = field(default_factory=set)  # files discovery analysed
    errors: dict[str, Finding] = field(default_factory=dict)  # CKP901 of those
    internal_errors: dict[str, str] = field(default_factory=dict)
    dirty: bool = False  # learned something the store does not hold

    def file_words(self, path: str, words: Words) -> str:
        """``file_words``, remembered by the file's digest and the words' (reading every
        file's identifiers again took 60 % of a warm run)."""
        key = (self.snapshot.digest(path), words.digest)
        named = self.named.get(key)
        if named is None:
            named = self.named[key] = file_words(self.snapshot, path, words)
            self.dirty = True
        return named

    def holds(self, dependencies: Dependencies) -> bool:
        """Whether everything a stored result read gives the same answers now."""
        snapshot, layout = self.snapshot, self.layout
        for path, (digest, name) in dependencies.modules.items():
            if snapshot.digest(path) != digest or layout.module_name(path) != name:
                return False
        for path, read in dependencies.shapes.items():
            if layout.module_name(path) != read.name:
                return False
            if snapshot.digest(path) != read.digest and not self._same_shape(path, read):
                return False
        for name, resolved in dependencies.resolved.items():
            if layout.find(name) != resolved:
                return False
        for name, found in dependencies.packages.items():
            if layout.is_project_package(name) != found:
                return False
        return all(self.scan(key) == paths for key, paths in dependencies.scans.items())

    def refresh_shapes(self, dependencies: Dependencies) -> bool:
        """A stored result that holds for a changed file whose shape is the same: what it
        read of the file holds for its new bytes too, so the next run need not read it to
        know. Whether anything was refreshed (the result is then stored again)."""
        refreshed = False
        for path, read in dependencies.shapes.items():
            digest = self.snapshot.digest(path)
            if read.digest != digest:
                read.digest = digest
                refreshed = True
        return refreshed

    def scan(self, key: ScanKey) -> tuple[str, ...]:
        """The project's files a text search finds (run once a project state)."""
        found = self.scans.get(key)
        if found is None:
            found = self.scans[key] = scan(self.snapshot, self.paths, *key)
            self.dirty = True
        return found

    def _same_shape(self, path: str, read: ShapeRead) -> bool:
        """Whether a changed file still gives what was read of it (early cutoff)."""
        shape = self.shapes.get(path)
        if shape is None:
            try:
                text = decode(self.snapshot.data(path))
            except UnreadableSource:
                return False
            shape = self.shapes[path] = shape_of(split_lines(text), text)
        if read.skeleton is not None and shape.skeleton != read.skeleton:
            return False
        if read.versions is not None and shape.versions != read.versions:
            return False
        if any(shape.part(key) != digest for key, digest in read.parts.items()):
            return False
        return all(shape.naming(name) == where for name, where in read.names.items())


class StoredResults:
    """A run's results in the store: findings by file, and the project entry."""

    def __init__(self, store: cache.Store) -> None:
        self.store = store

    def findings(self, state: ProjectState, path: str) -> Analysed | None:
        """The file's stored findings, if everything they read holds."""
        words = state.file_words(path, state.words)
        content = self.store.read(cache.findings_name(path, state.snapshot.digest(path), words))
        if content is None:
            return None
        try:
            entry = cache.decode_findings(content)
        except (cache.Invalid, ValueError, TypeError):
            return None
        if not state.holds(entry.dependencies):
            return None
        found = Analysed(path, entry.findings, None, entry.dependencies)
        if state.refresh_shapes(entry.dependencies):
            self.keep_findings(state, found)
        return found

    def keep_findings(self, state: ProjectState, result: Analysed) -> None:
        if result.internal_error is not None:
            return
        digest = state.snapshot.digest(result.path)
        words = state.file_words(result.path, state.words)
        entry = cache.StoredFindings(result.findings, result.dependencies)
        self.store.write(
            cache.findings_name(result.path, digest, words), cache.encode_findings(entry)
        )

    def load_project(self) -> StoredProject | None:
        content = self.store.read(PROJECT_ENTRY)
        if content is None:
            return None
        try:
            return decode_project(content)
        except (cache.Invalid, ValueError, TypeError, KeyError):
            return None

    def write_project(self, state: ProjectState) -> None:
        self.store.write(PROJECT_ENTRY, encode_project(state))
        self.store.prune()
        state.dirty = False

    def save_project(self, state: ProjectState) -> None:
        """Write what this run learned, keeping what another run (a concurrent chunk of
        pre-commit, another flake8 process) stored meanwhile: the searches, for the same
        files, and the words files name (by content, so always true). An entry still as
        this run read or wrote it holds nothing new: it is not decoded again."""
        with self.store.lock():
            stored = self.load_project() if self.store.changed(PROJECT_ENTRY) else None
            if stored is not None:
                for key, named in stored.named.items():
                    state.named.setdefault(key, named)
                if stored.files == state.snapshot.stored():
                    for key, paths in stored.scans.items():
                        state.scans.setdefault(key, paths)
            self.write_project(state)
