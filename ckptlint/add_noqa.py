"""``--add-noqa``: a ``# noqa: CODE`` comment on each reported line, so a team can adopt the
linter on a large codebase and fix what it finds over time (ruff's ``--add-noqa``).

Only comments are added: a line with ``# noqa: CODES`` already gets the new codes in its
list, a line with another comment gets the ``noqa`` after it (flake8 and ckptlint look for it
anywhere on the line), any other line gets it at its end. A line that ends inside a string
or with a backslash continuation cannot take a comment, and a ``noqa`` on another line would
not suppress the finding: it is left alone and named. The result must compile if the file
did (``compile()``); the CLI writes it only then, and only to files it changed.
"""

from __future__ import annotations

import io
import re
import tokenize
from collections.abc import Iterable
from dataclasses import dataclass

from ckptlint.core import Finding
from ckptlint.noqa import NOQA, SEPARATOR
from ckptlint.source import split_lines

# About files, not lines: a file that cannot be read or parsed has no line to suppress on.
WHOLE_FILE_CODES = frozenset({"CKP901", "CKP902"})


@dataclass(frozen=True)
class NoqaText:
    """``text`` with the comments added; ``added``: how many lines got one; ``left``: the
    findings no comment could suppress, each with the reason."""

    text: str
    added: int
    left: tuple[tuple[Finding, str], ...]


def add_noqa(text: str, findings: Iterable[Finding]) -> NoqaText:
    """``text`` with a ``# noqa`` comment for each of ``findings`` on its reported line."""
    codes_by_line: dict[int, list[Finding]] = {}
    for finding in findings:
        if finding.code not in WHOLE_FILE_CODES:
            codes_by_line.setdefault(finding.line, []).append(finding)
    if not codes_by_line:
        return NoqaText(text, 0, ())
    try:
        ends, comments = _line_ends(text)
    except (tokenize.TokenError, SyntaxError, RecursionError, MemoryError):
        every = [f for found in codes_by_line.values() for f in found]
        return NoqaText(text, 0, tuple((f, "the file does not tokenize") for f in every))
    lines = split_lines(text)
    left: list[tuple[Finding, str]] = []
    added = 0
    for number, found in sorted(codes_by_line.items()):
        if number not in ends or number > len(lines):
            reason = "its line ends inside a string or continues with a backslash"
            left.extend((finding, reason) for finding in found)
            continue
        codes = list(dict.fromkeys(f.code for f in found))
        lines[number - 1] = _with_noqa(lines[number - 1], codes, comments.get(number))
        added += 1
    return NoqaText("".join(lines), added, tuple(left))


def _line_ends(text: str) -> tuple[set[int], dict[int, int]]:
    """The numbers of the lines whose end is the end of a line of code (a comment may go
    there), and the column of each comment."""
    ends: set[int] = set()
    comments: dict[int, int] = {}
    readline = io.StringIO(text, newline="").readline  # lines split as Python splits them
    for token in tokenize.generate_tokens(readline):
        if token.type in (tokenize.NEWLINE, tokenize.NL):
            ends.add(token.start[0])
        elif token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.start[1]
    return ends, comments


_LINE_BREAK = re.compile(r"(\r\n|\r|\n)?\Z")


def _with_noqa(line: str, codes: list[str], comment: int | None) -> str:
    """The line with ``codes`` suppressed: merged into its ``# noqa:`` list, or a comment
    appended before its line break."""
    body = line[: _LINE_BREAK.search(line).start()]  # type: ignore[union-attr]
    end = line[len(body) :]
    existing = NOQA.search(body, comment) if comment is not None else None
    if existing is not None and existing.group("codes"):
        listed = [code for code in SEPARATOR.split(existing.group("codes")) if code]
        merged = ", ".join(dict.fromkeys([*listed, *codes]))
        rest = body[existing.end() :].strip()  # what the comment says after its codes
        return f"{body[: existing.start()]}# noqa: {merged}{' ' + rest if rest else ''}{end}"
    return f"{body.rstrip()}  # noqa: {', '.join(codes)}{end}"
