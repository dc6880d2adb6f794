"""What a rule is: a code, a message, an explanation and its own examples."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import ClassVar, Literal

from ckptlint.regions import RegionAnalysis
from ckptlint.resolve import (
    CheckpointCall,
    PartialValue,
    Resolution,
    Targets,
    resolve_checkpoint_calls,
)


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
    """A parsed file and the analyses rules share, each computed once on first use."""

    def __init__(self, tree: ast.Module, lines: list[str], targets: Targets) -> None:
        self.tree = tree
        self.lines = lines
        self.targets = targets

    @cached_property
    def resolution(self) -> Resolution:
        return resolve_checkpoint_calls(self.tree, self.lines, self.targets)

    @cached_property
    def regions(self) -> RegionAnalysis:
        """What each checkpoint call runs (used by the semantic rules)."""
        return RegionAnalysis(self.tree, self.lines, self.resolution)

    @property
    def checkpoint_calls(self) -> list[CheckpointCall]:
        return self.resolution.calls

    @property
    def unconsumed_partials(self) -> list[PartialValue]:
        return self.resolution.unconsumed_partials

    def character_column(self, line: int, byte_offset: int) -> int:
        """ast columns are UTF-8 byte offsets; report characters, 1-based, like flake8 does."""
        if 0 < line <= len(self.lines):
            text = self.lines[line - 1]
            if not text.isascii():
                return len(text.encode()[:byte_offset].decode(errors="replace")) + 1
        return byte_offset + 1

    def finding(self, node: ast.AST, code: str, message: str, fix: Fix | None = None) -> Finding:
        line, end_line = node.lineno, node.end_lineno or node.lineno  # type: ignore[attr-defined]
        return Finding(
            line=line,
            column=self.character_column(line, node.col_offset),  # type: ignore[attr-defined]
            code=code,
            message=message,
            end_line=end_line,
            end_column=self.character_column(end_line, node.end_col_offset or 0),  # type: ignore[attr-defined]
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
    VALID: ClassVar[list[str]]
    INVALID: ClassVar[list[str]]

    def check(self, context: FileContext) -> Iterator[Finding]:
        raise NotImplementedError
