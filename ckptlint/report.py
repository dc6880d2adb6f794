"""Output formats, by ruff's names: concise (flake8 style), full (with the code around each
finding), JSON, GitHub annotations, GitLab Code Quality, JUnit XML and SARIF 2.1.0.

Besides findings, a run can have problems that are not findings: an internal error on a
file (a bug of ours: exit 2) and fixes that were not applied. They go to standard error in
every format, and into the report itself where the format has a place for them: JSON
entries with ``"code": null``, GitHub ``::error`` annotations, JUnit ``<error>`` elements,
SARIF ``invocations[0].toolExecutionNotifications`` (with ``executionSuccessful: false``
after an internal error).

File names are bytes on POSIX (a non-UTF-8 name arrives as a ``str`` with surrogate
escapes): JSON, GitLab and SARIF carry them exactly (JSON string escapes; SARIF URIs
percent-encoded from the bytes), text, GitHub and JUnit output show them as
``display_path`` does, and no name can make writing the report fail.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import re
import urllib.parse
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from ckptlint import __version__
from ckptlint.core import Finding

if TYPE_CHECKING:
    from ckptlint.rules.base import Rule

Report = list[tuple[str, Finding]]
# The lines of a file as the report shows them (empty when it cannot be read).
LinesOf = Callable[[str], Sequence[str]]


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


def as_full(report: Report, lines_of: LinesOf, *, unsafe_fixes: bool) -> str:
    """ruff's ``full`` format: each finding's code and message, its place, and the lines
    around it with the finding's columns marked, as ruff prints a diagnostic."""
    return "".join(_full(path, f, lines_of(path), unsafe_fixes) for path, f in report)


_CONTEXT = 2  # lines shown before and after a finding's line, as ruff shows them


def _full(path: str, finding: Finding, lines: Sequence[str], unsafe_fixes: bool) -> str:
    mark = "[*] " if finding.fix_applies(unsafe_fixes) else ""
    head = f"{finding.code} {mark}{finding.message}\n"
    shown = range(max(finding.line - _CONTEXT, 1), min(finding.line + _CONTEXT, len(lines)) + 1)
    width = len(str(shown[-1])) if shown else 1
    gutter = " " * width
    place = f"{gutter}--> {display_path(path)}:{finding.line}:{finding.column}\n"
    if finding.line not in shown:  # a finding about the whole file, or one past its end
        return f"{head}{place}\n"
    rows = [f"{gutter} |\n"]
    for number in shown:
        text = _displayed(lines[number - 1])
        rows.append(f"{number:>{width}} | {text}".rstrip() + "\n")
        if number == finding.line:
            rows.append(f"{gutter} | {_carets(lines[number - 1], finding)}\n")
    rows.append(f"{gutter} |\n")
    return head + place + "".join(rows) + "\n"


def _displayed(line: str) -> str:
    """A source line as the full format prints it: tabs as 4 spaces, no line break."""
    return line.rstrip("\r\n").expandtabs(4)


def _carets(line: str, finding: Finding) -> str:
    """``^`` under the finding's columns on its first line (to the line's end when it
    goes on)."""
    text = line.rstrip("\r\n")
    start = min(finding.column - 1, len(text))
    end = finding.end_column - 1 if finding.end_line == finding.line else len(text)
    end = max(min(end, len(text)), start + 1)
    before = len(text[:start].expandtabs(4))
    return " " * before + "^" * len(text[start:end].expandtabs(4))


def as_gitlab(report: Report, lines_of: LinesOf) -> str:
    """GitLab Code Quality (the merge request widget's report): a JSON list of issues,
    each with ``description``, ``check_name``, ``fingerprint``, ``severity`` and
    ``location`` (``path`` relative to the working folder, ``positions``).

    The fingerprint names an issue across commits, so it leaves line numbers out: the
    code, the path, the text of the reported line and the message with its numbers
    dropped (a message names other lines), and which of the identical ones it is."""
    issues = []
    seen: dict[str, int] = {}
    for path, f in report:
        lines = lines_of(path)
        text = lines[f.line - 1].strip() if 0 < f.line <= len(lines) else ""
        key = "\0".join((f.code, path, text, re.sub(r"\d+", "", f.message)))
        occurrence = seen[key] = seen.get(key, -1) + 1
        fingerprint = hashlib.sha256(f"{key}\0{occurrence}".encode("utf-8", "surrogatepass"))
        issues.append(
            {
                "description": f"{f.code}: {f.message}",
                "check_name": f.code,
                "fingerprint": fingerprint.hexdigest(),
                "severity": "major",
                "location": {
                    "path": _relative(path),
                    "positions": {
                        "begin": {"line": f.line, "column": f.column},
                        "end": {"line": f.end_line, "column": max(f.end_column, 1)},
                    },
                },
            }
        )
    return json.dumps(issues, indent=2) + "\n"


def _relative(path: str) -> str:
    """A path from the working folder (the repository's root, in CI), with ``/``."""
    if os.path.isabs(path):
        relative = os.path.relpath(path)
        if not relative.startswith(os.pardir):
            path = relative
    return Path(path).as_posix()


# What XML 1.0 cannot hold, even escaped.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def as_junit(report: Report, problems: Sequence[Problem] = ()) -> str:
    """JUnit XML as Jenkins, Azure Pipelines and GitLab read test reports: a test suite per
    file, a failing test case per finding, an ``<error>`` per internal error; one passing
    case when there is neither."""
    from xml.etree import ElementTree

    by_file: dict[str, list[tuple[Finding | None, Problem | None]]] = {}
    for path, finding in report:
        by_file.setdefault(path, []).append((finding, None))
    for problem in problems:
        if problem.internal:
            by_file.setdefault(problem.path, []).append((None, problem))
    failures = len(report)
    errors = sum(1 for p in problems if p.internal)
    root = ElementTree.Element(
        "testsuites",
        name="ckptlint",
        tests=str(max(failures + errors, 1)),
        skipped="0",
        failures=str(failures),
        errors=str(errors),
    )
    if not by_file:
        suite = ElementTree.SubElement(
            root, "testsuite", name="ckptlint", tests="1", skipped="0", failures="0", errors="0"
        )
        ElementTree.SubElement(suite, "testcase", name="No findings", classname="ckptlint")
    for path, items in by_file.items():
        shown = _xml_text(display_path(path))
        suite = ElementTree.SubElement(
            root,
            "testsuite",
            name=shown,
            tests=str(len(items)),
            skipped="0",
            failures=str(sum(1 for f, _ in items if f is not None)),
            errors=str(sum(1 for _, p in items if p is not None)),
        )
        classname = shown.removesuffix(".py")
        for found, failed in items:
            if found is not None:
                case = ElementTree.SubElement(
                    suite,
                    "testcase",
                    name=f"ckptlint.{found.code}",
                    classname=classname,
                    file=shown,
                    line=str(found.line),
                    column=str(found.column),
                )
                message = _xml_text(found.message)
                failure = ElementTree.SubElement(case, "failure", message=message)
                failure.text = f"line {found.line}, col {found.column}, {message}"
            elif failed is not None:
                case = ElementTree.SubElement(
                    suite, "testcase", name="ckptlint", classname=classname, file=shown
                )
                text = _xml_text(f"internal error: {failed.message}")
                ElementTree.SubElement(case, "error", message=text).text = text
    ElementTree.indent(root, space="    ")
    return ElementTree.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _xml_text(text: str) -> str:
    """``text`` with what XML cannot hold (control characters, lone surrogates) escaped."""
    return _NOT_XML.sub(lambda match: match.group().encode("unicode_escape").decode(), text)


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
    found = f"Found {count(len(report) + fixed, 'finding')}"
    if fixed:
        found += f" ({fixed} fixed, {len(report)} remaining)"
    lines = [found + "."]
    applicable = sum(1 for _, f in report if f.fix_applies(unsafe_fixes))
    unsafe = 0 if unsafe_fixes else sum(1 for _, f in report if f.fixable == "unsafe")
    unsafe_note = f"{count(unsafe, 'unsafe fix')} available with `--fix --unsafe-fixes`"
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
    left_out = f"{count(unsafe, 'fix')} available with `--unsafe-fixes`"
    if would_fix:
        extra = f" ({count(unsafe, 'additional fix')} available with `--unsafe-fixes`)"
        return f"Would fix {count(would_fix, 'finding')}{extra if unsafe else ''}.\n"
    return f"No findings would be fixed ({left_out}).\n" if unsafe else ""


def count(number: int, noun: str) -> str:
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


# A rule's documentation, under ruff's headings in ruff's order, plus what the rule leaves
# alone and what ckptguard does about the same bug. The rule's docstring holds the prose:
# its first paragraphs say what it does, then its own "## " sections; the examples, the fix
# safety and the guard come from the rule's attributes.
RULE_HEADINGS = (
    "What it does",
    "Why is this bad?",
    "Example",
    "Use instead",
    "Fix safety",
    "Not reported",
    "At run time",
)
DOCSTRING_HEADINGS = ("Why is this bad?", "Fix safety", "Not reported")
_FIX_SAFETY = {
    "safe": "The fix is safe: `ckptlint --fix` applies it.",
    "unsafe": "The fix is unsafe (it can change what the code does): `ckptlint --fix "
    "--unsafe-fixes` applies it; review the diff.",
}


def rule_sections(rule: Rule) -> list[tuple[str, str]]:
    """The rule's documentation: (heading, markdown) in RULE_HEADINGS order, the empty
    ones left out. A docstring section under another heading is an error."""
    from ckptlint.rules.base import shown

    parts = re.split(r"^## (.+)\n", inspect.cleandoc(rule.__doc__ or ""), flags=re.MULTILINE)
    sections = {"What it does": parts[0].strip()}
    for heading, body in zip(parts[1::2], parts[2::2], strict=True):
        if heading not in DOCSTRING_HEADINGS:
            raise ValueError(f"{rule.code}: unknown heading {heading!r} in its docstring")
        sections[heading] = body.strip()
    language = "console" if rule.EXAMPLE.startswith("$ ") else "python"
    sections["Example"] = f"```{language}\n{shown(rule.EXAMPLE)}```"
    sections["Use instead"] = f"```{language}\n{shown(rule.CORRECTED)}```"
    safety = _FIX_SAFETY.get(rule.FIX or "", "")
    sections["Fix safety"] = "\n\n".join(filter(None, [safety, sections.get("Fix safety")]))
    sections["At run time"] = rule.GUARD or ""
    return [(heading, sections[heading]) for heading in RULE_HEADINGS if sections.get(heading)]


def rule_markdown(rule: Rule, level: int = 2) -> str:
    """The rule's documentation as markdown, its sections at heading ``level`` under a
    title one level up: ``--explain`` prints it, docs/rules.md holds it, and the language
    server shows it on hover."""
    title = f"{'#' * (level - 1)} {rule.code}\n\n`{rule.name}`: {rule.summary}.\n"
    body = "".join(
        f"\n{'#' * level} {heading}\n\n{text}\n" for heading, text in rule_sections(rule)
    )
    return title + body


def explain(code: str) -> str:
    """``--explain CODE``: the rule's documentation."""
    from ckptlint.rules import RULES_BY_CODE

    return rule_markdown(RULES_BY_CODE[code])
