"""What a ruff user types works: ``check``, ``-n``, ``-e``, ``-s``, ``--target-torch``,
``--cache-dir`` made like ruff's; and a configuration that is wrong says so, naming the key
(exit 2), with the key probably meant."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SUBPROCESS_TIMEOUT, run_cli

ROOT = Path(__file__).resolve().parent.parent
MISSING = "import torch.utils.checkpoint as cp\n\ny = cp.checkpoint(f, x)\n"
VERSIONED = """\
import torch
from torch.utils.checkpoint import checkpoint

CALLS = []


def block(x):
    if torch.__version__ < "2.0":
        CALLS.append(1)
    return x * 2


y = checkpoint(block, x, use_reentrant=False)
"""


@pytest.fixture
def tree(project: Path) -> Path:
    (project / ".git").mkdir()
    (project / "a.py").write_text(MISSING)
    return project


def test_check_is_the_bare_form(tmp_path: Path) -> None:
    """``ckptlint check examples/`` prints what ``ckptlint examples/`` prints."""
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    (tmp_path / ".git").mkdir()
    bare = run_cli("-n", "examples/", cwd=tmp_path)
    check = run_cli("check", "-n", "examples/", cwd=tmp_path)
    assert bare.returncode == check.returncode == 1
    assert (check.stdout, check.stderr) == (bare.stdout, bare.stderr)
    assert bare.stdout.startswith("examples/model.py:49:17: CKP001 ")
    assert run_cli("check", cwd=tmp_path / "examples").stdout == bare.stdout.replace(
        "examples/", ""
    )


def test_a_folder_named_like_a_command_is_reached_through_its_path(tree: Path) -> None:
    (tree / "check").mkdir()
    (tree / "check" / "b.py").write_text(MISSING)
    assert run_cli("-q", "./check", cwd=tree).stdout.startswith("check/b.py:3:5: CKP001 ")


def test_short_flags_are_ruffs(tree: Path) -> None:
    result = run_cli("-n", "-e", ".", cwd=tree)
    assert result.returncode == 0 and result.stdout.startswith("a.py:3:5: CKP001 ")
    assert not (tree / ".ckptlint_cache").exists()  # -n: no cache
    silent = run_cli("-s", ".", cwd=tree)
    assert (silent.returncode, silent.stdout, silent.stderr) == (1, "", "")
    usage = run_cli("-s", "--select", "XYZ1", ".", cwd=tree)
    assert usage.returncode == 2 and usage.stderr.startswith("ckptlint: error: ")


def test_exit_non_zero_on_fix(tree: Path) -> None:
    """As in ruff's pre-commit hooks (``args: [--fix, --exit-non-zero-on-fix]``): a run that
    wrote a fix fails, though nothing remains to report; one that wrote none passes."""
    fixed = run_cli("--fix", "--unsafe-fixes", "--exit-non-zero-on-fix", ".", cwd=tree)
    assert (fixed.returncode, fixed.stdout) == (1, "Found 1 finding (1 fixed, 0 remaining).\n")
    assert "use_reentrant=False" in (tree / "a.py").read_text()
    again = run_cli("--fix", "--unsafe-fixes", "--exit-non-zero-on-fix", ".", cwd=tree)
    assert (again.returncode, again.stdout) == (0, "All checks passed!\n")
    both = run_cli("--fix", "--exit-non-zero-on-fix", "-e", ".", cwd=tree)
    assert (both.returncode, both.stderr) == (
        2,
        "ckptlint: error: --exit-non-zero-on-fix cannot be used with --exit-zero\n",
    )


def test_target_torch_on_the_command_line(tree: Path) -> None:
    """On torch 2.1 the region's ``< 2.0`` branch never runs: no side effect (CKP203)."""
    (tree / "a.py").write_text(VERSIONED)
    on_1_9 = run_cli("-q", "--target-torch", "1.9", ".", cwd=tree).stdout
    assert on_1_9.startswith("a.py:13:5: CKP203 ")
    assert run_cli("-q", "--target-torch", "2.1", ".", cwd=tree).stdout == ""
    (tree / "pyproject.toml").write_text('[tool.ckptlint]\ntarget-torch = "1.9"\n')
    assert run_cli("-q", ".", cwd=tree).stdout == on_1_9
    assert run_cli("-q", "--target-torch", "2.1", ".", cwd=tree).stdout == ""
    shown = run_cli("--show-settings", "--target-torch", "2.1", ".", cwd=tree).stdout
    assert "target-torch                = 2.1\n" in shown
    wrong = run_cli("--target-torch", "two", ".", cwd=tree)
    assert (wrong.returncode, wrong.stderr) == (
        2,
        'ckptlint: error: argument --target-torch: expected a torch version such as "2.1", '
        "got 'two'\n",
    )
    ruff_name = run_cli("--target-version", "py310", ".", cwd=tree)
    assert ruff_name.stderr == (
        "ckptlint: error: unrecognized arguments: --target-version (did you mean --target-torch?)\n"
    )


def test_the_cache_folder_is_made_with_the_folders_above_it(tree: Path) -> None:
    result = run_cli("--cache-dir", "missing/deeper/cache", ".", cwd=tree)
    assert (result.returncode, result.stderr) == (1, "")
    cache = tree / "missing" / "deeper" / "cache"
    assert (cache / "CACHEDIR.TAG").is_file()
    warm = run_cli("--cache-dir", "missing/deeper/cache", ".", cwd=tree)
    assert (warm.stdout, warm.stderr) == (result.stdout, "")
    (tree / "blocked").write_text("")  # a file where a folder should be: said, run uncached
    blocked = run_cli("--cache-dir", "blocked/cache", ".", cwd=tree)
    assert blocked.returncode == 1
    assert blocked.stderr.startswith(f"ckptlint: warning: cache not used: cannot make {tree}")


# -- the configuration's types ---------------------------------------------------------------
def config_error(tree: Path, table: str) -> str:
    (tree / "pyproject.toml").write_text("[tool.ckptlint]\n" + table)
    result = run_cli(".", cwd=tree)
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    assert result.stderr.count("\n") == 1
    prefix = f"ckptlint: error: {tree / 'pyproject.toml'}: [tool.ckptlint]"
    assert result.stderr.startswith(prefix)
    return result.stderr[len(prefix) :].removeprefix(":").strip()


@pytest.mark.parametrize(
    ("table", "error"),
    [
        (
            'ignore = "CKP001"\n',
            "ignore: expected a list of strings, got 'CKP001' (a list of one: ['CKP001'])",
        ),
        (
            'exclude = "build"\n',
            "exclude: expected a list of strings, got 'build' (a list of one: ['build'])",
        ),
        (
            'extend-checkpoint-functions = ["notdotted"]\n',
            "extend-checkpoint-functions: expected a dotted name such as "
            "mylib.memory.checkpoint_block (the module, then the function), got 'notdotted'",
        ),
        (
            'extend-checkpoint-functions = ["mylib..wrap"]\n',
            "extend-checkpoint-functions: expected a dotted name such as "
            "mylib.memory.checkpoint_block (the module, then the function), got 'mylib..wrap'",
        ),
        (
            'extend-checkpoint-functions = [{ name = "wrap", kind = "module" }]\n',
            "extend-checkpoint-functions: expected a dotted name such as "
            "mylib.memory.checkpoint_block (the module, then the function), got 'wrap'",
        ),
        (
            'extend-checkpoint-functions = "mylib.wrap"\n',
            "extend-checkpoint-functions: expected a list of dotted names or tables, got "
            "'mylib.wrap' (a list of one: ['mylib.wrap'])",
        ),
        ('exlude = ["build"]\n', "unknown option(s): exlude (did you mean exclude?)"),
        (
            'per_file_ignores = {"tests/" = ["CKP001"]}\n',
            "unknown option(s): per_file_ignores (did you mean per-file-ignores?)",
        ),
        ("colour = true\n", "unknown option(s): colour"),
    ],
    ids=[
        "string for a list",
        "string for exclude",
        "not dotted",
        "empty part",
        "table not dotted",
        "string for names",
        "misspelt",
        "underscores",
        "unknown",
    ],
)
def test_a_wrong_configuration_names_the_key(tree: Path, table: str, error: str) -> None:
    assert config_error(tree, table) == error


def test_a_version_of_5000_digits_is_no_version(tree: Path) -> None:
    error = config_error(tree, f'target-torch = "{"9" * 5000}"\n')
    assert error.startswith('target-torch: expected a torch version such as "2.1", got \'999')
    assert len(error) < 200  # the value is shown shortened


def test_per_file_ignores_take_lists(tree: Path) -> None:
    error = config_error(tree, '[tool.ckptlint.per-file-ignores]\n"tests/" = "CKP001"\n')
    assert error == (
        "per-file-ignores 'tests/': expected a list of strings, got 'CKP001' (a list of one: "
        "['CKP001'])"
    )


def test_a_huge_torch_requirement_declares_nothing(tree: Path) -> None:
    """A project's own requirement is no configuration: a version no one can mean is
    passed over, as an unreadable requirement is."""
    (tree / "pyproject.toml").write_text(
        f'[project]\nname = "x"\ndependencies = ["torch>={"9" * 5000}"]\n'
    )
    result = run_cli("--show-settings", ".", cwd=tree)
    assert result.returncode == 0
    assert "target-torch                = not set (no torch requirement found)\n" in result.stdout


def test_the_server_takes_no_paths(tree: Path) -> None:
    result = run_cli("server", "a.py", cwd=tree)
    assert (result.returncode, result.stderr) == (
        2,
        "ckptlint: error: server takes no paths: it lints the files the editor opens\n",
    )
    # A rule code that does not exist is said before the session starts, not in it.
    wrong = run_cli("server", "--select", "CKP1,XYZ1", cwd=tree)
    assert (wrong.returncode, wrong.stdout) == (2, "")
    assert wrong.stderr.startswith(
        "ckptlint: error: --select: unknown rule code or prefix 'XYZ1' (known: CKP001, "
    )


def test_paths_among_the_options_and_after_a_double_dash(tree: Path) -> None:
    """Options and paths mix as in ruff; after ``--`` every word is a path, even ``-.py``
    (found by tests/test_fuzz.py)."""
    (tree / "-.py").write_text(MISSING)
    mixed = run_cli("a.py", "--select", "CKP001", "-q", "--", "-.py", cwd=tree)
    assert [line.split(":")[0] for line in mixed.stdout.splitlines()] == ["a.py", "-.py"]
    odd = run_cli("--no-such", "caf\udcff.py", cwd=tree)  # a usage error naming odd bytes
    assert odd.returncode == 2 and odd.stderr.startswith("ckptlint: error: ")


def test_the_linter_run_needs_no_torch(tmp_path: Path) -> None:
    """``python -m pytest -m "not slow and not torch"`` (CONTRIBUTING.md) collects without
    torch: a torch that cannot be imported stands in for one not installed."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text('raise ImportError("no torch")\n')
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "not slow and not torch", "--collect-only", "-q"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    collected = result.stdout.splitlines()
    assert not any(line.startswith("tests/guard/") for line in collected)
    assert any(line.startswith("tests/test_cli.py::") for line in collected)
