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
hold (see ``project.state``). Nothing raised while linting a file leaves this module: a file
that cannot be read is CKP902, one that cannot be decoded, parsed or analysed is CKP901, and
anything else is a bug of ours, reported as the file's ``internal_error``.
"""

from __future__ import annotations

import gc
import itertools
import os
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property, partial
from typing import TYPE_CHECKING

from packaging.version import Version

from ckptlint.config import Settings
from ckptlint.core import Finding
from ckptlint.noqa import file_exemption, is_suppressed
from ckptlint.project import cache
from ckptlint.project.files import MISSING, Snapshot, digest_of
from ckptlint.project.layout import Layout
from ckptlint.project.search import NAMES, matches, own_bases
from ckptlint.project.state import ProjectState, StoredResults
from ckptlint.project.stored import (
    Analysed,
    Exported,
    Round,
    StoredProject,
    Words,
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
class _State(ProjectState):
    """The project state of a run, with the analyser of its files."""

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
        self._results = None if store is None else StoredResults(store)
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
            stored = None if fixes or self._results is None else self._results.findings(state, path)
            if stored is not None:
                found[path] = stored
            else:
                missing.append(path)
        if missing:
            workers = self._workers_for(state, len(missing))
            task = partial(FindingsTask, state.words, fixes=fixes)
            for result in workers.run(task, missing):
                found[result.path] = result
                learned = result.dependencies.scans.items() - state.scans.items()
                if learned:  # the findings are stored apart: the project entry only if new
                    state.scans.update(learned)
                    state.dirty = True
                if not fixes and self._results is not None:
                    self._results.keep_findings(state, result)
        return found

    # -- the project's state ----------------------------------------------------------------
    def _state_for(self, overrides: Mapping[str, bytes]) -> _State:
        """The project as the disk holds it (computed once an engine), or with ``overrides``
        (standard input, the text being fixed), derived from it."""
        disk = self._disk
        if disk is None:
            if self._results is None:
                disk = self._disk_state(None)
            else:
                with self._results.store.lock():  # concurrent runs (pre-commit's chunks)
                    disk = self._disk_state(self._results.load_project())  # compute it once
                    if disk.dirty:
                        for path in disk.changed & disk.analysed:  # the findings' lookup asks
                            disk.file_words(path, disk.words)  # (so they need no 2nd write)
                        self._results.write_project(disk)
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
            earlier = known.get((path, state.file_words(path, words)))
            if (
                earlier is not None
                and earlier.digest == state.snapshot.digest(path)
                and state.holds(earlier.dependencies)
            ):
                found[path] = earlier
                if state.refresh_shapes(earlier.dependencies):
                    state.dirty = True
            else:
                missing.append(path)
        if missing:
            workers = self._workers_for(state, len(missing))
            for result in workers.run(partial(ExportsTask, words), missing):
                found[result.path] = result
                state.scans.update(result.dependencies.scans)
                state.dirty = True  # the project entry keeps the exports
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

    def save(self) -> None:
        """Store what the findings computed since the last save learned of the project on disk
        (the searches they ran, the words each file names), for the next run."""
        disk = self._disk
        if disk is not None and disk.dirty and self._results is not None:
            self._results.save_project(disk)
