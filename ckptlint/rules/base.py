"""What a rule is (a code, a message, an explanation and its own examples), and the file it
checks with the project analysis it may ask about that file."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from typing import ClassVar

from ckptlint.analysis import ProjectAnalysis
from ckptlint.core import Applicability, Finding, Fix
from ckptlint.project.index import Module


class FileContext:
    """The module a rule checks, and the project analysis it may ask about it."""

    def __init__(self, module: Module, analysis: ProjectAnalysis) -> None:
        self.module = module
        self.lines = module.lines
        self.analysis = analysis

    def character_column(self, line: int, byte_offset: int) -> int:
        """ast columns are UTF-8 byte offsets; report characters, 1-based, like flake8 does."""
        if 0 < line <= len(self.lines):
            text = self.lines[line - 1]
            if not text.isascii():
                return len(text.encode()[:byte_offset].decode(errors="replace")) + 1
        return byte_offset + 1

    def finding(self, node: ast.AST, code: str, message: str, fix: Fix | None = None) -> Finding:
        """A finding spanning ``node``; for a ``def``, its header up to the name."""
        line, column = node.lineno, node.col_offset  # type: ignore[attr-defined]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            end_line = line
            end_offset = self.lines[line - 1].encode().find(node.name.encode(), column)
            end_offset = column if end_offset < 0 else end_offset + len(node.name.encode())
        else:
            end_line, end_offset = node.end_lineno or line, node.end_col_offset or 0  # type: ignore[attr-defined]
        return Finding(
            line=line,
            column=self.character_column(line, column),
            code=code,
            message=message,
            end_line=end_line,
            end_column=self.character_column(end_line, end_offset),
            fix=fix,
        )


class Rule:
    """Base of every rule. The subclass docstring is what ``ckptlint --explain`` prints.

    ``EXAMPLE`` and ``CORRECTED`` are the whole modules ``--explain`` and docs/rules.md show:
    code that is reported and the same code written correctly. ``EXAMPLE`` marks each
    finding with an ``# expect: CODE@COLUMN`` comment on its line (left out where it is
    shown); the tests check both against the CLI and flake8 exactly, with every other case
    of the rule, in tests/fixtures/rules/<code>/ (see its README.md).
    """

    code: ClassVar[str]
    name: ClassVar[str]
    summary: ClassVar[str]
    # Identifiers that make a file worth analysing for this rule wherever they appear, also
    # in a file whose text names no region source (a trainer building DDP).
    TRIGGERS: ClassVar[frozenset[str]] = frozenset()
    # What ckptguard does about the same bug at run time (``--explain`` prints it).
    GUARD: ClassVar[str | None] = None
    # The fix its findings can carry: "safe", "unsafe" (applied with --unsafe-fixes), or None.
    FIX: ClassVar[Applicability | None] = None
    EXAMPLE: ClassVar[str]
    CORRECTED: ClassVar[str]

    def check(self, context: FileContext) -> Iterator[Finding]:
        raise NotImplementedError


_EXPECTATION = re.compile(r"[ \t]*# expect: .*$", re.MULTILINE)


def shown(example: str) -> str:
    """An example as users read it: without the ``# expect:`` comments the tests read."""
    return _EXPECTATION.sub("", example)
