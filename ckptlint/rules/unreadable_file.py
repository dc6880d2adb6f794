"""CKP901: a file that could not be decoded, parsed or analysed."""

from __future__ import annotations

from collections.abc import Iterator

from ckptlint.rules.base import (
    FileContext,
    Finding,
    Rule,
)


class UnreadableFile(Rule):
    """A file could not be decoded, parsed or analysed, so it was not checked.

    Reported for syntax errors (at the line and column Python names), bytes that are not
    valid in the file's encoding (UTF-8 unless a BOM or a `# -*- coding: ... -*-` line says
    otherwise), text in UTF-16 or UTF-32 (which Python cannot read as source; the message
    names the encoding), NUL bytes, and code nested too deeply for Python's parser or for
    the analysis ("too deeply nested to analyse": split the expression), and files larger
    than `max-file-size` (10 MiB unless `[tool.ckptlint]` says otherwise), which are never
    read whole. Every file that is parsed has its syntax errors reported, also in bodies no
    rule needed to read.

    ## Why is this bad?

    Nothing in the file was checked. The rest of the run goes on; the exit code is
    non-zero. Fix the file (or exclude it in `[tool.ckptlint]`).

    ## Not reported

    A file is decoded and parsed only when its text can reach a checkpoint function
    (whether it is named on the command line, found in a folder, read from standard input
    or handed over by flake8: one answer), so a syntax error in an unrelated file is left to
    flake8's or ruff's E999. A file the operating system refuses to read is CKP902.
    """

    code = "CKP901"
    name = "unreadable-file"
    summary = "file could not be decoded, parsed or analysed"

    EXAMPLE = """\
from torch.utils.checkpoint import checkpoint

def forward(self, x:  # expect: CKP901@12
    return checkpoint(self.block, x, use_reentrant=False)
"""
    CORRECTED = """\
from torch.utils.checkpoint import checkpoint

def forward(self, x):
    return checkpoint(self.block, x, use_reentrant=False)
"""

    def check(self, context: FileContext) -> Iterator[Finding]:
        """Reported by the engine while reading a file; a parsed file has nothing to add."""
        return iter(())
