"""The flake8 plugin: the CLI's findings, file by file, as flake8 hands the files over.

flake8 gives the plugin one file at a time, but a file's findings depend on the rest of its
project (a wrapper defined in another module, a global written in another). So the plugin
asks the same engine the CLI uses, for the same project (``config.project_root``) with the
same settings (``[tool.ckptlint]``: select, ignore, exclude, per-file-ignores,
extend-checkpoint-functions, plus flake8's own ``--extend-checkpoint-functions``), and the
same cache: each flake8 process works the project out once (or reads it from the cache) and
then answers each file. The findings are the CLI's, at the same lines and columns.

flake8's ``--select``, ``--ignore``, ``--extend-select`` and ``--extend-ignore`` (from its
command line or its own configuration) are the command-line layer of ckptlint's selection,
with the CLI's precedence: ``flake8 --select CKP101`` reports CKP101 although
``[tool.ckptlint]`` ignores it, as ``ckptlint --select CKP101`` does. flake8 then applies
its own selection to what the plugin reports, which agrees.

``# noqa`` and ``# flake8: noqa`` are flake8's; the plugin adds what the CLI also honours:
``# noqa`` codes in any case, and ``# ckptlint: noqa[: codes]`` (unless flake8 runs with
``--disable-noqa``). No exception ever reaches flake8 (which would stop the whole run and
lose every other file's results): a bug of ours is a CKP901 finding with its message.
"""

from __future__ import annotations

import argparse
import ast
import gc
import multiprocessing.util
import os
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckptlint import __version__

if TYPE_CHECKING:
    from ckptlint.config import ProjectRoot
    from ckptlint.engine import Engine

Result = tuple[int, int, str, type]


class CheckpointChecker:
    name = "ckptlint"
    version = __version__

    extend_checkpoint_functions: tuple[str, ...] = ()
    disable_noqa = False
    # flake8's select (None: not given), extend-select and ignore options, as given.
    flake8_selection: tuple[tuple[str, ...] | None, tuple[str, ...], tuple[str, ...]] = (
        None,
        (),
        (),
    )
    # Per process: each project's engine (it keeps the project it worked out), by root.
    _engines: dict[tuple[Path, Path | None], Engine] = {}
    _roots: dict[str, ProjectRoot] = {}

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
        select = getattr(options, "select", None)
        cls.flake8_selection = (
            None if select is None else tuple(select),
            tuple(getattr(options, "extend_select", None) or ()),
            (
                *(getattr(options, "ignore", None) or ()),
                *(getattr(options, "extend_ignore", None) or ()),
            ),
        )
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
        (result,) = engine.lint([path], overrides, suppress=False, save=False)
        _out_of_the_collectors_way()
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
        from ckptlint.config import RootFinder, RuleSelection, load_settings
        from ckptlint.discovery import discover
        from ckptlint.engine import Engine
        from ckptlint.project import cache

        folder = os.path.dirname(path)
        root = cls._roots.get(folder)
        if root is None:
            root = cls._roots[folder] = RootFinder().root(Path(folder))
        key = (root.folder, root.pyproject)
        engine = cls._engines.get(key)
        if engine is None:
            select, extend_select, ignore = cls.flake8_selection
            settings = load_settings(root)
            settings = replace(
                settings,
                extend_checkpoint_functions=(
                    *settings.extend_checkpoint_functions,
                    *cls.extend_checkpoint_functions,
                ),
                command_line=RuleSelection(
                    select=None if select is None else _our_codes(select),
                    extend_select=_our_codes(extend_select),
                    ignore=_our_codes(ignore),
                ),
            )
            known = [f.path for f in discover([str(root.folder)], settings) if not f.error]
            identity = cache.analysis_key([str(root.folder), settings.analysis_identity])
            store = cache.Store.open(root.folder / cache.FOLDER, identity)
            stored = store if isinstance(store, cache.Store) else None
            engine = cls._engines[key] = Engine(settings, known, stored, 1)
            # What the findings learn of the project is stored once, when the process ends
            # (flake8's workers end through multiprocessing, which runs these; a serial run
            # at exit): saved after each file, it cost 200 rewrites of the project's entry
            # in a cold run over transformers 4.34.1, and 35 in a warm one.
            multiprocessing.util.Finalize(engine, engine.save, exitpriority=1)
        return None if engine.settings.is_excluded(path) else engine

    def _internal_error(self, message: str) -> Result:
        text = f"CKP901 file not analysed: internal error {message} (please report it to ckptlint)"
        return 1, 0, " ".join(text.split())[:500], type(self)


def _out_of_the_collectors_way() -> None:
    """Keep the cycle collector off what the engine keeps for the process.

    A flake8 process lives for one run, and the engine keeps its analysis (millions of
    objects) to answer the next file; every full collection that pyflakes' and pycodestyle's
    allocations set off walked all of it again: flake8's CPU x1.6 with the plugin on
    transformers 4.34.1, cold, where the plugin's own calls took a third of the difference,
    and the first warm run after that x1.4. Frozen (after a collection of the young
    generations, the garbage of the file just checked), it is never walked again."""
    gc.collect(1)
    gc.freeze()


def _our_codes(codes: Iterable[str]) -> tuple[str, ...]:
    """The codes of a flake8 option that can name a ckptlint rule (``CKP1``, ``C``)."""
    from ckptlint.rules import RULES_BY_CODE

    found = (code.strip().upper() for code in codes)
    return tuple(c for c in found if c and any(known.startswith(c) for known in RULES_BY_CODE))


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
