"""Linting one file: read → prefilter → parse → resolve → rules → suppressions.

``analyze`` is shared by the command line and the flake8 plugin (which hands over the tree
it already parsed), so both report the same findings at the same places.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cached_property

from ckptlint.config import Settings
from ckptlint.lazy_tree import LazyTreeMismatch
from ckptlint.noqa import is_suppressed
from ckptlint.resolve import Targets
from ckptlint.rules import ALL_RULES
from ckptlint.rules.base import FileContext, Finding
from ckptlint.rules.unreadable_file import UnreadableFile
from ckptlint.source import (
    Prefilter,
    UnreadableSource,
    decode,
    parse,
    read_bytes,
    split_lines,
)


def analyze(
    tree: ast.Module, lines: list[str], targets: Targets, selected: frozenset[str]
) -> list[Finding]:
    """Findings of the selected rules on a parsed module, before any suppression."""
    context = FileContext(tree, lines, targets)
    findings = [
        finding for rule in ALL_RULES if rule.code in selected for finding in rule.check(context)
    ]
    return sorted(findings)


@dataclass(frozen=True)
class FileResult:
    path: str
    findings: list[Finding]
    internal_error: str | None = None


class Linter:
    """Lints files under one set of settings. Cheap to pickle for worker processes."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    @cached_property
    def targets(self) -> Targets:
        return Targets.with_extensions(self.settings.extend_checkpoint_functions)

    @cached_property
    def prefilter(self) -> Prefilter:
        return Prefilter(self.settings.extend_checkpoint_functions)

    @cached_property
    def selected(self) -> frozenset[str]:
        return frozenset(rule.code for rule in ALL_RULES if self.settings.is_selected(rule.code))

    def lint_path(self, path: str, *, always_parse: bool = False) -> FileResult:
        """Lint a file; files found by walking folders are skipped by the prefilter."""
        try:
            data = read_bytes(path)
            if not always_parse and not self.prefilter.passes(data):
                return FileResult(path, [])
            return FileResult(path, self.lint_text(decode(data), path))
        except UnreadableSource as error:
            return FileResult(path, self._keep(path, [_unreadable(error)], lines=[]))
        except Exception as error:  # a bug of ours must not stop the run
            return FileResult(path, [], internal_error=f"{type(error).__name__}: {error}")

    def lint_text(self, text: str, path: str) -> list[Finding]:
        try:
            parsed = parse(text, path, self.targets.words)
        except UnreadableSource as error:
            return self._keep(path, [_unreadable(error)], split_lines(text))
        try:
            findings = analyze(parsed.tree, parsed.lines, self.targets, self.selected)
        except LazyTreeMismatch:  # the lazy split misread the file: parse all of it
            tree = parse(text, path).tree
            findings = analyze(tree, parsed.lines, self.targets, self.selected)
        return self._keep(path, findings, parsed.lines)

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
