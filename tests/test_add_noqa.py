"""``--add-noqa``: a comment on each reported line and nothing else, never a file that stops
compiling, only files it changed written; afterwards the run is clean."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ckptlint.add_noqa import add_noqa
from ckptlint.core import Finding
from tests.conftest import run_cli

HEADER = "import torch\nimport torch.utils.checkpoint as cp\n\n"


def finding(line: int, code: str = "CKP001") -> Finding:
    return Finding(line, 1, code, "m", end_line=line, end_column=2)


@pytest.mark.parametrize(
    ("line", "codes", "expected"),
    [
        ("y = f(x)\n", ["CKP001"], "y = f(x)  # noqa: CKP001\n"),
        ("y = f(x)   \n", ["CKP001", "CKP101"], "y = f(x)  # noqa: CKP001, CKP101\n"),
        ("y = f(x)  # why\n", ["CKP001"], "y = f(x)  # why  # noqa: CKP001\n"),
        ("y = f(x)  # noqa: CKP101\n", ["CKP001"], "y = f(x)  # noqa: CKP101, CKP001\n"),
        (
            "y = f(x)  # noqa:CKP101 kept for now\n",
            ["CKP001"],
            "y = f(x)  # noqa: CKP101, CKP001 kept for now\n",
        ),
        (
            "y = f(x)  # type: ignore\r\n",
            ["CKP001"],
            "y = f(x)  # type: ignore  # noqa: CKP001\r\n",
        ),
        ("y = f(x)", ["CKP001"], "y = f(x)  # noqa: CKP001"),
        ("y = f(  # a call\n    x)\n", ["CKP001"], "y = f(  # a call  # noqa: CKP001\n    x)\n"),
    ],
    ids=["plain", "two codes", "comment", "merged", "merged with text", "crlf", "no eol", "open"],
)
def test_a_comment_is_added_or_merged(line: str, codes: list[str], expected: str) -> None:
    result = add_noqa(line, [finding(1, code) for code in codes])
    assert (result.text, result.added, result.left) == (expected, 1, ())


@pytest.mark.parametrize(
    "text",
    ['y = f("""\n""", x)\n', "y = f(x) + \\\n    1\n", 's = """\n"""; y = f(x)\n'],
    ids=["string goes on", "backslash", "string ends"],
)
def test_a_line_that_cannot_take_a_comment_is_left_and_named(text: str) -> None:
    result = add_noqa(text, [finding(1)])
    if text.startswith("s ="):  # the finding's line is the one the string ends on
        result = add_noqa(text, [finding(2)])
        assert result.text == 's = """\n"""; y = f(x)  # noqa: CKP001\n'
        return
    assert result.text == text and result.added == 0
    ((left, reason),) = result.left
    assert reason == "its line ends inside a string or continues with a backslash"


def test_whole_file_findings_get_no_comment() -> None:
    result = add_noqa("x = (\n", [finding(1, "CKP901")])
    assert (result.text, result.added, result.left) == ("x = (\n", 0, ())


MODEL = (
    HEADER + "y = cp.checkpoint(f, x)\n"
    "z = cp.checkpoint(torch.relu, x)  # noqa: CKP101\n"
    "w = cp.checkpoint(torch.relu, x)  # tiny on purpose\n"
    's = """\n""" + str(cp.checkpoint(g, x, use_reentrant=False))\n'
    "t = cp.checkpoint(f, x) + \\\n    1\n"
)
ADDED = (
    HEADER + "y = cp.checkpoint(f, x)  # noqa: CKP001\n"
    "z = cp.checkpoint(torch.relu, x)  # noqa: CKP101, CKP001\n"
    "w = cp.checkpoint(torch.relu, x)  # tiny on purpose  # noqa: CKP001, CKP101\n"
    's = """\n""" + str(cp.checkpoint(g, x, use_reentrant=False))\n'
    "t = cp.checkpoint(f, x) + \\\n    1\n"
)


def test_the_command_adds_comments_then_the_run_is_clean_but_for_what_it_names(
    tmp_path: Path,
) -> None:
    (tmp_path / ".git").mkdir()
    model = tmp_path / "model.py"
    model.write_text(MODEL)
    clean = tmp_path / "clean.py"
    clean.write_text("x = 1\n")
    os.utime(clean, (0, 0))
    inode = model.stat().st_ino

    result = run_cli("--add-noqa", ".", cwd=tmp_path)
    assert (result.returncode, result.stdout) == (0, "")
    assert result.stderr == (
        "ckptlint: warning: model.py:9:5: CKP001 not suppressed: its line ends inside a "
        "string or continues with a backslash\n"
        "Added 3 noqa directives.\n"
    )
    assert model.read_text() == ADDED
    assert model.stat().st_ino == inode  # written in place
    assert clean.stat().st_mtime == 0  # a file without findings is not written
    compile(model.read_text(), "model.py", "exec")

    after = run_cli(".", cwd=tmp_path)
    assert after.returncode == 1 and after.stdout.startswith("model.py:9:5: CKP001 ")
    again = run_cli("--add-noqa", ".", cwd=tmp_path)
    assert (again.returncode, again.stdout) == (0, "")
    assert model.read_text() == ADDED


def test_the_file_keeps_its_encoding_and_line_ends(tmp_path: Path) -> None:
    text = "# -*- coding: latin-1 -*-\n" + HEADER + "y = cp.checkpoint(f, x)  # café\n"
    model = tmp_path / "model.py"
    model.write_bytes(text.replace("\n", "\r\n").encode("latin-1"))
    assert run_cli("--add-noqa", "model.py", cwd=tmp_path).returncode == 0
    assert model.read_bytes() == (
        text.replace("# café", "# café  # noqa: CKP001").replace("\n", "\r\n").encode("latin-1")
    )


def test_it_cannot_be_combined_with_a_fix_or_standard_input(tmp_path: Path) -> None:
    (tmp_path / "model.py").write_text(MODEL)
    for flags in (["--fix"], ["--diff"], ["-"]):
        result = run_cli("--add-noqa", *flags, cwd=tmp_path)
        assert result.returncode == 2 and result.stderr.startswith(
            "ckptlint: error: --add-noqa cannot be used with "
        )
    assert (tmp_path / "model.py").read_text() == MODEL


def test_a_read_only_file_is_left_and_named(tmp_path: Path) -> None:
    model = tmp_path / "model.py"
    model.write_text(MODEL)
    model.chmod(0o444)
    result = run_cli("--add-noqa", "model.py", cwd=tmp_path)
    assert result.returncode == 0
    assert "model.py: no noqa added: the file is read-only (mode 0444)" in result.stderr
    assert model.read_text() == MODEL
