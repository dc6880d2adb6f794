"""The guard's invariants are named once, torch-style (``# NOTE [ Read twice ]``), and cited
where the code relies on them (``See NOTE [ Read twice ]``): a citation of a note nobody wrote,
a note written twice or a note nothing cites is a defect of the documentation."""

from __future__ import annotations

import collections
import pathlib
import re

import ckptguard

PACKAGE = pathlib.Path(ckptguard.__file__).parent
DEFINITION = re.compile(r"^\s*# NOTE \[ (.+?) \]\s*$", re.MULTILINE)
CITATION = re.compile(r"See NOTE \[ (.+?) \]")


def _sources() -> dict[str, str]:
    return {str(p.relative_to(PACKAGE)): p.read_text() for p in sorted(PACKAGE.rglob("*.py"))}


def test_each_note_is_defined_once_and_cited() -> None:
    defined: collections.Counter[str] = collections.Counter()
    cited: collections.Counter[str] = collections.Counter()
    for text in _sources().values():
        defined.update(DEFINITION.findall(text))
        cited.update(CITATION.findall(text))
    assert set(defined) == {
        "Read twice",
        "Outputs are not inputs",
        "The guard never stops training",
        "Never keeps a user's object alive",
        "Shared state, read once per backward pass",
        "Stale plans",
        "Momentum feeds only the running statistics",
    }
    assert [name for name, count in defined.items() if count > 1] == []
    assert sorted(set(cited) - set(defined)) == []  # cited, never written
    assert sorted(set(defined) - set(cited)) == []  # written, never cited
