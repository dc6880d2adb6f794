"""Text searches over a file's bytes that the analysis runs across every file of a project.

They decide which files a project-wide question must parse (who writes ``config.SCALE``,
who mutates an imported ``CONFIG``, who calls ``set_scale``), so each must find every file
that could matter: a search may match too much (the analysis then looks closer), never too
little.
"""

from __future__ import annotations

import re

from ckptlint.source import identifier_at, identifiers

NAMES = "names"  # the word as a whole identifier, anywhere
# ``x.WORD = ...``, ``x.WORD[k] += ...``, ``x.WORD.pop()``, ``setattr(x, "WORD", v)``,
# ``vars(x)["WORD"] = v``
ATTRIBUTE_WRITES = "attribute-writes"
# ``WORD[k] = ...``, ``WORD.a = ...``, ``WORD.update(...)``, ``alias = WORD`` (then written)
CONTENT_WRITES = "content-writes"
KINDS = (NAMES, ATTRIBUTE_WRITES, CONTENT_WRITES)

_MUTATORS = (
    "append extend insert remove pop popitem clear update setdefault add discard "
    "sort reverse __setitem__ __delitem__"
).split()
_MUTATOR_CALL = re.compile(rb"\s*\.\s*(?:" + b"|".join(m.encode() for m in _MUTATORS) + rb")\s*\(")
_ASSIGNMENT = re.compile(
    rb"\s*(?:(?:[-+*/%&|^@]|//|\*\*|<<|>>)?=(?!=)|[,:][^\n]*?(?<![=!<>])=(?!=))"
)
_ATTRIBUTE = re.compile(rb"\s*\.\s*[A-Za-z_\x80-\xff][\w\x80-\xff]*")
_MAX_SUBSCRIPT = 2000


def matches(kind: str, word: str, data: bytes) -> bool:
    needle = word.encode()
    start = data.find(needle)
    while start != -1:
        end = start + len(needle)
        if identifier_at(data, start, end) and _matches_at(kind, data, start, end):
            return True
        start = data.find(needle, end)
    return False


def _matches_at(kind: str, data: bytes, start: int, end: int) -> bool:
    if kind == NAMES:
        return True
    after_dot = data[:start].rstrip(b" \t\\\n").endswith(b".")
    if kind == ATTRIBUTE_WRITES:
        return (after_dot and _written(data, start, end, bare=True)) or _named_by_string(
            data, start, end
        )
    return not after_dot and (_written(data, start, end, bare=False) or _aliased(data, start, end))


def _named_by_string(data: bytes, start: int, end: int) -> bool:
    """``setattr(x, "WORD", v)``, ``delattr(x, "WORD")``, ``vars(x)["WORD"] = v``,
    ``x.__dict__["WORD"] = v``: the word quoted on a line that names one of those."""
    quote = data[start - 1 : start] if start else b""
    if quote not in (b'"', b"'") or data[end : end + 1] != quote:
        return False
    line = data[data.rfind(b"\n", 0, start) + 1 : start]
    return any(word in line for word in (b"setattr", b"delattr", b"vars", b"__dict__"))


def _aliased(data: bytes, start: int, end: int) -> bool:
    """``table = WORD``: another name for the object, whose writes are the object's."""
    before = data[data.rfind(b"\n", 0, start) + 1 : start].rstrip(b" \t")
    if not before.endswith(b"=") or before.endswith((b"==", b"!=", b"<=", b">=")):
        return False
    following = data[_skip_spaces(data, end) : _skip_spaces(data, end) + 1]
    return following in (b"", b"\n", b"\r", b";", b"#")


def _written(data: bytes, start: int, end: int, *, bare: bool) -> bool:
    """The word at ``start`` may be written: followed, past subscripts and attributes, by an
    assignment operator, a comma (a tuple target) or a mutating method call, or in a ``del``
    statement. ``bare``: an assignment to the word itself counts (``x.WORD = 1``); else
    only one to its content (``WORD[k] = 1``: ``WORD = 1`` rebinds a name of one's own)."""
    line_start = data.rfind(b"\n", 0, start) + 1
    if data[line_start:start].lstrip().startswith(b"del"):
        return True
    position, stepped = end, False
    while True:
        if _MUTATOR_CALL.match(data, position):
            return True
        following = data[_skip_spaces(data, position) : _skip_spaces(data, position) + 1]
        if following == b"[":
            position = _after_brackets(data, _skip_spaces(data, position))
            if position < 0:
                return True  # unbalanced, or too long to follow: look closer
            stepped = True
            continue
        attribute = _ATTRIBUTE.match(data, position) if following == b"." else None
        if attribute is not None:
            position, stepped = attribute.end(), True
            continue
        if following == b"\\":
            return True  # a line continued: look closer
        if following == b")":  # a parenthesized target: ``(cfg.SCALE) = 2``
            position = _skip_spaces(data, position)
            while data[position : position + 1] == b")":
                position = _skip_spaces(data, position + 1)
        return (bare or stepped) and _ASSIGNMENT.match(data, position) is not None


def _skip_spaces(data: bytes, position: int) -> int:
    while data[position : position + 1] in (b" ", b"\t"):
        position += 1
    return position


def _after_brackets(data: bytes, position: int) -> int:
    """The offset after the brackets opening at ``position``; -1 when they do not close."""
    depth = 0
    for offset in range(position, min(len(data), position + _MAX_SUBSCRIPT)):
        character = data[offset]
        if character in b"([{":
            depth += 1
        elif character in b")]}":
            depth -= 1
            if depth == 0:
                return offset + 1
    return -1


_CLASS_HEADER = re.compile(r"^[ \t]*class[ \t]+[^\W\d]\w*[ \t]*\(", re.MULTILINE)
_HEADER_END = re.compile(r":[ \t]*(?:#[^\n]*)?(?:\n|$)")


def own_bases(text: str, classes: frozenset[str]) -> bool:
    """Whether a class header of ``text`` names one of ``classes`` among its bases (read
    from the header's text: a header that cannot be delimited counts)."""
    if not classes:
        return False
    for header in _CLASS_HEADER.finditer(text):
        end = _HEADER_END.search(text, header.end(), header.end() + 4000)
        bases = text[header.end() : end.start() if end else header.end() + 4000]
        if identifiers(bases) & classes:
            return True
    return False
