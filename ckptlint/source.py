"""Reading, decoding, prefiltering and parsing one file.

The prefilter decides from the raw bytes whether a file can reach a checkpoint function at
all. Resolution (resolve.py) only ever recognises a checkpoint call through an import or an
attribute access that spells the identifier ``checkpoint`` (the module
``torch.utils.checkpoint``) or the last part of a configured extra name, so a file without
that identifier as a whole word cannot produce a finding and is not parsed.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterable
from dataclasses import dataclass


class UnreadableSource(Exception):
    """The file cannot be analysed; ``line``/``column`` locate the problem (1-based)."""

    def __init__(self, reason: str, line: int = 1, column: int = 1) -> None:
        super().__init__(reason)
        self.reason = reason
        self.line = line
        self.column = column


def prefilter_pattern(extra_names: Iterable[str] = ()) -> re.Pattern[bytes]:
    words = {"checkpoint"} | {name.rsplit(".", 1)[-1] for name in extra_names}
    alternatives = "|".join(re.escape(word) for word in sorted(words))
    return re.compile(rb"\b(?:" + alternatives.encode() + rb")\b")


@dataclass(frozen=True)
class ParsedSource:
    text: str
    lines: list[str]
    tree: ast.Module


def read_bytes(path: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as error:
        raise UnreadableSource(f"cannot read file: {error.strerror or error}") from None


def decode(data: bytes) -> str:
    """Decode as Python does: BOM, then a coding declaration, else UTF-8."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as error:
        raise UnreadableSource(f"cannot decode file: {error.msg}") from None
    try:
        text = data.decode(encoding)
    except (UnicodeDecodeError, LookupError) as error:
        line = data[: getattr(error, "start", 0)].count(b"\n") + 1
        raise UnreadableSource(f"cannot decode file as {encoding}: {error}", line) from None
    return text.removeprefix("\ufeff")


def parse(text: str, filename: str) -> ParsedSource:
    if "\0" in text:
        line = text.count("\n", 0, text.index("\0")) + 1
        raise UnreadableSource("cannot parse file: it contains a NUL byte", line)
    try:
        tree = ast.parse(text, filename=filename)
    except SyntaxError as error:
        raise UnreadableSource(
            f"syntax error: {error.msg}", error.lineno or 1, error.offset or 1
        ) from None
    except (ValueError, RecursionError, MemoryError) as error:
        raise UnreadableSource(f"cannot parse file: {error}") from None
    return ParsedSource(text, text.splitlines(keepends=True), tree)
