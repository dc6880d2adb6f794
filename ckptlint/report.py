"""Output formats: text (flake8 style), JSON, GitHub annotations and SARIF 2.1.0.

Besides findings, a run can have problems that are not findings: an internal error on a
file (a bug of ours: exit 2) and fixes that were not applied. They go to standard error in
every format, and into the report itself where the format has a place for them: JSON
entries with ``"code": null``, GitHub ``::error`` annotations, SARIF
``invocations[0].toolExecutionNotifications`` (with ``executionSuccessful: false`` after an
internal error).

File names are bytes on POSIX (a non-UTF-8 name arrives as a ``str`` with surrogate
escapes): JSON and SARIF carry them exactly (JSON string escapes; SARIF URIs
percent-encoded from the bytes), text and GitHub output show them as ``display_path``
does, and no name can make writing the report fail.
"""

from __future__ import annotations

import inspect
import json
import os
import textwrap
import urllib.parse
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from ckptlint import __version__
from ckptlint.core import Finding

Report = list[tuple[str, Finding]]


@dataclass(frozen=True)
class Problem:
    """Something that went wrong running the tool on a path; ``line`` 0: the whole file."""

    path: str
    message: str
    line: int = 0
    column: int = 0
    internal: bool = False  # a bug of ours (exit 2); else a fix that was not applied


def display_path(path: str) -> str:
    """``path`` as it is when every character of it prints and it does not start with a
    double quote; else quoted as git quotes file names: in double quotes, with C escapes
    (``\\n``, ``\\"``, ``\\\\``) and the other bytes that do not print (control
    characters, a non-UTF-8 name's bytes) in octal, so one name is one line and says
    exactly which bytes it holds."""
    if path.isprintable() and not path.startswith('"'):
        return path
    return '"' + "".join(_quoted_character(character) for character in path) + '"'


_C_ESCAPES = {
    "\a": "\\a",
    "\b": "\\b",
    "\t": "\\t",
    "\n": "\\n",
    "\v": "\\v",
    "\f": "\\f",
    "\r": "\\r",
}


def _quoted_character(character: str) -> str:
    if character in ('"', "\\"):
        return "\\" + character
    if character in _C_ESCAPES:
        return _C_ESCAPES[character]
    if character.isprintable():
        return character
    data = (
        os.fsencode(character)
        if "\udc80" <= character <= "\udcff"
        else character.encode("utf-8", "surrogatepass")
    )
    return "".join(f"\\{byte:03o}" for byte in data)


def write(stream: TextIO, text: str) -> None:
    """Write ``text`` in the stream's encoding; what that cannot hold (a surrogate escape
    of a non-UTF-8 name inside a message) as a backslash escape, never an error."""
    encoding = stream.encoding or "utf-8"
    stream.write(text.encode(encoding, "backslashreplace").decode(encoding))


def as_text(report: Report, *, unsafe_fixes: bool) -> str:
    """``path:line:col: CODE message``; ``[*]`` marks a finding that ``--fix`` fixes with
    these settings (an unsafe fix only with ``--unsafe-fixes``), as in ruff."""
    return "".join(
        f"{display_path(path)}:{f.line}:{f.column}: {f.code} "
        f"{'[*] ' if f.fix_applies(unsafe_fixes) else ''}{f.message}\n"
        for path, f in report
    )


def problem_line(problem: Problem) -> str:
    path = display_path(problem.path)
    where = f"{path}:{problem.line}:{problem.column}:" if problem.line else f"{path}:"
    kind = "internal error" if problem.internal else "warning"
    return f"ckptlint: {kind}: {where} {problem.message}\n"


def text_summary(report: Report, *, unsafe_fixes: bool, fixed: int) -> str:
    """ruff's summary: what was found (and fixed), then what ``--fix`` would fix, the safe
    and the unsafe fixes counted apart. ``report`` is what remains after the fixes."""
    if not report and not fixed:
        return "All checks passed!\n"
    found = f"Found {_count(len(report) + fixed, 'finding')}"
    if fixed:
        found += f" ({fixed} fixed, {len(report)} remaining)"
    lines = [found + "."]
    applicable = sum(1 for _, f in report if f.fix_applies(unsafe_fixes))
    unsafe = 0 if unsafe_fixes else sum(1 for _, f in report if f.fixable == "unsafe")
    unsafe_note = f"{_count(unsafe, 'unsafe fix')} available with `--fix --unsafe-fixes`"
    if applicable:
        lines.append(
            f"[*] {applicable} fixable with `--fix`" + (f" ({unsafe_note})." if unsafe else ".")
        )
    elif unsafe:
        lines.append(unsafe_note + ".")
    return "".join(f"{line}\n" for line in lines)


def diff_summary(report: Report, *, unsafe_fixes: bool, would_fix: int) -> str:
    """ruff's line after ``--diff``: how many findings the diff fixes, and the unsafe fixes
    left out for want of ``--unsafe-fixes``; nothing when there is nothing to fix."""
    unsafe = 0 if unsafe_fixes else sum(1 for _, f in report if f.fixable == "unsafe")
    left_out = f"{_count(unsafe, 'fix')} available with `--unsafe-fixes`"
    if would_fix:
        extra = f" ({_count(unsafe, 'additional fix')} available with `--unsafe-fixes`)"
        return f"Would fix {_count(would_fix, 'finding')}{extra if unsafe else ''}.\n"
    return f"No findings would be fixed ({left_out}).\n" if unsafe else ""


def _count(number: int, noun: str) -> str:
    """``1 finding``, ``2 findings``, ``2 fixes``."""
    if number == 1:
        return f"{number} {noun}"
    return f"{number} {noun}{'es' if noun.endswith('x') else 's'}"


def as_json(report: Report, problems: Sequence[Problem] = ()) -> str:
    """Findings, then internal errors as entries with ``"code": null``."""
    entries = [
        {
            "path": path,
            "line": f.line,
            "column": f.column,
            "end_line": f.end_line,
            "end_column": f.end_column,
            "code": f.code,
            "message": f.message,
            "fixable": f.fixable is not None,
            "fix_applicability": f.fixable,
        }
        for path, f in report
    ]
    entries.extend(
        {
            "path": p.path,
            "line": max(p.line, 1),
            "column": max(p.column, 1),
            "end_line": max(p.line, 1),
            "end_column": max(p.column, 1),
            "code": None,
            "message": f"internal error: {p.message}",
            "fixable": False,
            "fix_applicability": None,
        }
        for p in problems
        if p.internal
    )
    return json.dumps(entries, indent=2) + "\n"


def as_github(report: Report, problems: Sequence[Problem] = ()) -> str:
    """GitHub Actions workflow commands: one ``::error`` annotation per finding."""
    lines = []
    for path, f in report:
        location = (
            f"file={_escape_property(display_path(path))},line={f.line},col={f.column},"
            f"endLine={f.end_line},endColumn={f.end_column},title=ckptlint ({f.code})"
        )
        lines.append(f"::error {location}::{_escape_data(f'{f.code} {f.message}')}\n")
    for problem in problems:
        command = "error" if problem.internal else "warning"
        title = "ckptlint internal error" if problem.internal else "ckptlint fix not applied"
        location = f"file={_escape_property(display_path(problem.path))}"
        if problem.line:
            location += f",line={problem.line},col={problem.column}"
        lines.append(
            f"::{command} {location},title={_escape_property(title)}::"
            f"{_escape_data(problem.message)}\n"
        )
    return "".join(lines)


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def artifact_uri(path: str) -> str:
    """A path as a SARIF ``uri``: a relative reference, or a ``file://`` URI when absolute;
    its bytes (``os.fsencode``) percent-encoded (RFC 3986), so spaces, ``#``, ``%``, ``:``,
    non-ASCII and non-UTF-8 names survive."""
    posix = Path(path)
    if posix.is_absolute():
        return posix.as_uri()
    return urllib.parse.quote(os.fsencode(posix.as_posix()), safe="/")


def as_sarif(report: Report, problems: Sequence[Problem] = ()) -> str:
    """A SARIF 2.1.0 log with one run, as GitHub code scanning accepts it."""
    from ckptlint.rules import ALL_RULES, RULES_BY_CODE

    rules = [
        {
            "id": rule.code,
            "name": rule.name,
            "shortDescription": {"text": rule.summary},
            "fullDescription": {"text": " ".join((rule.__doc__ or "").split())},
            "help": {"text": (rule.__doc__ or rule.summary).strip()},
            "defaultConfiguration": {"level": "error"},
        }
        for rule in ALL_RULES
    ]
    index = {rule["id"]: position for position, rule in enumerate(rules)}
    results = [
        {
            "ruleId": f.code,
            "ruleIndex": index[f.code],
            "level": "error",
            "message": {"text": f.message},
            "locations": [
                {
                    "physicalLocation": {
                        "artifactLocation": {"uri": artifact_uri(path)},
                        "region": {
                            "startLine": f.line,
                            "startColumn": f.column,
                            "endLine": f.end_line,
                            "endColumn": max(f.end_column, 1),
                        },
                    }
                }
            ],
        }
        for path, f in report
        if f.code in RULES_BY_CODE
    ]
    invocation = {
        "executionSuccessful": not any(p.internal for p in problems),
        "toolExecutionNotifications": [_notification(p) for p in problems],
    }
    log = {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [
            {
                "tool": {"driver": {"name": "ckptlint", "version": __version__, "rules": rules}},
                "invocations": [invocation],
                "results": results,
            }
        ],
    }
    return json.dumps(log, indent=2) + "\n"


def _notification(problem: Problem) -> dict:
    physical: dict = {"artifactLocation": {"uri": artifact_uri(problem.path)}}
    if problem.line:
        physical["region"] = {"startLine": problem.line, "startColumn": max(problem.column, 1)}
    return {
        "level": "error" if problem.internal else "warning",
        "message": {
            "text": f"internal error: {problem.message}" if problem.internal else problem.message
        },
        "locations": [{"physicalLocation": physical}],
    }


def statistics(report: Report, output_format: str, *, unsafe_fixes: bool) -> str:
    """How many findings of each code, most frequent first, as ``ruff --statistics``
    prints them: ``[*]`` where ``--fix`` fixes some with these settings, the column left
    out when it fixes none."""
    from ckptlint.rules import RULES_BY_CODE

    counts = Counter(f.code for _, f in report)
    applicable = Counter(f.code for _, f in report if f.fix_applies(unsafe_fixes))
    rows = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    if output_format == "json":
        entries = [
            {
                "code": code,
                "name": RULES_BY_CODE[code].name,
                "count": count,
                "fixable": code in applicable,
                "fixable_count": applicable[code],
            }
            for code, count in rows
        ]
        return json.dumps(entries, indent=2) + "\n"
    width = max((len(str(count)) for count in counts.values()), default=1)
    marks = dict.fromkeys(counts, "")
    if applicable:
        marks = {code: "[*] " if code in applicable else "[ ] " for code in counts}
    return "".join(
        f"{count:>{width}}\t{code}\t{marks[code]}{RULES_BY_CODE[code].name}\n"
        for code, count in rows
    )


def rule_list(output_format: str) -> str:
    """Every rule: code, name and summary (``--show-rules``)."""
    from ckptlint.rules import ALL_RULES

    if output_format == "json":
        entries = [
            {"code": rule.code, "name": rule.name, "summary": rule.summary} for rule in ALL_RULES
        ]
        return json.dumps(entries, indent=2) + "\n"
    name_width = max(len(rule.name) for rule in ALL_RULES)
    return "".join(
        f"{rule.code}  {rule.name:<{name_width}}  {rule.summary}\n" for rule in ALL_RULES
    )


def explain(code: str) -> str:
    """The rule's explanation with its first bad and first fixed example."""
    from ckptlint.rules import RULES_BY_CODE
    from ckptlint.rules.base import shown

    rule = RULES_BY_CODE[code]
    doc = inspect.cleandoc(rule.__doc__ or "")
    guard = f"{textwrap.fill(rule.GUARD, 88)}\n\n" if rule.GUARD else ""
    return (
        f"{rule.code} ({rule.name}): {rule.summary}\n\n{doc}\n\n{guard}"
        f"Example that is reported:\n\n{_indent(shown(rule.EXAMPLE))}\n"
        f"Written correctly:\n\n{_indent(shown(rule.CORRECTED))}"
    )


def _indent(code: str) -> str:
    return "".join(f"    {line}" if line.strip() else line for line in code.splitlines(True))
