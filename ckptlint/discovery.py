"""Finding the Python files to lint under the paths given on the command line.

Every path is accounted for: a file to lint, or a problem to report (a missing path, a
folder that cannot be read). A file reached twice (named twice, through a symbolic link, as
an absolute and a relative path, or inside a folder also named) is linted once, under the
first spelling met, so ``--fix`` never edits it twice.

Folders are walked in name order. Skipped: the usual tool and environment folders,
virtualenvs, paths matching ``exclude``, and (with ``respect-gitignore``, the default) what
git ignores: ``.gitignore`` files of the repository and ``.git/info/exclude``, matched by
git's rules (``ckptlint.patterns``, in time linear in the path). An ignore file is read up
to its first ``MAX_ITEMS`` patterns, ``MAX_PATTERN_TEXT`` characters of them and 10 MiB: a
repository's file is untrusted input, and every pattern in force costs every path walked.

Only regular files are linted: a FIFO, socket or device (or a symbolic link to one, such as
``zero.py -> /dev/zero``) found in a folder is skipped, and one named on the command line
is reported (CKP902, "not a regular file: a FIFO"). A link that leads nowhere is kept, so
that reading it reports why.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

from ckptlint.config import MAX_ITEMS, MAX_PATTERN_TEXT, Settings
from ckptlint.patterns import Patterns, compiled
from ckptlint.source import DEFAULT_MAX_FILE_SIZE, CannotRead, read_head, special_kind

SKIPPED_FOLDERS = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        ".bzr",
        ".venv",
        "venv",
        ".tox",
        ".nox",
        ".eggs",
        "__pycache__",
        "__pypackages__",
        "build",
        "dist",
        "node_modules",
        "site-packages",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        ".hypothesis",
    }
)


@dataclass(frozen=True)
class SourceFile:
    path: str
    explicit: bool  # named on the command line rather than found in a folder
    error: str | None = None  # why the path cannot be linted (reported as CKP902)


def discover(
    paths: list[str], settings: Settings, notes: list[str] | None = None
) -> list[SourceFile]:
    """Files to lint and paths that cannot be, each once, in a stable order. ``notes``
    receives what the user should know (an ignore file read in part)."""
    found: dict[str, SourceFile] = {}

    def add(file: SourceFile, real: str) -> None:
        found.setdefault(real, file)

    for path in paths:
        if not os.path.lexists(path):
            add(SourceFile(path, explicit=True, error="no such file or folder"), path)
        elif os.path.isdir(path):
            if settings.is_excluded(path, is_folder=True):
                continue
            ignores = _GitIgnores.above(path, notes) if settings.respect_gitignore else None
            for file, real in _walk(path, settings, ignores):
                add(file, real)
        elif not settings.is_excluded(path):
            error = _not_regular(path)
            real = path if error else os.path.realpath(path)
            add(SourceFile(path, explicit=True, error=error), real)
    return list(found.values())


def files_to_lint(paths: list[str], settings: Settings) -> list[str]:
    """The paths of the files a run over ``paths`` lints (``--show-files``)."""
    return [file.path for file in discover(paths, settings) if file.error is None]


def _not_regular(path: str) -> str | None:
    """Why the file at ``path`` is not linted, when it is a FIFO, socket or device."""
    try:
        kind = special_kind(os.stat(path).st_mode)
    except OSError:
        return None  # a link that leads nowhere, a loop: reading it reports why
    return None if kind is None else f"not a regular file: {kind}"


@dataclass(frozen=True)
class _Folder:
    path: str
    real: str  # its path with every link resolved: a file's is this and its name
    ignores: _GitIgnores | None


def _walk(
    folder: str, settings: Settings, ignores: _GitIgnores | None
) -> Iterator[tuple[SourceFile, str]]:
    """The files under ``folder``, each with its real path, depth first, in name order,
    with a stack of the folders being listed: a repository can nest folders deeper than
    Python's recursion limit. Only the first folder and links are resolved by the system:
    a folder or file that is no link is its folder's real path and its name (a walk meets
    thousands of files in a few hundred folders)."""
    listings = [_listing(_Folder(folder, os.path.realpath(folder), ignores), settings)]
    while listings:
        item = next(listings[-1], None)
        if item is None:
            listings.pop()
        elif isinstance(item, _Folder):
            listings.append(_listing(item, settings))
        else:
            yield item


def _listing(folder: _Folder, settings: Settings) -> Iterator[tuple[SourceFile, str] | _Folder]:
    """The files to lint in one folder (with their real paths) and the sub-folders to walk,
    in name order."""
    try:
        with os.scandir(folder.path) as scan:
            entries = sorted(scan, key=lambda entry: entry.name)
    except OSError as error:
        reason = f"cannot read folder: {_reason(error)}"
        yield SourceFile(folder.path, explicit=False, error=reason), folder.path
        return
    ignores = folder.ignores.entering(folder.path) if folder.ignores is not None else None
    prefix = "" if folder.path == "." else os.path.join(os.path.normpath(folder.path), "")
    real_prefix = os.path.join(folder.real, "")
    for entry in entries:
        path = prefix + entry.name
        if _is_folder(entry):
            if entry.name in SKIPPED_FOLDERS or _is_virtualenv(path):
                continue
            if settings.is_excluded(path, is_folder=True, walked=True):
                continue
            if ignores is not None and ignores.ignores(path, is_folder=True):
                continue
            yield _Folder(path, real_prefix + entry.name, ignores)
        elif entry.name.endswith(".py") and not settings.is_excluded(path, walked=True):
            if ignores is None or not ignores.ignores(path, is_folder=False):
                if _may_be_regular(entry):
                    real = os.path.realpath(path) if _is_link(entry) else real_prefix + entry.name
                    yield SourceFile(path, explicit=False), real


def _is_folder(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def _is_link(entry: os.DirEntry) -> bool:
    try:
        return entry.is_symlink()
    except OSError:
        return True  # the system resolves it, or says why not


def _may_be_regular(entry: os.DirEntry) -> bool:
    """False for what is certainly no regular file: a FIFO, socket or device, or a link to
    one or to a folder."""
    try:
        if entry.is_file():  # follows links; no system call for a plain file
            return True
        entry.stat()  # raises for a link that leads nowhere
    except OSError:
        return True  # reading it reports why (CKP902)
    return False


def _is_virtualenv(folder: str) -> bool:
    return os.path.exists(os.path.join(folder, "pyvenv.cfg"))


def _reason(error: OSError) -> str:
    return error.strerror or str(error)


class _GitIgnores:
    """The gitignore rules in force in one folder of a git work tree.

    Each ``.gitignore`` applies to the paths below its own folder, relative to it; a deeper
    file's verdict (ignore, or ``!`` re-include) wins over a shallower one's. The walk
    never enters an ignored folder, so only the path itself is matched. At most
    ``MAX_ITEMS`` patterns of ``MAX_PATTERN_TEXT`` characters in all are in force at once
    (each costs every path walked): those of a file past that are not honoured, and the user
    is told.
    """

    def __init__(self, specs: tuple[tuple[str, Patterns], ...], notes: list[str] | None) -> None:
        self.specs = specs  # (absolute folder, its rules), outermost first
        self.notes = notes
        self.in_force = sum(len(rules.patterns) for _, rules in specs)
        self.text_in_force = sum(len(p.text) for _, rules in specs for p in rules.patterns)

    @classmethod
    def above(cls, folder: str, notes: list[str] | None) -> _GitIgnores | None:
        """The rules of the work tree around ``folder`` and of the folders above it; None
        outside a git work tree (git itself reads no .gitignore there)."""
        start = os.path.abspath(folder)
        chain = []
        current = start
        while True:
            chain.append(current)
            if os.path.exists(os.path.join(current, ".git")):
                break
            parent = os.path.dirname(current)
            if parent == current:
                return None
            current = parent
        root = chain[-1]
        ignores = cls((), notes)
        ignores = ignores.reading(root, os.path.join(root, ".git", "info", "exclude"))
        for ancestor in reversed(chain[1:]):  # the start folder is read when it is walked
            ignores = ignores.reading(ancestor, os.path.join(ancestor, ".gitignore"))
        return ignores

    def entering(self, folder: str) -> _GitIgnores:
        path = os.path.normpath(os.path.join(folder, ".gitignore"))
        return self.reading(os.path.abspath(folder), path)

    def reading(self, base: str, path: str) -> _GitIgnores:
        """These rules and those of the ignore file ``path``, for the paths below ``base``."""
        rules = _read_rules(
            path, MAX_ITEMS - self.in_force, MAX_PATTERN_TEXT - self.text_in_force, self.notes
        )
        if rules is None:
            return self
        return _GitIgnores((*self.specs, (base, rules)), self.notes)

    def ignores(self, path: str, *, is_folder: bool) -> bool:
        absolute = os.path.abspath(path)
        for base, rules in reversed(self.specs):
            relative = os.path.relpath(absolute, base).replace(os.sep, "/")
            verdict = rules.verdict(relative, is_folder=is_folder)
            if verdict is not None:
                return verdict
        return False


def _read_rules(path: str, room: int, text_room: int, notes: list[str] | None) -> Patterns | None:
    """The rules of an ignore file: its first ``room`` patterns at most, of ``text_room``
    characters in all, from its first 10 MiB; None when there is none (or it is a FIFO, a
    device...). What is left out is named in ``notes``."""
    try:
        data, cut = read_head(path)
    except CannotRead:
        return None
    left_out = []
    if cut:
        data = data[: data.rfind(b"\n") + 1]  # the last whole line
        left_out.append(f"over {DEFAULT_MAX_FILE_SIZE} bytes: only its first lines are read")
    lines = data.decode("utf-8", errors="replace").splitlines()
    patterns = [line for line in lines if line.strip() and not line.startswith("#")]
    if len(patterns) > room:
        left_out.append(
            f"{len(patterns)} patterns, {MAX_ITEMS} in force at most: only the first "
            f"{max(room, 0)} are honoured"
        )
        patterns = patterns[: max(room, 0)]
    kept = 0
    for pattern in patterns:
        if len(pattern) > text_room:
            left_out.append(
                f"patterns of more than {MAX_PATTERN_TEXT} characters in all are not in force "
                f"at once: only the first {kept} are honoured"
            )
            patterns = patterns[:kept]
            break
        text_room -= len(pattern)
        kept += 1
    if notes is not None:
        notes.extend(f"{path}: {reason}" for reason in left_out)
    rules = compiled(tuple(patterns))
    return rules if rules else None
