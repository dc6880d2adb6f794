"""The flake8 plugin: the CLI's findings, file by file, as flake8 hands the files over.

flake8 gives the plugin one file at a time, but a file's findings depend on the rest of its
project (a wrapper defined in another module, a global written in another). So the plugin
asks the same engine the CLI uses, for the same project (``config.project_root``) with the
same settings (``[tool.ckptlint]``: select, ignore, exclude, per-file-ignores,
extend-checkpoint-functions, plus flake8's own ``--extend-checkpoint-functions``), and the
same cache: each flake8 process works the project out once (or reads it from the cache) and
then answers each file. The findings are the CLI's, at the same lines and columns.

``# noqa`` and ``# flake8: noqa`` are flake8's; the plugin adds what the CLI also honours:
``# noqa`` codes in any case, and ``# ckptlint: noqa[: codes]`` (unless flake8 runs with
``--disable-noqa``). No exception ever reaches flake8 (which would stop the whole run and
lose every other file's results): a bug of ours is a CKP901 finding with its message.
"""

from __future__ import annotations

import argparse
import ast
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckptlint import __version__

if TYPE_CHECKING:
    from ckptlint.engine import Engine

Result = tuple[int, int, str, type]


class CheckpointChecker:
    name = "ckptlint"
    version = __version__

    extend_checkpoint_functions: tuple[str, ...] = ()
    disable_noqa = False
    # Per process: each project's engine (it keeps the project it worked out), by root.
    _engines: dict[tuple[Path, tuple[str, ...]], Engine | None] = {}
    _roots: dict[str, Any] = {}

    def __init__(self, tree: ast.Module, lines: list[str], filename: str = "stdin") -> None:
        self.tree = tree
        self.lines = lines
        self.filename = filename

    @classmethod
    def add_options(cls, option_manager: Any) -> None:
        option_manager.add_option(
            "--extend-checkpoint-functions",
            default="",
            parse_from_config=True,
            comma_separated_list=True,
            help="Qualified names of your own wrappers to treat like torch's checkpoint "
            "(ckptlint; added to [tool.ckptlint]'s). Default: none",
        )

    @classmethod
    def parse_options(cls, options: argparse.Namespace) -> None:
        cls.extend_checkpoint_functions = tuple(options.extend_checkpoint_functions or ())
        cls.disable_noqa = bool(getattr(options, "disable_noqa", False))
        cls._engines = {}

    def run(self) -> Iterator[Result]:
        try:
            results = list(self._check())
        except Exception as error:  # RecursionError and MemoryError included
            results = [self._internal_error(str(f"{type(error).__name__}: {error}"))]
        yield from results

    def _check(self) -> Iterator[Result]:
        path = self._path()
        engine = self._engine(path)
        if engine is None:
            return  # excluded by the project's configuration
        text = "".join(self.lines)
        overrides = {} if _is_disk_text(path, text) else {path: text.encode("utf-8", "replace")}
        (result,) = engine.lint([path], overrides, suppress=False)
        if result.internal_error is not None:
            yield self._internal_error(result.internal_error)
            return
        from ckptlint.noqa import file_exemption, is_suppressed

        exemption = None if self.disable_noqa else file_exemption(text)
        for finding in result.findings:
            if not self.disable_noqa:
                if exemption is not None and exemption.covers(finding.code):
                    continue
                line = self.lines[finding.line - 1] if 0 < finding.line <= len(self.lines) else ""
                if is_suppressed(line, finding.code):
                    continue
            yield finding.line, finding.column - 1, f"{finding.code} {finding.message}", type(self)

    def _path(self) -> str:
        """The file flake8 names (standard input: a file of the working folder)."""
        if self.filename in ("stdin", "-"):
            return os.path.abspath("stdin.py")
        return os.path.abspath(self.filename)

    @classmethod
    def _engine(cls, path: str) -> Engine | None:
        """The engine of the file's project, made once a process; None when the project's
        configuration excludes the file."""
        from ckptlint.config import load_settings, project_root
        from ckptlint.discovery import discover
        from ckptlint.engine import Engine
        from ckptlint.project import cache

        folder = os.path.dirname(path)
        root = cls._roots.get(folder)
        if root is None:
            found = project_root(Path(folder))
            root = cls._roots[folder] = found or _loose_root(folder)
        settings = load_settings(root)
        settings = replace(
            settings,
            extend_checkpoint_functions=(
                *settings.extend_checkpoint_functions,
                *cls.extend_checkpoint_functions,
            ),
        )
        if settings.is_excluded(path):
            return None
        key = (root.folder, cls.extend_checkpoint_functions)
        if key not in cls._engines:
            known = [f.path for f in discover([str(root.folder)], settings) if not f.error]
            identity = cache.analysis_key([str(root.folder), settings.analysis_identity])
            store = cache.Store.open(root.folder / cache.FOLDER, identity)
            stored = store if isinstance(store, cache.Store) else None
            cls._engines[key] = Engine(settings, known, stored, 1)
        return cls._engines[key]

    def _internal_error(self, message: str) -> Result:
        text = f"CKP901 file not analysed: internal error {message} (please report it to ckptlint)"
        return 1, 0, " ".join(text.split())[:500], type(self)


def _loose_root(folder: str) -> Any:
    from ckptlint.config import loose_root

    return loose_root([Path(folder)])


def _is_disk_text(path: str, text: str) -> bool:
    """Whether flake8's text is the file's own (it reads with universal newlines). A file
    the CLI cannot take as text (not UTF-8 nor its declared coding, which flake8 then reads
    as latin-1; over the size cap) is the file's own too: linted from its bytes, it gets the
    CLI's CKP901. Only text with no file behind it (standard input) is linted as given."""
    from ckptlint.source import CannotRead, UnreadableSource, decode, read_bytes

    try:
        data = read_bytes(path)
    except CannotRead:
        return os.path.isfile(path)
    try:
        disk = decode(data)
    except UnreadableSource:
        return True
    text = text.removeprefix("\ufeff")
    if disk == text:
        return True
    return disk.replace("\r\n", "\n").replace("\r", "\n") == text.replace("\r\n", "\n")
