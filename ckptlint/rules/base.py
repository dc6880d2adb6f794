"""What a rule is: a code, a message, an explanation and its own examples."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from ckptlint.core import FileContext, Finding


class Rule:
    """Base of every rule. The subclass docstring is what ``ckptlint --explain`` prints.

    ``INVALID`` and ``VALID`` hold whole example modules: each invalid one must produce at
    least one finding of this rule, each valid one none. Their first entries are the bad and
    the fixed example that ``--explain`` shows.
    """

    code: ClassVar[str]
    name: ClassVar[str]
    summary: ClassVar[str]
    VALID: ClassVar[list[str]]
    INVALID: ClassVar[list[str]]

    def check(self, context: FileContext) -> Iterator[Finding]:
        raise NotImplementedError
