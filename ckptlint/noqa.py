"""Suppression comments, with flake8's meaning, shared by the CLI and the flake8 plugin.

- ``# noqa`` on the reported line: flake8 7's own pattern, so both tools read the same
  comments (``# noqa: CKP`` has no digits, so flake8 reads it as a bare ``# noqa``).
  Listed codes are prefixes and compared case-insensitively: flake8 compares them as
  written, so the plugin drops lowercase-suppressed findings itself.
- ``# flake8: noqa`` at the start of a line skips the whole file, as flake8 does.
- ``# ckptlint: noqa`` does the same; ``# ckptlint: noqa: CKP101,CKP2`` skips only those
  codes in the file (like ruff's ``# ruff: noqa: F401``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# flake8.defaults.NOQA_INLINE_REGEXP (flake8 7).
NOQA = re.compile(r"# noqa(?::[\s]?(?P<codes>([A-Z]+[0-9]+(?:[,\s]+)?)+))?", re.IGNORECASE)
SEPARATOR = re.compile(r"[,\s]+")
# flake8.defaults.NOQA_FILE, applied to each line from its start, and ours.
_FILE_NOQA = re.compile(
    r"^[ \t\f]*(?:# flake8[:=][ \t]*noqa"
    r"|#[ \t]*ckptlint[:=][ \t]*noqa(?::[ \t]*(?P<codes>[A-Z]+[0-9]*(?:[,\s]+[A-Z]+[0-9]*)*))?)",
    re.IGNORECASE | re.MULTILINE,
)


def is_suppressed(line_text: str, code: str) -> bool:
    match = NOQA.search(line_text)
    if match is None:
        return False
    codes = match.group("codes")
    if not codes:
        return True
    return any(code.startswith(listed.upper()) for listed in SEPARATOR.split(codes) if listed)


@dataclass(frozen=True)
class FileExemption:
    """What a file-level comment exempts: every code (``codes`` empty) or these prefixes."""

    codes: tuple[str, ...] = ()

    def covers(self, code: str) -> bool:
        return not self.codes or code.startswith(self.codes)


def file_exemption(text: str) -> FileExemption | None:
    """The file's ``# flake8: noqa`` / ``# ckptlint: noqa[: codes]``, if any."""
    if "noqa" not in text.lower():  # most files: one pass in C instead of the pattern's
        return None
    codes: list[str] = []
    for match in _FILE_NOQA.finditer(text):
        listed = match.group("codes")
        if not listed:
            return FileExemption()
        codes.extend(code.upper() for code in SEPARATOR.split(listed) if code)
    return FileExemption(tuple(codes)) if codes else None
