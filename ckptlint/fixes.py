"""Fixes: computed on the exact text being fixed, applied call by call, checked, written safely.

For each file: read its bytes once, lint that text, apply the applicable fixes to it, check
the result with ``compile()`` (which, unlike ``ast.parse``, rejects a repeated keyword), and
write it in place, only if the file on disk still holds the bytes that were read, lies
inside the paths being linted and has a write permission bit (``write_if_unchanged``).

Each fix is applied on its own: libcst parses only the call being fixed (not the whole
module: a 50,000-line file would take tens of seconds), the new call must parse and name
no keyword twice, and a fix that fails any of this is reported as not applied while the
others go ahead. libcst is imported here only, so linting without ``--fix``/``--diff`` never
pays for it.
"""

from __future__ import annotations

import ast
import difflib
import io
import os
import stat
import tokenize
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate

import libcst as cst

from ckptlint.core import AddKeyword, BindNames, Finding, ReplaceText
from ckptlint.report import display_path
from ckptlint.source import UnreadableSource, decode, special_kind, split_lines


class FixFailed(Exception):
    """A fix (or a file's fixes) could not be applied safely; the reason is the message."""


# Why a fix was not applied: (line, column, message); line 0 means the whole file.
Note = tuple[int, int, str]


@dataclass(frozen=True)
class FixedText:
    text: str
    applied: tuple[Finding, ...]
    failed: tuple[tuple[Finding, str], ...]


@dataclass
class _Edit:
    findings: list[Finding]
    start: int  # offsets into the text; updated as nested edits change the text
    end: int
    edit: AddKeyword | ReplaceText | BindNames


def fix_text(text: str, findings: Sequence[Finding]) -> FixedText:
    """``text`` with the fix of each finding applied (each finding must carry one)."""
    lines = split_lines(text)
    starts = [0, *accumulate(len(line) for line in lines)]
    failed: list[tuple[Finding, str]] = []
    edits: dict[tuple[int, int, object], _Edit] = {}
    for finding in findings:
        assert finding.fix is not None
        try:
            start, end = _span(finding, starts, lines)
        except FixFailed as error:
            failed.append((finding, str(error)))
            continue
        edit = finding.fix.edit
        key = (start, end, edit if isinstance(edit, (ReplaceText, BindNames)) else 0)
        if key in edits:  # one change fixes several findings (a partial used twice)
            edits[key].findings.append(finding)
        else:
            edits[key] = _Edit([finding], start, end, finding.fix.edit)

    pieces: list[str] = []
    applied: list[Finding] = []
    done = 0
    for group in _nested_groups(sorted(edits.values(), key=lambda e: (e.start, -e.end)), failed):
        outer_start, outer_end = group[0].start, group[0].end
        snippet = _apply_group(text[outer_start:outer_end], group, outer_start, applied, failed)
        pieces.append(text[done:outer_start])
        pieces.append(snippet)
        done = outer_end
    pieces.append(text[done:])
    return FixedText("".join(pieces), tuple(sorted(applied)), tuple(failed))


def _apply_group(
    snippet: str,
    group: list[_Edit],
    offset: int,
    applied: list[Finding],
    failed: list[tuple[Finding, str]],
) -> str:
    """Apply nested edits to the text of the outermost one, innermost first.

    An edit sees the calls already fixed inside it as short placeholders, so libcst never
    re-parses them (nested checkpoint calls would otherwise cost quadratic time).
    """
    for edit in group:
        edit.start -= offset
        edit.end -= offset
    finished: list[_Edit] = []  # applied edits not yet inside a larger applied one
    # Innermost first: from the last start, and of equal starts the shorter span.
    for index in sorted(range(len(group)), key=lambda i: (-group[i].start, -i)):
        edit = group[index]
        inner = [d for d in finished if edit.start <= d.start and d.end <= edit.end]
        holes = [(d.start - edit.start, d.end - edit.start) for d in inner]
        try:
            new = _apply(edit.edit, snippet[edit.start : edit.end], holes)
        except FixFailed as error:
            failed.extend((finding, str(error)) for finding in edit.findings)
            continue
        except (RecursionError, MemoryError):
            failed.extend((finding, "too deeply nested to fix") for finding in edit.findings)
            continue
        except Exception as error:  # libcst's own failure on odd input: this fix only
            failed.extend(
                (finding, f"{type(error).__name__}: {error}") for finding in edit.findings
            )
            continue
        snippet = snippet[: edit.start] + new + snippet[edit.end :]
        delta = len(new) - (edit.end - edit.start)
        for other in [*group[:index], *finished]:
            if other.start >= edit.end:  # after this edit
                other.start += delta
                other.end += delta
            elif other.start <= edit.start and other.end >= edit.end:  # around it
                other.end += delta
        finished = [d for d in finished if d not in inner]
        edit.end += delta
        finished.append(edit)
        applied.extend(edit.findings)
    return snippet


def _span(finding: Finding, starts: list[int], lines: list[str]) -> tuple[int, int]:
    edit = finding.fix.edit  # type: ignore[union-attr]
    if isinstance(edit, AddKeyword):
        if (edit.line, edit.column) != (finding.line, finding.column):
            raise FixFailed("the fix does not start where the finding does")
        where = (finding.line, finding.column, finding.end_line, finding.end_column)
    else:
        where = (edit.line, edit.column, edit.end_line, edit.end_column)
    line, column, end_line, end_column = where
    if not (0 < line <= end_line <= len(lines)):
        raise FixFailed(f"lines {line}-{end_line} are not in the file")
    start, end = starts[line - 1] + column - 1, starts[end_line - 1] + end_column - 1
    if not (starts[line - 1] <= start <= end <= starts[end_line]):
        raise FixFailed(f"columns {column}-{end_column} are not in the file")
    return start, end


def _nested_groups(edits: list[_Edit], failed: list[tuple[Finding, str]]) -> list[list[_Edit]]:
    """Edits grouped under the outermost span containing them; partial overlaps refused."""
    groups: list[list[_Edit]] = []
    for edit in edits:
        if groups and edit.start < groups[-1][0].end:
            if edit.end <= groups[-1][0].end:
                groups[-1].append(edit)
            else:
                failed.extend((f, "overlaps another fix") for f in edit.findings)
            continue
        groups.append([edit])
    return groups


def _apply(
    edit: AddKeyword | ReplaceText | BindNames, code: str, holes: list[tuple[int, int]]
) -> str:
    """The new text of ``code``; ``holes`` are spans already fixed, kept as they are."""
    if isinstance(edit, ReplaceText):
        return edit.text
    kept: list[tuple[str, str]] = []
    for start, end in sorted(holes, reverse=True):
        placeholder = f"_ckptlint_fixed_{len(kept)}_"
        if placeholder in code:
            raise FixFailed("the call spells a name ckptlint uses internally")
        kept.append((placeholder, code[start:end]))
        code = code[:start] + placeholder + code[end:]
    if isinstance(edit, BindNames):
        new = bind_names_in_function(code, edit.names)
    else:
        new = add_keyword_to_call(code, edit.keyword, edit.value)
    for placeholder, original in kept:
        if new.count(placeholder) != 1:
            raise FixFailed("libcst changed a call fixed inside this one")
        new = new.replace(placeholder, original)
    return new


def add_keyword_to_call(code: str, keyword: str, value: str) -> str:
    """The source of the call ``code`` with ``keyword=value`` added, its layout kept."""
    try:
        module = cst.parse_module(code)
    except cst.ParserSyntaxError as error:
        raise FixFailed(f"libcst cannot parse the call: {error.message}") from None
    statement = module.body[0] if len(module.body) == 1 else None
    expression = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
    call = expression.value if isinstance(expression, cst.Expr) else None
    if not isinstance(call, cst.Call) or module.code_for_node(call) != code:
        raise FixFailed("no call found where the finding is")
    new = module.code_for_node(add_keyword(call, keyword, value))
    try:
        (fixed,) = ast.parse(new).body
    except SyntaxError as error:
        raise FixFailed(f"the fixed call would not be valid Python ({error.msg})") from None
    names = [item.arg for item in fixed.value.keywords if item.arg]  # type: ignore[attr-defined]
    if len(names) != len(set(names)):
        raise FixFailed(f"the fixed call would repeat the keyword `{keyword}`")
    return new


def bind_names_in_function(code: str, names: Sequence[str]) -> str:
    """The source of the ``def`` or ``lambda`` ``code`` with a parameter ``name=name`` for
    each of ``names``: the value each name has where the function is made becomes its
    default, what the function then reads instead of the variable of its closure. After a
    ``*args`` or keyword-only parameters the new ones are keyword-only; otherwise they come
    after the positional ones (before a ``**kwargs``)."""
    try:
        if code.startswith("lambda"):
            function: cst.CSTNode = cst.parse_expression(code)
            module = cst.parse_module("")
        else:
            module = cst.parse_module(code if code.endswith("\n") else code + "\n")
            function = module.body[0] if len(module.body) == 1 else None  # type: ignore[assignment]
    except cst.ParserSyntaxError as error:
        raise FixFailed(f"libcst cannot parse the function: {error.message}") from None
    if not isinstance(function, (cst.Lambda, cst.FunctionDef)):
        raise FixFailed("no def or lambda found where the region is made")
    if module.code_for_node(function).rstrip("\n") != code.rstrip("\n"):
        raise FixFailed("the function's text does not read back as it was")
    parameters = function.params
    taken = {
        p.name.value
        for p in (
            *parameters.posonly_params,
            *parameters.params,
            *parameters.kwonly_params,
            *[s for s in (parameters.star_arg, parameters.star_kwarg) if isinstance(s, cst.Param)],
        )
    }
    if taken.intersection(names):
        raise FixFailed(
            f"the function already has a parameter named {sorted(taken & set(names))[0]}"
        )
    no_space = cst.SimpleWhitespace("")
    added = [
        cst.Param(
            name=cst.Name(name),
            default=cst.Name(name),
            equal=cst.AssignEqual(whitespace_before=no_space, whitespace_after=no_space),
        )
        for name in names
    ]
    opening = getattr(function, "whitespace_before_params", None)
    if isinstance(parameters.star_arg, (cst.Param, cst.ParamStar)) or parameters.kwonly_params:
        if not parameters.kwonly_params and isinstance(parameters.star_arg, cst.Param):
            parameters = parameters.with_changes(star_arg=_ensure_comma(parameters.star_arg))
        kwonly = _appended(list(parameters.kwonly_params), added, opening)
        parameters = parameters.with_changes(kwonly_params=kwonly)
    else:
        if not parameters.params and isinstance(parameters.posonly_ind, cst.ParamSlash):
            slash = parameters.posonly_ind
            if not isinstance(slash.comma, cst.Comma):
                slash = slash.with_changes(
                    comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
                )
            parameters = parameters.with_changes(posonly_ind=slash)
        parameters = parameters.with_changes(
            params=_appended(list(parameters.params), added, opening)
        )
    if parameters.star_kwarg is not None:
        field = "kwonly_params" if parameters.kwonly_params else "params"
        listed = list(getattr(parameters, field))
        listed[-1] = _ensure_comma(listed[-1])
        parameters = parameters.with_changes(**{field: listed})
    changed = function.with_changes(params=parameters)
    if (
        isinstance(changed, cst.Lambda)
        and isinstance(changed.whitespace_after_lambda, cst.SimpleWhitespace)
        and not changed.whitespace_after_lambda.value
    ):
        changed = changed.with_changes(whitespace_after_lambda=cst.SimpleWhitespace(" "))
    new = module.code_for_node(changed)
    if not code.endswith("\n"):
        new = new.rstrip("\n")
    try:
        ast.parse(new if not new.startswith("lambda") else f"({new})")
    except SyntaxError as error:
        raise FixFailed(f"the fixed function would not be valid Python ({error.msg})") from None
    return new


def _ensure_comma(parameter: cst.Param) -> cst.Param:
    if isinstance(parameter.comma, cst.Comma):
        return parameter
    return parameter.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))


def _appended(
    existing: list[cst.Param], added: list[cst.Param], opening: object
) -> list[cst.Param]:
    """``existing`` followed by ``added`` in the layout the list has: one parameter a line
    when the last one ends with a comma and a line break (the closing parenthesis on a line
    of its own), else on the same line."""
    if not existing:
        return added
    last = existing[-1]
    comma = last.comma
    if isinstance(comma, cst.Comma) and isinstance(
        comma.whitespace_after, cst.ParenthesizedWhitespace
    ):
        between = opening
        if len(existing) > 1 and isinstance(existing[-2].comma, cst.Comma):
            between = existing[-2].comma.whitespace_after
        if isinstance(between, cst.ParenthesizedWhitespace):
            separator = cst.Comma(whitespace_after=between)
            existing[-1] = last.with_changes(comma=separator)
            added = [a.with_changes(comma=separator) for a in added[:-1]] + [
                added[-1].with_changes(comma=comma)
            ]
            return [*existing, *added]
    closing = last.whitespace_after_param
    if not isinstance(comma, cst.Comma) and isinstance(closing, cst.ParenthesizedWhitespace):
        existing[-1] = _ensure_comma(last).with_changes(
            whitespace_after_param=cst.SimpleWhitespace("")
        )
        added[-1] = added[-1].with_changes(whitespace_after_param=closing)
        return [*existing, *added]
    existing[-1] = _ensure_comma(last)
    return [*existing, *added]


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
    comma = last.comma
    has_trailing_comma = isinstance(comma, cst.Comma)
    if isinstance(comma, cst.Comma):
        after_last, comma_before = comma.whitespace_after, comma.whitespace_before
    else:
        after_last, comma_before = last.whitespace_after_arg, no_space
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


def encode_like(text: str, original: bytes) -> bytes:
    """``text`` in the encoding (and BOM) ``original`` was read with."""
    encoding, _ = tokenize.detect_encoding(io.BytesIO(original).readline)
    try:
        return text.encode(encoding)
    except (UnicodeEncodeError, LookupError) as error:
        raise FixFailed(f"the fixed text cannot be written as {encoding}: {error}") from None


def compile_error(data: bytes, path: str) -> str | None:
    """Why ``compile()`` rejects the file, or None. Warnings it would print are silenced."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(data, path, "exec", dont_inherit=True)
    except SyntaxError as error:
        return f"{error.msg} at line {error.lineno}"
    except (ValueError, RecursionError, MemoryError) as error:
        return f"{type(error).__name__}: {error}"
    return None


@dataclass
class FileFix:
    """The fixes of one file: its findings before and after, and what was not applied."""

    before: bytes
    findings_before: list[Finding]
    after: bytes | None = None  # None when nothing changed
    findings_after: list[Finding] = field(default_factory=list)
    applied: int = 0
    notes: tuple[Note, ...] = ()  # why fixes were not applied


# The findings of exactly these bytes (with their fixes when asked): the engine's answer for
# the file as if it held them.
Analyse = Callable[[bytes, bool], list[Finding]]


def fix_source(analyse: Analyse, data: bytes, path: str, *, unsafe: bool) -> FileFix:
    """Lint exactly ``data`` and apply the fixes found on it (the unsafe ones too if asked)."""
    findings = analyse(data, True)
    stored = [f.without_fix() for f in findings]
    fixable = [f for f in findings if f.fix_applies(unsafe) and f.fix is not None]
    try:
        text = decode(data)
    except UnreadableSource:
        return FileFix(data, stored)
    if not fixable:
        return FileFix(data, stored)
    fixed = fix_text(text, fixable)
    notes = [(f.line, f.column, f"{f.code} not fixed: {why}") for f, why in fixed.failed]
    if not fixed.applied:
        return FileFix(data, stored, notes=tuple(notes))
    try:
        after = encode_like(fixed.text, data)
    except FixFailed as failure:
        notes.append((0, 0, f"fixes not applied: {failure}"))
        return FileFix(data, stored, notes=tuple(notes))
    error = compile_error(after, path)
    if error is not None:
        before_error = compile_error(data, path)
        why = (
            f"the file does not compile as it is ({before_error})"
            if before_error
            else f"the fixed file would not compile ({error})"
        )
        notes.append((0, 0, f"fixes not applied: {why}"))
        return FileFix(data, stored, notes=tuple(notes))
    remaining = analyse(after, False)
    return FileFix(data, stored, after, remaining, len(fixed.applied), tuple(notes))


def unified_diff(path: str, before: bytes, after: bytes) -> str:
    """The change as a unified diff, both sides decoded in the file's own encoding."""
    old, new = split_lines(decode(before)), split_lines(decode(after))
    name = display_path(path)
    return "".join(difflib.unified_diff(old, new, fromfile=name, tofile=name))


def write_if_unchanged(path: str, before: bytes, after: bytes, *, roots: Sequence[str]) -> None:
    """Write ``after`` over the file at ``path`` if it may be written and still holds
    ``before``; else raise ``FixFailed`` saying why, the file untouched.

    May be written: a regular file whose real path (symbolic links resolved) lies inside
    one of ``roots`` (the paths the run was given, resolved too) and that has a write
    permission bit (a 0444 file is left alone, also when running as root). The bytes go
    into the same inode (not a new file renamed over it), so owner, group, mode, hard
    links and extended attributes stay as they were; written in full or, if writing
    fails half-way, put back as they were.
    """
    target = os.path.realpath(path)
    if not any(_inside(target, os.path.realpath(root)) for root in roots):
        raise FixFailed(f"it leads outside the paths being linted, to {display_path(target)}")
    try:
        _writable(os.stat(target))  # first: a read-only file is refused as such, by root too
        descriptor = os.open(target, _WRITE_FLAGS)
    except OSError as error:
        raise FixFailed(f"cannot open the file for writing: {_reason(error)}") from None
    with open(descriptor, "r+b") as handle:
        try:
            _writable(os.fstat(descriptor))  # the file opened is the one checked
            current = handle.read(len(before) + 1)
        except OSError as error:
            raise FixFailed(f"cannot read the file again: {_reason(error)}") from None
        if current != before:
            raise FixFailed("the file changed on disk since it was read; not written")
        try:
            _overwrite(handle, after)
        except OSError as error:
            why = _reason(error)
            try:
                _overwrite(handle, before)
            except OSError:
                raise FixFailed(f"writing failed half-way ({why}), the file is damaged") from None
            raise FixFailed(f"cannot write the file: {why}; it is as it was") from None


# No link followed at the end of a real path (one that appeared meanwhile), no waiting.
_WRITE_FLAGS = (
    os.O_RDWR
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_NOCTTY", 0)
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_BINARY", 0)
)


def _inside(path: str, root: str) -> bool:
    return os.path.commonpath([path, root]) == root


def _writable(status: os.stat_result) -> None:
    kind = special_kind(status.st_mode)
    if kind is not None:
        raise FixFailed(f"not a regular file: {kind}")
    mode = stat.S_IMODE(status.st_mode)
    if not mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
        raise FixFailed(f"the file is read-only (mode {mode:04o})")


def _overwrite(handle: io.BufferedRandom, data: bytes) -> None:
    handle.seek(0)
    handle.write(data)
    handle.truncate()
    handle.flush()
    os.fsync(handle.fileno())


def _reason(error: OSError) -> str:
    return error.strerror or str(error)
