"""The flake8 plugin: the same rules on the tree flake8 already parsed.

flake8 runs every installed plugin on every file whatever ``--select`` says, so this module
imports nothing heavy, and a file whose text cannot reach a checkpoint function costs one
regular-expression scan. ``# noqa`` and per-file ignores are left to flake8 itself.
"""

from __future__ import annotations

import argparse
import ast
from collections.abc import Iterator
from typing import Any

from ckptlint import __version__
from ckptlint.regions.sources import SourceTable
from ckptlint.source import Prefilter


class CheckpointChecker:
    name = "ckptlint"
    version = __version__

    extend_checkpoint_functions: tuple[str, ...] = ()
    _prefilter = Prefilter(SourceTable.build().words)

    def __init__(self, tree: ast.Module, lines: list[str], filename: str) -> None:
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
        from ckptlint.config import Settings
        from ckptlint.engine import Linter

        linter = Linter(Settings(extend_checkpoint_functions=cls.extend_checkpoint_functions))
        cls._prefilter = Prefilter(linter.table.words)

    def run(self) -> Iterator[tuple[int, int, str, type]]:
        if not self._prefilter.passes("".join(self.lines).encode()):
            return
        from ckptlint.config import Settings
        from ckptlint.engine import Linter

        linter = Linter(Settings(extend_checkpoint_functions=self.extend_checkpoint_functions))
        for finding in linter.analyze_tree(self.tree, self.lines, self.filename):
            yield finding.line, finding.column - 1, f"{finding.code} {finding.message}", type(self)
