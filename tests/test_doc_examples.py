"""The shell examples of README.md and docs/*.md print what the pages say they print.

Every runnable block runs (docs/examples.py: in its own copy of the checkout) and its output
is compared with the page's; a page whose example is stale fails with the command that
refreshes it. Every other shell block says why it cannot run here."""

from __future__ import annotations

import hashlib
import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "docs" / "examples.py"


def _load():
    spec = importlib.util.spec_from_file_location("doc_examples", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["doc_examples"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


examples = _load()
BLOCKS = examples.runnable_blocks()


@pytest.mark.parametrize("block", BLOCKS, ids=lambda block: block.name)
def test_the_example_prints_what_the_page_shows(block) -> None:  # noqa: ANN001
    assert examples.differences(block, examples.run_block(block)) == ""


def test_every_shell_block_says_whether_it_runs() -> None:
    undecided = [
        block.name
        for page in examples.PAGES
        if page not in examples.GENERATED
        for block in examples.shell_blocks(page)
        if block.marker != examples.RUNNABLE and not examples.NOT_RUNNABLE.fullmatch(block.marker)
    ]
    assert undecided == [], (
        "mark each shell block `<!-- runnable -->` (a console block whose output is checked) "
        "or `<!-- not runnable: why -->`, on the line before it"
    )
    runnable = [block for block in BLOCKS if block.commands]
    assert len(runnable) == len(BLOCKS) >= 5  # README's and linter.md's examples at least


def _page(tmp_path: Path, text: str) -> Path:
    page = tmp_path / "page.md"
    page.write_text(text)
    return page


STALE = """Some text.

<!-- runnable -->
```console
$ ckptlint --select CKP001 examples/model.py
examples/model.py:49:17: CKP001 ...
Found 5 findings.
1 unsafe fix available with `--fix --unsafe-fixes`.
$ ckptlint --fix --unsafe-fixes --select CKP001 examples/model.py
Found 1 finding (1 fixed, 0 remaining).
```
"""


def test_a_stale_output_fails_and_says_how_to_refresh_it(tmp_path: Path) -> None:
    """A count changed by hand fails; the refreshed page passes and keeps the elision."""
    page = _page(tmp_path, STALE)
    (block,) = examples.shell_blocks(page)
    outputs = examples.run_block(block)
    found = examples.differences(block, outputs)
    assert found.startswith(
        f"{page}:5: `ckptlint --select CKP001 examples/model.py` printed other output than the "
        "page shows:\n--- expected\n+++ printed\n"
    )
    assert "\n-Found 5 findings.\n+Found 1 finding.\n" in found
    assert found.endswith(
        "If the new output is right, refresh the page with `python docs/examples.py --update` "
        "(it rewrites the outputs that differ, keeping the `...` lines whose neighbours still "
        "match) and review its diff."
    )
    assert "examples.py:10" not in found  # the second command printed what it shows

    updated = examples.update(block, outputs, STALE)
    assert updated == STALE.replace("Found 5 findings.", "Found 1 finding.")
    (refreshed,) = examples.shell_blocks(_page(tmp_path, updated))
    assert examples.differences(refreshed, outputs) == ""


def test_a_count_changed_by_hand_in_linter_md_fails(tmp_path: Path) -> None:
    text = (ROOT / "docs" / "linter.md").read_text()
    count = int(re.search(r"^Found (\d+) findings\.$", text, re.MULTILINE)[1])
    wrong = text.replace(f"Found {count} findings.", f"Found {count + 2} findings.", 1)
    block = next(b for b in examples.shell_blocks(_page(tmp_path, wrong)) if b.commands)
    found = examples.differences(block, examples.run_block(block))
    assert f"\n-Found {count + 2} findings.\n+Found {count} findings.\n" in found


def test_the_examples_run_in_a_copy_and_change_nothing_here(tmp_path: Path) -> None:
    fixed = ROOT / "examples" / "model.py"
    before = hashlib.sha256(fixed.read_bytes()).hexdigest()
    (block,) = examples.shell_blocks(_page(tmp_path, STALE))
    second = examples.run_block(block)[1]
    assert second == "Found 1 finding (1 fixed, 0 remaining).\n"  # the copy's file was fixed
    assert hashlib.sha256(fixed.read_bytes()).hexdigest() == before


@pytest.mark.parametrize(
    ("expected", "printed", "refreshed"),
    [
        # The error under an elided traceback changed: the elision stays.
        (
            ["Traceback:", "...", "Error: old", "  hint: h"],
            "Traceback:\n  frame 1\n  frame 2\nError: new\n  hint: h\n",
            ["Traceback:", "...", "Error: new", "  hint: h"],
        ),
        # A line added at the end, and a line with `...` inside that still matches.
        (
            ["a.py:1:1: CKP001 ...", "...", "Found 2 findings."],
            "a.py:1:1: CKP001 text\nb.py:1:1: CKP101 text\nFound 2 findings.\nmore\n",
            ["a.py:1:1: CKP001 ...", "...", "Found 2 findings.", "more"],
        ),
        # What a trailing `...` stood for is gone: it goes too.
        (["header", "..."], "header changed\n", ["header changed"]),
        # The first line changed before a trailing elision.
        (["old header", "..."], "new header\nline\nline\n", ["new header", "..."]),
    ],
    ids=["traceback", "inline", "gone", "header"],
)
def test_a_refresh_keeps_the_elisions_that_still_fit(
    expected: list[str], printed: str, refreshed: list[str]
) -> None:
    assert examples.refreshed(tuple(expected), printed) == refreshed
    assert examples.matches(refreshed, printed)
