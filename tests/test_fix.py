"""--fix / --unsafe-fixes / --diff: formatting kept, atomic writes, idempotent."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from ckptlint.core import AddKeyword
from ckptlint.fixes import FixFailed, apply_edits
from tests.conftest import run_ckptlint

HEADER = "import torch.utils.checkpoint as cp\n"

ROUND_TRIPS = {
    "one line": ("y = cp.checkpoint(f, x)\n", "y = cp.checkpoint(f, x, use_reentrant=False)\n"),
    "one line, trailing comma": (
        "y = cp.checkpoint(f, x,)\n",
        "y = cp.checkpoint(f, x, use_reentrant=False,)\n",
    ),
    "multi-line with trailing comma and comment": (
        """\
        y = cp.checkpoint(
            f,
            x,  # the input
        )
        """,
        """\
        y = cp.checkpoint(
            f,
            x,  # the input
            use_reentrant=False,
        )
        """,
    ),
    "multi-line without trailing comma": (
        """\
        def forward(self, x):
            if self.gradient_checkpointing:
                return cp.checkpoint(
                    create_custom_forward(self.layer),
                    x,
                    mask
                )
        """,
        """\
        def forward(self, x):
            if self.gradient_checkpointing:
                return cp.checkpoint(
                    create_custom_forward(self.layer),
                    x,
                    mask,
                    use_reentrant=False
                )
        """,
    ),
    "hanging indent": (
        """\
        y = cp.checkpoint(f,
                          x)
        """,
        """\
        y = cp.checkpoint(f,
                          x, use_reentrant=False)
        """,
    ),
    "starred positional": (
        "y = cp.checkpoint(f, *inputs)\n",
        "y = cp.checkpoint(f, *inputs, use_reentrant=False)\n",
    ),
    "nested in another call": (
        "out = norm(cp.checkpoint(f, x) + 1)  # keep this comment\n",
        "out = norm(cp.checkpoint(f, x, use_reentrant=False) + 1)  # keep this comment\n",
    ),
    "partial never called here": (
        "import functools\nrun = functools.partial(cp.checkpoint)\n",
        "import functools\nrun = functools.partial(cp.checkpoint, use_reentrant=False)\n",
    ),
}


@pytest.mark.parametrize(("before", "after"), ROUND_TRIPS.values(), ids=ROUND_TRIPS.keys())
def test_fix_round_trip(project: Path, before: str, after: str) -> None:
    path = project / "model.py"
    path.write_text(HEADER + textwrap.dedent(before))
    result = run_ckptlint("--fix", "--unsafe-fixes", "model.py", cwd=project)
    assert result.returncode == 0, result.stdout + result.stderr
    assert path.read_text() == HEADER + textwrap.dedent(after)
    assert "Fixed 1 finding." in result.stdout
    # A second run finds nothing to change.
    again = run_ckptlint("--fix", "--unsafe-fixes", "model.py", cwd=project)
    assert again.returncode == 0 and path.read_text() == HEADER + textwrap.dedent(after)


def test_fix_without_unsafe_fixes_changes_nothing(project: Path) -> None:
    path = project / "model.py"
    path.write_text(HEADER + "y = cp.checkpoint(f, x)\n")
    result = run_ckptlint("--fix", "model.py", cwd=project)
    assert result.returncode == 1
    assert path.read_text() == HEADER + "y = cp.checkpoint(f, x)\n"
    assert "fixable with `ckptlint --fix --unsafe-fixes`" in result.stdout


def test_diff_prints_and_writes_nothing(project: Path) -> None:
    path = project / "model.py"
    path.write_text(HEADER + "y = cp.checkpoint(f, x)\n")
    result = run_ckptlint("--diff", "--unsafe-fixes", "model.py", cwd=project)
    assert result.returncode == 1
    assert (
        "-y = cp.checkpoint(f, x)\n+y = cp.checkpoint(f, x, use_reentrant=False)\n" in result.stdout
    )
    assert result.stdout.startswith("--- model.py\n+++ model.py\n")
    assert path.read_text() == HEADER + "y = cp.checkpoint(f, x)\n"
    clean = project / "clean.py"
    clean.write_text(HEADER + "y = cp.checkpoint(f, x, use_reentrant=True)\n")
    assert run_ckptlint("--diff", "--unsafe-fixes", "clean.py", cwd=project).stdout == ""


def test_fix_keeps_encoding_bom_and_mode(project: Path) -> None:
    path = project / "latin.py"
    source = "# -*- coding: latin-1 -*-\n" + HEADER + "s = 'é'; y = cp.checkpoint(f, x)\n"
    path.write_bytes(source.encode("latin-1"))
    bom = project / "bom.py"
    bom.write_bytes(b"\xef\xbb\xbf" + (HEADER + "y = cp.checkpoint(f, x)\n").encode())
    os.chmod(path, 0o640)
    result = run_ckptlint("--fix", "--unsafe-fixes", "latin.py", "bom.py", cwd=project)
    assert result.returncode == 0, result.stderr
    expected = source.replace("(f, x)", "(f, x, use_reentrant=False)")
    assert path.read_bytes() == expected.encode("latin-1")
    assert bom.read_bytes().startswith(b"\xef\xbb\xbf")
    assert b"use_reentrant=False" in bom.read_bytes()
    assert os.stat(path).st_mode & 0o777 == 0o640
    assert sorted(p.name for p in project.iterdir()) == ["bom.py", "latin.py"]  # no temp left


def test_fix_through_symlink_replaces_the_target(project: Path) -> None:
    real = project / "real.py"
    real.write_text(HEADER + "y = cp.checkpoint(f, x)\n")
    (project / "link.py").symlink_to(real)
    run_ckptlint("--fix", "--unsafe-fixes", "link.py", cwd=project)
    assert (project / "link.py").is_symlink()
    assert "use_reentrant=False" in real.read_text()


def test_edit_that_matches_no_call_is_refused() -> None:
    with pytest.raises(FixFailed, match="no call found at 1:1"):
        apply_edits(b"x = 1\n", [AddKeyword(1, 1, "use_reentrant", "False")])


def test_result_that_would_not_parse_is_refused() -> None:
    # A keyword after ``**kwargs`` is legal; one after a bare generator argument is not.
    source = b"import torch.utils.checkpoint as cp\ncp.checkpoint(x for x in y)\n"
    with pytest.raises(FixFailed, match="would not parse"):
        apply_edits(source, [AddKeyword(2, 1, "use_reentrant", "False")])
