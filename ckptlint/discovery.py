"""Finding the Python files to lint under the paths given on the command line."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

from ckptlint.config import Settings

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


class MissingPath(Exception):
    """A path given on the command line does not exist."""


@dataclass(frozen=True)
class SourceFile:
    path: str
    explicit: bool  # named on the command line rather than found in a folder


def discover(paths: list[str], settings: Settings) -> list[SourceFile]:
    """Files to lint, in a stable order; a missing path raises MissingPath."""
    missing = [path for path in paths if not os.path.exists(path)]
    if missing:
        raise MissingPath(", ".join(missing))
    found: dict[str, SourceFile] = {}
    for path in paths:
        if os.path.isdir(path):
            for file in _walk(path, settings):
                found.setdefault(file, SourceFile(file, explicit=False))
        elif not settings.is_excluded(path):
            found[path] = SourceFile(path, explicit=True)
    return list(found.values())


def _walk(folder: str, settings: Settings) -> Iterator[str]:
    try:
        entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
    except OSError:
        return
    for entry in entries:
        path = os.path.normpath(entry.path) if folder != "." else entry.name
        if entry.is_dir(follow_symlinks=False):
            if entry.name in SKIPPED_FOLDERS or _is_virtualenv(entry.path):
                continue
            if not settings.is_excluded(path):
                yield from _walk(path, settings)
        elif entry.name.endswith(".py") and not settings.is_excluded(path):
            yield path


def _is_virtualenv(folder: str) -> bool:
    return os.path.exists(os.path.join(folder, "pyvenv.cfg"))
