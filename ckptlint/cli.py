"""The ``ckptlint`` command: discover → lint (in processes for large trees) → fix → report."""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from ckptlint import __version__, report
from ckptlint.config import ConfigError, Settings, load_settings, parse_code_list
from ckptlint.core import Finding
from ckptlint.discovery import MissingPath, SourceFile, discover
from ckptlint.engine import FileResult, Linter, LintTarget
from ckptlint.rules import RULES_BY_CODE
from ckptlint.source import UnreadableSource, decode, read_bytes

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2
# Below this many files, starting worker processes costs more than it saves.
FILES_PER_EXTRA_PROCESS = 100


class UsageError(Exception):
    pass


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ckptlint",
        description="Find misuse of torch.utils.checkpoint: missing use_reentrant, regions "
        "too small to pay off, and recomputes that can see a different world than the forward.",
    )
    parser.add_argument("paths", nargs="*", metavar="PATH", help="files or folders (default: .)")
    parser.add_argument(
        "--select",
        action="append",
        default=[],
        metavar="CODES",
        help="comma-separated codes or prefixes to report",
    )
    parser.add_argument(
        "--ignore",
        action="append",
        default=[],
        metavar="CODES",
        help="comma-separated codes or prefixes to skip",
    )
    parser.add_argument("--fix", action="store_true", help="apply safe fixes to the files")
    parser.add_argument(
        "--unsafe-fixes",
        action="store_true",
        help="also apply fixes that may change behaviour (with --fix or --diff)",
    )
    parser.add_argument(
        "--diff",
        action="store_true",
        help="print the fixes as a unified diff instead of writing them",
    )
    parser.add_argument("--format", choices=("text", "json", "github", "sarif"), default="text")
    parser.add_argument("--explain", metavar="CODE", help="print what a rule checks, with examples")
    parser.add_argument(
        "--exit-zero", action="store_true", help="exit 0 even when there are findings"
    )
    parser.add_argument(
        "--jobs",
        "-j",
        type=_positive_int,
        metavar="N",
        help="worker processes (default: one per CPU)",
    )
    parser.add_argument("--version", action="version", version=f"ckptlint {__version__}")
    return parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    # Parsing allocates millions of acyclic AST nodes; the default threshold would run the
    # cycle collector thousands of times over them (measured: ~20 % of parse time).
    gc.set_threshold(100_000, 50, 100)
    arguments = build_parser().parse_args(argv)
    try:
        return run(arguments)
    except (UsageError, ConfigError) as error:
        print(f"ckptlint: error: {error}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_ERROR
    except Exception as error:  # a bug of ours: say so in one line, never a traceback
        print(f"ckptlint: internal error: {type(error).__name__}: {error}", file=sys.stderr)
        return EXIT_ERROR


def run(arguments: argparse.Namespace) -> int:
    if arguments.explain:
        code = arguments.explain.strip().upper()
        if code not in RULES_BY_CODE:
            known = ", ".join(RULES_BY_CODE)
            raise UsageError(f"unknown rule code {arguments.explain!r} (known: {known})")
        print(report.explain(code), end="")
        return EXIT_CLEAN

    paths = arguments.paths or ["."]
    settings = _settings(arguments, Path(paths[0]))
    try:
        files = discover(paths, settings)
    except MissingPath as error:
        raise UsageError(f"no such file or folder: {error}") from None

    linter = Linter(settings)
    results = _lint_all(linter, files, arguments.jobs)
    internal_errors = [r for r in results if r.internal_error]
    for result in internal_errors:
        print(
            f"ckptlint: internal error on {result.path}: {result.internal_error}", file=sys.stderr
        )

    if arguments.fix or arguments.diff:
        outcome = _apply_fixes(linter, results, arguments)
        if arguments.diff:
            return (
                EXIT_ERROR
                if internal_errors or outcome.failed
                else (EXIT_FINDINGS if outcome.changed else EXIT_CLEAN)
            )
        results, fixed = outcome.results, outcome.fixed
    else:
        fixed = 0

    findings = [(r.path, f) for r in results for f in r.findings]
    _print_report(findings, arguments, fixed)
    if internal_errors:
        return EXIT_ERROR
    if findings and not arguments.exit_zero:
        return EXIT_FINDINGS
    return EXIT_CLEAN


def _settings(arguments: argparse.Namespace, start: Path) -> Settings:
    settings = load_settings(start)
    if arguments.select:
        settings = replace(settings, select=parse_code_list(arguments.select))
    if arguments.ignore:
        settings = replace(settings, ignore=parse_code_list(arguments.ignore))
    return settings


def _lint_all(linter: Linter, files: list[SourceFile], jobs: int | None) -> list[FileResult]:
    return linter.lint_files((LintTarget(f.path, f.explicit) for f in files), jobs)


class _FixOutcome:
    def __init__(self, results: list[FileResult]) -> None:
        self.results = results
        self.fixed = 0
        self.changed = 0
        self.failed = 0


def _apply_fixes(
    linter: Linter, results: list[FileResult], arguments: argparse.Namespace
) -> _FixOutcome:
    from ckptlint.fixes import FixFailed, apply_edits, unified_diff, write_atomically

    outcome = _FixOutcome(list(results))
    for index, result in enumerate(results):
        edits = [f.fix.edit for f in result.findings if _applies(f, arguments.unsafe_fixes)]
        if not edits:
            continue
        try:
            before = read_bytes(result.path)
            after = apply_edits(before, edits)
        except (FixFailed, UnreadableSource) as error:
            print(f"ckptlint: {result.path}: fixes not applied: {error}", file=sys.stderr)
            outcome.failed += 1
            continue
        outcome.changed += 1
        if arguments.diff:
            sys.stdout.write(unified_diff(result.path, before, after))
            continue
        write_atomically(result.path, after)
        outcome.fixed += len(edits)
        outcome.results[index] = FileResult(
            result.path, linter.lint_text(decode(after), result.path)
        )
    return outcome


def _applies(finding: Finding, unsafe_fixes: bool) -> bool:
    return finding.fix is not None and (finding.fix.applicability == "safe" or unsafe_fixes)


def _print_report(
    findings: list[tuple[str, Finding]], arguments: argparse.Namespace, fixed: int
) -> None:
    if arguments.format == "json":
        sys.stdout.write(report.as_json(findings))
    elif arguments.format == "github":
        sys.stdout.write(report.as_github(findings))
    elif arguments.format == "sarif":
        sys.stdout.write(report.as_sarif(findings))
    else:
        sys.stdout.write(report.as_text(findings))
        sys.stdout.write(
            report.text_summary(findings, unsafe_fixes=arguments.unsafe_fixes, fixed=fixed)
        )
