"""The project root, found as Python packaging finds one: the nearest folder holding
pyproject.toml (with or without [tool.ckptlint]), setup.py, setup.cfg or a git work tree;
else the top of the path's package, else its folder; never the working folder for being
the working folder. Settings come from the nearest [tool.ckptlint]; ``--config`` changes
settings only. One RootFinder gives each of many paths the root it gets alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckptlint.config import ProjectRoot, RootFinder, project_root
from tests.conftest import run_cli

MISSING = "import torch.utils.checkpoint as cp\n\ny = cp.checkpoint(block, x)\n"


def test_one_finder_gives_each_path_its_own_root(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.ckptlint]\n")
    inner = tmp_path / "lib" / "inner"
    (inner / "deep").mkdir(parents=True)
    (tmp_path / "lib" / "pyproject.toml").write_text("[tool.black]\n")  # no [tool.ckptlint]
    (inner / ".git").mkdir()  # a git tree below the configuring pyproject.toml
    (inner / "deep" / "pyproject.toml").write_text("[tool.ckptlint]\nignore = []\n")
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "setup.cfg").write_text("[metadata]\nname = tools\n")
    outside = tmp_path / "outside"
    (outside / "repo" / ".git").mkdir(parents=True)
    top = tmp_path / "pyproject.toml"
    deep = inner / "deep" / "pyproject.toml"
    paths = [
        inner / "deep" / "a.py",
        inner / "b.py",
        tmp_path / "lib" / "c.py",
        inner / "deep",
        tmp_path / "missing.py",
        outside / "repo" / "d.py",
        tmp_path / "tools" / "e.py",
    ]
    expected = [
        ProjectRoot(inner / "deep", "pyproject.toml", deep),
        ProjectRoot(inner, "git", top),
        ProjectRoot(tmp_path / "lib", "pyproject.toml", top),
        ProjectRoot(inner / "deep", "pyproject.toml", deep),
        ProjectRoot(tmp_path, "pyproject.toml", top),
        ProjectRoot(outside / "repo", "git", top),
        ProjectRoot(tmp_path / "tools", "setup.cfg", top),
    ]
    finder = RootFinder()
    assert [finder.root(p) for p in paths] == expected
    assert [project_root(p) for p in reversed(paths)] == expected[::-1]
    assert not any((folder / ".git").exists() for folder in tmp_path.parents)
    isolated = RootFinder(isolated=True)  # the same roots, no configuration
    assert [isolated.root(p) for p in paths] == [
        ProjectRoot(root.folder, root.reason) for root in expected
    ]


def test_without_markers_the_package_or_the_folder(tmp_path: Path) -> None:
    package = tmp_path / "code" / "pkg"
    (package / "sub").mkdir(parents=True)
    for folder in (package, package / "sub"):
        (folder / "__init__.py").write_text("")
    (tmp_path / "code" / "scripts").mkdir()
    assert project_root(package / "sub" / "m.py") == ProjectRoot(package, "package")
    assert project_root(package / "sub") == ProjectRoot(package, "package")
    scripts = tmp_path / "code" / "scripts"
    assert project_root(scripts / "train.py") == ProjectRoot(scripts, "folder")


def lint(folder: Path, *arguments: str) -> list[tuple[str, int, str]]:
    result = run_cli("--format", "json", *arguments, cwd=folder)
    assert result.returncode in (0, 1), result.stderr
    return sorted((i["path"], i["line"], i["code"]) for i in json.loads(result.stdout))


def settings_rows(text: str) -> list[dict[str, str]]:
    """``--show-settings``, one dictionary a project."""
    blocks = []
    for block in text.strip().split("\n\n"):
        pairs = (line.split(" = ", 1) for line in block.splitlines())
        blocks.append({key.strip(): value for key, value in pairs})
    return blocks


@pytest.fixture
def unrelated(tmp_path: Path) -> Path:
    """A folder of unpacked packages, none configured, no git: one of them is linted."""
    code = tmp_path / "code"
    for name in ("alpha", "beta", "gamma"):
        package = code / name / name
        package.mkdir(parents=True)
        (package / "__init__.py").write_text("")
        (package / "model.py").write_text(MISSING)
    (code / "alpha" / "setup.py").write_text("from setuptools import setup\nsetup()\n")
    (code / "beta" / "pyproject.toml").write_text('[project]\nname = "beta"\n')
    (code / "loose.py").write_text(MISSING)
    return code


def test_a_package_named_from_a_folder_of_packages_is_the_project(unrelated: Path) -> None:
    shown = settings_rows(run_cli("--show-settings", "alpha", cwd=unrelated).stdout)
    assert [row["project root"] for row in shown] == [
        f"{unrelated / 'alpha'}  (the nearest folder holding setup.py)"
    ]
    assert lint(unrelated, "alpha") == [("alpha/alpha/model.py", 3, "CKP001")]
    # Only alpha was known, and only alpha's cache was written.
    assert (unrelated / "alpha" / ".ckptlint_cache").is_dir()
    assert not (unrelated / ".ckptlint_cache").exists()
    assert not (unrelated / "beta" / ".ckptlint_cache").exists()
    files = run_cli("--show-files", "gamma/gamma/model.py", cwd=unrelated).stdout
    assert files == "gamma/gamma/model.py\n"
    shown = settings_rows(run_cli("--show-settings", "gamma/gamma/model.py", cwd=unrelated).stdout)
    assert shown[0]["project root"].startswith(f"{unrelated / 'gamma' / 'gamma'}  (the top")


def test_several_named_projects_at_once(unrelated: Path) -> None:
    result = run_cli("--show-settings", "alpha", "beta/beta/model.py", "loose.py", cwd=unrelated)
    roots = [row["project root"].split()[0] for row in settings_rows(result.stdout)]
    assert roots == [str(unrelated / "alpha"), str(unrelated / "beta"), str(unrelated)]
    assert lint(unrelated, "alpha", "beta/beta/model.py", "loose.py") == [
        ("alpha/alpha/model.py", 3, "CKP001"),
        ("beta/beta/model.py", 3, "CKP001"),
        ("loose.py", 3, "CKP001"),
    ]
    for project in (unrelated / "alpha", unrelated / "beta", unrelated):
        assert (project / ".ckptlint_cache").is_dir()  # each its own cache
    # Warm, each from its own cache: the same answer.
    assert lint(unrelated, "alpha", "beta/beta/model.py", "loose.py") == lint(
        unrelated, "--no-cache", "alpha", "beta/beta/model.py", "loose.py"
    )


def test_a_file_in_a_project_nested_in_another_named_one_is_linted_once(
    unrelated: Path,
) -> None:
    (unrelated / "pyproject.toml").write_text('[project]\nname = "all"\n')
    assert lint(unrelated, ".", "alpha/alpha/model.py") == [
        ("alpha/alpha/model.py", 3, "CKP001"),
        ("beta/beta/model.py", 3, "CKP001"),
        ("gamma/gamma/model.py", 3, "CKP001"),
        ("loose.py", 3, "CKP001"),
    ]


# A project whose findings depend on another file: the wrapper in mypkg/memory.py makes
# the call in mypkg/model.py a region source; only a run that knows memory.py finds it.
MEMORY = """
from torch.utils.checkpoint import checkpoint


def run_checkpointed(function, *args):
    return checkpoint(function, *args, preserve_rng_state=False)
"""
MODEL = """
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from mypkg.memory import run_checkpointed


def block(x):
    return F.dropout(x, 0.1)


def forward(x):
    y = checkpoint(block, x)
    return run_checkpointed(block, y)
"""


@pytest.fixture
def wrapped(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    (root / "mypkg").mkdir(parents=True)
    (root / ".git").mkdir()
    (root / "mypkg" / "__init__.py").write_text("")
    (root / "mypkg" / "memory.py").write_text(MEMORY)
    (root / "mypkg" / "model.py").write_text(MODEL)
    return root


SETTINGS = 'ignore = ["CKP101"]\nper-file-ignores = { "mypkg/memory.py" = ["CKP0"] }\n'


def test_config_inside_or_outside_the_project_changes_settings_only(
    wrapped: Path, tmp_path: Path
) -> None:
    (wrapped / "configs").mkdir()
    (wrapped / "configs" / "ck.toml").write_text(SETTINGS)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "ck.toml").write_text(SETTINGS)
    outside = str(tmp_path / "elsewhere" / "ck.toml")
    with_config = [
        lint(wrapped, "--no-cache", "--config", "configs/ck.toml", "mypkg/model.py"),
        lint(wrapped, "--no-cache", "--config", outside, "mypkg/model.py"),
        lint(wrapped, "--config", outside, "."),
    ]
    (wrapped / "pyproject.toml").write_text("[tool.ckptlint]\n" + SETTINGS)
    in_pyproject = lint(wrapped, "--no-cache", "mypkg/model.py")
    assert len({str(found) for found in with_config}) == 1
    assert with_config[0] == [f for f in in_pyproject if f[0] == "mypkg/model.py"] and with_config[
        2
    ] == lint(wrapped, "--no-cache", ".")
    # The call through the wrapper of memory.py is found: the root stayed the project's.
    assert ("mypkg/model.py", 14, "CKP301") in in_pyproject
    shown = settings_rows(
        run_cli("--show-settings", "--config", outside, "mypkg/model.py", cwd=wrapped).stdout
    )
    assert shown[0]["project root"].startswith(f"{wrapped}  ")
    assert shown[0]["configuration"] == outside
    assert shown[0]["patterns relative to"] == str(wrapped)


def test_config_key_value_overrides_one_setting(wrapped: Path) -> None:
    (wrapped / "pyproject.toml").write_text('[tool.ckptlint]\nignore = ["CKP301"]\n')
    everything = lint(wrapped, "--no-cache", "--config", "ignore = []", ".")
    assert {code for _, _, code in everything} >= {"CKP001", "CKP301"}
    assert lint(wrapped, "--config", "ignore=['CKP001', 'CKP301']", ".") == [
        f for f in everything if f[2] not in ("CKP001", "CKP301")
    ]
    assert lint(wrapped, "--config", 'per-file-ignores."mypkg/*" = ["CKP"]', ".") == []
    # The override wins over a file given with --config too, whatever the order.
    (wrapped / "ck.toml").write_text('ignore = ["CKP0", "CKP1", "CKP2", "CKP3"]\n')
    assert lint(wrapped, "--config", "ignore = []", "--config", "ck.toml", ".") == everything


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("nope.toml", "--config nope.toml: no such file"),
        ("a = 1\nb = 2", "--config a = 1\nb = 2: not one setting as TOML"),
        ("ignore = [", "--config ignore = [: not one setting as TOML"),
        ("colour = 'red'", "--config \"colour = 'red'\": unknown option(s): colour"),
        ("select = ['XYZ']", "--config \"select = ['XYZ']\" select: unknown rule code"),
    ],
)
def test_config_values_that_are_neither(wrapped: Path, value: str, message: str) -> None:
    result = run_cli("--config", value, ".", cwd=wrapped)
    assert result.returncode == 2
    assert result.stderr.startswith(f"ckptlint: error: {message}")


def test_show_settings_prints_every_setting(wrapped: Path) -> None:
    (wrapped / "pyproject.toml").write_text(
        '[project]\nname = "p"\ndependencies = ["torch>=2.1"]\n'
        '[tool.ckptlint]\nmax-file-size = 1000000\nexclude = ["legacy"]\n'
    )
    shown = settings_rows(
        run_cli("--show-settings", "--config", "respect-gitignore = false", ".", cwd=wrapped).stdout
    )
    (row,) = shown
    assert list(row) == [
        "paths",
        "project root",
        "configuration",
        "configuration overrides",
        "patterns relative to",
        "select",
        "ignore",
        "command line select",
        "command line extend-select",
        "command line ignore",
        "selected rules",
        "exclude",
        "per-file-ignores",
        "extend-checkpoint-functions",
        "respect-gitignore",
        "max-file-size",
        "target-torch",
        "cache",
        "jobs",
    ]
    assert row["max-file-size"] == "1000000 bytes"
    assert row["target-torch"] == "2.1"
    assert row["respect-gitignore"] == "false"
    assert row["configuration overrides"] == "respect-gitignore = false"
    assert row["project root"] == f"{wrapped}  (the nearest folder holding pyproject.toml)"
