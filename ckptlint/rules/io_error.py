"""CKP902: a path that could not be accessed (missing, or refused by the operating system)."""

from __future__ import annotations

from collections.abc import Iterator

from ckptlint.rules.base import (
    FileContext,
    Finding,
    Rule,
)


class InaccessiblePath(Rule):
    """A path given on the command line does not exist, or a file or folder could not be
    opened (no permission, a dangling symbolic link), or a file named on the command line
    is not a regular file ("not a regular file: a FIFO", a socket, a device such as a link
    to `/dev/zero`: never opened nor read).

    Reported at line 1, column 1 of the path, like ruff's E902 and flake8's E902.

    ## Why is this bad?

    Nothing in the path was checked. The rest of the run goes on and the exit code is 1.
    Check the path, fix its permissions, or exclude it in `[tool.ckptlint]`.

    ## Not reported

    Special files (FIFOs, sockets, devices) found by walking a folder: they are skipped
    without a finding. Files that could be read but not decoded or parsed are CKP901.
    """

    code = "CKP902"
    name = "io-error"
    summary = "path could not be accessed"

    # The examples are command lines and their output, not modules: the finding is about
    # the file system. tests/test_rule_fixtures.py runs them and compares the output.
    EXAMPLE = (
        "$ ckptlint src/model.py does_not_exist.py\n"
        "does_not_exist.py:1:1: CKP902 no such file or folder\n"
    )
    CORRECTED = "$ ckptlint src/model.py\nAll checks passed!\n"

    def check(self, context: FileContext) -> Iterator[Finding]:
        """Reported by the command line while finding and reading files; a parsed file has
        nothing to add."""
        return iter(())
