"""Core types every layer shares: findings, fixes and the file a rule is checking.

A leaf of the package: it imports no rule and no analysis layer.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from ckptlint.analysis import ProjectAnalysis
    from ckptlint.project.index import Module


@dataclass(frozen=True)
class AddKeyword:
    """Edit: add ``keyword=value`` to the call that starts at (line, column)."""

    line: int
    column: int
    keyword: str
    value: str


@dataclass(frozen=True)
class ReplaceText:
    """Edit: replace the text from (line, column) up to (end_line, end_column) with ``text``.

    Columns are 1-based characters, as in Finding; the end is exclusive.
    """

    line: int
    column: int
    end_line: int
    end_column: int
    text: str


@dataclass(frozen=True)
class Fix:
    """A fix and whether applying it can change behaviour ("unsafe", as in ruff).

    An AddKeyword edit applies to the call the finding spans (its start and end).
    """

    edit: AddKeyword | ReplaceText
    applicability: Literal["safe", "unsafe"]


@dataclass(frozen=True, order=True)
class Finding:
    """One reported problem. Lines and columns are 1-based; columns count characters."""

    line: int
    column: int
    code: str
    message: str
    end_line: int = field(compare=False)
    end_column: int = field(compare=False)
    fix: Fix | None = field(default=None, compare=False)


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
