"""Reading, decoding, prefiltering and parsing one file.

The prefilter (``Prefilter``) decides from the raw bytes whether a file can reach a
checkpoint function at all; a file that cannot is never decoded or parsed.
"""

from __future__ import annotations

import ast
import io
import os
import re
import stat
import tokenize
from bisect import bisect_right
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from itertools import accumulate, islice

from ckptlint.core import Finding
from ckptlint.lazy_tree import Chunk, parse_lazily, split_statements, statement_too_deep
from ckptlint.memos import process_cache


class UnreadableSource(Exception):
    """The file cannot be analysed; ``line``/``column`` locate the problem (1-based)."""

    def __init__(self, reason: str, line: int = 1, column: int = 1) -> None:
        super().__init__(reason)
        self.reason = reason
        self.line = line
        self.column = column


class CannotRead(UnreadableSource):
    """``read_bytes`` did not read the file: the operating system refused, or it is not a
    regular file (CKP902), or it is over the size cap (``FileTooLarge``, CKP901). Every
    reader catches this one exception."""


class FileTooLarge(CannotRead):
    """The file holds more than ``max-file-size`` bytes; it was not read whole."""

    def __init__(self, max_size: int) -> None:
        super().__init__(f"file too large: over max-file-size ({max_size} bytes)")


# Far above any real source file (transformers' largest module is under 0.5 MiB). Also the
# ceiling: a repository's configuration may lower it, only the command line may raise it.
DEFAULT_MAX_FILE_SIZE = 10 * 1024 * 1024

# What the analysis of one file may hold is bounded by its tokens, not its bytes: Python's
# parser alone holds 500 to 800 bytes a token (measured: a one-line list of 2,000,000 tokens,
# 2 MB, took 946 MiB to parse; 10 MiB of it, 5 GiB). The largest module of fifteen public
# model trees has 53,000 tokens. The bound is one token per 20 bytes of the size cap, at
# least that of the default 10 MiB (524,288): only the command line, which alone can raise
# the cap, raises it too.
BYTES_PER_TOKEN = 20


def token_limit(max_file_size: int) -> int:
    """The most tokens a file may hold to be analysed, under a size cap."""
    return max(max_file_size, DEFAULT_MAX_FILE_SIZE) // BYTES_PER_TOKEN


_TOKEN = re.compile(r"\w+|[^\w\s]")


_WHITESPACE = b" \t\f\r\n\\"
# Every byte but ASCII letters, digits and the underscore, as a space.
_NAME_BYTES = b"".join(
    bytes([c]) if chr(c).isascii() and (chr(c).isalnum() or c == ord("_")) else b" "
    for c in range(256)
)
_IDENTIFIER_BYTE = re.compile(rb"[A-Za-z0-9_\x80-\xff]")
# What may stand between ``import`` and a name it imports: other names (``as`` aliases),
# commas, an opening parenthesis, line continuations, comments in a parenthesized list.
_IMPORT_LIST_PREFIX = re.compile(
    rb"\s*(?:\(\s*)?(?:(?:[\w.]+(?:\s+as\s+\w+)?\s*,\s*)|\\\n\s*|#[^\n]*\n\s*)*"
)


class Prefilter:
    """Says from raw bytes whether a file can hold a reference the analysis would follow.

    A module reaches a region source only through a name that spells one of the words of
    interest (``checkpoint``, a table row's last name, a project wrapper's name): as an
    attribute (``torch.utils.checkpoint``, ``self._ckpt_fn``), in an import list, as a
    string (``getattr(module, "name")``), or bare in a file that star-imports. Anything
    unsure (a comment between the dot and the name) passes too.
    """

    def __init__(self, extra_names: Iterable[str] = ()) -> None:
        words = {"checkpoint"} | {name.rsplit(".", 1)[-1] for name in extra_names}
        self.words = sorted(word.encode() for word in words)
        self._word_set = frozenset(words)
        # Few words: a substring search each for the words no other word contains (where none
        # occurs, no word does: ``checkpoint`` covers ``apply_activation_checkpointing``).
        # Many words (a project's hundreds of layer class names): one pass over the
        # identifiers instead, as 500 searches of every file took a fifth of a cold run.
        self._needles = (
            [w for w in self.words if not any(o != w and o in w for o in self.words)]
            if len(self.words) <= _FEW_WORDS
            else None
        )

    @property
    def needs_names(self) -> bool:
        """Whether ``passes`` looks at the file's ``names_in_bytes`` (many words)."""
        return self._needles is None

    def passes(self, data: bytes, names: frozenset[bytes] | None = None) -> bool:
        """``names``: the file's ``names_in_bytes``, when already known."""
        if wide_encoding(data) is not None:
            return True  # its words are not these bytes: decoding it reports CKP901
        words = self.words
        if self._needles is None:
            named = may_name(self._word_set, names if names is not None else names_in_bytes(data))
            words = [word.encode() for word in named]
            if not words:
                return False
        elif not any(needle in data for needle in self._needles):
            return False  # most files of a tree: the cost a flake8 run pays for the plugin
        star_import = b"import *" in data  # names from a star import are used bare
        for word in words:
            start = data.find(word)
            while start != -1:
                end = start + len(word)
                if identifier_at(data, start, end) and (
                    star_import
                    or _after_dot(data, start)
                    or _in_import_list(data, start)
                    or _quoted(data, start, end)
                ):
                    return True
                start = data.find(word, end)
        return False


def names_in_bytes(data: bytes) -> frozenset[bytes]:
    """The runs of ASCII letters, digits and underscores of raw bytes, strings and comments
    included: one scan of a file that every search for a set of words reuses. An ASCII word
    the text names as a whole identifier is one of them (whatever the encoding: a character
    that is not ASCII only ever ends a run), so they tell which words need looking for; a
    word that is not ASCII must always be looked for (``may_name``)."""
    return frozenset(data.translate(_NAME_BYTES).split())


def may_name(words: frozenset[str], names: frozenset[bytes]) -> list[str]:
    """Those of ``words`` a file with these ``names_in_bytes`` may name, sorted."""
    ascii_words, others = _encoded(words)
    return sorted([*map(ascii_words.__getitem__, ascii_words.keys() & names), *others])


@lru_cache(maxsize=64)
def _encoded(words: frozenset[str]) -> tuple[dict[bytes, str], tuple[str, ...]]:
    """The ASCII words by their bytes, and the others (a run's few sets of words, each
    asked about every file)."""
    ascii_words = {word.encode(): word for word in words if word.isascii()}
    return ascii_words, tuple(word for word in words if not word.isascii())


def identifier_at(data: bytes, start: int, end: int) -> bool:
    """Whether ``data[start:end]`` is a whole identifier, not part of a longer one."""
    before = data[start - 1 : start] if start else b""
    after = data[end : end + 1]
    return not (_IDENTIFIER_BYTE.match(before) or _IDENTIFIER_BYTE.match(after))


def _quoted(data: bytes, start: int, end: int) -> bool:
    """``getattr(module, "name")``, ``setattr(self, "name", ...)``: a name as a string."""
    return data[start - 1 : start] in (b"'", b'"') and data[end : end + 1] in (b"'", b'"')


def _after_dot(data: bytes, start: int) -> bool:
    """A dot before the name, maybe across line breaks; a comment there passes too."""
    before = data[max(0, start - 512) : start]
    stripped = before.rstrip(_WHITESPACE)
    if stripped.endswith(b"."):
        return True
    starts_line = b"\n" in before[len(stripped) :]
    return starts_line and b"#" in stripped.rsplit(b"\n", 1)[-1]


def _in_import_list(data: bytes, start: int) -> bool:
    keyword = data.rfind(b"import", 0, start)
    return keyword != -1 and _IMPORT_LIST_PREFIX.fullmatch(data, keyword + 6, start) is not None


@dataclass(frozen=True)
class ParsedSource:
    text: str
    lines: list[str]
    tree: ast.Module
    chunks: list[Chunk] | None  # the lines' ``split_statements``, when parsed lazily


# Opening never waits (a FIFO with no writer) nor takes a terminal as controlling one.
_OPEN_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_NOCTTY", 0)
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_BINARY", 0)
)


def read_bytes(path: str, max_size: int = DEFAULT_MAX_FILE_SIZE) -> bytes:
    """The bytes of the regular file at ``path`` (symbolic links followed), at most
    ``max_size`` of them: a FIFO, socket or device (``/dev/zero``) is never opened, nor
    read if it takes a file's place meanwhile; nothing past the cap is ever read."""
    try:
        _refuse_special(os.stat(path))  # not opened: opening a device can act on it
        descriptor = os.open(path, _OPEN_FLAGS)
    except OSError as error:
        raise CannotRead(f"cannot read file: {error.strerror or error}") from None
    with open(descriptor, "rb") as handle:
        try:
            size = _refuse_special(os.fstat(descriptor)).st_size
            if size > max_size:
                raise FileTooLarge(max_size)
            data = handle.read(size + 1)  # not max_size + 1: read(n) allocates n bytes
            if len(data) > size:  # it is growing, or its size says nothing (/proc)
                data += handle.read(max_size + 1 - len(data))
        except OSError as error:
            raise CannotRead(f"cannot read file: {error.strerror or error}") from None
    if len(data) > max_size:
        raise FileTooLarge(max_size)
    return data


def read_head(path: str, max_size: int = DEFAULT_MAX_FILE_SIZE) -> tuple[bytes, bool]:
    """The first ``max_size`` bytes of the regular file at ``path`` (as ``read_bytes``
    opens it), and whether the file holds more: for files whose beginning is of use
    without the rest (an ignore file's first patterns)."""
    try:
        _refuse_special(os.stat(path))
        descriptor = os.open(path, _OPEN_FLAGS)
    except OSError as error:
        raise CannotRead(f"cannot read file: {error.strerror or error}") from None
    with open(descriptor, "rb") as handle:
        try:
            size = _refuse_special(os.fstat(descriptor)).st_size
            data = handle.read(min(size, max_size) + 1)  # read(n) allocates n bytes
            if len(data) <= max_size and len(data) > size:  # growing, or /proc
                data += handle.read(max_size + 1 - len(data))
        except OSError as error:
            raise CannotRead(f"cannot read file: {error.strerror or error}") from None
    return data[:max_size], len(data) > max_size


def _refuse_special(status: os.stat_result) -> os.stat_result:
    kind = special_kind(status.st_mode)
    if kind is not None:
        raise CannotRead(f"not a regular file: {kind}")
    return status


_SPECIAL_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def special_kind(mode: int) -> str | None:
    """What a file that is not a regular file is ("a FIFO"), or None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _SPECIAL_KINDS if test(mode)), "an unknown kind of file")


# Byte order marks of the encodings Python never reads source in (UTF-32 first: its
# little-endian mark starts with UTF-16's).
_WIDE_MARKS = (
    (b"\xff\xfe\x00\x00", "UTF-32-LE"),
    (b"\x00\x00\xfe\xff", "UTF-32-BE"),
    (b"\xff\xfe", "UTF-16-LE"),
    (b"\xfe\xff", "UTF-16-BE"),
)
# Without a mark, what ASCII text (the first characters of any Python file) looks like in
# each: where its NUL bytes fall among the first four.
_WIDE_SHAPES = {
    (False, True, False, True): "UTF-16-LE",
    (True, False, True, False): "UTF-16-BE",
    (False, True, True, True): "UTF-32-LE",
    (True, True, True, False): "UTF-32-BE",
}


def wide_encoding(data: bytes) -> str | None:
    """``UTF-16-LE`` and the like when ``data`` is text in UTF-16 or UTF-32 (a byte order
    mark, or the NUL bytes of ASCII in them), which Python cannot read as source; else
    None."""
    for mark, name in _WIDE_MARKS:
        if data.startswith(mark):
            return name
    if len(data) < 4 or b"\0" not in data[:4]:
        return None
    return _WIDE_SHAPES.get(tuple(byte == 0 for byte in data[:4]))  # type: ignore[arg-type]


def decode(data: bytes) -> str:
    """Decode as Python does: BOM, then a coding declaration, else UTF-8. Text in UTF-16
    or UTF-32 is refused by name, as Python refuses it (with a less helpful message)."""
    wide = wide_encoding(data)
    if wide is not None:
        raise UnreadableSource(
            f"cannot decode file: it is encoded in {wide}; Python reads source files as UTF-8 "
            "(or the encoding a coding declaration names)"
        )
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


_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")
# Characters str.splitlines breaks at but Python's tokenizer does not.
_OTHER_LINE_BREAKS = re.compile("[\v\f\x1c\x1d\x1e\x85\u2028\u2029]")


def split_lines(text: str) -> list[str]:
    """Lines as Python numbers them (str.splitlines also breaks at form feeds and more)."""
    if _OTHER_LINE_BREAKS.search(text):
        return _LINE.findall(text)
    return text.splitlines(keepends=True)


def word_starts(text: str, word: str) -> Iterator[int]:
    """Offsets where ``word`` appears as a whole identifier (str.find: far faster than re)."""
    start = text.find(word)
    while start != -1:
        end = start + len(word)
        before = text[start - 1] if start else " "
        after = text[end] if end < len(text) else " "
        if not (_in_identifier(before) or _in_identifier(after)):
            yield start
        start = text.find(word, end)


def names_word(text: str, word: str) -> bool:
    """Whether ``word`` appears in ``text`` as a whole identifier."""
    return next(word_starts(text, word), None) is not None


def _in_identifier(character: str) -> bool:
    return character.isidentifier() or character.isdigit()


def lines_with_words(
    lines: list[str],
    words: Iterable[str],
    *,
    skip_assigned: bool = False,
    text: str | None = None,
) -> frozenset[int]:
    """1-based numbers of the lines where any of ``words`` appears as a whole identifier.

    With ``skip_assigned``, an occurrence followed by ``=`` (a keyword argument such as
    ``checkpoint=_CHECKPOINT_FOR_DOC``, or a plain assignment target) does not count.
    ``text`` (the lines joined) saves joining them again.
    """
    if text is None:
        text = "".join(lines)
    words = list(words)
    if len(words) > _WORDS_PER_SCAN:  # one pass over the identifiers beats a search per word
        wanted = set(words)
        starts = [found.start() for found in _IDENTIFIER.finditer(text) if found[0] in wanted]
    else:
        starts = sorted(start for word in words for start in word_starts(text, word))
    if skip_assigned:
        starts = [start for start in starts if not _assigned_at(text, start)]
    if not starts:
        return frozenset()
    if "\r" in text:  # old Mac line ends: count by line lengths
        line_ends = list(accumulate(len(line) for line in lines))
        return frozenset(bisect_right(line_ends, start) + 1 for start in starts)
    numbers, line, previous = set(), 1, 0
    for start in starts:
        line += text.count("\n", previous, start)
        numbers.add(line)
        previous = start
    return frozenset(numbers)


# The built-in table's words (nine with CheckpointWrapper) are few: a search each costs
# nothing kept, where the identifiers of every file (the way for hundreds of words) took
# 90 MB more on transformers 5.24.
_FEW_WORDS = 16
# One pass of ``_IDENTIFIER`` over a text costs 30 to 70 searches of it for a word (a model
# file, 80 KB: 2.1 ms against 0.03 to 0.07 ms a word).
_WORDS_PER_SCAN = 48
_IDENTIFIER = re.compile(r"[^\W\d]\w*")


@process_cache
@lru_cache(maxsize=4096)
def identifiers(text: str) -> frozenset[str]:
    """Every identifier-like word of ``text`` (strings and comments included)."""
    return frozenset(_IDENTIFIER.findall(text))


def _assigned_at(text: str, start: int) -> bool:
    """``word =`` (not ``==``) for the identifier starting at ``start``."""
    return _IDENTIFIER_THEN_EQUALS.match(text, start) is not None


_IDENTIFIER_THEN_EQUALS = re.compile(r"\w+[ \t]*=(?!=)")


def _more_tokens_than(text: str, limit: int) -> bool:
    """Whether ``text`` holds more than ``limit`` tokens (names, numbers and operators,
    counted up to the limit; a token is at least one character, so short text is never
    counted)."""
    if len(text) <= limit:
        return False
    return sum(1 for _ in islice(_TOKEN.finditer(text), limit + 1)) > limit


def parser_gave_up(
    error: RecursionError | MemoryError, lines: list[str], filename: str
) -> UnreadableSource:
    """Why a text nested too deeply could not be parsed, at the statement that did it:
    the same finding whether the file was parsed whole or its bodies one by one."""
    reason = str(error) or type(error).__name__
    message = f"too deeply nested to analyse: the parser gave up ({reason})"
    return UnreadableSource(message, statement_too_deep(lines, filename))


def parse(
    text: str,
    filename: str,
    words: Iterable[str] | None = None,
    max_tokens: int = token_limit(DEFAULT_MAX_FILE_SIZE),
) -> ParsedSource:
    """Parse ``text``; with ``words``, definitions not touching them are parsed lazily. A
    text of more than ``max_tokens`` tokens is not parsed (``UnreadableSource``)."""
    if "\0" in text:
        line = text.count("\n", 0, text.index("\0")) + 1
        raise UnreadableSource("cannot parse file: it contains a NUL byte", line)
    if _more_tokens_than(text, max_tokens):
        raise UnreadableSource(
            f"file too large to analyse: over {max_tokens} tokens (the parser alone would "
            "hold hundreds of bytes for each)"
        )
    lines = split_lines(text)
    # Not the path itself: given a path that exists, Python reads the file from disk to
    # place a syntax error, and bytes it does not see here (a BOM) shift the column.
    name = f"<{filename}>"
    chunks = None
    try:
        if words is None:
            tree = ast.parse(text, filename=name)
        else:
            interesting = lines_with_words(lines, words, skip_assigned=True)
            chunks = split_statements(lines)
            tree = parse_lazily(text, lines, name, interesting, chunks)
    except SyntaxError as error:
        raise UnreadableSource(
            f"syntax error: {error.msg}", error.lineno or 1, error.offset or 1
        ) from None
    except (RecursionError, MemoryError) as error:
        raise parser_gave_up(error, lines, name) from None
    except ValueError as error:
        raise UnreadableSource(f"cannot parse file: {error}") from None
    return ParsedSource(text, lines, tree, chunks)


def unreadable_finding(code: str, error: UnreadableSource | None) -> Finding:
    """``code`` (CKP901, CKP902) where the file could not be read, decoded or parsed."""
    error = error or UnreadableSource("cannot read file")
    return Finding(
        line=error.line,
        column=error.column,
        code=code,
        message=error.reason,
        end_line=error.line,
        end_column=error.column,
    )
