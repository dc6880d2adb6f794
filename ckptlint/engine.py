"""Linting a project: one entry point, ``Engine.lint``, for the CLI, standard input and the
flake8 plugin alike.

The engine always knows the whole project (every Python file of it); the files a run names
decide only what it reports. That is what makes every entry point give one answer: the
findings of a file are the same from a run over the whole tree, from the file named alone,
from pre-commit's chunks, from flake8 and from standard input.

A run, for the project's files as it finds them (``Snapshot``):

1. **Discovery** of the project's own region sources, round by round from the sources
   torch and the libraries define: the files whose text can name a source
   (``Prefilter``) are analysed for the names other files reach a source through
   (``ProjectAnalysis.exports``: wrappers, layer subclasses, attributes holding a partial),
   and files naming a new one are analysed next, until no new name appears.
2. **Findings** of every reported file that discovery analysed, with the words it ended with.

Each file's exports, and each file's findings, are computed on their own (a fresh analysis
over the shared parsed modules), so they depend on nothing but the project's files and the
words: not on what else the run named, nor in what order, nor in how many processes. Each is
stored with the ``Dependencies`` it read, and an earlier run's result is reused while those
hold (see ``project.cache``). Nothing raised while linting a file leaves this module: a file
that cannot be read is CKP902, one that cannot be decoded, parsed or analysed is CKP901, and
anything else is a bug of ours, reported as the file's ``internal_error``.
"""

from __future__ import annotations

import gc
import itertools
import os
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import TYPE_CHECKING

from packaging.version import Version

from ckptlint.config import Settings
from ckptlint.core import Finding
from ckptlint.noqa import file_exemption, is_suppressed
from ckptlint.project import cache
from ckptlint.project.dependencies import Dependencies, ScanKey, ShapeRead
from ckptlint.project.files import MISSING, Snapshot, digest_of
from ckptlint.project.index import scan
from ckptlint.project.layout import Layout
from ckptlint.project.search import NAMES, matches, own_bases
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
    updated_scans,
)
from ckptlint.regions.sources import SourceTable, configured_source
from ckptlint.rules import CODES, INACCESSIBLE_PATH, TRIGGERS, UNREADABLE_FILE
from ckptlint.source import (
    CannotRead,
    FileTooLarge,
    Prefilter,
    UnreadableSource,
    decode,
    may_name,
    names_in_bytes,
    names_word,
    read_bytes,
    split_lines,
    token_limit,
    unreadable_finding,
)
from ckptlint.workers import ExportsTask, FindingsTask, Workers, worker_count

if TYPE_CHECKING:  # the analysis is imported only by a run that analyses a file
    from ckptlint.analyser import Analyser
    from ckptlint.analysis import ProjectAnalysis


# -- results ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class FileResult:
    """A file's findings (selection and suppressions applied, unless asked not to)."""

    path: str
    findings: list[Finding]
    internal_error: str | None = None


# -- a run's view of the project -------------------------------------------------------------
@dataclass
class _State:
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
    _analyser: Analyser | None = None

    def analyser(
        self, table: SourceTable, target_torch: Version | None, max_tokens: int
    ) -> Analyser:
        """This process's analyser of the project (kept: it holds the parsed modules)."""
        if self._analyser is None:
            from ckptlint.analyser import Analyser

            self._analyser = Analyser(
                table, self.layout, self.snapshot, self.paths, target_torch, max_tokens
            )
        self._analyser.seed_scans(self.scans)
        return self._analyser


class Engine:
    """Lints files of one project: ``paths`` are all its Python files."""

    def __init__(
        self,
        settings: Settings,
        paths: Iterable[str],
        store: cache.Store | None = None,
        jobs: int | None = None,
    ) -> None:
        self.settings = settings
        self.paths = sorted(dict.fromkeys(os.path.abspath(p) for p in paths))
        self.store = store
        self.jobs = jobs
        self.notes: list[str] = []  # what the user should know (a worker died...)
        self._disk: _State | None = None
        self._workers: Workers | None = None

    @cached_property
    def table(self) -> SourceTable:
        extra = [
            configured_source(item)
            if isinstance(item, str)
            else configured_source(item.name, item.kind, item.region)  # type: ignore[arg-type]
            for item in self.settings.extend_checkpoint_functions
        ]
        return SourceTable.build(extra)

    @cached_property
    def target_torch(self) -> Version | None:
        target = self.settings.target_torch
        return None if target is None else Version(target)

    @cached_property
    def selected(self) -> frozenset[str]:
        return frozenset(code for code in CODES if self.settings.is_selected(code))

    # -- the entry point ------------------------------------------------------------------
    def lint(
        self,
        reported: Sequence[str],
        overrides: Mapping[str, bytes] | None = None,
        *,
        suppress: bool = True,
        fixes: bool = False,
        save: bool = True,
    ) -> list[FileResult]:
        """The findings of ``reported`` (in that order, as spelled), the project's files read
        from disk except those ``overrides`` gives. ``suppress``: apply ``# noqa`` comments
        (the flake8 plugin applies flake8's own); ``fixes``: findings carry their fixes,
        computed from the exact bytes (never taken from the cache); ``save``: store what the
        findings learned of the project now, not at the caller's ``save`` (the flake8 plugin,
        called once a file, saves once a process)."""
        collecting = gc.isenabled()
        gc.disable()  # millions of objects, almost none freed before the end (16 % of the time)
        try:
            with warnings.catch_warnings():
                # Python's parser warns about the code it reads (invalid escape sequences):
                # not ours to print, and under ``-W error`` it would be a false CKP901.
                warnings.simplefilter("ignore")
                state = self._state_for(overrides or {})
                absolute = [os.path.abspath(path) for path in reported]
                analysed = self._analysed(state, list(dict.fromkeys(absolute)), fixes)
                results = [
                    self._result(state, path, shown, analysed.get(path), suppress)
                    for path, shown in zip(absolute, reported, strict=True)
                ]
                if save and state is self._disk:
                    self.save()
                return results
        finally:
            if self._workers is not None:
                self.notes.extend(self._workers.notes)
                self._workers.close()
                self._workers = None
            if collecting:
                gc.enable()

    def _result(
        self, state: _State, path: str, shown: str, analysed: Analysed | None, suppress: bool
    ) -> FileResult:
        digest = state.snapshot.digest(path)
        if digest == MISSING:
            findings = [unreadable_finding(INACCESSIBLE_PATH, CannotRead("no such file"))]
        elif digest.startswith("!"):
            findings = [self._unreadable(state, path)]
        elif path in state.internal_errors:
            return FileResult(shown, [], state.internal_errors[path])
        elif path in state.errors:
            findings = [state.errors[path]]
        elif analysed is None:
            findings = []  # its text cannot reach a region source
        elif analysed.internal_error is not None:
            return FileResult(shown, [], analysed.internal_error)
        else:
            findings = list(analysed.findings)
        return FileResult(shown, self._keep(state, path, findings, suppress))

    def _unreadable(self, state: _State, path: str) -> Finding:
        try:
            state.snapshot.data(path)
        except FileTooLarge as error:
            return unreadable_finding(UNREADABLE_FILE, error)
        except CannotRead as error:
            return unreadable_finding(INACCESSIBLE_PATH, error)
        except UnreadableSource as error:
            return unreadable_finding(UNREADABLE_FILE, error)
        raise AssertionError("an unreadable file was read")  # pragma: no cover

    def _keep(
        self, state: _State, path: str, findings: list[Finding], suppress: bool
    ) -> list[Finding]:
        """Drop unselected and per-file-ignored findings, and (``suppress``) those a
        ``# noqa`` comment or a file-level exemption covers."""
        findings = [
            f
            for f in findings
            if f.code in self.selected and not self.settings.is_ignored_in(f.code, path)
        ]
        if not suppress or not findings:
            return findings
        try:
            text = decode(state.snapshot.data(path))
        except UnreadableSource:
            return findings
        exemption = file_exemption(text)
        lines = split_lines(text)
        return [
            f
            for f in findings
            if not (exemption is not None and exemption.covers(f.code))
            and not (0 < f.line <= len(lines) and is_suppressed(lines[f.line - 1], f.code))
        ]

    @property
    def work(self) -> int:
        """How many answers this engine's analysis of the files on disk computed (reused
        ones not counted): the measure of work a test can bound without a clock."""
        disk = self._disk
        if disk is None or disk._analyser is None:
            return 0
        return disk._analyser.analysis.solver.computed

    def analysis(self) -> tuple[list[str], ProjectAnalysis]:
        """The files discovery analysed, and one analysis of the project for the words it
        ended with (benchmarks read sites, regions and reaches from it)."""
        state = self._state_for({})
        analyser = state.analyser(
            self.table, self.target_torch, token_limit(self.settings.max_file_size)
        )
        analyser.use(state.words)
        analysed = [p for p in self.paths if p in state.analysed and p not in state.errors]
        return analysed, analyser.analysis

    # -- findings ---------------------------------------------------------------------------
    def _analysed(self, state: _State, paths: list[str], fixes: bool) -> dict[str, Analysed]:
        """The findings of the files discovery analysed among ``paths``: stored, or computed."""
        found: dict[str, Analysed] = {}
        missing = []
        for path in paths:
            if path not in state.analysed or path in state.errors:
                continue
            if path in state.internal_errors:
                continue
            stored = None if fixes else self._stored_findings(state, path)
            if stored is not None:
                found[path] = stored
            else:
                missing.append(path)
        if missing:
            workers = self._workers_for(state, len(missing))
            task = partial(FindingsTask, state.words, fixes=fixes)
            for result in workers.run(task, missing):
                found[result.path] = result
                state.scans.update(result.dependencies.scans)
                state.dirty = True
                if not fixes:
                    self._store_findings(state, result)
        return found

    def _stored_findings(self, state: _State, path: str) -> Analysed | None:
        if self.store is None:
            return None
        words = self._file_words(state, path, state.words)
        name = cache.findings_name(path, state.snapshot.digest(path), words)
        content = self.store.read(name)
        if content is None:
            return None
        try:
            entry = cache.decode_findings(content)
        except (cache.Invalid, ValueError, TypeError):
            return None
        if not self._holds(state, entry.dependencies):
            return None
        return Analysed(path, entry.findings, None, entry.dependencies)

    def _store_findings(self, state: _State, result: Analysed) -> None:
        if self.store is None or result.internal_error is not None:
            return
        digest = state.snapshot.digest(result.path)
        words = self._file_words(state, result.path, state.words)
        name = cache.findings_name(result.path, digest, words)
        entry = cache.StoredFindings(result.findings, result.dependencies)
        self.store.write(name, cache.encode_findings(entry))

    def _file_words(self, state: _State, path: str, words: Words) -> str:
        """``file_words``, remembered by the file's digest and the words' (reading every
        file's identifiers again took 60 % of a warm run)."""
        key = (state.snapshot.digest(path), words.digest)
        named = state.named.get(key)
        if named is None:
            named = state.named[key] = file_words(state.snapshot, path, words)
            state.dirty = True
        return named

    def _holds(self, state: _State, dependencies: Dependencies) -> bool:
        """Whether everything a stored result read gives the same answers now."""
        snapshot, layout = state.snapshot, state.layout
        for path, (digest, name) in dependencies.modules.items():
            if snapshot.digest(path) != digest or layout.module_name(path) != name:
                return False
        for path, read in dependencies.shapes.items():
            if layout.module_name(path) != read.name:
                return False
            if snapshot.digest(path) != read.digest and not self._same_shape(state, path, read):
                return False
        for name, resolved in dependencies.resolved.items():
            if layout.find(name) != resolved:
                return False
        for name, found in dependencies.packages.items():
            if layout.is_project_package(name) != found:
                return False
        return all(self._scan(state, key) == paths for key, paths in dependencies.scans.items())

    def _refresh_shapes(self, state: _State, dependencies: Dependencies) -> None:
        """Stored exports that hold for a changed file whose shape is the same: what they read
        of it holds for its new bytes too, so the next run need not read it to know."""
        shapes = dependencies.shapes
        for path, read in shapes.items():
            digest = state.snapshot.digest(path)
            if read.digest != digest:
                read.digest = digest
                state.dirty = True

    def _same_shape(self, state: _State, path: str, read: ShapeRead) -> bool:
        """Whether a changed file still gives what was read of it (early cutoff)."""
        shape = state.shapes.get(path)
        if shape is None:
            try:
                text = decode(state.snapshot.data(path))
            except UnreadableSource:
                return False
            shape = state.shapes[path] = shape_of(split_lines(text), text)
        if read.skeleton is not None and shape.skeleton != read.skeleton:
            return False
        if read.versions is not None and shape.versions != read.versions:
            return False
        if any(shape.parts.get(key) != digest for key, digest in read.parts.items()):
            return False
        return all(shape.naming(name) == where for name, where in read.names.items())

    def _scan(self, state: _State, key: ScanKey) -> tuple[str, ...]:
        found = state.scans.get(key)
        if found is None:
            found = state.scans[key] = scan(state.snapshot, state.paths, *key)
            state.dirty = True
        return found

    # -- the project's state ----------------------------------------------------------------
    def _state_for(self, overrides: Mapping[str, bytes]) -> _State:
        """The project as the disk holds it (computed once an engine), or with ``overrides``
        (standard input, the text being fixed), derived from it."""
        disk = self._disk
        if disk is None:
            if self.store is None:
                disk = self._disk_state(None)
            else:
                with self.store.lock():  # concurrent runs (pre-commit's chunks) compute it once
                    disk = self._disk_state(self._load_project())
                    if disk.dirty:
                        self._write_project(disk)
            self._disk = disk
        overrides = {os.path.abspath(p): data for p, data in overrides.items()}
        if all(disk.snapshot.digest(p) == digest_of(data) for p, data in overrides.items()):
            return disk  # the text handed over is the file's own (flake8 read the disk)
        snapshot = disk.snapshot.overlay(overrides)
        paths = sorted({*disk.paths, *overrides})
        changed = {p for p in overrides if disk.snapshot.digest(p) != snapshot.digest(p)}
        state = _State(
            paths,
            snapshot,
            Layout(paths) if len(paths) != len(disk.paths) else disk.layout,
            changed,
            updated_scans(disk.scans, snapshot, paths, changed),
            Words(self.table.words),
            named=disk.named,
        )
        self._discover(state, disk.rounds, disk.exported)
        return state

    def _disk_state(self, stored: StoredProject | None) -> _State:
        previous = stored.files if stored is not None else {}
        read = partial(read_bytes, max_size=self.settings.max_file_size)
        snapshot = Snapshot(previous=previous, read=read)
        for path in self.paths:
            snapshot.digest(path)
        changed = {
            p for p in self.paths if p not in previous or previous[p].digest != snapshot.digest(p)
        }
        scans = updated_scans(stored.scans, snapshot, self.paths, changed) if stored else {}
        state = _State(
            self.paths, snapshot, Layout(self.paths), changed, scans, Words(self.table.words)
        )
        if stored is None:
            state.changed = set(self.paths)
        else:
            state.named = stored.named
        self._discover(state, stored.rounds if stored else [], stored.exported if stored else {})
        state.dirty = state.dirty or stored is None or bool(changed) or snapshot.reads > 0
        return state

    def _discover(
        self, state: _State, trace: list[Round], known: Mapping[tuple[str, str], Exported]
    ) -> None:
        """Discovery, round by round (see the module docstring). While the rounds are those of
        the earlier ``trace``, it tells which unchanged files each analysed; an earlier
        file's exports are reused while what they read holds."""
        words = state.words
        new = words
        owned: list[str] = []
        exported: dict[str, frozenset[str]] = {}  # each file's own exports so far
        following = True
        for index in itertools.count():
            earlier = trace[index] if following and index < len(trace) else None
            if earlier is None or earlier.new != new:
                earlier, following = None, False
            pending = self._pending(state, new, earlier, TRIGGERS if index == 0 else ())
            reprocess = self._reprocess(state, owned, new, earlier, exported) if index else ()
            state.rounds.append(Round(new, pending, reprocess))
            state.analysed.update(pending)
            calls: set[str] = set()
            classes: set[str] = set()
            for result in self._exports(state, words, [*reprocess, *pending], known):
                if result.error is not None:
                    state.errors[result.path] = result.error
                if result.internal_error is not None:
                    state.internal_errors[result.path] = result.internal_error
                calls |= result.calls
                classes |= result.classes
                exported[result.path] = exported.get(result.path, frozenset()) | (
                    result.calls | result.classes
                )
            owned.extend(p for p in pending if p not in state.errors)
            added = Words(frozenset(calls) - words.names, frozenset(classes) - words.names)
            if not added.names:
                state.words = words
                return
            words = Words(words.calls | added.calls, words.classes | added.classes)
            new = added

    def _pending(
        self, state: _State, new: Words, earlier: Round | None, triggers: Sequence[str]
    ) -> tuple[str, ...]:
        """Files not analysed yet whose bytes can name one of the round's new words (or, in
        the first round, a rule's trigger anywhere)."""
        prefilter = Prefilter(new.names)
        known = set(earlier.pending) if earlier is not None else None
        found = []
        for path in state.paths:
            if path in state.analysed:
                continue
            if known is not None and path not in state.changed:
                if path in known:
                    found.append(path)
                continue
            try:
                data = state.snapshot.data(path)
            except UnreadableSource:
                continue
            names = names_in_bytes(data) if prefilter.needs_names else None
            if prefilter.passes(data, names) or any(matches(NAMES, w, data) for w in triggers):
                found.append(path)
                if names is not None:
                    state.snapshot.names(path, names)  # the file is analysed: scanned once
        return tuple(found)

    def _reprocess(
        self,
        state: _State,
        owned: list[str],
        new: Words,
        earlier: Round | None,
        exported: Mapping[str, frozenset[str]],
    ) -> tuple[str, ...]:
        """Files analysed in earlier rounds that a new word can change: they name one that
        another file exported, or one of their own classes is the base of a class of theirs.

        A file naming only words it exported itself is left alone: its own wrappers,
        factories and bindings to a source are among the names it was scoped with already
        (its local aliases), and a class of its own reaches other classes of it only as
        their base (see ``search.own_bases``)."""
        known = set(earlier.reprocess) if earlier is not None else None
        found = []
        for path in owned:
            if known is not None and path not in state.changed:
                if path in known:
                    found.append(path)
                continue
            own = exported.get(path, frozenset())
            others = new.names - own
            mine = new.classes & own
            try:
                named = may_name(others, state.snapshot.names(path))
                if not (named or mine):
                    continue  # the file names none of the words: no need to decode it
                text = decode(state.snapshot.data(path))
            except UnreadableSource:
                continue
            if any(names_word(text, word) for word in named) or own_bases(text, mine):
                found.append(path)
        return tuple(found)

    def _exports(
        self,
        state: _State,
        words: Words,
        paths: list[str],
        known: Mapping[tuple[str, str], Exported],
    ) -> list[Exported]:
        found: dict[str, Exported] = {}
        missing = []
        for path in paths:
            earlier = known.get((path, self._file_words(state, path, words)))
            if (
                earlier is not None
                and earlier.digest == state.snapshot.digest(path)
                and self._holds(state, earlier.dependencies)
            ):
                found[path] = earlier
                self._refresh_shapes(state, earlier.dependencies)
            else:
                missing.append(path)
        if missing:
            workers = self._workers_for(state, len(missing))
            for result in workers.run(partial(ExportsTask, words), missing):
                found[result.path] = result
                state.scans.update(result.dependencies.scans)
                state.dirty = True
        results = [found[path] for path in paths]
        for result in results:
            state.exported[(result.path, result.words)] = result
        return results

    def _workers_for(self, state: _State, files: int) -> Workers:
        """The processes of this call to ``lint``, started when there is work enough."""
        local = state.analyser(
            self.table, self.target_torch, token_limit(self.settings.max_file_size)
        )
        count = worker_count(self.jobs, files)
        workers = self._workers
        if workers is not None and workers.local is local and (workers.size > 1 or count == 1):
            return workers
        if workers is not None:
            self.notes.extend(workers.notes)
            workers.close()
        if count > 1:
            state.snapshot.read_all(state.paths)  # the workers inherit the bytes read
        self._workers = Workers(local, count)
        return self._workers

    # -- the store ----------------------------------------------------------------------------
    def _load_project(self) -> StoredProject | None:
        assert self.store is not None
        content = self.store.read("project.json")
        if content is None:
            return None
        try:
            return decode_project(content)
        except (cache.Invalid, ValueError, TypeError, KeyError):
            return None

    def save(self) -> None:
        """Store what the findings computed since the last save learned of the project on disk
        (the searches they ran, the words each file names), for the next run."""
        disk = self._disk
        if disk is not None and disk.dirty and self.store is not None:
            self._save_project(disk)

    def _write_project(self, state: _State) -> None:
        assert self.store is not None
        self.store.write("project.json", encode_project(state))
        self.store.prune()
        state.dirty = False

    def _save_project(self, state: _State) -> None:
        """Write what this run learned, keeping what another run (a concurrent chunk of
        pre-commit, another flake8 process) stored meanwhile: the searches, for the same
        files, and the words files name (by content, so always true). An entry still as
        this run read or wrote it holds nothing new: it is not decoded again."""
        assert self.store is not None
        with self.store.lock():
            stored = self._load_project() if self.store.changed("project.json") else None
            if stored is not None:
                for key, named in stored.named.items():
                    state.named.setdefault(key, named)
                if stored.files == state.snapshot.stored():
                    for key, paths in stored.scans.items():
                        state.scans.setdefault(key, paths)
            self._write_project(state)
