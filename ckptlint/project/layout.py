"""Module names of files, and files of module names, as Python's import system would see them.

A file's module name comes from the packages (folders with ``__init__.py``) above it; the
first folder above them is an import root, as a ``sys.path`` entry would be. A module that
no linted file names is looked for under those roots on disk, so a run over one file still
resolves ``from .layers import Block`` into the file next to it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable


class Layout:
    def __init__(self, files: Iterable[str] = ()) -> None:
        self.roots: list[str] = []
        self._paths: dict[str, str | None] = {}
        self._names: dict[str, str] = {}
        for path in files:
            self.add(path)

    def add(self, path: str) -> str:
        """Register a file; returns its module name."""
        absolute = os.path.abspath(path)
        name = self._names.get(absolute)
        if name is None:
            root, parts = _split_at_root(absolute)
            name = ".".join(parts)
            self._names[absolute] = name
            self._paths.setdefault(name, absolute)
            if root not in self.roots:
                self.roots.append(root)
        return name

    def module_name(self, path: str) -> str:
        return self._names.get(os.path.abspath(path)) or self.add(path)

    def is_package(self, path: str) -> bool:
        return os.path.basename(path) == "__init__.py"

    def find(self, name: str) -> str | None:
        """The file of module ``name`` (a package's ``__init__.py``), or None."""
        if name in self._paths:
            return self._paths[name]
        found = None
        relative = name.replace(".", os.sep)
        for root in self.roots:
            for candidate in (
                os.path.join(root, relative + ".py"),
                os.path.join(root, relative, "__init__.py"),
            ):
                if os.path.isfile(candidate):
                    found = candidate
                    break
            if found:
                break
        self._paths[name] = found
        if found is not None:
            self._names.setdefault(found, name)
        return found

    @property
    def missing(self) -> set[str]:
        """Module names looked for and not found (a new file may provide one)."""
        return {name for name, path in self._paths.items() if path is None}

    def is_project_package(self, name: str) -> bool:
        """A folder of the project that imports can name, with or without ``__init__.py``."""
        relative = name.replace(".", os.sep)
        return any(os.path.isdir(os.path.join(root, relative)) for root in self.roots)


_PROJECT_MARKERS = ("pyproject.toml", "setup.py", "setup.cfg")
_SOURCE_FOLDERS = frozenset({"src", "lib", "python"})


def _split_at_root(path: str) -> tuple[str, list[str]]:
    """The import root above ``path`` and the module name parts below it.

    The root is the first folder above the packages; but a folder without ``__init__.py``
    directly inside a project (``megatron/`` next to ``pyproject.toml``) is a namespace
    package, and the project folder is the root.
    """
    folder, filename = os.path.split(path)
    stem = filename[:-3] if filename.endswith(".py") else filename
    parts = [] if stem == "__init__" else [stem]
    while os.path.isfile(os.path.join(folder, "__init__.py")):
        folder, package = os.path.split(folder)
        parts.insert(0, package)
        if not package:
            break
    parent, name = os.path.split(folder)
    if (
        len(parts) > 1
        and name.isidentifier()
        and name not in _SOURCE_FOLDERS
        and any(os.path.isfile(os.path.join(parent, marker)) for marker in _PROJECT_MARKERS)
    ):
        return parent, [name, *parts]
    return folder, parts


def resolve_relative(current: str, is_package: bool, level: int, module: str) -> str | None:
    """The absolute name of ``from <level dots><module> import ...`` written in ``current``."""
    if level == 0:
        return module
    parts = current.split(".") if current else []
    if not is_package:
        parts = parts[:-1]
    if level - 1 > len(parts):
        return None
    base = parts[: len(parts) - (level - 1)]
    return ".".join([*base, module] if module else base)
