"""Linting a project: read → prefilter → parse → project analysis → rules → suppressions.

``Linter.lint_files`` lints the files of a run together, so a region defined in one file and
checkpointed in another is seen whole. ``Linter.lint_text`` lints one text as if it were the
file at ``path`` (tests, editors, the fix phase); the files around that path are still read
when the analysis follows an import into them. The flake8 plugin calls ``analyze`` on the
tree flake8 parsed, so both report the same findings at the same places.

Nothing raised while linting a file leaves this module: a file that cannot be read is
CKP902, one that cannot be decoded, parsed or analysed (nesting too deep for the parser or
the analysis) is CKP901, and anything else is a bug of ours, reported as the file's
``internal_error`` while the run goes on.
"""

from __future__ import annotations

import ast
import contextlib
import gc
import hashlib
import multiprocessing
import os
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import cached_property
from multiprocessing.connection import Connection
from typing import Any

from ckptlint.analysis import Exports, ProjectAnalysis, names_any, with_local_aliases
from ckptlint.config import Settings
from ckptlint.core import Finding
from ckptlint.lazy_tree import LazyTreeMismatch, check_unparsed_bodies
from ckptlint.noqa import file_exemption, is_suppressed
from ckptlint.project.cache import CachedRun, FileState, RunCache
from ckptlint.project.index import Module, Project
from ckptlint.project.layout import Layout
from ckptlint.regions.sources import SourceTable, configured_source
from ckptlint.rules import ALL_RULES
from ckptlint.rules.base import FileContext
from ckptlint.rules.io_error import InaccessiblePath
from ckptlint.rules.unreadable_file import UnreadableFile
from ckptlint.source import (
    CannotRead,
    Prefilter,
    UnreadableSource,
    decode,
    parse,
    read_bytes,
    split_lines,
)

TOO_DEEP = "too deeply nested to analyse"


def analyze(module: Module, analysis: ProjectAnalysis, selected: frozenset[str]) -> list[Finding]:
    """Findings of the selected rules on one module, before any suppression."""
    context = FileContext(module, analysis)
    findings = [
        finding for rule in ALL_RULES if rule.code in selected for finding in rule.check(context)
    ]
    return sorted(set(findings))


def analyze_safely(
    module: Module, analysis: ProjectAnalysis, selected: frozenset[str]
) -> list[Finding]:
    """``analyze``, then the syntax of the bodies no rule read; input nested too deeply, or
    a syntax error in a body parsed late, is one CKP901 finding."""
    try:
        findings = analyze(module, analysis, selected)
        check_unparsed_bodies(module.tree, module.text, f"<{module.path}>")
    except SyntaxError as error:  # in a lazily parsed body
        unreadable = UnreadableSource(
            f"syntax error: {error.msg}", error.lineno or 1, error.offset or 1
        )
        return [_finding(UnreadableFile.code, unreadable)]
    except (RecursionError, MemoryError):
        return [too_deep_finding(module.tree)]
    return findings


def too_deep_finding(tree: ast.AST) -> Finding:
    """CKP901 at the most deeply nested node (found without recursion)."""
    line, depth = 1, 0
    try:
        stack = [(tree, 0)]
        while stack:
            node, level = stack.pop()
            if level > depth:
                depth, line = level, getattr(node, "lineno", line)
            stack.extend((child, level + 1) for child in ast.iter_child_nodes(node))
    except Exception:  # a lazily parsed body that fails here: the line found so far will do
        pass
    message = f"{TOO_DEEP}: nesting depth {depth} at line {line}; split the expression"
    return Finding(line, 1, UnreadableFile.code, message, end_line=line, end_column=1)


@dataclass(frozen=True)
class FileResult:
    """A file's findings (selection and suppressions applied). ``digest`` identifies the
    bytes they were found in (the fix phase reuses them when the file is unchanged)."""

    path: str
    findings: list[Finding]
    internal_error: str | None = None
    digest: str | None = None


def digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


@dataclass(frozen=True)
class LintTarget:
    """A file to lint; ``explicit`` when named on the command line (always parsed)."""

    path: str
    explicit: bool = True


class Linter:
    """Lints files under one set of settings."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        # Names the last run over files found to reach a region source (project wrappers,
        # layer subclasses...): linting one text afterwards (the fix phase) looks for them too.
        self.discovered_words: frozenset[str] = frozenset()
        self._neighbours: Project | None = None  # analyze_tree's modules, kept between files

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
    def prefilter(self) -> Prefilter:
        return Prefilter(self.table.words)

    @cached_property
    def selected(self) -> frozenset[str]:
        return frozenset(rule.code for rule in ALL_RULES if self.settings.is_selected(rule.code))

    # -- a run over files ------------------------------------------------------------------
    def lint_files(
        self,
        targets: Iterable[LintTarget],
        jobs: int | None = None,
        cache: RunCache | None = None,
    ) -> list[FileResult]:
        """Lint files together; results in the order given. ``jobs``: worker processes
        (default: one per CPU when there are enough candidate files to pay for them);
        ``cache``: reuse the results of the last such run while they still hold."""
        targets = list(targets)
        if cache is not None:
            reused = self._reuse(cache, targets)
            if reused is not None:
                return reused
        # The analysis allocates millions of objects and frees almost none before the end:
        # the cycle collector would scan them over and over (measured: 16 % of the time).
        collecting = gc.isenabled()
        gc.disable()
        try:
            # Python's parser warns about the code it reads (invalid escape sequences): not
            # ours to print, and under ``-W error`` it would turn into a false CKP901.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    return self._lint_files(targets, jobs, cache, lazy=True)
                except LazyTreeMismatch:  # a lazy split misread a file: parse all in full
                    return self._lint_files(targets, jobs, cache, lazy=False)
        finally:
            if collecting:
                gc.enable()

    def _lint_files(
        self, targets: list[LintTarget], jobs: int | None, cache: RunCache | None, *, lazy: bool
    ) -> list[FileResult]:
        data: dict[str, bytes] = {}
        stats: dict[str, os.stat_result] = {}
        unreadable: dict[str, Finding] = {}
        for target in targets:
            try:
                stats[target.path] = os.stat(target.path)
                data[target.path] = read_bytes(target.path)
            except CannotRead as error:
                unreadable[target.path] = _finding(InaccessiblePath.code, error)
            except OSError as error:
                reason = f"cannot read file: {error.strerror or error}"
                unreadable[target.path] = _finding(InaccessiblePath.code, CannotRead(reason))
        paths = [t.path for t in targets if t.path in data]
        explicit = {t.path for t in targets if t.explicit}
        pending = [p for p in paths if p in explicit or self.prefilter.passes(data[p])]
        sessions = _start_sessions(self, paths, data, lazy, _processes(jobs, len(pending)))
        try:
            words = self._discover(sessions, paths, data, pending)
            results = {r.path: r for session in sessions for r in session.call("results")}
            read: set[str] = set()
            missing: set[str] = set()
            for session in sessions:
                session_read, session_missing = session.call("footprint")
                read |= session_read
                missing |= session_missing
        finally:
            for session in sessions:
                session.close()
        self.discovered_words = words - self.table.words
        ordered = []
        for target in targets:
            path = target.path
            if path in unreadable:
                ordered.append(FileResult(path, self._keep(path, [unreadable[path]], [])))
            else:
                found = results.get(path) or FileResult(path, [])
                ordered.append(replace(found, digest=digest(data[path])))
        if cache is not None and not unreadable:
            states = {
                r.path: FileState(
                    stats[r.path].st_size,
                    stats[r.path].st_mtime_ns,
                    r.digest or "",
                    r.findings,
                    r.internal_error,
                )
                for r in ordered
            }
            cache.store(CachedRun(states, read, missing, words))
        return ordered

    def _reuse(self, cache: RunCache, targets: list[LintTarget]) -> list[FileResult] | None:
        """The cached results, when every file changed since is one the run never read,
        that names none of its words and provides none of the modules it missed."""
        cached = cache.load()
        if cached is None:
            return None
        prefilter = Prefilter(cached.words)
        layout = Layout(t.path for t in targets)
        results = []
        refreshed = False
        for target in targets:
            path = target.path
            state = cached.files.get(path)
            try:
                status = os.stat(path)
                if state and (state.size, state.mtime_ns) == (status.st_size, status.st_mtime_ns):
                    results.append(
                        FileResult(path, state.findings, state.internal_error, state.digest)
                    )
                    continue
                data = read_bytes(path)
            except (OSError, UnreadableSource):
                return None  # the run reports it
            content = digest(data)
            if state is None or state.digest != content:
                if (
                    target.explicit
                    or os.path.abspath(path) in cached.loaded
                    or prefilter.passes(data)
                    or layout.module_name(path) in cached.missing
                ):
                    return None
                state = FileState(status.st_size, status.st_mtime_ns, content)
            cached.files[path] = replace(state, size=status.st_size, mtime_ns=status.st_mtime_ns)
            refreshed = True
            results.append(FileResult(path, state.findings, state.internal_error, content))
        given = {t.path for t in targets}
        if any(os.path.abspath(p) in cached.loaded for p in cached.files if p not in given):
            return None  # a file the analysis read is gone
        if refreshed:
            cached.files = {p: s for p, s in cached.files.items() if p in given}
            cache.store(cached)
        self.discovered_words = cached.words - self.table.words
        return results

    def _discover(
        self,
        sessions: list[_SessionHandle],
        paths: list[str],
        data: dict[str, bytes],
        pending: list[str],
    ) -> frozenset[str]:
        """Deal candidate files to the sessions, round by round, until no file exports a
        new name reaching a source; the words of interest in the end."""
        assigned: set[str] = set()
        words = self.table.words
        new = Exports(frozenset(), frozenset())
        while True:
            exports = _grow(sessions, pending, new)
            assigned.update(pending)
            new = Exports(exports.calls - words, exports.classes - words)
            if not new.names:
                return words
            words = words | new.names
            prefilter = Prefilter(new.names)
            pending = [p for p in paths if p not in assigned and prefilter.passes(data[p])]

    def session(self, targets: list[LintTarget]) -> Session:
        """One in-process session over ``targets``, its discovery done: the sites, regions
        and reaches it holds are what a run reports from (benchmarks read them)."""
        data = {t.path: read_bytes(t.path) for t in targets}
        paths = list(data)
        explicit = {t.path for t in targets if t.explicit}
        pending = [p for p in paths if p in explicit or self.prefilter.passes(data[p])]
        handle = _SessionHandle(Session(self, paths, data, lazy=True))
        self._discover([handle], paths, data, pending)
        assert handle.session is not None
        return handle.session

    def inaccessible(self, path: str, reason: str) -> FileResult:
        """The CKP902 result of a path that cannot be linted (missing, unreadable folder)."""
        finding = Finding(1, 1, InaccessiblePath.code, reason, end_line=1, end_column=1)
        return FileResult(path, self._keep(path, [finding], lines=[]))

    # -- one file --------------------------------------------------------------------------
    def lint_path(self, path: str, *, always_parse: bool = False) -> FileResult:
        """Lint one file; a file found by walking folders is skipped by the prefilter."""
        return self.lint_files([LintTarget(path, explicit=always_parse)], jobs=1)[0]

    def lint_bytes(self, data: bytes, path: str) -> FileResult:
        """Lint a file's content (read from disk or standard input) under its path."""
        try:
            try:
                text = decode(data)
            except UnreadableSource as error:
                findings = self._keep(path, [_finding(UnreadableFile.code, error)], [])
                return FileResult(path, findings, digest=digest(data))
            return FileResult(path, self.lint_text(text, path), digest=digest(data))
        except Exception as error:  # a bug of ours must not stop the run
            return FileResult(path, [], internal_error=f"{type(error).__name__}: {error}")

    def lint_text(self, text: str, path: str) -> list[Finding]:
        """Findings for ``text`` as the file ``path`` (selection and suppressions applied)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                return self._lint_text(text, path, lazy=True)
            except LazyTreeMismatch:
                return self._lint_text(text, path, lazy=False)

    def _lint_text(self, text: str, path: str, *, lazy: bool) -> list[Finding]:
        project = Project(Layout([path]), self.table.words | self.discovered_words, lazy=lazy)
        try:
            parsed = parse(text, path, project.words if lazy else None)
        except UnreadableSource as error:
            return self._keep(path, [_finding(UnreadableFile.code, error)], split_lines(text))
        except (RecursionError, MemoryError):
            error = UnreadableSource(f"cannot parse file: {TOO_DEEP}")
            return self._keep(path, [_finding(UnreadableFile.code, error)], split_lines(text))
        module = project.adopt(path, text, parsed.tree, parsed.lines)
        return self._keep(path, self._analyze_alone(project, module), module.lines)

    def analyze_tree(self, tree: ast.Module, lines: list[str], path: str) -> list[Finding]:
        """Findings of every selected rule on a tree its caller parsed (the flake8 plugin),
        before suppressions (the caller applies its own). The modules read to follow
        regions stay loaded for the next file (flake8 hands over one file at a time)."""
        words = self.table.words | self.discovered_words
        project = self._neighbours
        if project is None or project.words != words:
            project = self._neighbours = Project(Layout(), words)
        project.layout.add(path)
        module = project.adopt(path, "".join(lines), tree, lines)
        try:
            return self._analyze_alone(project, module)
        except LazyTreeMismatch:  # a neighbour's lazy split misread it: parse them in full
            project = self._neighbours = Project(Layout([path]), words, lazy=False)
            return self._analyze_alone(project, project.adopt(path, module.text, tree, lines))

    def _analyze_alone(self, project: Project, module: Module) -> list[Finding]:
        """One module, its neighbours read from disk when the analysis follows an import."""
        analysis = ProjectAnalysis(project, self.table)
        if self.discovered_words:  # a subclass of a project's layer class is a layer too
            analysis.learn_layer_classes(self.discovered_words)
        try:
            with_local_aliases(analysis, module)
        except (RecursionError, MemoryError):
            return [too_deep_finding(module.tree)]
        module = project.module_at(module.path) or module
        return _exempt(module, analyze_safely(module, analysis, self.selected))

    def _keep(self, path: str, findings: list[Finding], lines: list[str]) -> list[Finding]:
        """Drop unselected, per-file-ignored and ``# noqa``-suppressed findings."""
        kept = []
        for finding in findings:
            if finding.code not in self.selected or self.settings.is_ignored_in(finding.code, path):
                continue
            if 0 < finding.line <= len(lines) and is_suppressed(
                lines[finding.line - 1], finding.code
            ):
                continue
            kept.append(finding)
        return kept


def _exempt(module: Module, findings: list[Finding]) -> list[Finding]:
    """Drop what the file's ``# flake8: noqa`` / ``# ckptlint: noqa[: codes]`` exempts."""
    exemption = file_exemption(module.text)
    if exemption is None:
        return findings
    return [f for f in findings if not exemption.covers(f.code)]


class Session:
    """One process's share of a run: its own project index over all the run's files, the
    candidate files it was given, and what it found in them."""

    def __init__(
        self, linter: Linter, paths: list[str], data: dict[str, bytes], lazy: bool
    ) -> None:
        self.linter = linter
        self.data = data
        self.project = Project(Layout(paths), linter.table.words, lazy=lazy)
        self.analysis = ProjectAnalysis(self.project, linter.table)
        self.owned: list[str] = []
        self.unreadable: dict[str, Finding] = {}
        self.too_deep: set[str] = set()

    def grow(self, paths: list[str], new: Exports) -> Exports:
        """Take new words and new candidate files; return the names that the modules they
        change export (see ``ProjectAnalysis.exports``). New wrapper names make the modules
        using them scoped again; new layer classes only make classes naming them as a base
        looked at again."""
        project = self.project
        changed: list[str] = []
        if new.names:
            project.words = project.words | new.names
        if new.classes:
            self.analysis.learn_layer_classes(new.classes)
            changed += [p for p in self.owned if self._names(p, new.classes)]
        if new.calls:
            rescoped = [p for p in self.owned if self._names(p, new.calls)]
            for path in rescoped:
                project.rescope(project.module_at(path), project.words)  # type: ignore[arg-type]
            if rescoped:
                self.analysis.reset()
            changed += rescoped
        for path in paths:
            if self._load(path):
                self.owned.append(path)
                changed.append(path)
        calls: set[str] = set()
        classes: set[str] = set()
        for path in dict.fromkeys(changed):
            module = project.module_at(path)
            if module is None or path in self.too_deep:
                continue
            try:
                module = with_local_aliases(self.analysis, module)
                exported = self.analysis.exports(module)
            except (RecursionError, MemoryError):
                self.too_deep.add(path)  # reported when results are asked for
                continue
            except SyntaxError:
                continue  # in a lazily parsed body: reported with the results
            calls |= exported.calls
            classes |= exported.classes
        return Exports(frozenset(calls), frozenset(classes))

    def _names(self, path: str, words: frozenset[str]) -> bool:
        module = self.project.module_at(path)
        return module is not None and names_any(module, words)

    def footprint(self) -> tuple[set[str], set[str]]:
        """What the results depend on: the files read, the module names not found."""
        return self.project.read_paths(), self.project.layout.missing

    def results(self) -> list[FileResult]:
        linter = self.linter
        found = []
        for path, finding in self.unreadable.items():
            found.append(FileResult(path, linter._keep(path, [finding], [])))
        for path in self.owned:
            module = self.project.module_at(path)
            assert module is not None
            try:
                if path in self.too_deep:
                    findings = [too_deep_finding(module.tree)]
                else:
                    findings = analyze_safely(module, self.analysis, linter.selected)
                kept = linter._keep(path, _exempt(module, findings), module.lines)
                found.append(FileResult(path, kept))
            except LazyTreeMismatch:
                raise
            except Exception as error:  # a bug of ours must not stop the run
                found.append(FileResult(path, [], f"{type(error).__name__}: {error}"))
        return found

    def _load(self, path: str) -> bool:
        """Parse a file into the project; a file that cannot be is reported as CKP901."""
        try:
            text = decode(self.data[path])
            parsed = parse(text, path, self.project.words if self.project.lazy else None)
        except UnreadableSource as error:
            self.unreadable[path] = _finding(UnreadableFile.code, error)
            return False
        except (RecursionError, MemoryError):
            error = UnreadableSource(f"cannot parse file: {TOO_DEEP}")
            self.unreadable[path] = _finding(UnreadableFile.code, error)
            return False
        self.project.adopt(path, text, parsed.tree, parsed.lines)
        return True


class _SessionHandle:
    """A session in this process, or one in a worker process reached through a pipe."""

    def __init__(self, session: Session | None, connection: Connection | None = None) -> None:
        self.session = session
        self.connection = connection
        self._reply: object = None

    def send(self, method: str, *arguments: object) -> None:
        if self.connection is None:
            self._reply = getattr(self.session, method)(*arguments)
        else:
            self.connection.send((method, arguments))

    def receive(self) -> Any:
        if self.connection is None:
            return self._reply
        kind, payload = self.connection.recv()
        if kind == "lazy":
            raise LazyTreeMismatch(payload)
        if kind == "error":
            raise RuntimeError(payload)
        return payload

    def call(self, method: str, *arguments: object) -> Any:
        self.send(method, *arguments)
        return self.receive()

    def close(self) -> None:
        if self.connection is not None:
            with contextlib.suppress(OSError):
                self.connection.send(None)
            self.connection.close()


def _grow(sessions: list[_SessionHandle], paths: list[str], new: Exports) -> Exports:
    """Deal new candidate files round robin, tell every session the new words, and collect
    what they export (the sessions work at the same time)."""
    shares: list[list[str]] = [paths[index :: len(sessions)] for index in range(len(sessions))]
    for session, share in zip(sessions, shares, strict=True):
        session.send("grow", share, new)
    calls: set[str] = set()
    classes: set[str] = set()
    for session in sessions:
        exported = session.receive()
        calls |= exported.calls
        classes |= exported.classes
    return Exports(frozenset(calls), frozenset(classes))


def _serve(session: Session, connection: Connection) -> None:
    """A worker's loop: run the session methods the coordinator asks for."""
    while True:
        request = connection.recv()
        if request is None:
            return
        method, arguments = request
        try:
            connection.send(("ok", getattr(session, method)(*arguments)))
        except LazyTreeMismatch as error:
            connection.send(("lazy", str(error)))
        except Exception as error:  # reported by the coordinator, never a silent hang
            connection.send(("error", f"{type(error).__name__}: {error}"))


def _start_sessions(
    linter: Linter, paths: list[str], data: dict[str, bytes], lazy: bool, processes: int
) -> list[_SessionHandle]:
    if processes <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        return [_SessionHandle(Session(linter, paths, data, lazy))]
    context = multiprocessing.get_context("fork")  # workers inherit the files already read
    handles = []
    for _ in range(processes):
        ours, theirs = context.Pipe()
        session = Session(linter, paths, data, lazy)
        context.Process(target=_serve, args=(session, theirs), daemon=True).start()
        theirs.close()
        handles.append(_SessionHandle(None, ours))
    return handles


# Below this many candidate files per process, a worker costs more than it saves.
FILES_PER_PROCESS = 40


def _processes(jobs: int | None, candidates: int) -> int:
    if jobs is not None:
        return jobs
    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(available or 1, candidates // FILES_PER_PROCESS))


def _finding(code: str, error: UnreadableSource) -> Finding:
    return Finding(
        line=error.line,
        column=error.column,
        code=code,
        message=error.reason,
        end_line=error.line,
        end_column=error.column,
    )
