"""Applying fixes with libcst, keeping the file's formatting, and writing files atomically.

libcst is imported here only, so linting without ``--fix``/``--diff`` never pays for it.
"""

from __future__ import annotations

import ast
import difflib
import os
import stat
import tempfile
from collections.abc import Iterable

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from ckptlint.core import AddKeyword
from ckptlint.source import decode, split_lines


class FixFailed(Exception):
    """A fix could not be applied safely; the file is left untouched."""


def apply_edits(data: bytes, edits: Iterable[AddKeyword]) -> bytes:
    """The file's new bytes (same encoding) with every edit applied."""
    try:
        module = cst.parse_module(data)
    except cst.ParserSyntaxError as error:
        raise FixFailed(f"libcst cannot parse the file: {error.message}") from None
    pending = {(edit.line, edit.column - 1): edit for edit in edits}
    transformer = _AddKeywords(pending)
    fixed = MetadataWrapper(module).visit(transformer)
    if pending:
        missed = ", ".join(f"{line}:{column + 1}" for line, column in sorted(pending))
        raise FixFailed(f"no call found at {missed}")
    new_data = fixed.bytes
    try:
        ast.parse(new_data)
    except (SyntaxError, ValueError) as error:
        raise FixFailed(f"the fixed file would not parse ({error}); not written") from None
    return new_data


class _AddKeywords(cst.CSTTransformer):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, pending: dict[tuple[int, int], AddKeyword]) -> None:
        super().__init__()
        self.pending = pending

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        for node in (original_node, original_node.func):
            start = self.get_metadata(PositionProvider, node).start
            edit = self.pending.pop((start.line, start.column), None)
            if edit is not None:
                return add_keyword(updated_node, edit.keyword, edit.value)
        return updated_node


def add_keyword(call: cst.Call, keyword: str, value: str) -> cst.Call:
    """``call`` with ``keyword=value`` appended, in the layout the call already uses.

    A call whose closing parenthesis sits on its own line gets the keyword on a line of its
    own, with the indentation of the other arguments; comments stay where they were.
    """
    no_space = cst.SimpleWhitespace("")
    new_argument = cst.Arg(
        keyword=cst.Name(keyword),
        value=cst.parse_expression(value),
        equal=cst.AssignEqual(whitespace_before=no_space, whitespace_after=no_space),
    )
    arguments = list(call.args)
    if not arguments:
        return call.with_changes(args=[new_argument])
    last = arguments[-1]
    has_trailing_comma = isinstance(last.comma, cst.Comma)
    after_last = last.comma.whitespace_after if has_trailing_comma else last.whitespace_after_arg
    comma_before = last.comma.whitespace_before if has_trailing_comma else no_space
    argument_line = _argument_line_whitespace(call, arguments)

    if isinstance(after_last, cst.ParenthesizedWhitespace) and argument_line is not None:
        separator: cst.BaseParenthesizableWhitespace = after_last.with_changes(
            indent=argument_line.indent, last_line=argument_line.last_line
        )
        closing: cst.BaseParenthesizableWhitespace = cst.ParenthesizedWhitespace(
            indent=after_last.indent, last_line=after_last.last_line
        )
    else:
        separator, closing = cst.SimpleWhitespace(" "), after_last

    arguments[-1] = last.with_changes(
        comma=cst.Comma(whitespace_before=comma_before, whitespace_after=separator),
        whitespace_after_arg=last.whitespace_after_arg if has_trailing_comma else no_space,
    )
    if has_trailing_comma:
        new_argument = new_argument.with_changes(comma=cst.Comma(whitespace_after=closing))
    else:
        new_argument = new_argument.with_changes(whitespace_after_arg=closing)
    return call.with_changes(args=[*arguments, new_argument])


def _argument_line_whitespace(
    call: cst.Call, arguments: list[cst.Arg]
) -> cst.ParenthesizedWhitespace | None:
    """The line break and indentation that put an argument on its own line, if any does."""
    for argument in reversed(arguments[:-1]):
        if isinstance(argument.comma, cst.Comma) and isinstance(
            argument.comma.whitespace_after, cst.ParenthesizedWhitespace
        ):
            return argument.comma.whitespace_after
    if isinstance(call.whitespace_before_args, cst.ParenthesizedWhitespace):
        return call.whitespace_before_args
    return None


def unified_diff(path: str, before: bytes, after: bytes) -> str:
    """The change as a unified diff, both sides decoded in the file's own encoding."""
    old, new = split_lines(decode(before)), split_lines(decode(after))
    return "".join(difflib.unified_diff(old, new, fromfile=path, tofile=path))


def write_atomically(path: str, data: bytes) -> None:
    """Temp file in the same folder, flush, fsync, then ``os.replace``: all or nothing."""
    target = os.path.realpath(path)
    folder, name = os.path.split(target)
    mode = stat.S_IMODE(os.stat(target).st_mode)
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".ckptlint")
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
