"""``# noqa`` comments, with flake8's meaning: bare, or followed by codes (prefixes)."""

from __future__ import annotations

import re

NOQA = re.compile(
    r"#\s*noqa(?::[\s]?(?P<codes>[A-Z]+[0-9]*(?:[,\s]+[A-Z]+[0-9]*)*))?", re.IGNORECASE
)
SEPARATOR = re.compile(r"[,\s]+")


def is_suppressed(line_text: str, code: str) -> bool:
    match = NOQA.search(line_text)
    if match is None:
        return False
    codes = match.group("codes")
    if not codes:
        return True
    return any(code.startswith(listed.upper()) for listed in SEPARATOR.split(codes) if listed)
