"""The text searches that decide which files a project-wide question parses: each matches
every way of writing the word it looks for (it may match more, never less), and not the
plain reads that make up most of a large tree."""

from __future__ import annotations

import pytest

from ckptlint.project.search import ATTRIBUTE_WRITES, CONTENT_WRITES, matches

ATTRIBUTE_CASES = [
    ("cfg.SCALE = 2", True),
    ("cfg.SCALE[k] += 2", True),
    ("cfg.SCALE.update(x=1)", True),
    ("del cfg.SCALE", True),
    ('setattr(cfg, "SCALE", 2)', True),
    ("setattr(cfg, 'SCALE', 2)", True),
    ('delattr(cfg, "SCALE")', True),
    ('vars(cfg)["SCALE"] = 2', True),
    ('cfg.__dict__["SCALE"] = 2', True),
    ("y = cfg.SCALE", False),
    ('y = getattr(cfg, "SCALE", 1.0)', False),
    ('print("SCALE")', False),
    ('setattr(cfg, "SCALE_2", 2)', False),
]

CONTENT_CASES = [
    ("TABLE[k] = 2", True),
    ("TABLE.update(k=2)", True),
    ("del TABLE[k]", True),
    ("table = TABLE", True),
    ("table: dict = TABLE", True),
    ("y = TABLE[k]", False),
    ("same = x == TABLE", False),
    ("smaller = x <= TABLE", False),
    ("TABLE = {}", False),  # rebinds a name of one's own
]


@pytest.mark.parametrize(("line", "found"), ATTRIBUTE_CASES)
def test_attribute_writes(line: str, found: bool) -> None:
    word = "SCALE"
    assert matches(ATTRIBUTE_WRITES, word, f"def f():\n    {line}\n".encode()) is found


@pytest.mark.parametrize(("line", "found"), CONTENT_CASES)
def test_content_writes(line: str, found: bool) -> None:
    assert matches(CONTENT_WRITES, "TABLE", f"def f():\n    {line}\n".encode()) is found
