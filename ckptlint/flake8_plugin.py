"""The flake8 plugin: the same rules on the tree flake8 already parsed.

flake8 runs every installed plugin on every file whatever ``--select`` says, so this module
imports nothing heavy, and a file whose text cannot reach a checkpoint function costs one
regular-expression scan. ``# noqa``, ``# flake8: noqa`` and per-file ignores are flake8's;
the plugin adds what the CLI also honours: ``# noqa`` codes in any case, and
``# ckptlint: noqa[: codes]`` (unless flake8 runs with ``--disable-noqa``).

flake8 hands over one file at a time. Regions are still followed into the modules they run
(read from disk, as the CLI does); the names of a project's own wrappers and layer
subclasses defined in other files come from the cache a CLI run wrote
(``.ckptlint_cache/words.json``): without it, calls of those are not recognised.

No exception ever reaches flake8 (which would stop the whole run and lose every other
file's results): input nested too deeply to analyse is a CKP901 finding, and so is a bug of
ours, with its message.
"""

from __future__ import annotations

import argparse
import ast
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckptlint import __version__
from ckptlint.project.cache import project_words
from ckptlint.regions.sources import SourceTable, configured_source
from ckptlint.source import Prefilter

if TYPE_CHECKING:
    from ckptlint.engine import Linter

Result = tuple[int, int, str, type]


class CheckpointChecker:
    name = "ckptlint"
    version = __version__

    extend_checkpoint_functions: tuple[str, ...] = ()
    disable_noqa = False
    _cached: tuple[tuple[str, ...], Linter] | None = None
    _projects: dict[str, tuple[frozenset[str], Prefilter]] = {}
    _table_words: frozenset[str] = SourceTable.build().words
    _prefilter = Prefilter(_table_words)

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
            "(ckptlint). Default: none",
        )

    @classmethod
    def parse_options(cls, options: argparse.Namespace) -> None:
        cls.extend_checkpoint_functions = tuple(options.extend_checkpoint_functions or ())
        cls.disable_noqa = bool(getattr(options, "disable_noqa", False))
        # The table alone (not the linter, whose import is most of the plugin's start-up):
        # a run over files that cannot reach a checkpoint never imports the analysis.
        extra = [configured_source(name) for name in cls.extend_checkpoint_functions]
        cls._table_words = SourceTable.build(extra).words
        cls._prefilter = Prefilter(cls._table_words)

    def run(self) -> Iterator[Result]:
        try:
            results = list(self._check())
        except Exception as error:  # RecursionError and MemoryError included
            results = [self._internal_error(error)]
        yield from results

    def _check(self) -> Iterator[Result]:
        text = "".join(self.lines)
        words, prefilter = self._project_words()
        if not prefilter.passes(text.encode(errors="surrogatepass")):
            return
        from ckptlint.noqa import file_exemption, is_suppressed

        exemption = None if self.disable_noqa else file_exemption(text)
        if exemption is not None and not exemption.codes:
            return
        linter = self._linter()
        linter.discovered_words = words
        for finding in linter.analyze_tree(self.tree, self.lines, self.filename):
            if not self.disable_noqa:
                if exemption is not None and exemption.covers(finding.code):
                    continue
                line = self.lines[finding.line - 1] if 0 < finding.line <= len(self.lines) else ""
                if is_suppressed(line, finding.code):
                    continue
            yield finding.line, finding.column - 1, f"{finding.code} {finding.message}", type(self)

    def _project_words(self) -> tuple[frozenset[str], Prefilter]:
        """The words a CLI run cached for this file's project (its wrappers, layer
        subclasses...), and the prefilter that looks for them too; per folder, once."""
        folder = os.path.dirname(os.path.abspath(self.filename))
        found = self._projects.get(folder)
        if found is None:
            words = project_words(Path(folder))
            prefilter = Prefilter(self._table_words | words) if words else self._prefilter
            found = self._projects[folder] = (words, prefilter)
        return found

    @classmethod
    def _linter(cls) -> Linter:
        """A linter with every rule selected (flake8 selects) and the configured wrappers."""
        from ckptlint.config import Settings
        from ckptlint.engine import Linter

        key = cls.extend_checkpoint_functions
        if cls._cached is None or cls._cached[0] != key:
            cls._cached = (key, Linter(Settings(extend_checkpoint_functions=key)))
        return cls._cached[1]

    def _internal_error(self, error: Exception) -> Result:
        message = (
            f"CKP901 file not analysed: internal error {type(error).__name__}: {error}"
            " (please report it to ckptlint)"
        )
        return 1, 0, " ".join(message.split())[:500], type(self)
