"""A module tree whose top-level function and class bodies are parsed on first use.

Parsing dominates the linter's time, yet most of a large model file is definitions that
cannot hold a checkpoint call. The text is split at lines where a top-level ``def``,
``class`` or decorator starts; every other top-level statement is parsed at once, and a
definition that does not touch a line of interest gets a stub built from its header alone.
The stub is an instance of a subclass of the real node type (``isinstance`` holds); its
``body`` is parsed the first time anything reads it.

Soundness: the split looks at raw lines, so a line that only looks like a definition (inside
a multi-line string or brackets) must never be trusted. Every chunk must have balanced
triple quotes and eagerly parsed chunks must parse (else the file is parsed whole up front).
A body parsed later must parse on its own and end where the stub said; when it does not,
the whole text decides: the body of the same definition in ``ast.parse(text)``, or, when
the text does not parse (a syntax error in that body), a body that returns what cannot be
known (``UNPARSABLE``), and the file's own check reports the syntax error (CKP901). Lazy
parsing never changes a tree, and a body that does not parse stops no one else's analysis.
"""

from __future__ import annotations

import ast
import re
import symtable
from bisect import bisect_right
from collections.abc import Callable, Iterable
from dataclasses import dataclass

_DEFINITION = re.compile(r"(?:async[ \t]+def|def|class)[ \t]")
_CONTINUATION = re.compile(r"(?:else|elif|except|finally)\b")
_MAX_HEADER_LINES = 40
# First characters of lines that cannot start the ``def``/``class`` line of a chunk:
# indented or blank lines, comments, decorators and the brackets that close them.
_NOT_A_HEADER = frozenset(" \t\r\n\f#@)]}")


# The name a body that does not parse returns: bound nowhere, so its value is unknown.
UNPARSABLE = "<unparsable>"


@dataclass(frozen=True)
class Chunk:
    start: int  # 0-based index of the first line
    end: int  # index after the last line
    is_definition: bool


def parse_lazily(
    text: str,
    lines: list[str],
    filename: str,
    lines_of_interest: Iterable[int],
    chunks: list[Chunk] | None = None,
) -> ast.Module:
    """``ast.parse(text)``, with the bodies of top-level definitions that do not touch
    ``lines_of_interest`` (1-based) parsed only when first read. ``lines`` are the text's
    lines as Python numbers them; ``chunks``, their ``split_statements`` if known."""
    if chunks is None:
        chunks = split_statements(lines)
    interesting = sorted(set(lines_of_interest))
    stubbed = [
        chunk.is_definition and not _any_within(interesting, chunk.start, chunk.end)
        for chunk in chunks
    ]
    at_once = _parse_at_once(lines, chunks, stubbed, filename)
    if at_once is not None:
        return at_once
    body: list[ast.stmt] = []
    eager: list[Chunk] = []

    def flush() -> bool:
        if not eager:
            return True
        statements = _parse_at(lines, eager[0].start, eager[-1].end, filename)
        eager.clear()
        if statements is None:
            return False
        body.extend(statements)
        return True

    for chunk, lazy in zip(chunks, stubbed, strict=True):
        stub = _stub(lines, chunk, filename) if lazy else None
        if stub is None:
            eager.append(chunk)
            continue
        if not flush():
            return ast.parse(text, filename)
        body.append(stub)
    if not flush():
        return ast.parse(text, filename)
    return ast.Module(body=body, type_ignores=[])


def _any_within(ascending: list[int], after: int, up_to: int) -> bool:
    """Whether a number of ``ascending`` lies in (after, up_to]."""
    index = bisect_right(ascending, after)
    return index < len(ascending) and ascending[index] <= up_to


def _parse_at_once(
    lines: list[str], chunks: list[Chunk], stubbed: list[bool], filename: str
) -> ast.Module | None:
    """The tree, in one parse: the text with the body of each definition to stub replaced
    by ``pass`` (lines kept where they are), its definitions then stubbed with the headers
    parsed. None when a header's end cannot be told from its text or the text does not
    parse so (the definitions are then parsed one by one)."""
    text: list[str] = []
    stubs: dict[int, Chunk] = {}
    for chunk, lazy in zip(chunks, stubbed, strict=True):
        end = _header_end(lines, chunk) if lazy else None
        if end is None or not _balanced_quotes("".join(lines[chunk.start : chunk.end])):
            text.extend(lines[chunk.start : chunk.end])
            continue
        stubs[chunk.start] = chunk
        text.extend(lines[chunk.start : end + 1])
        if end + 1 < chunk.end:
            text.append(" pass\n")
            text.extend("\n" for _ in range(end + 2, chunk.end))
        else:
            return None  # the body is on the header's line
    try:
        tree = ast.parse("".join(text), filename)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    for index, node in enumerate(tree.body):
        first = min((d.lineno for d in getattr(node, "decorator_list", ())), default=node.lineno)
        found = stubs.pop(first - 1, None)
        if found is None:
            continue
        if not isinstance(node, _DEFINITIONS):
            return None
        tree.body[index] = _lazy_from(node, lines, found, filename)
    return None if stubs else tree


def _header_end(lines: list[str], chunk: Chunk) -> int | None:
    """The line of the colon that ends a definition's header (after its ``def`` or
    ``class`` line, outside brackets, strings and comments), when nothing but a comment
    follows it there; None otherwise."""
    depth = 0
    quote = ""
    started = False
    for index in range(chunk.start, min(chunk.end, chunk.start + _MAX_HEADER_LINES)):
        line = lines[index]
        if not started and not quote and depth == 0:
            started = bool(_DEFINITION.match(line)) or line.startswith("async")
        position, length = 0, len(line)
        while position < length:
            character = line[position]
            if quote:
                if character == "\\":
                    position += 2
                    continue
                if line.startswith(quote, position):
                    position += len(quote)
                    quote = ""
                    continue
            elif character in "\"'":
                quote = line[position : position + 3]
                quote = quote if quote in ('"""', "'''") else character
                position += len(quote)
                continue
            elif character == "#":
                break
            elif character in "([{":
                depth += 1
            elif character in ")]}":
                depth -= 1
            elif character == ":" and depth == 0 and started:
                rest = line[position + 1 :].strip()
                return index if not rest or rest.startswith("#") else None
            position += 1
    return None


def _lazy_from(node: ast.stmt, lines: list[str], chunk: Chunk, filename: str) -> ast.stmt:
    """A stub of ``node`` (parsed with a ``pass`` body): its header, its body parsed from
    ``chunk`` when read."""
    last = chunk.end - 1  # the definition ends at its last line of code
    while last > chunk.start and (not lines[last].strip() or lines[last].lstrip()[0] == "#"):
        last -= 1
    header = {field: getattr(node, field) for field in node._fields if field != "body"}
    lazy = _LAZY_TYPES[type(node)](**header)
    lazy._parsed_body = None
    lazy.lineno, lazy.col_offset = node.lineno, node.col_offset
    lazy.end_lineno = last + 1
    lazy._source = (lines, chunk, filename)
    return lazy


_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def check_unparsed_bodies(tree: ast.Module, text: str, filename: str) -> None:
    """Raise the SyntaxError ``ast.parse(text)`` would, for bodies no rule ever read.

    The definitions whose bodies were never parsed are checked together, in one text where
    every other line is blank (line numbers stay right), by ``symtable``: Python's parser
    without building Python objects, about 25 % cheaper than ``ast.parse``. Chunks that fail
    there may only have been split wrongly, so the whole text has the last word.
    """
    if any(isinstance(node, _LazyBody) and node._failed for node in tree.body):
        ast.parse(text, filename)  # raises the syntax error a body was found to have
    stubs: list[_LazyBody] = [
        node for node in tree.body if isinstance(node, _LazyBody) and node._parsed_body is None
    ]
    if not stubs:
        return
    pieces: list[str] = []
    previous_end = 0
    for stub in stubs:
        lines, chunk, _ = stub._source
        pieces.append("\n" * (chunk.start - previous_end))
        pieces.extend(lines[chunk.start : chunk.end])
        previous_end = chunk.end
    try:
        symtable.symtable("".join(pieces), filename, "exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        ast.parse(text, filename)


def statement_too_deep(lines: list[str], filename: str) -> int:
    """The first line of the first top-level statement the parser gives up on by itself
    (``RecursionError`` or ``MemoryError`` while building its tree), else 1: where a text
    nested too deeply to parse whole is reported."""
    for chunk in split_statements(lines):
        try:
            ast.parse("".join(lines[chunk.start : chunk.end]), filename)  # depth, not lines
        except (RecursionError, MemoryError):
            return chunk.start + 1
        except (SyntaxError, ValueError):
            continue
    return 1


def definition_chunks(chunks: list[Chunk]) -> list[tuple[int, int]]:
    """The lines (0-based start, end excluded) of each top-level ``def`` or ``class`` with its
    decorators, among a text's ``split_statements``."""
    return [(chunk.start, chunk.end) for chunk in chunks if chunk.is_definition]


def split_statements(lines: list[str]) -> list[Chunk]:
    """Top-level statements by their first line; decorators join their definition."""
    starts: list[int] = []
    decorated = False
    for index, line in enumerate(lines):
        first = line[:1]
        if not first or first in _NOT_A_HEADER - {"@"} or _CONTINUATION.match(line):
            continue
        if index and lines[index - 1].rstrip("\r\n").endswith("\\"):
            continue
        if decorated:  # a definition's own line, or another decorator of it
            decorated = first == "@"
            continue
        starts.append(index)
        decorated = first == "@"
    starts.append(len(lines))
    chunks = []
    for start, end in zip(starts, starts[1:], strict=False):
        header = next((line for line in lines[start:end] if line[:1] not in _NOT_A_HEADER), "")
        chunks.append(Chunk(start, end, bool(_DEFINITION.match(header))))
    if starts[0] > 0:
        chunks.insert(0, Chunk(0, starts[0], False))
    return chunks


# Blank lines put before a piece of a text make the parser number the piece's lines as the
# text does. Each costs about a hundredth of a line of code parsed; past that many per line of
# the piece, renumbering the parsed tree (about as dear as parsing the piece again) is cheaper,
# and reading every body of a long file stays linear in its length.
_BLANK_LINES_PER_LINE = 100


def _parse_lines(
    lines: list[str], start: int, end: int, filename: str, tail: str = ""
) -> ast.Module:
    """``ast.parse`` of lines[start:end] (then ``tail``), numbered as in the whole text."""
    piece = "".join(lines[start:end]) + tail
    if start <= _BLANK_LINES_PER_LINE * max(end - start, 1):
        return ast.parse("\n" * start + piece, filename)
    return ast.increment_lineno(ast.parse(piece, filename), start)


def _parse_at(lines: list[str], start: int, end: int, filename: str) -> list[ast.stmt] | None:
    """Parse lines[start:end] with their real line numbers; None when they do not parse."""
    try:
        return _parse_lines(lines, start, end, filename).body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _balanced_quotes(text: str) -> bool:
    return text.count('"""') % 2 == 0 and text.count("'''") % 2 == 0


def _stub(lines: list[str], chunk: Chunk, filename: str) -> ast.stmt | None:
    """A node carrying the definition's header, with its body parsed on demand."""
    if not _balanced_quotes("".join(lines[chunk.start : chunk.end])):
        return None
    last = chunk.end - 1  # the definition ends at its last line of code
    while last > chunk.start and (not lines[last].strip() or lines[last].lstrip()[0] == "#"):
        last -= 1
    for header_end in range(chunk.start, min(chunk.end, chunk.start + _MAX_HEADER_LINES)):
        if ":" not in lines[header_end]:
            continue
        header = "".join(lines[chunk.start : header_end + 1])
        if not _balanced_quotes(header):
            continue
        try:
            (node,) = _parse_lines(lines, chunk.start, header_end + 1, filename, "\n pass\n").body
        except (SyntaxError, ValueError):
            continue
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return None
        header_fields = {field: getattr(node, field) for field in node._fields if field != "body"}
        lazy = _LAZY_TYPES[type(node)](**header_fields)
        lazy._parsed_body = None  # newer Pythons fill an omitted list field with []
        lazy.lineno, lazy.col_offset = node.lineno, node.col_offset
        lazy.end_lineno = last + 1
        lazy._source = (lines, chunk, filename)
        return lazy
    return None


class _LazyBody:
    """Mixin: ``body`` is parsed from the definition's own lines on first read."""

    _real_type: type
    _source: tuple[list[str], Chunk, str]
    end_lineno: int | None
    _parsed_body: list[ast.stmt] | None = None
    _failed = False  # the body does not parse: a syntax error the file's check reports
    on_read: Callable[[], None] | None = None  # told each time the body is read
    _parsed_end_col_offset: int | None = None

    @property
    def body(self) -> list[ast.stmt]:
        if self.on_read is not None:
            self.on_read()
        body = self._parsed_body
        return body if body is not None else self._parse()

    @body.setter
    def body(self, statements: list[ast.stmt]) -> None:
        self._parsed_body = statements

    @property
    def end_col_offset(self) -> int | None:
        """Known only from the body's last statement (a trailing comment is not part of it)."""
        if self._parsed_end_col_offset is None:
            self._parse()
        return self._parsed_end_col_offset

    @end_col_offset.setter
    def end_col_offset(self, value: int | None) -> None:
        self._parsed_end_col_offset = value

    def _parse(self) -> list[ast.stmt]:
        """Parse the definition's lines, keep its body and end, and return the body."""
        lines, chunk, filename = self._source
        statements = _parse_at(lines, chunk.start, chunk.end, filename)
        real = statements[0] if statements is not None and len(statements) == 1 else None
        if real is None or type(real) is not self._real_type or real.end_lineno != self.end_lineno:
            real = self._from_whole_text()
        if real is None:
            self._failed = True
            self._parsed_body = [_unparsable(chunk.start + 1)]
            self._parsed_end_col_offset = 0
        else:
            self._parsed_body = real.body  # type: ignore[attr-defined]
            self._parsed_end_col_offset = real.end_col_offset
            self.end_lineno = real.end_lineno
        return self._parsed_body

    def _from_whole_text(self) -> ast.stmt | None:
        """The same definition in the whole text's tree (None: the text does not parse)."""
        lines, chunk, filename = self._source
        try:
            tree = ast.parse("".join(lines), filename)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None
        for node in tree.body:
            if node.lineno == self.lineno and type(node) is self._real_type:  # type: ignore[attr-defined]
                return node
        return None


def _unparsable(line: int) -> ast.stmt:
    """``return <unparsable>``: a body whose code cannot be known."""
    name = ast.Name(id=UNPARSABLE, ctx=ast.Load())
    statement = ast.Return(value=name)
    for node in (name, statement):
        node.lineno, node.col_offset = line, 0
        node.end_lineno, node.end_col_offset = line, 0
    return statement


class LazyFunctionDef(_LazyBody, ast.FunctionDef):
    _real_type = ast.FunctionDef


class LazyAsyncFunctionDef(_LazyBody, ast.AsyncFunctionDef):
    _real_type = ast.AsyncFunctionDef


class LazyClassDef(_LazyBody, ast.ClassDef):
    _real_type = ast.ClassDef


LAZY_DEFINITIONS = (LazyFunctionDef, LazyAsyncFunctionDef, LazyClassDef)


def mark_read(node: ast.AST) -> None:
    """Tell whoever watches a lazily parsed definition that its body is read again: a memo
    that answers from what it learned of the body once says so each time it answers, so
    that what a computation is recorded to read never depends on what was asked before."""
    on_read = getattr(node, "on_read", None)
    if on_read is not None:
        on_read()


_LAZY_TYPES: dict[type, type] = {
    ast.FunctionDef: LazyFunctionDef,
    ast.AsyncFunctionDef: LazyAsyncFunctionDef,
    ast.ClassDef: LazyClassDef,
}
# ast.NodeVisitor dispatches on the class name (visit_FunctionDef): answer to the real one.
for _real, _lazy in _LAZY_TYPES.items():
    _lazy.__name__ = _lazy.__qualname__ = _real.__name__
