"""Core types every layer shares: findings and their fixes.

A leaf of the package: it imports nothing of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

Applicability = Literal["safe", "unsafe"]


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
class BindNames:
    """Edit: give the ``def`` or ``lambda`` spanning (line, column) up to (end_line,
    end_column) a parameter ``name=name`` for each of ``names``, so that each is bound to
    its value when the function is made (columns as in ReplaceText)."""

    line: int
    column: int
    end_line: int
    end_column: int
    names: tuple[str, ...]


@dataclass(frozen=True)
class Fix:
    """A fix and whether applying it can change behaviour ("unsafe", as in ruff).

    An AddKeyword edit applies to the call the finding spans (its start and end).
    """

    edit: AddKeyword | ReplaceText | BindNames
    applicability: Applicability


@dataclass(frozen=True, order=True)
class Finding:
    """One reported problem. Lines and columns are 1-based; columns count characters.

    ``fix`` is computed from the exact text being linted and never stored; ``fixable`` (the
    fix's applicability) is what a stored finding keeps, so reports mark it ``[*]``.
    """

    line: int
    column: int
    code: str
    message: str
    end_line: int = field(compare=False)
    end_column: int = field(compare=False)
    fix: Fix | None = field(default=None, compare=False)
    fixable: Applicability | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.fix is not None and self.fixable is None:
            object.__setattr__(self, "fixable", self.fix.applicability)

    def fix_applies(self, unsafe_fixes: bool) -> bool:
        """Whether ``--fix`` applies this finding's fix with these settings (ruff's ``[*]``)."""
        return self.fixable == "safe" or (self.fixable == "unsafe" and unsafe_fixes)

    def without_fix(self) -> Finding:
        """The finding as it is stored: its fix's applicability, not its edit."""
        return self if self.fix is None else replace(self, fix=None)
