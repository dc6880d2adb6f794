"""The work of a run, wherever it runs: one process's ``Analyser``.

An ``Analyser`` holds the project as one process parses it and its one analysis
(``analysis.ProjectAnalysis``), shared by every discovery round and every file's findings.
It computes a file's exports for a round's words (``Exported``) and a file's findings
(``Analysed``), each inside a unit of the solver whose facts become the ``Dependencies``
the result is stored with (``project.facts``). Nothing raised while analysing a file leaves
it: a file that cannot be decoded, parsed or analysed is CKP901, anything else a bug of
ours, the file's ``internal_error``.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Mapping, Sequence

from packaging.version import Version

from ckptlint.analysis import ProjectAnalysis
from ckptlint.core import Finding
from ckptlint.lazy_tree import check_unparsed_bodies
from ckptlint.project.dependencies import Dependencies, ScanKey, ShapeRead
from ckptlint.project.facts import WholeRead, dependencies_of
from ckptlint.project.files import Snapshot
from ckptlint.project.index import Module, Project
from ckptlint.project.layout import Layout
from ckptlint.project.stored import Analysed, Exported, Words, file_words
from ckptlint.regions.sources import SourceTable
from ckptlint.resolution.solver import TOO_DEEP, Fault, Unit
from ckptlint.rules import ALL_RULES, UNREADABLE_FILE
from ckptlint.rules.base import FileContext
from ckptlint.source import (
    DEFAULT_MAX_FILE_SIZE,
    UnreadableSource,
    parser_gave_up,
    token_limit,
    unreadable_finding,
)


class Analyser:
    """A process's share of the analysis: the parsed project and its one analysis, shared by
    every discovery round and every file's findings (see ``analysis``)."""

    def __init__(
        self,
        table: SourceTable,
        layout: Layout,
        files: Snapshot,
        paths: Sequence[str],
        target_torch: Version | None = None,
        max_tokens: int = token_limit(DEFAULT_MAX_FILE_SIZE),
    ) -> None:
        self.table = table
        self.words = Words(table.words)
        self.project = Project(layout, files, paths, table.words, max_tokens=max_tokens)
        self.analysis = ProjectAnalysis(self.project, table, target_torch=target_torch)

    def use(self, words: Words) -> None:
        self.words = words
        self.analysis.use(words.calls, words.classes)

    def seed_scans(self, scans: Mapping[ScanKey, tuple[str, ...]]) -> None:
        self.project.seed_scans(scans)

    def exports(self, path: str) -> Exported:
        project = self.project
        calls: frozenset[str] = frozenset()
        classes: frozenset[str] = frozenset()
        error = internal_error = None
        with self.analysis.solver.unit() as unit:
            try:
                module = project.module_at(path)
                if module is None:
                    error = unreadable_finding(UNREADABLE_FILE, project.error(path))
                else:
                    exported = self.analysis.exports(module)
                    calls, classes = exported.calls, exported.classes
            except (RecursionError, MemoryError, SyntaxError):
                pass  # reported with the file's findings
            except Exception as bug:  # a bug of ours must not stop the run
                internal_error = f"{type(bug).__name__}: {bug}"
        digest = project.files.digest(path)
        dependencies = self._dependencies(unit)
        words = file_words(project.files, path, self.words)
        return Exported(path, digest, words, calls, classes, error, internal_error, dependencies)

    def findings(self, path: str, fixes: bool) -> Analysed:
        project = self.project
        with self.analysis.solver.unit() as unit:
            try:
                module = project.module_at(path)
                if module is None:
                    found = [unreadable_finding(UNREADABLE_FILE, project.error(path))]
                else:
                    found = analyze_safely(module, self.analysis)
            except (RecursionError, MemoryError):
                found = [_too_deep(project, path)]
            except Exception as error:  # a bug of ours must not stop the run
                message = f"{type(error).__name__}: {error}"
                return Analysed(path, (), message, self._dependencies(unit))
        cited: list[WholeRead] = []
        if module is not None and unit.faults and not _unreadable(found):
            found.extend(fault_finding(module, fault) for fault in unit.faults)
            for other in {_path_of(fault) for fault in unit.faults} - {"", module.path}:
                cited.append(self._whole(other))  # the note names a line of it
        if not fixes:
            found = [f.without_fix() for f in found]
        return Analysed(path, tuple(found), None, self._dependencies(unit, cited))

    def _dependencies(self, unit: Unit, cited: Sequence[WholeRead] = ()) -> Dependencies:
        """What a computation read, as the cache checks it (see ``project.facts``), and the
        modules its notes cite."""
        project = self.project

        def module(path: str) -> ShapeRead:
            return ShapeRead(project.files.digest(path), project.layout.module_name(path))

        return dependencies_of([*self.analysis.solver.facts(unit.reads), *cited], module)

    def _whole(self, path: str) -> WholeRead:
        project = self.project
        return WholeRead(path, project.files.digest(path), project.layout.module_name(path))


def analyze(module: Module, analysis: ProjectAnalysis) -> list[Finding]:
    """Every rule's findings on one module, before selection and suppressions."""
    context = FileContext(module, analysis)
    return sorted({finding for rule in ALL_RULES for finding in rule.check(context)})


def analyze_safely(module: Module, analysis: ProjectAnalysis) -> list[Finding]:
    """``analyze``, then the syntax of the bodies no rule read; input nested too deeply, or
    a syntax error in a body parsed late, is one CKP901 finding."""
    try:
        found = analyze(module, analysis)
    except (RecursionError, MemoryError):
        return [too_deep_finding(module.tree)]
    name = f"<{module.path}>"
    try:
        check_unparsed_bodies(module.tree, module.text, name)
    except SyntaxError as error:  # in a lazily parsed body
        where = UnreadableSource(f"syntax error: {error.msg}", error.lineno or 1, error.offset or 1)
        return [unreadable_finding(UNREADABLE_FILE, where)]
    except (RecursionError, MemoryError) as error:  # a body the parser gives up on
        return [unreadable_finding(UNREADABLE_FILE, parser_gave_up(error, module.lines, name))]
    return found


def fault_finding(module: Module, fault: Fault) -> Finding:
    """CKP901 for a part of the analysis that gave up (see ``resolution.solver``): at the
    line it concerns when that is in this file, else at line 1 naming the place."""
    path, _, line = fault.where.rpartition(":")
    if path == module.path and line.isdigit():
        at, where = int(line), f"line {line}"
    else:
        at, where = 1, _display(fault.where) if fault.where else "code this file reaches"
    if fault.what.startswith(TOO_DEEP):
        message = f"{fault.what}, at {where}"
    else:
        message = f"part of the analysis failed at {where}: {fault.what}"
    message += "; findings that depend on it may be missing"
    return Finding(at, 1, UNREADABLE_FILE, message, end_line=at, end_column=1)


def _path_of(fault: Fault) -> str:
    """The file of the place a fault names ("" when it names none)."""
    path, _, line = fault.where.rpartition(":")
    return path if line.isdigit() else ""


def _display(where: str) -> str:
    path, _, line = where.rpartition(":")
    if not path:
        return where
    relative = os.path.relpath(path)
    return f"{path if relative.startswith('..') else relative}:{line}"


def _unreadable(found: list[Finding]) -> bool:
    return len(found) == 1 and found[0].code == UNREADABLE_FILE


def _too_deep(project: Project, path: str) -> Finding:
    module = project.module_at(path)
    return (
        too_deep_finding(module.tree)
        if module is not None
        else unreadable_finding(UNREADABLE_FILE, UnreadableSource(f"cannot parse file: {TOO_DEEP}"))
    )


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
    return Finding(line, 1, UNREADABLE_FILE, message, end_line=line, end_column=1)
