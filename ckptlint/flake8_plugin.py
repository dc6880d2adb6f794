"""The flake8 plugin: the same rules on the tree flake8 already parsed.

flake8 runs every installed plugin on every file whatever ``--select`` says, so this module
imports nothing heavy, and a file whose text cannot reach a checkpoint function costs one
regular-expression scan. ``# noqa``, ``# flake8: noqa`` and per-file ignores are flake8's;
the plugin adds what the CLI also honours: ``# noqa`` codes in any case, and
``# ckptlint: noqa[: codes]`` (unless flake8 runs with ``--disable-noqa``).

No exception ever reaches flake8 (which would stop the whole run and lose every other
file's results): input nested too deeply to analyse is a CKP901 finding, and so is a bug of
ours, with its message.
"""

from __future__ import annotations

import argparse
import ast
from collections.abc import Iterator
from typing import Any

from ckptlint import __version__
from ckptlint.source import Prefilter

Result = tuple[int, int, str, type]


class CheckpointChecker:
    name = "ckptlint"
    version = __version__

    extend_checkpoint_functions: tuple[str, ...] = ()
    disable_noqa = False
    _prefilter = Prefilter()

    def __init__(self, tree: ast.Module, lines: list[str]) -> None:
        self.tree = tree
        self.lines = lines

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
        cls._prefilter = Prefilter(cls.extend_checkpoint_functions)

    def run(self) -> Iterator[Result]:
        try:
            results = list(self._check())
        except Exception as error:  # RecursionError and MemoryError included
            results = [self._internal_error(error)]
        yield from results

    def _check(self) -> Iterator[Result]:
        text = "".join(self.lines)
        if not self._prefilter.passes(text.encode(errors="surrogatepass")):
            return
        from ckptlint.engine import analyze_safely
        from ckptlint.noqa import file_exemption, is_suppressed
        from ckptlint.resolve import Targets
        from ckptlint.rules import ALL_RULES

        exemption = None if self.disable_noqa else file_exemption(text)
        if exemption is not None and not exemption.codes:
            return
        targets = Targets.with_extensions(self.extend_checkpoint_functions)
        selected = frozenset(rule.code for rule in ALL_RULES)
        for finding in analyze_safely(self.tree, self.lines, targets, selected):
            if not self.disable_noqa:
                if exemption is not None and exemption.covers(finding.code):
                    continue
                line = self.lines[finding.line - 1] if 0 < finding.line <= len(self.lines) else ""
                if is_suppressed(line, finding.code):
                    continue
            yield finding.line, finding.column - 1, f"{finding.code} {finding.message}", type(self)

    def _internal_error(self, error: Exception) -> Result:
        message = (
            f"CKP901 file not analysed: internal error {type(error).__name__}: {error}"
            " (please report it to ckptlint)"
        )
        return 1, 0, " ".join(message.split())[:500], type(self)
