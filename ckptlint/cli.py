"""The ``ckptlint`` command: find the project → lint the files named → fix → report.

Each named path belongs to a project (``config.project_root``): the analysis knows every
Python file of that project, and the paths decide only which files are reported. Every path
given is accounted for in the report: findings, "All checks passed!", a CKP901 (cannot parse
or analyse) or CKP902 (cannot access) finding, or an internal error naming the file. No
exception from one file stops the run.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import gc
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from ckptlint import __version__

if TYPE_CHECKING:  # the analysis is imported only by the commands that lint (issue 36)
    from ckptlint.config import ProjectRoot, Settings
    from ckptlint.core import Finding
    from ckptlint.discovery import SourceFile
    from ckptlint.engine import Engine, FileResult
    from ckptlint.project import cache
    from ckptlint.report import Problem

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2
STDIN = "-"
CHECK, CLEAN, SERVER = "check", "clean", "server"
# The first path may name a command, as in ruff (a folder of that name: ``./check``).
COMMANDS = (CHECK, CLEAN, SERVER)


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error in one line (and a suggestion) instead of the usage."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message + _suggestion(message, self._option_string_actions))


def _suggestion(message: str, options: dict) -> str:
    """The option probably meant, for an option argparse does not know (as ruff's tip)."""
    prefix = "unrecognized arguments: "
    if not message.startswith(prefix):
        return ""
    for word in message[len(prefix) :].split():
        if word.startswith("-"):
            option = word.split("=")[0]
            close = _RUFF_OPTIONS.get(option) or next(
                iter(difflib.get_close_matches(option, list(options), n=1)), None
            )
            if close:
                return f" (did you mean {close}?)"
    return ""


# ruff's options whose ckptlint counterpart is named otherwise.
_RUFF_OPTIONS = {"--target-version": "--target-torch"}

OUTPUT_FORMATS = ("concise", "full", "json", "github", "gitlab", "junit", "sarif")
# ckptlint's first name for concise, kept for the scripts that use it.
_ALIASES = {"text": "concise"}


def _output_format(text: str) -> str:
    """An output format, or a usage error that lists them all (and the one probably meant)."""
    text = _ALIASES.get(text, text)
    if text in OUTPUT_FORMATS:
        return text
    close = next(iter(difflib.get_close_matches(text, OUTPUT_FORMATS, n=1)), None)
    hint = f"; did you mean {close}?" if close else ""
    raise argparse.ArgumentTypeError(
        f"invalid choice: {text!r} (choose from {', '.join(OUTPUT_FORMATS)}{hint})"
    )


def _target_torch(text: str) -> str:
    from ckptlint.config import TORCH_VERSION_EXPECTED, torch_version

    version = torch_version(text)
    if version is None:
        raise argparse.ArgumentTypeError(f"{TORCH_VERSION_EXPECTED}, got {text[:60]!r}")
    return version


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="ckptlint",
        description="Find misuse of torch.utils.checkpoint: missing use_reentrant, regions "
        "too small to pay off, and recomputes that can see a different world than the forward. "
        f"`ckptlint [{CHECK}] PATH...` lints (the two forms are the same), `ckptlint {CLEAN}` "
        f"deletes the cache, `ckptlint {SERVER}` runs the language server for editors (over "
        "standard input and output). Exit status: 0 no findings, 1 findings, 2 a usage or "
        "internal error.",
        allow_abbrev=False,
    )
    parser.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help=f"files or folders (default: .); - reads stdin; a first {CHECK}, {CLEAN} or "
        f"{SERVER} is the command",
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
        "--extend-select",
        action="append",
        default=[],
        metavar="CODES",
        help="comma-separated codes or prefixes to report in addition to those selected",
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
    parser.add_argument(
        "--add-noqa",
        action="store_true",
        help="add a `# noqa: CODE` comment to each line with a finding (to adopt the linter "
        "on existing code), then exit 0",
    )
    parser.add_argument(
        "--output-format",
        "--format",
        type=_output_format,
        default="concise",
        metavar="{" + ",".join(OUTPUT_FORMATS) + "}",
        help="how findings are printed (default: concise, one line each; text is the same); "
        "--format is the same option",
    )
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
        "--silent",
        "-s",
        action="store_true",
        help="print nothing but usage and internal errors; the exit status still says "
        "whether there are findings",
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
        "--config",
        action="append",
        default=[],
        metavar="FILE|KEY=VALUE",
        help="read the settings from FILE (a pyproject.toml's [tool.ckptlint], or another "
        "TOML file's top level) instead of the nearest pyproject.toml; or set one setting, "
        "as TOML (--config \"ignore = ['CKP101']\"), over every file's. Repeatable (one "
        "FILE at most). It never moves the project root",
    )
    parser.add_argument(
        "--isolated",
        action="store_true",
        help="ignore every configuration file (pyproject.toml), as ruff's --isolated does",
    )
    parser.add_argument("--explain", metavar="CODE", help="print what a rule checks, with examples")
    parser.add_argument(
        "--show-rules", action="store_true", help="list every rule (text or --output-format json)"
    )
    parser.add_argument(
        "--show-settings",
        action="store_true",
        help="print the project root, the settings and the cache each path is linted with",
    )
    parser.add_argument(
        "--show-files", action="store_true", help="print the files that would be linted"
    )
    parser.add_argument(
        "--exit-zero", "-e", action="store_true", help="exit 0 even when there are findings"
    )
    parser.add_argument(
        "--exit-non-zero-on-fix",
        action="store_true",
        help="with --fix, exit 1 when a fix was written even if no finding remains (as in "
        "ruff: a pre-commit hook that fixes files fails the commit)",
    )
    parser.add_argument(
        "--jobs",
        "-j",
        type=_positive_int,
        metavar="N",
        help="worker processes (default: one per CPU for large projects; never more than the "
        "CPUs or the files)",
    )
    parser.add_argument(
        "--max-file-size",
        type=_positive_int,
        metavar="BYTES",
        help="read files of up to BYTES bytes (default and the most a configuration may set: "
        "10485760, 10 MiB); a larger file is CKP901",
    )
    parser.add_argument(
        "--target-torch",
        type=_target_torch,
        metavar="VERSION",
        help='the oldest torch the code runs on ("2.1"): branches testing the torch version '
        "are decided against it (default: the configuration's target-torch, else the lower "
        "bound of the project's torch requirement)",
    )
    parser.add_argument(
        "--no-cache", "-n", action="store_true", help="neither read nor write the cache"
    )
    parser.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="where the cache lives, made if missing (default: .ckptlint_cache at the project "
        "root)",
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
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed: the language server's session ended
            pass
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return run(parse_arguments(sys.argv[1:] if argv is None else list(argv)))
    except UsageError as error:
        _error(f"ckptlint: error: {error}")
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_ERROR
    except Exception as error:
        from ckptlint.config import ConfigError  # loaded already by the run that raised it

        if isinstance(error, ConfigError):
            _error(f"ckptlint: error: {error}")
        else:  # a bug of ours: say so in one line, never a traceback
            _error(f"ckptlint: internal error: {type(error).__name__}: {error}")
        return EXIT_ERROR


def parse_arguments(argv: list[str]) -> argparse.Namespace:
    """The options, with the paths among them as ruff takes them (``check -n examples/``);
    every word after ``--`` is a path (argparse's intermixed parsing forgets that)."""
    end = argv.index("--") if "--" in argv else len(argv)
    arguments = build_parser().parse_intermixed_args(argv[:end])
    arguments.paths += argv[end + 1 :]
    return arguments


def _error(line: str) -> None:
    """One line on standard error, whatever bytes a file name in it holds."""
    from ckptlint.report import write

    write(sys.stderr, line + "\n")


@dataclass(frozen=True)
class FileOutcome:
    """One path's result, with what its fixes did (``--fix``/``--diff``)."""

    result: FileResult
    fixed: int = 0  # fixes written (--fix), or shown in ``diff`` (--diff)
    problems: tuple[Problem, ...] = ()
    diff: str = ""
    fixed_bytes: bytes | None = None  # standard input's fixed text (for stdout)
    added_noqa: int = 0  # lines given a noqa comment (--add-noqa)
    stdin_text: bytes | None = None  # standard input as the report shows it (--format full)


def run(arguments: argparse.Namespace) -> int:
    from ckptlint import report

    if arguments.explain:
        from ckptlint.rules import RULES_BY_CODE

        code = arguments.explain.strip().upper()
        if code not in RULES_BY_CODE:
            known = ", ".join(RULES_BY_CODE)
            raise UsageError(f"unknown rule code {arguments.explain!r} (known: {known})")
        print(report.explain(code), end="")
        return EXIT_CLEAN
    if arguments.show_rules:
        if arguments.output_format not in ("concise", "full", "json"):
            raise UsageError("--show-rules prints text or json only")
        as_json = arguments.output_format == "json"
        sys.stdout.write(report.rule_list("json" if as_json else "text"))
        return EXIT_CLEAN
    if arguments.statistics and arguments.output_format not in ("concise", "full", "json"):
        raise UsageError("--statistics prints text or json only")
    read_config_arguments(arguments)
    if arguments.config_file and arguments.isolated:
        raise UsageError("--config FILE and --isolated cannot be used together")
    command, paths = _command(arguments.paths)
    if command == CLEAN:
        return _clean(arguments, paths or ["."])
    if command == SERVER:
        if paths:
            raise UsageError(f"{SERVER} takes no paths: it lints the files the editor opens")
        from ckptlint.config import parse_code_list

        for option, codes in (
            ("--select", arguments.select),
            ("--extend-select", arguments.extend_select),
            ("--ignore", arguments.ignore),
        ):
            parse_code_list(codes, option)  # wrong: said before the session, not in it
        from ckptlint.server import serve

        return serve(arguments)

    paths = paths or ([STDIN] if arguments.stdin_filename else ["."])
    from_stdin = STDIN in paths
    if from_stdin and len(paths) > 1:
        raise UsageError("- (standard input) cannot be combined with other paths")
    if arguments.exit_non_zero_on_fix and arguments.exit_zero:  # as ruff refuses it
        raise UsageError("--exit-non-zero-on-fix cannot be used with --exit-zero")
    if arguments.add_noqa:
        if arguments.fix or arguments.diff or from_stdin:
            what = "standard input" if from_stdin else "--fix" if arguments.fix else "--diff"
            raise UsageError(f"--add-noqa cannot be used with {what}")
    named = [arguments.stdin_filename or STDIN] if from_stdin else paths
    if arguments.output_file and not os.path.isdir(os.path.dirname(arguments.output_file) or "."):
        raise UsageError(_cannot_write_report(arguments.output_file, "no such folder"))
    projects = [
        Project(root, project_settings(arguments, root), group)
        for root, group in by_root(arguments, named)
    ]
    if arguments.show_settings:
        sys.stdout.write("".join(p.describe(arguments) for p in projects))
        return EXIT_CLEAN
    mode = "diff" if arguments.diff else "fix" if arguments.fix else "lint"
    if arguments.add_noqa:
        mode = "noqa"
    if from_stdin:
        (project,) = projects
        outcomes = [_lint_stdin(project, arguments, mode)]
        project.warn(arguments)
    else:
        files_of = _files_of(projects)
        if arguments.show_files:
            for project in projects:
                for file in files_of[id(project)]:
                    if file.error is None:
                        sys.stdout.write(f"{file.path}\n")
            return EXIT_CLEAN
        outcomes = []
        for project in projects:
            outcomes.extend(_lint_project(project, files_of[id(project)], arguments, mode))
    return _finish(outcomes, arguments, mode, from_stdin)


def _command(paths: list[str]) -> tuple[str, list[str]]:
    """The command a first path names (``check`` when none does), and the paths after it."""
    if paths and paths[0] in COMMANDS:
        return paths[0], paths[1:]
    return CHECK, paths


def _finish(
    outcomes: list[FileOutcome], arguments: argparse.Namespace, mode: str, from_stdin: bool
) -> int:
    from ckptlint import report

    problems = [problem for outcome in outcomes for problem in outcome.problems]
    silent = arguments.silent
    for problem in problems:
        if problem.internal or not silent:
            report.write(sys.stderr, report.problem_line(problem))
    internal_error = any(problem.internal for problem in problems)
    if not outcomes and not silent:
        sys.stderr.write("ckptlint: warning: no Python file found under the given path(s)\n")
    findings = [(o.result.path, f) for o in outcomes for f in o.result.findings]
    fixed = sum(outcome.fixed for outcome in outcomes)

    if mode == "noqa":  # ruff's one line, on stderr
        if not silent:
            added = sum(outcome.added_noqa for outcome in outcomes)
            if added:
                sys.stderr.write(f"Added {report.count(added, 'noqa directive')}.\n")
        return EXIT_ERROR if internal_error else EXIT_CLEAN

    if mode == "diff":  # the diffs, then ruff's "Would fix" line, on stdout
        diffs = "".join(outcome.diff for outcome in outcomes)
        if not arguments.quiet:
            summary = report.diff_summary(
                findings, unsafe_fixes=arguments.unsafe_fixes, would_fix=fixed
            )
            diffs += f"\n{summary}" if diffs and summary else summary
        if not silent:
            report.write(sys.stdout, diffs)
        return EXIT_ERROR if internal_error else (EXIT_FINDINGS if fixed else EXIT_CLEAN)
    if from_stdin and mode == "fix":
        (outcome,) = outcomes
        sys.stdout.buffer.write(outcome.fixed_bytes or b"")
        sys.stdout.flush()

    text = _render(outcomes, findings, problems, fixed, arguments)
    if silent:
        pass
    elif arguments.output_file:
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
    if arguments.exit_zero:
        return EXIT_CLEAN
    if findings or (fixed and arguments.exit_non_zero_on_fix):
        return EXIT_FINDINGS
    return EXIT_CLEAN


def _cannot_write_report(path: str, reason: str) -> str:
    from ckptlint.report import display_path

    return f"cannot write the report to {display_path(path)}: {reason}"


# -- projects --------------------------------------------------------------------------------
@dataclass
class Project:
    """The named paths of one project, with its settings."""

    root: ProjectRoot
    settings: Settings
    paths: list[str]
    notes: list[str] = field(default_factory=list)  # what the user should know, once

    def __post_init__(self) -> None:
        if self.settings.held_to_ceiling is not None:
            self.notes.append(self.settings.held_to_ceiling)

    def warn(self, arguments: argparse.Namespace) -> None:
        """Print the notes gathered so far, each once (none with ``--silent``)."""
        from ckptlint import report

        for note in dict.fromkeys(self.notes):
            if not arguments.silent:
                report.write(sys.stderr, f"ckptlint: warning: {note}\n")
        self.notes.clear()

    def engine(self, arguments: argparse.Namespace, named: Sequence[str]) -> Engine:
        """An engine that knows every file of the project and the files named (the walk of
        the root is not done twice when the root is what was named)."""
        from ckptlint.discovery import discover
        from ckptlint.engine import Engine

        root = os.path.abspath(self.root.folder)
        if any(os.path.abspath(p) == root for p in self.paths):
            known: list[str] = []
        else:
            found = discover([str(root)], self.settings, self.notes)
            known = [f.path for f in found if not f.error]
        return Engine(self.settings, [*known, *named], self.store(arguments), arguments.jobs)

    def store(self, arguments: argparse.Namespace) -> cache.Store | None:
        """The project's cache; None with ``--no-cache``, or (with a note saying why) when
        it cannot be used."""
        from ckptlint.project import cache

        if arguments.no_cache:
            return None
        folder = self.cache_folder(arguments)
        if arguments.cache_dir:  # made with the folders above it, as ruff makes it
            try:
                folder.parent.mkdir(parents=True, exist_ok=True)
            except OSError as error:
                self.notes.append(f"cache not used: cannot make {folder.parent}: {error.strerror}")
                return None
        opened = cache.Store.open(folder, self.analysis_key, self.notes)
        if isinstance(opened, cache.Store):
            return opened
        self.notes.append(f"cache not used: {opened}")
        return None

    def cache_folder(self, arguments: argparse.Namespace) -> Path:
        from ckptlint.project import cache

        if arguments.cache_dir:
            return Path(arguments.cache_dir).absolute()
        return self.root.folder / cache.FOLDER

    @property
    def analysis_key(self) -> str:
        from ckptlint.project import cache

        return cache.analysis_key([str(self.root.folder), self.settings.analysis_identity])

    def describe(self, arguments: argparse.Namespace) -> str:
        """``--show-settings``: what the paths are linted with, one setting a line."""
        from ckptlint.project import cache
        from ckptlint.rules import RULES_BY_CODE

        settings = self.settings
        if arguments.no_cache:
            cache_state = "off (--no-cache)"
        else:
            opened = cache.Store.open(self.cache_folder(arguments), self.analysis_key)
            cache_state = str(opened.part) if isinstance(opened, cache.Store) else f"off: {opened}"
        how = {
            "git": "the nearest folder holding a git work tree",
            "package": "the top of the package (no pyproject.toml, setup.py, setup.cfg or git "
            "work tree above the paths)",
            "folder": "the folder named (no pyproject.toml, setup.py, setup.cfg, git work tree "
            "or package above the paths)",
        }.get(self.root.reason, f"the nearest folder holding {self.root.reason}")
        overrides = [text for text, _ in arguments.config_overrides]
        rows = [
            ("paths", " ".join(self.paths)),
            ("project root", f"{self.root.folder}  ({how})"),
            ("configuration", str(settings.config_file or "none")),
            ("configuration overrides", "; ".join(overrides) or "none"),
            ("patterns relative to", str(settings.root)),
            ("select", ", ".join(settings.select)),
            ("ignore", ", ".join(settings.ignore) or "none"),
            ("command line select", _codes(settings.command_line.select)),
            ("command line extend-select", _codes(settings.command_line.extend_select)),
            ("command line ignore", _codes(settings.command_line.ignore)),
            ("selected rules", ", ".join(c for c in RULES_BY_CODE if settings.is_selected(c))),
            ("exclude", ", ".join(settings.exclude) or "none"),
            (
                "per-file-ignores",
                "; ".join(f"{p} = {', '.join(c)}" for p, c in settings.per_file_ignores) or "none",
            ),
            (
                "extend-checkpoint-functions",
                ", ".join(map(str, settings.extend_checkpoint_functions)) or "none",
            ),
            ("respect-gitignore", str(settings.respect_gitignore).lower()),
            ("max-file-size", f"{settings.max_file_size} bytes"),
            ("target-torch", settings.target_torch or "not set (no torch requirement found)"),
            ("cache", cache_state),
            ("jobs", str(arguments.jobs or "one per CPU for large projects")),
        ]
        width = max(len(key) for key, _ in rows)
        return "".join(f"{key:<{width}} = {value}\n" for key, value in rows) + "\n"


def _codes(codes: tuple[str, ...] | None) -> str:
    return "not given" if not codes else ", ".join(codes)


def _files_of(projects: list[Project]) -> dict[int, list[SourceFile]]:
    """Each project's files to lint; a file also reached from an earlier project (a
    project nested in another named one) is linted there only."""
    from ckptlint.discovery import discover

    if len(projects) == 1:
        (project,) = projects
        return {id(project): discover(project.paths, project.settings, project.notes)}
    seen: set[str] = set()
    files_of = {}
    for project in projects:
        files = discover(project.paths, project.settings, project.notes)
        kept = []
        for file in files:
            real = file.path if file.error else os.path.realpath(file.path)
            if real not in seen:
                seen.add(real)
                kept.append(file)
        files_of[id(project)] = kept
    return files_of


def read_config_arguments(arguments: argparse.Namespace) -> None:
    """Each ``--config``: a file that exists, else one TOML ``KEY = VALUE`` pair, as in
    ruff (``arguments.config_file``, ``arguments.config_overrides``)."""
    from ckptlint.config import parse_override

    files: list[Path] = []
    overrides: list[tuple[str, dict[str, object]]] = []
    for text in arguments.config:
        path = Path(text).expanduser()
        if path.is_file():
            files.append(path.absolute())
            continue
        table = parse_override(text)
        if table is None and "=" not in text:
            raise UsageError(f"--config {text}: no such file")
        if table is None:
            raise UsageError(
                f"--config {text}: not one setting as TOML (KEY = VALUE, such as "
                "\"ignore = ['CKP101']\")"
            )
        overrides.append((text, table))
    if len(files) > 1:
        raise UsageError("--config: one configuration file at most (and any KEY = VALUE)")
    arguments.config_file = files[0] if files else None
    arguments.config_overrides = overrides


def by_root(arguments: argparse.Namespace, paths: list[str]) -> list[tuple[ProjectRoot, list[str]]]:
    """The named paths grouped by project (each its own root, settings and cache), in the
    order first named."""
    from ckptlint.config import RootFinder

    finder = RootFinder(isolated=arguments.isolated)
    found = [finder.root(Path(path)) for path in paths]
    roots = list(dict.fromkeys(found))

    def project_of(root: ProjectRoot) -> ProjectRoot:
        """A root found for want of any project marker (a package's top, a folder) inside
        the root of another named path is part of that project."""
        while root.reason in ("package", "folder"):
            enclosing = [other for other in roots if other.folder in root.folder.parents]
            if not enclosing:
                break
            root = max(enclosing, key=lambda other: len(other.folder.parts))
        return root

    groups: dict[ProjectRoot, tuple[ProjectRoot, list[str]]] = {}
    for path, root in zip(paths, found, strict=True):
        project = project_of(root)
        groups.setdefault(project, (project, []))[1].append(path)
    return list(groups.values())


def project_settings(arguments: argparse.Namespace, root: ProjectRoot) -> Settings:
    from ckptlint.config import RuleSelection, load_settings, parse_code_list

    settings = load_settings(
        root, config=arguments.config_file, overrides=arguments.config_overrides
    )
    command_line = RuleSelection(
        select=parse_code_list(arguments.select, "--select") if arguments.select else None,
        extend_select=parse_code_list(arguments.extend_select, "--extend-select"),
        ignore=parse_code_list(arguments.ignore, "--ignore"),
    )
    settings = replace(settings, command_line=command_line)
    if arguments.max_file_size is not None:  # the user's explicit choice: no ceiling
        settings = replace(settings, max_file_size=arguments.max_file_size, held_to_ceiling=None)
    if arguments.respect_gitignore is not None:
        settings = replace(settings, respect_gitignore=arguments.respect_gitignore)
    if arguments.target_torch is not None:
        settings = replace(settings, target_torch=arguments.target_torch)
    return settings


def _clean(arguments: argparse.Namespace, paths: list[str]) -> int:
    """``ckptlint clean [PATH ...]``: delete the cache of each path's project (what ckptlint
    wrote there: anything else is left alone, and named)."""
    from ckptlint import report
    from ckptlint.project import cache

    for root, _ in by_root(arguments, paths):
        folder = (
            Path(arguments.cache_dir).absolute()
            if arguments.cache_dir
            else root.folder / cache.FOLDER
        )
        cleaned = cache.clean(folder)
        if cleaned.removed:
            print(f"Removed {folder}")
        elif cleaned.is_cache:
            for item in cleaned.left_alone:
                report.write(sys.stderr, f"ckptlint: warning: left alone: {item}\n")
            print(f"Removed what ckptlint wrote in {folder}")
        elif os.path.lexists(folder):
            print(
                f"ckptlint: warning: {folder} is not a ckptlint cache; left alone", file=sys.stderr
            )
    return EXIT_CLEAN


def _render(
    outcomes: list[FileOutcome],
    findings: list[tuple[str, Finding]],
    problems: list[Problem],
    fixed: int,
    arguments: argparse.Namespace,
) -> str:
    from ckptlint import report

    unsafe_fixes = arguments.unsafe_fixes
    output_format = arguments.output_format
    if output_format == "json":
        if arguments.statistics:
            return report.statistics(findings, "json", unsafe_fixes=unsafe_fixes)
        return report.as_json(findings, problems)
    if output_format == "github":
        return report.as_github(findings, problems)
    if output_format == "gitlab":
        return report.as_gitlab(findings, _lines_of(outcomes))
    if output_format == "junit":
        return report.as_junit(findings, problems)
    if output_format == "sarif":
        return report.as_sarif(findings, problems)
    if arguments.statistics:  # the counts, then the summary, as ruff prints them
        text = report.statistics(findings, "text", unsafe_fixes=unsafe_fixes)
    elif output_format == "full":
        text = report.as_full(findings, _lines_of(outcomes), unsafe_fixes=unsafe_fixes)
    else:
        text = report.as_text(findings, unsafe_fixes=unsafe_fixes)
    if not arguments.quiet:
        text += report.text_summary(findings, unsafe_fixes=unsafe_fixes, fixed=fixed)
    return text


def _lines_of(outcomes: list[FileOutcome]) -> Callable[[str], list[str]]:
    """The lines of each reported file as it is now (fixed, or standard input's text), read
    once; none for a file that cannot be read or decoded."""
    from ckptlint.source import UnreadableSource, decode, read_bytes, split_lines

    given = {o.result.path: o.stdin_text for o in outcomes if o.stdin_text is not None}

    @functools.cache
    def lines_of(path: str) -> list[str]:
        try:
            return split_lines(decode(given[path] if path in given else read_bytes(path)))
        except UnreadableSource:
            return []

    return lines_of


# -- linting and fixing ------------------------------------------------------------------------
def _lint_project(
    project: Project, files: list[SourceFile], arguments: argparse.Namespace, mode: str
) -> list[FileOutcome]:
    """Lint a project's named files in one run, then fix the files that have applicable
    fixes, each from its exact bytes."""
    from ckptlint.engine import FileResult

    outcomes = {f.path: FileOutcome(_inaccessible(f, project.settings)) for f in files if f.error}
    accessible = [f.path for f in files if f.error is None]
    engine = project.engine(arguments, accessible)
    try:
        results = engine.lint(accessible)
    except Exception as error:  # a bug of ours in the run itself: name it, lose nothing else
        message = f"{type(error).__name__}: {error}"
        results = [FileResult(path, [], internal_error=message) for path in accessible]
    project.notes.extend(engine.notes)
    project.warn(arguments)
    for result in results:
        outcomes[result.path] = _outcome(result)
    if mode == "noqa":
        for result in results:
            if result.findings and result.internal_error is None:
                outcomes[result.path] = _add_noqa(engine, result, tuple(project.paths))
    elif mode != "lint":
        fixer = _Fixer(engine, mode, arguments.unsafe_fixes, tuple(project.paths))
        for result in results:
            if any(f.fixable for f in result.findings):
                outcomes[result.path] = fixer.fix_file(result)
    return [outcomes[f.path] for f in files]


def _add_noqa(engine: Engine, result: FileResult, roots: tuple[str, ...]) -> FileOutcome:
    """``--add-noqa`` for one file: its findings on its exact bytes, a ``# noqa`` for each,
    written only if the file still compiles as it did and still holds those bytes."""
    from ckptlint.add_noqa import add_noqa
    from ckptlint.fixes import FixFailed, compile_error, encode_like, write_if_unchanged
    from ckptlint.report import Problem
    from ckptlint.source import CannotRead, UnreadableSource, decode, read_bytes

    path = result.path
    try:
        data = read_bytes(path, engine.settings.max_file_size)
        (linted,) = engine.lint([path], {path: data})
        text = decode(data)
    except (CannotRead, UnreadableSource) as error:
        return FileOutcome(result, problems=(Problem(path, f"no noqa added: {error}"),))
    if linted.internal_error is not None:
        return _outcome(linted)
    added = add_noqa(text, linted.findings)
    problems = [
        Problem(path, f"{finding.code} not suppressed: {reason}", finding.line, finding.column)
        for finding, reason in added.left
    ]
    if not added.added:
        return FileOutcome(linted, problems=tuple(problems))
    try:
        after = encode_like(added.text, data)
        if compile_error(after, path) and not compile_error(data, path):
            raise FixFailed(f"the file would not compile ({compile_error(after, path)})")
        write_if_unchanged(path, data, after, roots=roots)
    except FixFailed as error:
        problems.append(Problem(path, f"no noqa added: {error}"))
        return FileOutcome(linted, problems=tuple(problems))
    return FileOutcome(linted, problems=tuple(problems), added_noqa=added.added)


def _inaccessible(file: SourceFile, settings: Settings) -> FileResult:
    """The CKP902 of a path that cannot be linted (missing, an unreadable folder)."""
    return _whole_file(file.path, "CKP902", file.error or "cannot be accessed", settings)


def _whole_file(path: str, code: str, message: str, settings: Settings) -> FileResult:
    """A finding about a whole file the engine never sees, at its first line."""
    from ckptlint.core import Finding
    from ckptlint.engine import FileResult

    if not settings.is_selected(code) or settings.is_ignored_in(code, path):
        return FileResult(path, [])
    return FileResult(path, [Finding(1, 1, code, message, end_line=1, end_column=1)])


def _outcome(result: FileResult) -> FileOutcome:
    from ckptlint.report import Problem

    if result.internal_error is None:
        return FileOutcome(result)
    return FileOutcome(
        result, problems=(Problem(result.path, result.internal_error, internal=True),)
    )


def _lint_stdin(project: Project, arguments: argparse.Namespace, mode: str) -> FileOutcome:
    """Standard input, linted (and fixed, without writing any file) as the file it names;
    read up to ``max-file-size`` bytes, as a file is."""
    from ckptlint.engine import FileResult
    from ckptlint.source import FileTooLarge

    limit = project.settings.max_file_size
    data = sys.stdin.buffer.read(limit + 1)
    path = arguments.stdin_filename or STDIN
    too_large = len(data) > limit
    if too_large and mode == "fix":
        data += sys.stdin.buffer.read()  # handed back unchanged: all of it
    if arguments.stdin_filename and project.settings.is_excluded(path):
        return FileOutcome(FileResult(path, []), fixed_bytes=data)
    if too_large:
        result = _whole_file(path, "CKP901", str(FileTooLarge(limit)), project.settings)
        return FileOutcome(result, fixed_bytes=data if mode == "fix" else None)
    engine = project.engine(arguments, [path])
    if mode == "lint":
        (result,) = engine.lint([path], {path: data})
        return replace(_outcome(result), stdin_text=data)
    outcome = _Fixer(engine, mode, arguments.unsafe_fixes, (path,)).fix(data, path, write=False)
    return replace(outcome, stdin_text=outcome.fixed_bytes or data)


@dataclass(frozen=True)
class _Fixer:
    """Fixes files (``mode`` "fix") or shows their fixes (``mode`` "diff")."""

    engine: Engine
    mode: str
    unsafe_fixes: bool
    roots: tuple[str, ...]  # the paths given: fixes are written only to files inside them

    def fix_file(self, result: FileResult) -> FileOutcome:
        from ckptlint.report import Problem
        from ckptlint.source import CannotRead, read_bytes

        try:
            data = read_bytes(result.path, self.engine.settings.max_file_size)
        except CannotRead as error:
            return FileOutcome(result, problems=(Problem(result.path, f"not fixed: {error}"),))
        try:
            return self.fix(data, result.path, write=self.mode == "fix")
        except Exception as error:  # a bug of ours outside the fix phase's own guard
            problem = Problem(result.path, f"{type(error).__name__}: {error}", internal=True)
            return FileOutcome(result, problems=(problem,))

    def findings(self, data: bytes, path: str, *, fixes: bool) -> list[Finding]:
        """The findings of exactly ``data`` as the file ``path``."""
        (result,) = self.engine.lint([path], {path: data}, fixes=fixes)
        if result.internal_error is not None:
            raise RuntimeError(result.internal_error)
        return result.findings

    def fix(self, data: bytes, path: str, *, write: bool) -> FileOutcome:
        """Fix ``data`` (the file's bytes as read): write the result to ``path``, or (not
        writing, standard input) hand the fixed bytes back for stdout."""
        from ckptlint.engine import FileResult
        from ckptlint.fixes import FixFailed, fix_source, unified_diff, write_if_unchanged
        from ckptlint.report import Problem

        keep = not write and self.mode == "fix"  # only standard input's text goes back
        try:
            fix = fix_source(
                lambda text, fixes: self.findings(text, path, fixes=fixes),
                data,
                path,
                unsafe=self.unsafe_fixes,
            )
        except Exception as error:  # a bug of ours: name the file, keep its findings
            (result,) = self.engine.lint([path], {path: data})
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
            return replace(unchanged, fixed=fix.applied, diff=unified_diff(path, data, fix.after))
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
