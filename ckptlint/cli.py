"""The ``ckptlint`` command: discover → lint the files together → fix → report.

Every path given is accounted for in the report: findings, "All checks passed!", a CKP901
(cannot parse or analyse) or CKP902 (cannot access) finding, or an internal error naming
the file. No exception from one file stops the run.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from ckptlint import __version__, report
from ckptlint.config import ConfigError, RuleSelection, Settings, load_settings, parse_code_list
from ckptlint.core import Finding
from ckptlint.discovery import SourceFile, discover
from ckptlint.engine import FileResult, Linter, LintTarget, digest
from ckptlint.project.cache import FOLDER, RunCache
from ckptlint.report import Problem
from ckptlint.rules import RULES_BY_CODE
from ckptlint.source import CannotRead, read_bytes

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2
STDIN = "-"


class UsageError(Exception):
    pass


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ckptlint",
        description="Find misuse of torch.utils.checkpoint: missing use_reentrant, regions "
        "too small to pay off, and recomputes that can see a different world than the forward.",
    )
    parser.add_argument(
        "paths", nargs="*", metavar="PATH", help="files or folders (default: .); - reads stdin"
    )
    parser.add_argument(
        "--select",
        action="append",
        default=[],
        metavar="CODES",
        help="comma-separated codes or prefixes to report (replaces the configuration's "
        "select and ignore)",
    )
    parser.add_argument(
        "--ignore",
        action="append",
        default=[],
        metavar="CODES",
        help="comma-separated codes or prefixes to skip (added to the configuration's ignore)",
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
    parser.add_argument(
        "--output-file", "-o", metavar="FILE", help="write the report to FILE instead of stdout"
    )
    parser.add_argument(
        "--statistics", action="store_true", help="print the number of findings per code"
    )
    parser.add_argument(
        "--quiet", "-q", action="store_true", help="print findings only, no summary line"
    )
    parser.add_argument(
        "--stdin-filename",
        metavar="PATH",
        help="lint standard input as if it were the file PATH (configuration, excludes and "
        "per-file ignores apply as for PATH); implies reading stdin when no path is given",
    )
    parser.add_argument(
        "--no-respect-gitignore",
        dest="respect_gitignore",
        action="store_false",
        default=None,
        help="also lint files that .gitignore files exclude",
    )
    parser.add_argument(
        "--isolated",
        action="store_true",
        help="ignore every configuration file (pyproject.toml), as ruff's --isolated does",
    )
    parser.add_argument("--explain", metavar="CODE", help="print what a rule checks, with examples")
    parser.add_argument(
        "--show-rules", action="store_true", help="list every rule (text or --format json)"
    )
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
    parser.add_argument(
        "--no-cache", action="store_true", help="neither read nor write the results cache"
    )
    parser.add_argument(
        "--cache-dir",
        metavar="DIR",
        help=f"where the results cache lives (default: {FOLDER} next to the configuration)",
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


def entry() -> None:
    """The ``ckptlint`` command: ``main``, then exit without tearing down what the analysis
    built (millions of objects; freeing them took longer than some runs, as mypy found)."""
    gc.disable()  # a short-lived process: the cycle collector would only rescan the analysis
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
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


@dataclass(frozen=True)
class FileOutcome:
    """One path's result, with what its fixes did (``--fix``/``--diff``)."""

    result: FileResult
    fixed: int = 0
    problems: tuple[Problem, ...] = ()
    diff: str = ""
    fixed_bytes: bytes | None = None  # standard input's fixed text (for stdout)


def run(arguments: argparse.Namespace) -> int:
    if arguments.explain:
        code = arguments.explain.strip().upper()
        if code not in RULES_BY_CODE:
            known = ", ".join(RULES_BY_CODE)
            raise UsageError(f"unknown rule code {arguments.explain!r} (known: {known})")
        print(report.explain(code), end="")
        return EXIT_CLEAN
    if arguments.show_rules:
        sys.stdout.write(report.rule_list(arguments.format))
        return EXIT_CLEAN
    if arguments.statistics and arguments.format not in ("text", "json"):
        raise UsageError("--statistics prints text or json only")

    paths = arguments.paths or ([STDIN] if arguments.stdin_filename else ["."])
    from_stdin = STDIN in paths
    if from_stdin and len(paths) > 1:
        raise UsageError("- (standard input) cannot be combined with other paths")
    start = Path(arguments.stdin_filename or ".") if from_stdin else Path(paths[0])
    settings = _settings(arguments, start)
    if arguments.output_file and not os.path.isdir(os.path.dirname(arguments.output_file) or "."):
        raise UsageError(_cannot_write_report(arguments.output_file, "no such folder"))
    mode = "diff" if arguments.diff else "fix" if arguments.fix else "lint"
    job = _Job(Linter(settings), mode, arguments.unsafe_fixes, roots=tuple(paths))

    if from_stdin:
        outcomes = [_lint_stdin(job, arguments.stdin_filename)]
    else:
        cache = None
        if not arguments.no_cache:
            folder = Path(arguments.cache_dir) if arguments.cache_dir else settings.root / FOLDER
            cache = RunCache.for_run(folder, [os.path.abspath(p) for p in paths], settings)
        outcomes = _run_all(job, discover(paths, settings), arguments.jobs, cache)

    problems = [problem for outcome in outcomes for problem in outcome.problems]
    for problem in problems:
        report.write(sys.stderr, report.problem_line(problem))
    internal_error = any(problem.internal for problem in problems)

    if mode == "diff":
        diffs = "".join(outcome.diff for outcome in outcomes)
        sys.stdout.write(diffs)
        return EXIT_ERROR if internal_error else (EXIT_FINDINGS if diffs else EXIT_CLEAN)
    if from_stdin and mode == "fix":
        (outcome,) = outcomes
        sys.stdout.buffer.write(outcome.fixed_bytes or b"")
        sys.stdout.flush()

    findings = [(o.result.path, f) for o in outcomes for f in o.result.findings]
    fixed = sum(outcome.fixed for outcome in outcomes)
    text = _render(findings, problems, fixed, arguments)
    if arguments.output_file:
        try:
            with open(arguments.output_file, "w", encoding="utf-8") as output:
                report.write(output, text)
        except OSError as error:
            reason = error.strerror or str(error)
            raise UsageError(_cannot_write_report(arguments.output_file, reason)) from None
    else:  # with fixed standard input on stdout, the report goes to stderr (as in ruff)
        report.write(sys.stderr if from_stdin and mode == "fix" else sys.stdout, text)
    if internal_error:
        return EXIT_ERROR
    if findings and not arguments.exit_zero:
        return EXIT_FINDINGS
    return EXIT_CLEAN


def _cannot_write_report(path: str, reason: str) -> str:
    return f"cannot write the report to {report.display_path(path)}: {reason}"


def _settings(arguments: argparse.Namespace, start: Path) -> Settings:
    settings = Settings() if arguments.isolated else load_settings(start)
    command_line = RuleSelection(
        select=parse_code_list(arguments.select, "--select") if arguments.select else None,
        ignore=parse_code_list(arguments.ignore, "--ignore"),
    )
    settings = replace(settings, command_line=command_line)
    if arguments.respect_gitignore is not None:
        settings = replace(settings, respect_gitignore=arguments.respect_gitignore)
    return settings


def _render(
    findings: list[tuple[str, Finding]],
    problems: list[Problem],
    fixed: int,
    arguments: argparse.Namespace,
) -> str:
    if arguments.statistics:
        return report.statistics(findings, arguments.format)
    if arguments.format == "json":
        return report.as_json(findings, problems)
    if arguments.format == "github":
        return report.as_github(findings, problems)
    if arguments.format == "sarif":
        return report.as_sarif(findings, problems)
    text = report.as_text(findings)
    if not arguments.quiet:
        text += report.text_summary(findings, unsafe_fixes=arguments.unsafe_fixes, fixed=fixed)
    return text


@dataclass(frozen=True)
class _Job:
    """What the run does with its files: lint them, and fix or diff them."""

    linter: Linter
    mode: str  # "lint", "fix" or "diff"
    unsafe_fixes: bool
    roots: tuple[str, ...]  # the paths given: fixes are written only to files inside them

    def fix_file(self, result: FileResult) -> FileOutcome:
        """Fix a linted file: its findings are reused when its bytes are unchanged."""
        try:
            data = read_bytes(result.path, self.linter.settings.max_file_size)
        except CannotRead as error:
            return FileOutcome(result, problems=(Problem(result.path, f"not fixed: {error}"),))
        reuse = result.findings if result.digest == digest(data) else None
        return self.fix(data, result.path, write=self.mode == "fix", findings=reuse)

    def fix(
        self, data: bytes, path: str, *, write: bool, findings: list[Finding] | None = None
    ) -> FileOutcome:
        """Fix ``data`` (the file's bytes as read): write the result to ``path``, or (not
        writing, standard input) hand the fixed bytes back for stdout."""
        from ckptlint.fixes import FixFailed, fix_source, unified_diff, write_if_unchanged

        keep = not write and self.mode == "fix"  # only standard input's text goes back
        try:
            fix = fix_source(self.linter, data, path, unsafe=self.unsafe_fixes, findings=findings)
        except Exception as error:  # a bug of ours: name the file, keep its findings
            result = self.linter.lint_bytes(data, path)
            problem = Problem(path, f"fix phase: {type(error).__name__}: {error}", internal=True)
            return FileOutcome(result, problems=(problem,), fixed_bytes=data if keep else None)
        problems = tuple(
            Problem(path, message, line, column) for line, column, message in fix.notes
        )
        unchanged = FileOutcome(
            FileResult(path, fix.findings_before),
            problems=problems,
            fixed_bytes=data if keep else None,
        )
        if fix.after is None:
            return unchanged
        if self.mode == "diff":
            return replace(unchanged, diff=unified_diff(path, data, fix.after))
        if write:
            try:
                write_if_unchanged(path, data, fix.after, roots=self.roots)
            except FixFailed as error:
                problem = Problem(path, f"fixes not written: {error}")
                return replace(unchanged, problems=(*problems, problem))
        return FileOutcome(
            FileResult(path, fix.findings_after),
            fix.applied,
            problems,
            fixed_bytes=fix.after if keep else None,
        )


def _outcome(result: FileResult) -> FileOutcome:
    if result.internal_error is None:
        return FileOutcome(result)
    return FileOutcome(
        result, problems=(Problem(result.path, result.internal_error, internal=True),)
    )


def _lint_stdin(job: _Job, filename: str | None) -> FileOutcome:
    """Standard input, linted (and fixed, without writing any file) as the file ``filename``."""
    data = sys.stdin.buffer.read()
    path = filename or STDIN
    if filename and job.linter.settings.is_excluded(filename):
        return FileOutcome(FileResult(path, []), fixed_bytes=data)
    if job.mode == "lint":
        return _outcome(job.linter.lint_bytes(data, path))
    return job.fix(data, path, write=False)


def _run_all(
    job: _Job, files: list[SourceFile], jobs: int | None, cache: RunCache | None = None
) -> list[FileOutcome]:
    """Lint every file in one run (regions cross files), then fix the files that have
    applicable fixes, each on its own."""
    linter = job.linter
    outcomes = {f.path: FileOutcome(linter.inaccessible(f.path, f.error)) for f in files if f.error}
    accessible = [f for f in files if f.error is None]
    try:
        targets = (LintTarget(f.path, f.explicit) for f in accessible)
        results = linter.lint_files(targets, jobs, cache)
    except Exception as error:  # a bug of ours in the run itself: name it, lose nothing else
        message = f"{type(error).__name__}: {error}"
        results = [FileResult(f.path, [], internal_error=message) for f in accessible]
    for result in results:
        outcomes[result.path] = _outcome(result)
    if job.mode != "lint":
        from ckptlint.fixes import is_applicable  # libcst: only when fixing

        for result in results:
            if any(is_applicable(f, job.unsafe_fixes) for f in result.findings):
                outcomes[result.path] = _guarded(job, result)
    return [outcomes[f.path] for f in files]


def _guarded(job: _Job, result: FileResult) -> FileOutcome:
    try:
        return job.fix_file(result)
    except Exception as error:  # a bug of ours outside the fix phase's own guard
        problem = Problem(result.path, f"{type(error).__name__}: {error}", internal=True)
        return FileOutcome(result, problems=(problem,))
