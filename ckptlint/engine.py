"""Linting a project: read → prefilter → parse → project analysis → rules → suppressions.

``Linter.lint_files`` lints the files of a run together, so a region defined in one file and
checkpointed in another is seen whole. ``Linter.lint_text`` lints one text as if it were the
file at ``path`` (tests, editors, the fix phase); the files around that path are still read
when the analysis follows an import into them. The flake8 plugin calls ``analyze`` on the
tree flake8 parsed, so both report the same findings at the same places.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

from ckptlint.analysis import ProjectAnalysis, expand_words
from ckptlint.config import Settings
from ckptlint.core import FileContext, Finding
from ckptlint.lazy_tree import LazyTreeMismatch
from ckptlint.noqa import is_suppressed
from ckptlint.project.index import Module, Project
from ckptlint.project.layout import Layout
from ckptlint.regions.sources import SourceTable, configured_source
from ckptlint.rules import ALL_RULES
from ckptlint.rules.unreadable_file import UnreadableFile
from ckptlint.source import (
    Prefilter,
    UnreadableSource,
    decode,
    parse,
    read_bytes,
    split_lines,
)


def analyze(module: Module, analysis: ProjectAnalysis, selected: frozenset[str]) -> list[Finding]:
    """Findings of the selected rules on one module, before any suppression."""
    context = FileContext(module, analysis)
    findings = [
        finding for rule in ALL_RULES if rule.code in selected for finding in rule.check(context)
    ]
    return sorted(set(findings))


@dataclass(frozen=True)
class FileResult:
    path: str
    findings: list[Finding]
    internal_error: str | None = None


@dataclass(frozen=True)
class LintTarget:
    """A file to lint; ``explicit`` when named on the command line (always parsed)."""

    path: str
    explicit: bool = True


class Linter:
    """Lints files under one set of settings."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    @cached_property
    def table(self) -> SourceTable:
        extra = [configured_source(name) for name in self.settings.extend_checkpoint_functions]
        return SourceTable.build(extra)

    @cached_property
    def prefilter(self) -> Prefilter:
        return Prefilter(self.table.words)

    @cached_property
    def selected(self) -> frozenset[str]:
        return frozenset(rule.code for rule in ALL_RULES if self.settings.is_selected(rule.code))

    # -- a run over files ------------------------------------------------------------------
    def lint_files(self, targets: Iterable[LintTarget]) -> list[FileResult]:
        """Lint files together; results in the order given."""
        targets = list(targets)
        try:
            return self._lint_files(targets, lazy=True)
        except LazyTreeMismatch:  # the lazy split misread a file: parse everything in full
            return self._lint_files(targets, lazy=False)

    def _lint_files(self, targets: list[LintTarget], *, lazy: bool) -> list[FileResult]:
        layout = Layout(target.path for target in targets)
        project = Project(layout, self.table.words, lazy=lazy)
        analysis = ProjectAnalysis(project, self.table)
        data: dict[str, bytes] = {}
        unreadable: dict[str, list[Finding]] = {}
        for target in targets:
            try:
                data[target.path] = read_bytes(target.path)
            except UnreadableSource as error:
                unreadable[target.path] = [_unreadable(error)]
        explicit = [t.path for t in targets if t.explicit]
        initial = project.words

        def candidates(words: frozenset[str]) -> list[str]:
            """Files naming one of ``words``; in the first round, also every explicit file."""
            prefilter = Prefilter(words)
            first_round = words is initial
            found = []
            for target in targets:
                path = target.path
                if path not in data or project.is_loaded(path):
                    continue
                if (first_round and path in explicit) or prefilter.passes(data[path]):
                    if self._load(project, path, data[path], unreadable):
                        found.append(path)
            return found

        _, analysed_paths = expand_words(analysis, initial, candidates)
        analysed = set(analysed_paths)
        results = []
        for target in targets:
            path = target.path
            if path in unreadable:
                findings = unreadable[path]
                lines = []
            elif path in analysed:
                module = project.module_at(path)
                assert module is not None
                findings, lines = analyze(module, analysis, self.selected), module.lines
            else:
                findings, lines = [], []
            results.append(FileResult(path, self._keep(path, findings, lines)))
        return results

    def _load(
        self, project: Project, path: str, data: bytes, unreadable: dict[str, list[Finding]]
    ) -> bool:
        """Parse a file into the project; a file that cannot be is reported as CKP901."""
        if path in unreadable:
            return False
        try:
            text = decode(data)
            parsed = parse(text, path, project.words if project.lazy else None)
        except UnreadableSource as error:
            unreadable[path] = [_unreadable(error)]
            return False
        except (RecursionError, MemoryError):
            unreadable[path] = [
                _unreadable(UnreadableSource("cannot parse file: too deeply nested"))
            ]
            return False
        project.adopt(path, text, parsed.tree, parsed.lines)
        return True

    # -- one file --------------------------------------------------------------------------
    def lint_path(self, path: str, *, always_parse: bool = False) -> FileResult:
        """Lint one file; a file found by walking folders is skipped by the prefilter."""
        return self.lint_files([LintTarget(path, explicit=always_parse)])[0]

    def lint_text(self, text: str, path: str) -> list[Finding]:
        """Findings for ``text`` as the file ``path`` (selection and suppressions applied)."""
        try:
            return self._lint_text(text, path, lazy=True)
        except LazyTreeMismatch:
            return self._lint_text(text, path, lazy=False)

    def _lint_text(self, text: str, path: str, *, lazy: bool) -> list[Finding]:
        project = Project(Layout([path]), self.table.words, lazy=lazy)
        try:
            parsed = parse(text, path, project.words if lazy else None)
        except UnreadableSource as error:
            return self._keep(path, [_unreadable(error)], split_lines(text))
        module = project.adopt(path, text, parsed.tree, parsed.lines)
        analysis = ProjectAnalysis(project, self.table)
        expand_words(
            analysis, project.words, lambda words: [path] if words is project.words else []
        )
        module = project.module_at(path) or module
        return self._keep(path, analyze(module, analysis, self.selected), module.lines)

    def analyze_tree(self, tree: ast.Module, lines: list[str], path: str) -> list[Finding]:
        """Findings of every selected rule on a tree its caller parsed (the flake8 plugin),
        before suppressions (the caller applies its own)."""
        project = Project(Layout([path]), self.table.words)
        module = project.adopt(path, "".join(lines), tree, lines)
        analysis = ProjectAnalysis(project, self.table)
        expand_words(
            analysis, project.words, lambda words: [path] if words is project.words else []
        )
        return analyze(project.module_at(path) or module, analysis, self.selected)

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


def _unreadable(error: UnreadableSource) -> Finding:
    return Finding(
        line=error.line,
        column=error.column,
        code=UnreadableFile.code,
        message=error.reason,
        end_line=error.line,
        end_column=error.column,
    )
