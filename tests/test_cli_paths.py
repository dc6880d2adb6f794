"""Which files the CLI lints: excludes (gitignore-style), .gitignore, each file once, and
every path accounted for (missing and unreadable ones are CKP902 findings)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import ckptlint.config
import ckptlint.discovery
from tests.conftest import run_cli

MISSING = "import torch.utils.checkpoint as cp\n\ny = cp.checkpoint(block, x)\n"


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def linted(project: Path, *arguments: str) -> list[str]:
    result = run_cli("--format", "json", *arguments, cwd=project)
    assert result.returncode in (0, 1), result.stderr
    return sorted({item["path"] for item in json.loads(result.stdout)})


@pytest.mark.parametrize(
    ("pattern", "left"),
    [
        ("**/legacy", ["keep/m.py"]),
        ("legacy", ["keep/m.py"]),
        ("legacy/", ["keep/m.py"]),
        ("/legacy", ["keep/m.py", "src/legacy/m.py"]),
        ("src/legacy", ["keep/m.py", "legacy/m.py"]),
        ("*.py", []),
        ("legacy/*.py", ["keep/m.py", "src/legacy/m.py"]),
    ],
)
def test_exclude_patterns_are_gitignore_style(project: Path, pattern: str, left: list) -> None:
    for name in ("legacy/m.py", "src/legacy/m.py", "keep/m.py"):
        write(project, name, MISSING)
    write(project, "pyproject.toml", f"[tool.ckptlint]\nexclude = [{pattern!r}]\n")
    assert linted(project) == left


def test_per_file_ignores_are_gitignore_style(project: Path) -> None:
    for name in ("tests/unit/test_m.py", "src/tests/m.py", "src/m.py"):
        write(project, name, MISSING)
    write(project, "pyproject.toml", '[tool.ckptlint.per-file-ignores]\n"tests/" = ["CKP001"]\n')
    assert linted(project) == ["src/m.py"]


def test_gitignore_is_respected_and_can_be_turned_off(project: Path) -> None:
    (project / ".git").mkdir()
    (project / ".git" / "info").mkdir()
    (project / ".git" / "info" / "exclude").write_text("scratch.py\n")
    write(project, ".gitignore", "generated/\n*_pb2.py\n")
    write(project, "pkg/.gitignore", "local_*.py\n!local_keep.py\n")
    for name in (
        "generated/m.py",
        "pkg/model_pb2.py",
        "pkg/local_notes.py",
        "pkg/local_keep.py",
        "pkg/model.py",
        "scratch.py",
    ):
        write(project, name, MISSING)
    assert linted(project) == ["pkg/local_keep.py", "pkg/model.py"]
    # From a sub-folder, the repository's rules above it still apply.
    assert linted(project / "pkg", ".") == ["local_keep.py", "model.py"]
    everything = linted(project, "--no-respect-gitignore")
    assert len(everything) == 6
    write(project, "pyproject.toml", "[tool.ckptlint]\nrespect-gitignore = false\n")
    assert len(linted(project)) == 6
    # A file named on the command line is linted even when git ignores it.
    write(project, "pyproject.toml", "[tool.ckptlint]\n")
    assert linted(project, "generated/m.py") == ["generated/m.py"]


def test_gitignore_outside_a_git_work_tree_is_not_read(project: Path) -> None:
    write(project, ".gitignore", "*.py\n")
    write(project, "m.py", MISSING)
    assert linted(project) == ["m.py"]


def test_each_file_once_however_it_is_reached(project: Path) -> None:
    model = write(project, "pkg/model.py", MISSING)
    (project / "alias.py").symlink_to(model)
    (project / "elsewhere").mkdir()
    (project / "elsewhere" / "pkg").symlink_to(project / "pkg")  # a folder named through a link
    result = run_cli(
        "pkg",
        "pkg/model.py",
        "./pkg/model.py",
        str(model),
        "alias.py",
        "elsewhere/pkg",
        ".",
        cwd=project,
    )
    assert result.stdout.count("CKP001") == 1
    assert result.stdout.startswith("pkg/model.py:3:5: CKP001 ")


def test_unreadable_folder_is_reported_and_the_run_goes_on(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operating system refuses to list a folder (simulated: tests may run as root)."""
    write(project, "locked/m.py", MISSING)
    write(project, "open/m.py", MISSING)
    scan = os.scandir

    def refuse_locked(path: str | int = ".") -> object:
        if isinstance(path, str) and os.path.basename(os.path.normpath(path)) == "locked":
            raise PermissionError(13, "Permission denied", path)
        return scan(path)

    monkeypatch.setattr(ckptlint.discovery.os, "scandir", refuse_locked)
    result = run_cli("--format", "json", ".", cwd=project)
    assert result.returncode == 1
    found = [(item["path"], item["code"], item["message"]) for item in json.loads(result.stdout)]
    assert found == [
        ("locked", "CKP902", "cannot read folder: Permission denied"),
        ("open/m.py", "CKP001", found[1][2]),
    ]


def test_unreadable_first_path_does_not_break_config_discovery(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(project, "pyproject.toml", '[tool.ckptlint]\nignore = ["CKP101"]\n')
    write(project, "locked/m.py", MISSING)
    is_file, is_dir = Path.is_file, Path.is_dir

    def refuse(method):
        def guarded(path: Path) -> bool:
            if "locked" in path.parts:
                raise PermissionError(13, "Permission denied", str(path))
            return method(path)

        return guarded

    monkeypatch.setattr(ckptlint.config.Path, "is_file", refuse(is_file))
    monkeypatch.setattr(ckptlint.config.Path, "is_dir", refuse(is_dir))
    result = run_cli("locked/m.py", cwd=project)
    assert result.returncode == 1, result.stderr
    assert result.stdout.startswith("locked/m.py:3:5: CKP001 ")


def test_explicit_paths_keep_their_order_and_spelling(project: Path) -> None:
    write(project, "b.py", MISSING)
    write(project, "a.py", MISSING)
    result = run_cli("b.py", "missing.py", "a.py", cwd=project)
    assert [line.split(":")[0] for line in result.stdout.splitlines()[:3]] == [
        "b.py",
        "missing.py",
        "a.py",
    ]
