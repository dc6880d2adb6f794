"""What a rule is (a code, a message, an explanation and its own examples), and the file it
checks with the project analysis it may ask about that file."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from typing import ClassVar

from ckptlint.analysis import ProjectAnalysis
from ckptlint.core import Finding, Fix
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

    ``INVALID`` and ``VALID`` hold whole example modules: each invalid one must produce at
    least one finding of this rule, each valid one none. Their first entries are the bad and
    the fixed example that ``--explain`` shows.
    """

    code: ClassVar[str]
    name: ClassVar[str]
    summary: ClassVar[str]
    # Identifiers that make a file worth analysing for this rule wherever they appear, also
    # in a file whose text names no region source (a trainer building DDP).
    TRIGGERS: ClassVar[frozenset[str]] = frozenset()
    # What ckptguard does about the same bug at run time (``--explain`` prints it).
    GUARD: ClassVar[str | None] = None
    VALID: ClassVar[list[str]]
    INVALID: ClassVar[list[str]]

    def check(self, context: FileContext) -> Iterator[Finding]:
        raise NotImplementedError
