"""Module names of files, and files of module names, as Python's import system would see them.

A file's module name comes from the packages (folders with ``__init__.py``) above it; the
first folder above them is an import root, as a ``sys.path`` entry would be (where a script
run from that folder, or pytest, imports it from). Folders without ``__init__.py`` are
namespace packages (PEP 420) where the import system would see them as such: inside a
regular package, or between the file and a project root (a folder holding
``pyproject.toml``, ``setup.py``, ``setup.cfg`` or ``.git``) or a source folder of one
(``src/``). So ``proj/pkg/models/block.py`` is ``pkg.models.block`` and its
``from ..utils import f`` resolves, while ``proj/pkg/models/`` stays an import root too.
Several source folders may each hold a part of one namespace package. The project's files
are registered up front; a module none of them provides is looked for under those roots on
disk (an excluded or git-ignored file is still importable). Within a root a package
(``blocks/__init__.py``) wins over a module of the same name (``blocks.py``), and a folder
without ``__init__.py`` is a namespace package, as in Python's ``FileFinder``.

Every answer a computation gets is recorded with the ``recorder`` (the run's solver) as a
``ResolvedRead`` or a ``PackageRead`` (see ``project.facts``): what a result depended on is
what the cache checks before it reuses the result.
"""

from __future__ import annotations

import keyword
import os
from collections.abc import Iterable

from ckptlint.project.facts import PackageRead, Recorder, ResolvedRead


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
        self._project_roots: dict[str, bool] = {}  # folder: holds a project marker
        self._folder_splits: dict[str, tuple[str, str, tuple[str, ...]]] = {}
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
            root, first, parts = self._split(absolute)
            name = ".".join(parts)
            self._names[absolute] = name
            present = self._registered.get(name)
            if present is None or _shadows(absolute, present):
                self._registered[name] = absolute
                self._found.pop(name, None)
            for folder in (first, root):
                if folder not in self._root_set:
                    self._root_set.add(folder)
                    self.roots.append(folder)
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
            parts = self._split(absolute)[2]
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
            self.recorder.read(ResolvedRead(name, found))
        return found

    def is_project_package(self, name: str) -> bool:
        """A folder of the project that imports can name, with or without ``__init__.py``."""
        found = self._project_packages.get(name)
        if found is None:
            parts = name.split(".")
            found = any(self._is_folder(root, parts) for root in self._roots_holding(parts[0]))
            self._project_packages[name] = found
        if self.recorder is not None:
            self.recorder.read(PackageRead(name, found))
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

    def _split(self, path: str) -> tuple[str, str, list[str]]:
        """The import root of ``path``, the first folder above its packages (an import root
        too: a script run there, or pytest, imports from it) and the module name's parts."""
        folder, filename = os.path.split(path)
        stem = filename[:-3] if filename.endswith(".py") else filename
        split = self._folder_splits.get(folder)
        if split is None:
            split = self._folder_splits[folder] = self._split_folder(folder)
        root, first, packages = split
        return root, first, [*packages] if stem == "__init__" else [*packages, stem]

    def _split_folder(self, folder: str) -> tuple[str, str, tuple[str, ...]]:
        """``_split`` of the files in ``folder`` (the same for all: a file's stem only ends
        its module name), the packages' names aside from the file's own.

        Above the packages, folders without ``__init__.py`` are namespace packages up to a
        project root, or up to a source folder directly inside one (``src/``); without
        either, up to the last regular package crossed (``pkg/models/`` in ``pkg/``). A
        folder whose name is no identifier ends the walk, as do ``MAX_NAMESPACE_DEPTH``
        folders.
        """
        parts = self._above_packages(folder, [])
        first = folder = parts.pop(0)
        found = (first, parts)
        for _ in range(MAX_NAMESPACE_DEPTH + 1):  # each namespace folder, then the root
            if self._is_project_root(folder):
                return folder, first, tuple(parts)
            parent, name = os.path.split(folder)
            if name in _SOURCE_FOLDERS and self._is_project_root(parent):
                return folder, first, tuple(parts)
            if parent == folder or not name.isidentifier() or keyword.iskeyword(name):
                break
            above = self._above_packages(parent, [name, *parts])
            folder = above.pop(0)
            if folder != parent:  # a namespace package inside a regular one
                found = (folder, above)
            parts = above
        return found[0], first, tuple(found[1])

    def _above_packages(self, folder: str, parts: list[str]) -> list[str]:
        """The first folder from ``folder`` up that is no package, then the names of the
        packages crossed and ``parts``."""
        while self._is_package_folder(folder):
            parent, package = os.path.split(folder)
            if parent == folder:
                break
            parts = [package, *parts]
            folder = parent
        return [folder, *parts]

    def _is_package_folder(self, folder: str) -> bool:
        found = self._packages.get(folder)
        if found is None:
            found = self._packages[folder] = os.path.isfile(os.path.join(folder, "__init__.py"))
        return found

    def _is_project_root(self, folder: str) -> bool:
        found = self._project_roots.get(folder)
        if found is None:
            found = any(
                os.path.isfile(os.path.join(folder, m)) for m in _PROJECT_MARKERS
            ) or os.path.exists(os.path.join(folder, ".git"))
            self._project_roots[folder] = found
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


# What makes a folder a project root (as ``config.project_root`` finds one, with ``.git``).
_PROJECT_MARKERS = ("pyproject.toml", "setup.py", "setup.cfg")
_SOURCE_FOLDERS = frozenset({"src", "lib", "python"})
# Namespace packages nested deeper than this above a file's packages are not looked for (a
# bound on the walk up from each file; what each folder is, is read once a run).
MAX_NAMESPACE_DEPTH = 32


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
