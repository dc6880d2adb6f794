"""gitignore patterns, matched by git's rules in time linear in the path.

One matcher serves ``.gitignore`` files, ``exclude`` and ``per-file-ignores``. Regular
expression engines that backtrack (Python's ``re``, hence ``pathspec``) take time
exponential in the number of stars of a pattern such as ``*a*a*a*a*a*a*a*a*c``: a
repository's ``.gitignore`` could hang a run. Here a pattern is split at its stars into
pieces of fixed length, and a piece between two stars is placed at its leftmost match
(``str.find``, or a search for a regular expression of fixed length): where pieces of fixed
length are separated by stars, the leftmost placement of each is the one that leaves the
most room to the next, so nothing is ever tried twice. ``**`` works the same way one level
up, with path components as the characters.

The rules are git's (gitignore(5) and its wildmatch): a pattern without a slash (but for a
trailing one) matches a file or folder name at any depth, one with a slash matches the path
from the folder of the file holding it; a trailing ``/`` matches folders only; ``*`` and
``?`` never match ``/``; ``**/``, ``/**/`` and ``/**`` match any number of folders; ``[...]``
classes take ranges, ``!`` or ``^`` negation and POSIX classes (``[[:digit:]]``); ``\\``
escapes; ``!`` re-includes, and the last pattern that matches decides; a path inside an
excluded folder is excluded, whatever a later pattern says about the path itself.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from ckptlint.memos import process_cache

# A piece of a name between two stars: a literal string, or a regular expression that
# matches a fixed number of characters (``?`` or a class in it), with that number.
_Piece = str | tuple["re.Pattern[str]", int]

_POSIX_CLASSES = {
    "alnum": "0-9A-Za-z",
    "alpha": "A-Za-z",
    "blank": " \\t",
    "cntrl": "\\x00-\\x1f\\x7f",
    "digit": "0-9",
    "graph": "!-~",
    "lower": "a-z",
    "print": " -~",
    "punct": "!-/:-@\\[-`{-~",
    "space": " \\t\\n\\r\\f\\v",
    "upper": "A-Z",
    "xdigit": "0-9A-Fa-f",
}


class _Never(Exception):
    """The pattern can match nothing (an unclosed class, a trailing backslash): git's
    wildmatch gives up on such a pattern for every path."""


@dataclass(frozen=True)
class _Glob:
    """One path component's pattern: pieces of fixed length with a star between each two
    (``starred`` False: a single piece that must match the whole name). ``literal``: its
    longest literal piece, which any name it matches contains; ``shortest``: the length of
    the shortest name it can match (its pieces' lengths)."""

    pieces: tuple[_Piece, ...]
    starred: bool
    literal: str
    shortest: int

    def matches(self, name: str) -> bool:
        pieces = self.pieces
        if not self.starred:
            return _match_at(pieces[0], name, 0) == len(name)
        first, last = pieces[0], pieces[-1]
        start = _match_at(first, name, 0)
        end = len(name) - _length(last)
        if start is None or end < start or _match_at(last, name, end) != len(name):
            return False
        for piece in pieces[1:-1]:
            found = _search(piece, name, start, end)
            if found is None:
                return False
            start = found
        return True


def _length(piece: _Piece) -> int:
    return len(piece) if isinstance(piece, str) else piece[1]


def _match_at(piece: _Piece, name: str, position: int) -> int | None:
    """Where the piece ends when it matches ``name`` at ``position``, else None."""
    if isinstance(piece, str):
        return position + len(piece) if name.startswith(piece, position) else None
    found = piece[0].match(name, position)
    return None if found is None else found.end()


def _search(piece: _Piece, name: str, start: int, end: int) -> int | None:
    """Where the leftmost match of the piece in ``name[start:end]`` ends, else None."""
    if isinstance(piece, str):
        found = name.find(piece, start, end)
        return None if found == -1 else found + len(piece)
    match = piece[0].search(name, start, end)
    return None if match is None else match.end()


# A component pattern ``**``: any number of path components (none included).
_ANY = None


@dataclass(frozen=True)
class Pattern:
    """One line of a gitignore file, compiled."""

    text: str
    negated: bool
    folders_only: bool
    basename: bool  # no slash: matches the last component, at any depth
    components: tuple[_Glob | None, ...]  # for a path pattern; None stands for ``**``
    # What every last component this pattern matches has: a string it contains ("" when
    # unknown) and a least length. Computed once, tested for every path and folder level a
    # walk meets: most paths fail one of them without matching a piece.
    literal: str
    shortest: int

    def matches(self, parts: list[str], is_folder: bool) -> bool:
        """Whether the pattern matches the path itself (not a folder above it)."""
        if self.folders_only and not is_folder:
            return False
        if self.basename:
            glob = self.components[0]
            return glob is not None and glob.matches(parts[-1])
        return _match_components(self.components, parts)


def _match_components(components: tuple[_Glob | None, ...], parts: list[str]) -> bool:
    """``components`` against ``parts`` with ``**`` (None) matching any number of parts:
    the runs between two ``**`` are placed leftmost, as pieces between stars are."""
    runs: list[list[_Glob]] = [[]]
    for component in components:
        if component is None:
            runs.append([])
        else:
            runs[-1].append(component)
    if len(runs) == 1:
        return len(parts) == len(runs[0]) and _run_at(runs[0], parts, 0)
    first, last = runs[0], runs[-1]
    end = len(parts) - len(last)
    if end < len(first) or not _run_at(first, parts, 0) or not _run_at(last, parts, end):
        return False
    position = len(first)
    for run in runs[1:-1]:
        while position + len(run) <= end and not _run_at(run, parts, position):
            position += 1
        if position + len(run) > end:
            return False
        position += len(run)
    return True


def _run_at(run: list[_Glob], parts: list[str], position: int) -> bool:
    return all(glob.matches(parts[position + index]) for index, glob in enumerate(run))


def compile_pattern(line: str) -> Pattern | None:
    """A gitignore line, compiled; None for a blank line, a comment, or a pattern that can
    match nothing."""
    text = _strip_trailing_spaces(line.rstrip("\n").removesuffix("\r"))
    if not text or text.startswith("#"):
        return None
    negated = text.startswith("!")
    if negated:
        text = text[1:]
    folders_only = text.endswith("/") and not text.endswith("\\/")
    if folders_only:
        text = text.rstrip("/")
    basename = "/" not in text
    text = text.lstrip("/") if not basename else text
    if not text:
        return None
    try:
        if basename:
            components: tuple[_Glob | None, ...] = (_compile_glob(text),)
        else:
            components = _compile_path(text)
    except _Never:
        return None
    last = components[-1]
    literal, shortest = ("", 0) if last is None else (last.literal, last.shortest)
    return Pattern(line, negated, folders_only, basename, components, literal, shortest)


def _strip_trailing_spaces(text: str) -> str:
    """Trailing spaces go, unless escaped with a backslash (git's rule)."""
    stripped = text.rstrip(" ")
    if stripped != text and stripped.endswith("\\") and not _escaped_end(stripped):
        return stripped + " "  # the backslash escapes the first trailing space
    return stripped


def _escaped_end(text: str) -> bool:
    """Whether the last backslash of ``text`` is itself escaped."""
    count = len(text) - len(text.rstrip("\\"))
    return count % 2 == 0


def _compile_path(text: str) -> tuple[_Glob | None, ...]:
    components: list[_Glob | None] = []
    parts = text.split("/")
    for index, part in enumerate(parts):
        if part == "**":
            if index == len(parts) - 1:  # ``a/**``: everything inside, not ``a`` itself
                components.append(_compile_glob("*"))
            if not components or components[-1] is not _ANY:
                components.append(_ANY)
        elif part:
            components.append(_compile_glob(part))
        else:
            raise _Never  # ``a//b``: git never matches an empty component
    return tuple(components)


# A run of characters that stand for themselves, taken in one step: compiling costs a step
# per star, ``?``, class or escape, not per character.
_LITERAL_RUN = re.compile(r"[^*?\[\\]+")


@process_cache
@lru_cache(maxsize=4096)
def _compile_glob(text: str) -> _Glob:
    """One component's pattern (no ``/`` in it) to pieces between stars."""
    pieces: list[_Piece] = []
    # (literal text, or a regular expression matching one character; is literal)
    current: list[tuple[str, bool]] = []
    starred = False
    index = 0
    while index < len(text):
        character = text[index]
        if character == "*":
            starred = True
            pieces.append(_piece(current))
            current = []
            while index < len(text) and text[index] == "*":
                index += 1
            continue
        if character == "?":
            current.append(("[^/]", False))
        elif character == "[":
            expression, index = _class(text, index)
            current.append((expression, False))
            continue
        elif character == "\\":
            index += 1
            if index == len(text):
                raise _Never
            current.append((text[index], True))
        else:
            run = _LITERAL_RUN.match(text, index)
            assert run is not None
            current.append((run.group(), True))
            index = run.end()
            continue
        index += 1
    pieces.append(_piece(current))
    literal = max((piece for piece in pieces if isinstance(piece, str)), key=len, default="")
    return _Glob(tuple(pieces), starred, literal, sum(map(_length, pieces)))


def _piece(items: list[tuple[str, bool]]) -> _Piece:
    if len(items) == 1:  # most pieces of a pattern of many stars: a name or one ``?``
        text, literal = items[0]
        return text if literal else _one_character(text)
    if all(literal for _, literal in items):
        return "".join(text for text, _ in items)
    expression = "".join(re.escape(text) if literal else text for text, literal in items)
    length = sum(len(text) if literal else 1 for text, literal in items)
    return (_expression(expression), length)


@process_cache
@lru_cache(maxsize=4096)
def _one_character(expression: str) -> tuple[re.Pattern[str], int]:
    """A piece of one ``?`` or class, one object however many patterns hold it: 10,000
    distinct patterns of 450 ``*?`` each held 4.5 million tuples (320 MB) otherwise."""
    return (_expression(expression), 1)


@process_cache
@lru_cache(maxsize=4096)
def _expression(expression: str) -> re.Pattern[str]:
    """A piece's regular expression, compiled once however many patterns hold it (``?``
    and ``[...]`` repeat: 10,000 patterns of 400 ``?`` each are 4 million pieces)."""
    return re.compile(expression, re.DOTALL)


def _class(text: str, start: int) -> tuple[str, int]:
    """The ``[...]`` at ``start`` as a regular expression class, and the index after it."""
    index = start + 1
    negated = index < len(text) and text[index] in "!^"
    if negated:
        index += 1
    members: list[str] = []
    first = True
    while True:
        if index >= len(text):
            raise _Never  # an unclosed class
        character = text[index]
        if character == "]" and not first:
            index += 1
            break
        first = False
        if character == "[" and text.startswith("[:", index):
            close = text.find(":]", index + 2)
            if close == -1:
                members.append(re.escape("["))
                index += 1
                continue
            name = text[index + 2 : close]
            if name not in _POSIX_CLASSES:
                raise _Never
            members.append(_POSIX_CLASSES[name])
            index = close + 2
            continue
        if character == "\\":
            index += 1
            if index >= len(text):
                raise _Never
            character = text[index]
        low = character
        index += 1
        if text.startswith("-", index) and index + 1 < len(text) and text[index + 1] != "]":
            high = text[index + 1]
            index += 2
            if high == "\\":
                if index >= len(text):
                    raise _Never
                high = text[index]
                index += 1
            if low <= high:
                members.append(f"{re.escape(low)}-{re.escape(high)}")
            continue
        members.append(re.escape(low))
    body = "".join(members)
    if not body:
        return ("[^/]" if negated else "(?!)"), index
    return (f"[^/{body}]" if negated else f"(?:(?!/)[{body}])"), index


class Patterns:
    """The lines of one gitignore file (or one ``exclude`` list), compiled once.

    A path is matched against the patterns that can match it: those naming its first
    component or its name exactly (``src/legacy``, ``build/``) are found by that name, so
    thousands of such patterns cost a path two lookups; the others are tried in turn.
    """

    def __init__(self, lines: Iterable[str]) -> None:
        compiled = (compile_pattern(line) for line in lines)
        self.patterns = tuple(p for p in compiled if p is not None)
        self._by_first: dict[str, list[int]] = {}
        self._by_name: dict[str, list[int]] = {}
        self._others: list[int] = []
        for index, pattern in enumerate(self.patterns):
            first = pattern.components[0]
            literal = first.pieces[0] if first is not None and not first.starred else None
            if not isinstance(literal, str):
                self._others.append(index)
            elif pattern.basename:
                self._by_name.setdefault(literal, []).append(index)
            else:
                self._by_first.setdefault(literal, []).append(index)

    def __bool__(self) -> bool:
        return bool(self.patterns)

    def verdict(self, path: str, *, is_folder: bool) -> bool | None:
        """What the last pattern matching the path itself says (True: excluded, False:
        re-included with ``!``); None when none matches. ``path`` is relative, with ``/``."""
        parts = path.split("/")
        name = parts[-1]
        candidates: Iterable[int] = reversed(self._others)
        by_first = self._by_first.get(parts[0])
        by_name = self._by_name.get(name)
        if by_first or by_name:  # each index is in one list: merged, last first
            named = (reversed(found) for found in (by_first, by_name) if found)
            candidates = heapq.merge(candidates, *named, reverse=True)
        patterns = self.patterns
        for index in candidates:
            pattern = patterns[index]
            if len(name) < pattern.shortest or pattern.literal not in name:
                continue
            if pattern.matches(parts, is_folder):
                return not pattern.negated
        return None

    def excludes(self, path: str, *, is_folder: bool) -> bool:
        """git's answer for ``path``: excluded when it, or a folder above it, is."""
        parts = path.split("/")
        for depth in range(1, len(parts)):
            if self.verdict("/".join(parts[:depth]), is_folder=True):
                return True
        return bool(self.verdict(path, is_folder=is_folder))


@process_cache
@lru_cache(maxsize=256)
def compiled(lines: tuple[str, ...]) -> Patterns:
    """``Patterns(lines)``, compiled once a run for each distinct list of lines."""
    return Patterns(lines)
