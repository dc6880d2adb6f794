"""The project root of many named paths, found with one RootFinder (each folder looked at
once), is the root each path gets on its own."""

from __future__ import annotations

from pathlib import Path

from ckptlint.config import ProjectRoot, RootFinder, project_root


def test_one_finder_gives_each_path_its_own_root(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.ckptlint]\n")
    inner = tmp_path / "lib" / "inner"
    (inner / "deep").mkdir(parents=True)
    (tmp_path / "lib" / "pyproject.toml").write_text("[tool.black]\n")  # no [tool.ckptlint]
    (inner / ".git").mkdir()  # a git tree below the configuring pyproject.toml
    (inner / "deep" / "pyproject.toml").write_text("[tool.ckptlint]\nignore = []\n")
    outside = tmp_path / "outside"
    (outside / "repo" / ".git").mkdir(parents=True)
    paths = [
        inner / "deep" / "a.py",
        inner / "b.py",
        tmp_path / "lib" / "c.py",
        inner / "deep",
        tmp_path / "missing.py",
        outside / "repo" / "d.py",
    ]
    expected = [
        ProjectRoot(inner / "deep", "pyproject", inner / "deep" / "pyproject.toml"),
        ProjectRoot(tmp_path, "pyproject", tmp_path / "pyproject.toml"),
        ProjectRoot(tmp_path, "pyproject", tmp_path / "pyproject.toml"),
        ProjectRoot(inner / "deep", "pyproject", inner / "deep" / "pyproject.toml"),
        ProjectRoot(tmp_path, "pyproject", tmp_path / "pyproject.toml"),
        ProjectRoot(tmp_path, "pyproject", tmp_path / "pyproject.toml"),
    ]
    finder = RootFinder()
    assert [finder.root(p) for p in paths] == expected
    assert [project_root(p) for p in reversed(paths)] == expected[::-1]
    assert not any((folder / ".git").exists() for folder in tmp_path.parents)
    isolated = RootFinder(isolated=True)  # no pyproject.toml: the git tree, else None
    assert [isolated.root(p) for p in paths] == [
        ProjectRoot(inner, "git"),
        ProjectRoot(inner, "git"),
        None,
        ProjectRoot(inner, "git"),
        None,
        ProjectRoot(outside / "repo", "git"),
    ]
