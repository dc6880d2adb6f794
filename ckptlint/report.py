"""Output formats: text (flake8 style), JSON, GitHub annotations and SARIF 2.1.0."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

from ckptlint import __version__
from ckptlint.core import Finding
from ckptlint.rules import ALL_RULES, RULES_BY_CODE

Report = list[tuple[str, Finding]]
INFORMATION_URI = "https://pypi.org/project/ckptlint/"


def as_text(report: Report) -> str:
    """``path:line:col: CODE message``; ``[*]`` marks a finding that has an autofix."""
    return "".join(
        f"{path}:{f.line}:{f.column}: {f.code} {'[*] ' if f.fix else ''}{f.message}\n"
        for path, f in report
    )


def text_summary(report: Report, *, unsafe_fixes: bool, fixed: int) -> str:
    parts = []
    if fixed:
        parts.append(f"Fixed {fixed} finding{'s' if fixed != 1 else ''}.")
    if report:
        count = len(report)
        line = f"Found {count} finding{'s' if count != 1 else ''}."
        fixable = sum(1 for _, f in report if f.fix)
        if fixable:
            how = "--fix" if unsafe_fixes else "--fix --unsafe-fixes"
            line += f" [*] {fixable} fixable with `ckptlint {how}`."
        parts.append(line)
    return "\n".join(parts) + ("\n" if parts else "")


def as_json(report: Report) -> str:
    return (
        json.dumps(
            [
                {
                    "path": path,
                    "line": f.line,
                    "column": f.column,
                    "end_line": f.end_line,
                    "end_column": f.end_column,
                    "code": f.code,
                    "message": f.message,
                    "fixable": f.fix is not None,
                }
                for path, f in report
            ],
            indent=2,
        )
        + "\n"
    )


def as_github(report: Report) -> str:
    """GitHub Actions workflow commands: one ``::error`` annotation per finding."""
    lines = []
    for path, f in report:
        location = (
            f"file={_escape_property(path)},line={f.line},col={f.column},"
            f"endLine={f.end_line},endColumn={f.end_column},title=ckptlint ({f.code})"
        )
        lines.append(f"::error {location}::{_escape_data(f'{f.code} {f.message}')}\n")
    return "".join(lines)


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def as_sarif(report: Report) -> str:
    """A SARIF 2.1.0 log with one run, as GitHub code scanning accepts it."""
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
                        "artifactLocation": {"uri": Path(path).as_posix()},
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
    log = {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "ckptlint",
                        "version": __version__,
                        "informationUri": INFORMATION_URI,
                        "rules": rules,
                    }
                },
                "results": results,
            }
        ],
    }
    return json.dumps(log, indent=2) + "\n"


def explain(code: str) -> str:
    """The rule's explanation with its first bad and first fixed example."""
    rule = RULES_BY_CODE[code]
    doc = inspect.cleandoc(rule.__doc__ or "")
    return (
        f"{rule.code} ({rule.name}): {rule.summary}\n\n{doc}\n\n"
        f"Example that is reported:\n\n{_indent(rule.INVALID[0])}\n"
        f"Written correctly:\n\n{_indent(rule.VALID[0])}"
    )


def _indent(code: str) -> str:
    return "".join(f"    {line}" if line.strip() else line for line in code.splitlines(True))
