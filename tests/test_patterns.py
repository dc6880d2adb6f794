"""gitignore patterns: git's answers, in time linear in the path.

Each row's patterns go into a real ``.gitignore`` of a real work tree, and the paths that
``git check-ignore`` reports are the ones ``Patterns.excludes`` excludes (where git is
installed; the expected answers are written out too, so the table also runs without it).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from ckptlint.patterns import Patterns
from tests.conftest import SUBPROCESS_TIMEOUT, run_cli

# Paths of the tree: a trailing slash marks a folder.
PATHS = [
    "a.py",
    "b.txt",
    "build/",
    "build/keep.py",
    "build/x.py",
    "src/",
    "src/build/",
    "src/build/y.py",
    "src/a.py",
    "src/deep/",
    "src/deep/a.py",
    "src/deep/z/",
    "src/deep/z/a.py",
    "doc/",
    "doc/a.py",
    "x1.py",
    "xy.py",
    "x-.py",
    "x].py",
    "[x].py",
    "a b.py",
    "#c.py",
    "!d.py",
    "star*.py",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaac",
]

# git's own wildmatch backtracks on this one (it did not end in minutes on the long name).
GIT_BACKTRACKS = "*a*a*a*a*a*a*a*a*a*a*a*a*a*a*b"
EVERY_A_PY = [p for p in PATHS if p.split("/")[-1] == "a.py"]
# (patterns, the paths git ignores)
TABLE: list[tuple[list[str], list[str]]] = [
    (["*.py"], [p for p in PATHS if p.endswith(".py")]),
    (["build/"], ["build/", "build/keep.py", "build/x.py", "src/build/", "src/build/y.py"]),
    (["/build"], ["build/", "build/keep.py", "build/x.py"]),
    (
        ["build/", "!build/keep.py"],
        ["build/", "build/keep.py", "build/x.py", "src/build/"] + ["src/build/y.py"],
    ),
    (
        ["*.py", "!a.py"],
        [p for p in PATHS if p.endswith(".py") and not p.endswith("/a.py") and p != "a.py"],
    ),
    (["src/*.py"], ["src/a.py"]),
    (["src/**/a.py"], ["src/a.py", "src/deep/a.py", "src/deep/z/a.py"]),
    (["**/a.py"], EVERY_A_PY),
    (["src/**"], [p for p in PATHS if p.startswith("src/") and p != "src/"]),
    (["deep"], ["src/deep/", "src/deep/a.py", "src/deep/z/", "src/deep/z/a.py"]),
    (["src/deep/z/"], ["src/deep/z/", "src/deep/z/a.py"]),
    (["x?.py"], ["x1.py", "xy.py", "x-.py", "x].py"]),
    (["x[0-9].py"], ["x1.py"]),
    (["x[!0-9].py"], ["xy.py", "x-.py", "x].py"]),
    (["x[^0-9].py"], ["xy.py", "x-.py", "x].py"]),
    (["x[]].py"], ["x].py"]),
    (["x[a-].py"], ["x-.py"]),
    (["x[[:digit:]].py"], ["x1.py"]),
    (["x[[:alpha:]].py"], ["xy.py"]),
    (["\\[x\\].py"], ["[x].py"]),
    (["x[.py"], []),  # an unclosed class matches nothing
    (["a\\ b.py"], ["a b.py"]),
    (["a.py   "], EVERY_A_PY),  # trailing spaces are not part of the pattern
    (["\\#c.py"], ["#c.py"]),
    (["#c.py"], []),  # a comment
    (["\\!d.py"], ["!d.py"]),
    (["star\\*.py"], ["star*.py"]),
    (["star*.py"], ["star*.py"]),
    (
        ["*a*a*a*a*a*a*a*a*a*a*a*a*a*a*c"],
        ["aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaac"],
    ),
    ([GIT_BACKTRACKS], []),
    (["a**.py"], [*EVERY_A_PY, "a b.py"]),  # stars not between slashes are plain stars
    (["doc", "!doc/a.py"], ["doc/", "doc/a.py"]),  # inside an ignored folder: ignored
    (["doc/*", "!doc/a.py"], []),
    (["**"], PATHS),
]


def _tree(root: Path) -> None:
    for path in PATHS:
        if path.endswith("/"):
            (root / path).mkdir(parents=True, exist_ok=True)
        else:
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text("")


def _ours(patterns: list[str]) -> list[str]:
    compiled = Patterns(patterns)
    return [p for p in PATHS if compiled.excludes(p.rstrip("/"), is_folder=p.endswith("/"))]


@pytest.mark.parametrize(("patterns", "ignored"), TABLE, ids=[" ".join(r[0]) for r in TABLE])
def test_patterns_match_as_written(patterns: list[str], ignored: list[str]) -> None:
    assert _ours(patterns) == [p for p in PATHS if p in ignored]


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_patterns_match_as_git_does(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    _tree(tmp_path)
    for patterns, _ in TABLE:
        if patterns == [GIT_BACKTRACKS]:
            continue
        (tmp_path / ".gitignore").write_text("".join(f"{line}\n" for line in patterns))
        result = subprocess.run(
            ["git", "check-ignore", "--no-index", "--stdin", "-z"],
            input="\0".join(p.rstrip("/") for p in PATHS) + "\0",
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=SUBPROCESS_TIMEOUT,
        )
        assert result.returncode in (0, 1), result.stderr
        by_git = set(result.stdout.split("\0")) - {""}
        assert _ours(patterns) == [p for p in PATHS if p.rstrip("/") in by_git], patterns


BACKTRACKING = "*a*a*a*a*a*a*a*a*a*a*a*a*a*a*c"
LONG_NAME = "a" * 57 + ".py"  # 60 characters, no final c: a backtracking engine tries them all


@pytest.mark.parametrize("where", ["gitignore", "exclude"])
def test_a_backtracking_pattern_ends_at_once(project: Path, where: str) -> None:
    (project / ".git").mkdir()
    (project / LONG_NAME).write_text("import torch.utils.checkpoint as cp\ncp.checkpoint(f, x)\n")
    if where == "gitignore":
        (project / ".gitignore").write_text(BACKTRACKING + "\n")
    else:
        (project / "pyproject.toml").write_text(f"[tool.ckptlint]\nexclude = [{BACKTRACKING!r}]\n")
    started = time.monotonic()
    result = run_cli("--no-cache", "--format", "json", ".", cwd=project)
    assert time.monotonic() - started < 1.0  # a generous bound: the only timing in the suite
    assert [item["path"] for item in json.loads(result.stdout)] == [LONG_NAME]


def test_exclude_and_per_file_ignores_follow_the_same_rules(project: Path) -> None:
    for name in ("build/keep.py", "build/x.py", "src/m.py"):
        path = project / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("import torch.utils.checkpoint as cp\ncp.checkpoint(f, x)\n")
    (project / "pyproject.toml").write_text(
        '[tool.ckptlint]\nexclude = ["build/", "!build/keep.py"]\n'
        '[tool.ckptlint.per-file-ignores]\n"src/**" = ["CKP001"]\n'
    )
    result = run_cli("--no-cache", "--format", "json", ".", cwd=project)
    assert json.loads(result.stdout) == []


def test_the_root_named_as_dot_is_never_excluded(project: Path) -> None:
    """``.*`` (hidden files) matches the name ``.``: the project itself stays linted."""
    (project / "m.py").write_text("import torch.utils.checkpoint as cp\ncp.checkpoint(f, x)\n")
    (project / ".hidden").mkdir()
    (project / ".hidden" / "h.py").write_text(
        "import torch.utils.checkpoint as cp\ncp.checkpoint(f, x)\n"
    )
    (project / "pyproject.toml").write_text('[tool.ckptlint]\nexclude = [".*"]\n')
    result = run_cli("--no-cache", "--format", "json", ".", cwd=project)
    assert [item["path"] for item in json.loads(result.stdout)] == ["m.py"]
