"""``python -m ckptlint``."""

from ckptlint.cli import entry

entry()
