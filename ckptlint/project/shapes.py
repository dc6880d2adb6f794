"""What a module is made of, positions aside: the facts early cutoff compares.

A module's text splits into its top-level statements (``lazy_tree``'s split). Each top-level
``def`` or ``class`` is a part of its own, keyed by its kind, its name and its rank among the
parts of that kind and name (``def run#0``), and digested from its text alone. Everything
else (imports, assignments, and the headers of the definitions: decorators, name, bases,
parameters) is the module's skeleton, digested as one. A stored result (a file's exports
or findings) records the skeleton of each module it read, the parts whose bodies it read,
the parts that hold a name it searched for, and whether the text tests versions; an edit
that changes none of those (a body it never read, lines moved, a comment) leaves the result
valid. Parts are found from the text with no parsing, so checking a changed file costs a
split and a few digests.
"""

from __future__ import annotations

import hashlib
import re
from bisect import bisect_right
from dataclasses import dataclass, field

from ckptlint.lazy_tree import Chunk, definition_chunks, split_statements
from ckptlint.source import lines_with_words

_DEFINITION_NAME = re.compile(r"[ \t]*(?:async[ \t]+)?(def|class)[ \t]+(\w+)")
# A header longer than this many lines counts whole (with its body): never a missed change.
_MAX_HEADER_LINES = 40


def digest(lines: list[str]) -> str:
    """The digest of the code of ``lines``: lines that are blank or only a comment left out,
    so that adding a comment invalidates nothing."""
    code = "".join(line for line in lines if line.strip() and not line.lstrip().startswith("#"))
    return hashlib.blake2b(code.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


@dataclass
class Shape:
    """The parts of one module's text (see the module docstring)."""

    skeleton: str
    spans: dict[str, tuple[int, int]]  # key: the part's lines (a slice of ``_lines``)
    starts: list[int]  # first line (1-based) of each definition part, ascending
    ends: list[int]  # and its last
    keys: list[str]  # and its key
    versions: bool  # the text names a version test (see Module.tests_versions)
    _lines: list[str] = field(repr=False)
    _text: str = field(repr=False)
    _found: dict[str, list[int]] = field(default_factory=dict, repr=False)
    _names: dict[str, tuple[tuple[str, int], ...]] = field(default_factory=dict, repr=False)
    _digests: dict[str, str] = field(default_factory=dict, repr=False)

    def part(self, key: str) -> str | None:
        """The digest of a part's text (None: no such part), made when first asked for:
        most bodies are never read, so their digests are never needed."""
        found = self._digests.get(key)
        if found is None:
            span = self.spans.get(key)
            if span is None:
                return None
            found = self._digests[key] = digest(self._lines[span[0] : span[1]])
        return found

    def key_at(self, line: int) -> str:
        """The part holding ``line`` (1-based); "" for the skeleton."""
        index = bisect_right(self.starts, line) - 1
        if index >= 0 and line <= self.ends[index]:
            return self.keys[index]
        return ""

    def lines_naming(self, name: str) -> list[int]:
        """Lines (1-based, ascending) where ``name`` appears as a whole identifier."""
        found = self._found.get(name)
        if found is None:
            found = []
            if name in self._text:
                found = sorted(lines_with_words(self._lines, [name], text=self._text))
            self._found[name] = found
        return found

    def naming(self, name: str) -> tuple[tuple[str, int], ...]:
        """Where the lines naming ``name`` lie, positions aside: each part holding some,
        with how many (the skeleton as "")."""
        found = self._names.get(name)
        if found is None:
            counts: dict[str, int] = {}
            for line in self.lines_naming(name):
                key = self.key_at(line)
                counts[key] = counts.get(key, 0) + 1
            found = self._names[name] = tuple(counts.items())
        return found


def shape_of(lines: list[str], text: str, chunks: list[Chunk] | None = None) -> Shape:
    """The shape of a module's text (``lines`` as Python numbers them; ``chunks``, their
    ``split_statements`` if known)."""
    if chunks is None:
        chunks = split_statements(lines)
    skeleton: list[str] = []
    spans: dict[str, tuple[int, int]] = {}
    starts: list[int] = []
    ends: list[int] = []
    keys: list[str] = []
    ranks: dict[tuple[str, str], int] = {}
    previous = 0
    for start, end in definition_chunks(chunks):
        skeleton.extend(lines[previous:start])
        header_end = _header_end(lines, start, end)
        skeleton.extend(lines[start:header_end])
        match = next(
            (m for m in map(_DEFINITION_NAME.match, lines[start:end]) if m is not None), None
        )
        kind, name = match.groups() if match else ("?", "?")
        rank = ranks.get((kind, name), 0)
        ranks[(kind, name)] = rank + 1
        key = f"{kind} {name}#{rank}"
        spans[key] = (start, end)
        starts.append(start + 1)
        ends.append(end)
        keys.append(key)
        previous = end
    skeleton.extend(lines[previous:])
    versions = "version" in text or "is_torch_" in text
    return Shape(digest(skeleton), spans, starts, ends, keys, versions, lines, text)


def _header_end(lines: list[str], start: int, end: int) -> int:
    """The index after a definition's header (decorators, then the ``def``/``class`` line
    up to the ``:`` that ends it outside brackets); the whole chunk when it cannot tell."""
    depth = 0
    for index in range(start, min(end, start + _MAX_HEADER_LINES)):
        line = lines[index]
        code = line.split("#", 1)[0] if "'" not in line and '"' not in line else line
        for character in code:
            if character in "([{":
                depth += 1
            elif character in ")]}":
                depth -= 1
        stripped = code.rstrip()
        if depth <= 0 and stripped.endswith(":") and not stripped.lstrip().startswith("@"):
            return index + 1
    return end
