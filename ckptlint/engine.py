"""Linting one file: read → prefilter → parse → resolve → rules → suppressions.

``analyze`` is shared by the command line and the flake8 plugin (which hands over the tree
it already parsed), so both report the same findings at the same places.

Nothing raised while linting a file leaves this module: a file that cannot be read is
CKP902, one that cannot be decoded, parsed or analysed (nesting too deep for the parser or
the analysis) is CKP901, and anything else is a bug of ours, reported as the file's
``internal_error`` while the run goes on.
"""

from __future__ import annotations

import ast
import warnings
from dataclasses import dataclass
from functools import cached_property

from ckptlint.config import Settings
from ckptlint.lazy_tree import LazyTreeMismatch, check_unparsed_bodies
from ckptlint.noqa import file_exemption, is_suppressed
from ckptlint.resolve import Targets
from ckptlint.rules import ALL_RULES
from ckptlint.rules.base import FileContext, Finding
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


def analyze(
    tree: ast.Module, lines: list[str], targets: Targets, selected: frozenset[str]
) -> list[Finding]:
    """Findings of the selected rules on a parsed module, before any suppression."""
    context = FileContext(tree, lines, targets)
    findings = [
        finding for rule in ALL_RULES if rule.code in selected for finding in rule.check(context)
    ]
    return sorted(findings)


def analyze_safely(
    tree: ast.Module, lines: list[str], targets: Targets, selected: frozenset[str]
) -> list[Finding]:
    """``analyze``, with input nested too deeply for it reported as one CKP901 finding."""
    try:
        return analyze(tree, lines, targets, selected)
    except (RecursionError, MemoryError):
        return [too_deep_finding(tree)]


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
        except CannotRead as error:
            finding = _finding(InaccessiblePath.code, error)
            return FileResult(path, self._keep(path, [finding], lines=[]))
        return self.lint_bytes(data, path, always_parse=always_parse)

    def inaccessible(self, path: str, reason: str) -> FileResult:
        """The CKP902 result of a path that cannot be linted (missing, unreadable folder)."""
        finding = Finding(1, 1, InaccessiblePath.code, reason, end_line=1, end_column=1)
        return FileResult(path, self._keep(path, [finding], lines=[]))

    def lint_bytes(self, data: bytes, path: str, *, always_parse: bool = True) -> FileResult:
        """Lint a file's content (read from disk or standard input) under its path."""
        try:
            if not always_parse and not self.prefilter.passes(data):
                return FileResult(path, [])
            try:
                text = decode(data)
            except UnreadableSource as error:
                return FileResult(
                    path, self._keep(path, [_finding(UnreadableFile.code, error)], [])
                )
            return FileResult(path, self.lint_text(text, path))
        except Exception as error:  # a bug of ours must not stop the run
            return FileResult(path, [], internal_error=f"{type(error).__name__}: {error}")

    def lint_text(self, text: str, path: str) -> list[Finding]:
        exemption = file_exemption(text)
        if exemption is not None and not exemption.codes:
            return []
        # Python's parser warns about the code it reads (invalid escape sequences): that is
        # not ours to print, and under ``-W error`` it would turn into a false CKP901.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            findings, lines = self._lint_text(text, path)
        if exemption is not None:
            findings = [f for f in findings if not exemption.covers(f.code)]
        return self._keep(path, findings, lines)

    def _lint_text(self, text: str, path: str) -> tuple[list[Finding], list[str]]:
        try:
            parsed = parse(text, path, self.targets.words)
        except UnreadableSource as error:
            return [_finding(UnreadableFile.code, error)], split_lines(text)
        try:
            findings = self._analyze(parsed.tree, parsed.lines, text, path)
        except SyntaxError as error:  # in a lazily parsed body
            unreadable = UnreadableSource(
                f"syntax error: {error.msg}", error.lineno or 1, error.offset or 1
            )
            findings = [_finding(UnreadableFile.code, unreadable)]
        except (RecursionError, MemoryError):  # the full parse of a body, or its check
            findings = [too_deep_finding(parsed.tree)]
        return findings, parsed.lines

    def _analyze(self, tree: ast.Module, lines: list[str], text: str, path: str) -> list[Finding]:
        """Findings, after checking that the bodies no rule read parse too."""
        try:
            findings = analyze_safely(tree, lines, self.targets, self.selected)
        except LazyTreeMismatch:  # the lazy split misread the file: parse all of it
            tree = ast.parse(text, path)
            return analyze_safely(tree, lines, self.targets, self.selected)
        check_unparsed_bodies(tree, text, path)
        return findings

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


def _finding(code: str, error: UnreadableSource) -> Finding:
    return Finding(
        line=error.line,
        column=error.column,
        code=code,
        message=error.reason,
        end_line=error.line,
        end_column=error.column,
    )
