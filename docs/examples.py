"""Run the runnable examples of README.md, CONTRIBUTING.md and docs/*.md and compare what
they print.

A runnable example is a ``console`` block right after the line ``<!-- runnable -->``
(GitHub shows neither the comment nor anything odd about the block). Each line starting
with ``$ `` is a command; the lines after it, up to the next command, are what it prints,
standard output and standard error together as a terminal shows them. ``...`` stands for
any text, as in doctest's ELLIPSIS: a line of only ``...`` for any lines, ``...`` inside a
line for the rest of it. Every other shell block (``bash``, ``sh``, ``console``, or one
whose first line is a ``$ `` prompt) says why it cannot run here, right before it:
``<!-- not runnable: it installs packages -->``.

Each block runs in its own copy of the checkout (the files .gitignore does not ignore), so
a command that fixes or writes files changes the copy only (the copies take the same path
in turn and hand the ckptlint cache on, so only the first lints cold); each command runs in its own
``bash`` in the copy's root, where ``ckptlint``, ``flake8`` and ``python`` are this
interpreter running the copy's code. The copy's own path prints as ``...``.

    python docs/examples.py           # run them all, show what differs
    python docs/examples.py --update  # rewrite the expected output of those that differ

tests/test_doc_examples.py runs them and fails where an output differs.
"""

from __future__ import annotations

import atexit
import difflib
import doctest
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pathspec

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
GENERATED = {ROOT / "docs" / "rules.md"}  # its examples are the rules' own (--explain)
COMMAND = "python docs/examples.py --update"
RUNNABLE = "<!-- runnable -->"
NOT_RUNNABLE = re.compile(r"<!-- not runnable: \S.* -->")
SHELL_LANGUAGES = {"bash", "sh", "shell", "console", "shell-session", "zsh"}
FENCE = re.compile(r"^(```+)\s*([\w-]*)")
PROMPT = "$ "
ELLIPSIS = "..."
TIMEOUT = 600  # seconds for one command: a training example takes seconds
# The programs the examples call, as this interpreter runs them (on the copy's code).
PROGRAMS = {"python": [], "ckptlint": ["-m", "ckptlint"], "flake8": ["-m", "flake8"]}


@dataclass(frozen=True)
class Command:
    line: int  # of the ``$ `` line in its page, from 1
    text: str
    expected: tuple[str, ...]


@dataclass(frozen=True)
class Block:
    """A fenced shell block; ``marker`` is the comment line before it, or ``""``."""

    page: Path
    line: int  # of the opening fence, from 1
    end: int  # of the closing fence
    marker: str
    commands: tuple[Command, ...]

    @property
    def name(self) -> str:
        return f"{shown(self.page)}:{self.line}"


def shown(page: Path) -> str:
    """A page's path from the repository root (as the failure messages name it)."""
    return page.relative_to(ROOT).as_posix() if page.is_relative_to(ROOT) else str(page)


def shell_blocks(page: Path, text: str | None = None) -> Iterator[Block]:
    """Every shell block of ``page`` (its text given, or read)."""
    lines = (page.read_text(encoding="utf-8") if text is None else text).splitlines()
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        close = next(
            (i for i in range(index + 1, len(lines)) if lines[i].startswith(opening[1])),
            len(lines),
        )
        body = lines[index + 1 : close]
        if opening[2] in SHELL_LANGUAGES or (body and body[0].startswith(PROMPT)):
            marker = lines[index - 1].strip() if index else ""
            yield Block(page, index + 1, close + 1, marker, _commands(body, index + 2))
        index = close + 1


def _commands(body: list[str], first_line: int) -> tuple[Command, ...]:
    commands: list[Command] = []
    for offset, line in enumerate(body):
        if line.startswith(PROMPT):
            commands.append(Command(first_line + offset, line[len(PROMPT) :], ()))
        elif commands:
            last = commands[-1]
            commands[-1] = Command(last.line, last.text, (*last.expected, line))
    return tuple(commands)


def runnable_blocks(pages: list[Path] = PAGES) -> list[Block]:
    return [block for page in pages for block in shell_blocks(page) if block.marker == RUNNABLE]


# -- running -----------------------------------------------------------------------------------
def run_block(block: Block) -> list[str]:
    """What each command of ``block`` prints, run in a fresh copy of the checkout (once a
    process for the same commands: two pages showing one command run it once)."""
    commands = tuple(command.text for command in block.commands)
    if commands not in _OUTPUTS:
        _OUTPUTS[commands] = _run_commands(commands)
    return list(_OUTPUTS[commands])


_OUTPUTS: dict[tuple[str, ...], list[str]] = {}


def _run_commands(commands: tuple[str, ...]) -> list[str]:
    place = _place()
    copy = place / "checkout"
    _fresh_copy(copy)
    environment = _environment(place, copy)
    outputs = []
    for command in commands:
        result = subprocess.run(
            ["bash", "-c", command],
            cwd=copy,
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=TIMEOUT,
        )
        shown = result.stdout.decode("utf-8", "backslashreplace")
        outputs.append(shown.replace(str(copy), ELLIPSIS))
    return outputs


@functools.cache
def _place() -> Path:
    """The folder every block runs in, one a process, removed when it ends."""
    folder = tempfile.TemporaryDirectory()
    atexit.register(folder.cleanup)
    return Path(os.path.realpath(folder.name))


def _fresh_copy(copy: Path) -> None:
    """A fresh copy of the checkout at ``copy``, with the ckptlint cache the blocks before
    left there: every block runs on the same path with the same user key, so the cache an
    earlier command filled serves the next (the findings are the same cold or warm; linting
    this repository cold for each of some thirty commands was most of their time)."""
    cache = copy / ".ckptlint_cache"
    kept = copy.parent / "kept_cache"
    if cache.is_dir():
        cache.rename(kept)
    if copy.exists():
        shutil.rmtree(copy)
    _copy_checkout(copy)
    if kept.is_dir():
        kept.rename(cache)


def _copy_checkout(copy: Path) -> None:
    """The checkout's files but those git ignores (caches, virtual environments, the
    benchmarks' downloaded trees), symbolic links kept as links."""
    gitignore = ROOT / ".gitignore"
    patterns = gitignore.read_text(encoding="utf-8").splitlines() if gitignore.exists() else []
    ignored = pathspec.GitIgnoreSpec.from_lines([*patterns, ".git", ".ckptlint_cache/"])

    def ignore(folder: str, names: list[str]) -> set[str]:
        relative = Path(folder).relative_to(ROOT)
        return {
            name
            for name in names
            if ignored.match_file(
                (relative / name).as_posix() + ("/" if os.path.isdir(Path(folder, name)) else "")
            )
        }

    shutil.copytree(ROOT, copy, symlinks=True, ignore=ignore)


def _environment(place: Path, copy: Path) -> dict[str, str]:
    programs = place / "bin"
    programs.mkdir(exist_ok=True)
    for name, arguments in PROGRAMS.items():
        script = programs / name
        words = " ".join([sys.executable, *arguments])
        script.write_text(f'#!/bin/sh\nexec {words} "$@"\n')
        script.chmod(0o755)
    return {
        **os.environ,
        "PATH": f"{programs}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(copy),
        "PYTHONUNBUFFERED": "1",  # stdout and stderr interleaved as on a terminal
        "XDG_CACHE_HOME": str(place / "user-cache"),  # the cache's key, made for the run
    }


# -- comparing ---------------------------------------------------------------------------------
def matches(expected: tuple[str, ...] | list[str], output: str) -> bool:
    want = "".join(f"{line}\n" for line in expected)
    return doctest.OutputChecker().check_output(want, output, doctest.ELLIPSIS)


def differences(block: Block, outputs: list[str]) -> str:
    """What differs, command by command, and how to refresh the page; "" when nothing."""
    report = []
    for command, output in zip(block.commands, outputs, strict=True):
        if matches(command.expected, output):
            continue
        printed = refreshed(command.expected, output)  # elided lines that still match: as shown
        diff = difflib.unified_diff(
            list(command.expected), printed, "expected", "printed", lineterm=""
        )
        report.append(
            f"{shown(block.page)}:{command.line}: `{command.text}` printed other "
            "output than the page shows:\n" + "\n".join(diff)
        )
    if not report:
        return ""
    return "\n\n".join(report) + (
        f"\n\nIf the new output is right, refresh the page with `{COMMAND}` (it rewrites the "
        "outputs that differ, keeping the `...` lines whose neighbours still match) and "
        "review its diff."
    )


def refreshed(expected: tuple[str, ...], output: str) -> list[str]:
    """``output`` as lines, with the page's elisions kept where they still fit: a line of
    ``...`` stays in place of the lines it stands for when the lines around it still match,
    and a line with ``...`` inside stays where it matches one line of the output."""
    printed = output.splitlines()
    # Each expected line as the printed line it matches, so the matcher can pair them.
    keyed = [
        next((p for p in printed if line != ELLIPSIS and matches([line], p + "\n")), line)
        for line in expected
    ]
    lines: list[str] = []
    matcher = difflib.SequenceMatcher(None, keyed, printed, autojunk=False)
    for operation, start, stop, printed_start, printed_stop in matcher.get_opcodes():
        old, new = list(expected[start:stop]), printed[printed_start:printed_stop]
        if operation == "equal":
            lines.extend(old)
        elif operation == "replace" and ELLIPSIS in old and new:
            lines.extend(_elided(old, new))
        else:
            lines.extend(new)
    return lines


def _elided(old: list[str], new: list[str]) -> list[str]:
    """The printed lines ``new`` in place of ``old``, which holds ``...`` lines: a leading
    (or trailing) ``...`` still stands for all but the last (or first) lines that replace
    the other old lines, one for one; any other mix is shown in full."""
    others = len(old) - 1
    if old.count(ELLIPSIS) == 1 and others < len(new):
        if old[0] == ELLIPSIS:
            return [ELLIPSIS, *new[len(new) - others :]]
        if old[-1] == ELLIPSIS:
            return [*new[:others], ELLIPSIS]
    return new


def update(block: Block, outputs: list[str], text: str) -> str:
    """``text`` (the page) with the outputs of ``block`` that differ refreshed."""
    lines = text.splitlines(keepends=True)
    # From the last command up, so earlier line numbers stay right.
    for index in reversed(range(len(block.commands))):
        command, output = block.commands[index], outputs[index]
        if matches(command.expected, output):
            continue
        first = command.line  # the first expected line, counted from 0
        new = [f"{line}\n" for line in refreshed(command.expected, output)]
        lines[first : first + len(command.expected)] = new
    return "".join(lines)


def main(arguments: list[str]) -> int:
    write = arguments == ["--update"]
    if arguments and not write:
        print(f"usage: python docs/examples.py [--update]\n\n{__doc__}", file=sys.stderr)
        return 2
    failed = 0
    for page in PAGES:
        blocks = [block for block in shell_blocks(page) if block.marker == RUNNABLE]
        text = original = page.read_text(encoding="utf-8")
        for block in reversed(blocks):  # the last first: line numbers above stay right
            outputs = run_block(block)
            found = differences(block, outputs)
            if not found:
                continue
            failed += 1
            if write:
                text = update(block, outputs, text)
                print(f"{block.name}: refreshed")
            else:
                print(found, end="\n\n")
        if text != original:
            page.write_text(text, encoding="utf-8")
    print(f"{len(runnable_blocks())} runnable blocks, {failed} with other output")
    return 1 if failed and not write else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
