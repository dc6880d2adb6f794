"""Module names of files, and files of module names, as Python's import system would see them.

A file's module name comes from the packages (folders with ``__init__.py``) above it; the
first folder above them is an import root, as a ``sys.path`` entry would be. The project's
files are registered up front; a module none of them provides is looked for under those
roots on disk (an excluded or git-ignored file is still importable). Within a root a package
(``blocks/__init__.py``) wins over a module of the same name (``blocks.py``), and a folder
without ``__init__.py`` is a namespace package, as in Python's ``FileFinder``.

Every answer a computation gets is recorded with the ``recorder`` (the run's solver): what a
result depended on is what the cache checks before it reuses the result.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ckptlint.project.index import Recorder


class Layout:
    def __init__(self, files: Iterable[str] = ()) -> None:
        self.roots: list[str] = []
        self._root_set: set[str] = set()
        self._registered: dict[str, str] = {}  # module name -> file, from the project's files
        self._names: dict[str, str] = {}  # absolute file -> module name
        self._found: dict[str, str | None] = {}
        self._found_names: dict[str, str] = {}  # a file found on disk: the name it was found by
        self._listings: dict[str, frozenset[str]] = {}
        self._packages: dict[str, bool] = {}  # folder: holds an __init__.py
        self._project_packages: dict[str, bool] = {}
        self._roots_naming: dict[str, list[str]] | None = None
        self.recorder: Recorder | None = None
        for path in files:
            self.add(path)

    def add(self, path: str) -> str:
        """Register a file; returns its module name."""
        absolute = os.path.abspath(path)
        name = self._names.get(absolute)
        if name is None:
            root, parts = _split_at_root(absolute, self._is_package_folder)
            name = ".".join(parts)
            self._names[absolute] = name
            present = self._registered.get(name)
            if present is None or _shadows(absolute, present):
                self._registered[name] = absolute
                self._found.pop(name, None)
            if root not in self._root_set:
                self._root_set.add(root)
                self.roots.append(root)
                self._roots_naming = None
                self._project_packages.clear()
        return name

    def module_name(self, path: str) -> str:
        """The module name of a file: registered, else the name it was found by, else the
        name its folders give it (asking never registers a file: roots come from the
        project's files alone)."""
        absolute = os.path.abspath(path)
        name = self._names.get(absolute) or self._found_names.get(absolute)
        if name is None:
            parts = _split_at_root(absolute, self._is_package_folder)[1]
            name = self._found_names[absolute] = ".".join(parts)
        return name

    def is_package(self, path: str) -> bool:
        return os.path.basename(path) == "__init__.py"

    def find(self, name: str) -> str | None:
        """The file of module ``name`` (a package's ``__init__.py``), or None."""
        if name in self._found:
            found = self._found[name]
        else:
            found = self._registered.get(name)
            if found is None:
                found = self._on_disk(name)
                if found is not None:
                    self._found_names.setdefault(found, name)
            self._found[name] = found
        if self.recorder is not None:
            self.recorder.read(("resolved", name), found)
        return found

    def is_project_package(self, name: str) -> bool:
        """A folder of the project that imports can name, with or without ``__init__.py``."""
        found = self._project_packages.get(name)
        if found is None:
            parts = name.split(".")
            found = any(self._is_folder(root, parts) for root in self._roots_holding(parts[0]))
            self._project_packages[name] = found
        if self.recorder is not None:
            self.recorder.read(("package", name), found)
        return found

    def _on_disk(self, name: str) -> str | None:
        parts = name.split(".")
        for root in self._roots_holding(parts[0], f"{parts[0]}.py"):
            if self._is_folder(root, parts):
                package = os.path.join(root, *parts, "__init__.py")
                if os.path.isfile(package):
                    return package
            folder = os.path.join(root, *parts[:-1])
            if f"{parts[-1]}.py" in self._listing(folder):
                module = os.path.join(folder, f"{parts[-1]}.py")
                if os.path.isfile(module):
                    return module
        return None

    def _roots_holding(self, *names: str) -> list[str]:
        """The roots (in order) whose folder holds one of ``names``: a lookup of ``torch``
        asks a few roots, not the hundreds a tree of loose scripts has."""
        if self._roots_naming is None:
            self._roots_naming = {}
            for root in self.roots:
                for entry in self._listing(root):
                    self._roots_naming.setdefault(entry, []).append(root)
        found: list[str] = []
        for name in names:
            found.extend(r for r in self._roots_naming.get(name, ()) if r not in found)
        return sorted(found, key=self.roots.index) if len(names) > 1 else found

    def _is_package_folder(self, folder: str) -> bool:
        found = self._packages.get(folder)
        if found is None:
            found = self._packages[folder] = os.path.isfile(os.path.join(folder, "__init__.py"))
        return found

    def _is_folder(self, root: str, parts: list[str]) -> bool:
        folder = root
        for part in parts:
            if part not in self._listing(folder):
                return False
            folder = os.path.join(folder, part)
        return os.path.isdir(folder)

    def _listing(self, folder: str) -> frozenset[str]:
        """The names in a folder, read once a run (most lookups miss: ``torch``, ``numpy``)."""
        names = self._listings.get(folder)
        if names is None:
            try:
                names = frozenset(os.listdir(folder))
            except OSError:
                names = frozenset()
            self._listings[folder] = names
        return names


def _shadows(candidate: str, present: str) -> bool:
    """Whether ``candidate`` takes the name from ``present``: a package shadows a module of
    the same name in the same folder (``blocks/__init__.py`` over ``blocks.py``)."""
    if os.path.basename(candidate) != "__init__.py":
        return False
    package_folder = os.path.dirname(candidate)
    return present == package_folder + ".py"


_PROJECT_MARKERS = ("pyproject.toml", "setup.py", "setup.cfg")
_SOURCE_FOLDERS = frozenset({"src", "lib", "python"})


def _split_at_root(path: str, is_package: Callable[[str], bool]) -> tuple[str, list[str]]:
    """The import root above ``path`` and the module name parts below it.

    The root is the first folder above the packages; but a folder without ``__init__.py``
    directly inside a project (``megatron/`` next to ``pyproject.toml``) is a namespace
    package, and the project folder is the root.
    """
    folder, filename = os.path.split(path)
    stem = filename[:-3] if filename.endswith(".py") else filename
    parts = [] if stem == "__init__" else [stem]
    while is_package(folder):
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
