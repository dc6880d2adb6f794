"""The command-line conventions ruff users expect, with exact expectations."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import ckptlint.workers
from ckptlint.config import Settings
from ckptlint.engine import Engine
from ckptlint.workers import worker_count
from tests.conftest import SUBPROCESS_TIMEOUT, run_cli

MISSING = "import torch.utils.checkpoint as cp\n\ny = cp.checkpoint(f, x)\n"
TINY = (
    "import torch\nfrom torch.utils.checkpoint import checkpoint\n\n"
    "y = checkpoint(torch.relu, x, use_reentrant=False)\n"
)


@pytest.fixture
def tree(project: Path) -> Path:
    (project / ".git").mkdir()
    return project


def test_only_unsafe_fixes_available_is_said(tree: Path) -> None:
    (tree / "a.py").write_text(MISSING)
    diff = run_cli("--diff", ".", cwd=tree)
    assert (diff.returncode, diff.stderr) == (0, "")
    assert diff.stdout == "No findings would be fixed (1 fix available with `--unsafe-fixes`).\n"
    fix = run_cli("--fix", ".", cwd=tree)
    assert fix.returncode == 1
    assert fix.stdout.endswith(
        "Found 1 finding.\n1 unsafe fix available with `--fix --unsafe-fixes`.\n"
    )
    assert (tree / "a.py").read_text() == MISSING


@pytest.mark.parametrize("layout", ["empty", "excluded"])
def test_nothing_to_lint_is_a_warning(tree: Path, layout: str) -> None:
    if layout == "excluded":
        (tree / "pyproject.toml").write_text('[tool.ckptlint]\nexclude = ["*.py"]\n')
        (tree / "a.py").write_text(MISSING)
    result = run_cli(".", cwd=tree)
    assert result.returncode == 0
    assert result.stderr == "ckptlint: warning: no Python file found under the given path(s)\n"


def test_extend_select_adds_to_the_configuration(tree: Path) -> None:
    (tree / "pyproject.toml").write_text('[tool.ckptlint]\nselect = ["CKP001"]\n')
    (tree / "a.py").write_text(TINY)
    assert run_cli("--format", "json", ".", cwd=tree).stdout == "[]\n"
    extended = run_cli("--extend-select", "CKP101", "--quiet", ".", cwd=tree)
    assert extended.stdout.startswith("a.py:4:5: CKP101 ")
    ignored = run_cli("--extend-select", "CKP101", "--ignore", "CKP101", "--quiet", ".", cwd=tree)
    assert ignored.stdout == ""


def test_config_names_the_settings_file(tree: Path) -> None:
    (tree / "a.py").write_text(MISSING)
    (tree / "strict.toml").write_text('ignore = ["CKP001"]\n')
    (tree / "other.toml").write_text("[tool.something]\n")
    assert run_cli("--config", "strict.toml", ".", cwd=tree).stdout == "All checks passed!\n"
    missing = run_cli("--config", "nope.toml", ".", cwd=tree)
    assert (missing.returncode, missing.stderr) == (
        2,
        "ckptlint: error: --config nope.toml: no such file\n",
    )
    both = run_cli("--config", "strict.toml", "--isolated", ".", cwd=tree)
    assert both.returncode == 2 and both.stderr.count("\n") == 1


def settings_rows(text: str) -> dict[str, str]:
    pairs = (line.split(" = ", 1) for line in text.splitlines() if " = " in line)
    return {key.strip(): value for key, value in pairs}


def test_show_settings_names_the_root_and_why(tree: Path) -> None:
    (tree / "pkg").mkdir()
    (tree / "pkg" / "a.py").write_text(MISSING)
    shown = run_cli("--show-settings", "pkg/a.py", cwd=tree)
    assert shown.returncode == 0
    rows = settings_rows(shown.stdout)
    assert rows["project root"].split()[0] == str(tree)
    assert "git work tree" in rows["project root"]
    assert rows["selected rules"].startswith("CKP001, CKP002")
    (tree / "pyproject.toml").write_text('[tool.ckptlint]\nignore = ["CKP101"]\n')
    rows = settings_rows(run_cli("--show-settings", "pkg/a.py", cwd=tree).stdout)
    assert rows["configuration"] == str(tree / "pyproject.toml")
    assert rows["ignore"] == "CKP101"


def test_show_files_lists_what_is_linted(tree: Path) -> None:
    (tree / "a.py").write_text(MISSING)
    (tree / "b.py").write_text("x = 1\n")
    (tree / "notes.txt").write_text("")
    (tree / "build").mkdir()
    (tree / "build" / "c.py").write_text("x = 1\n")
    result = run_cli("--show-files", ".", cwd=tree)
    assert (result.returncode, result.stdout) == (0, "a.py\nb.py\n")


def test_show_rules_prints_text_or_json_only(tree: Path) -> None:
    result = run_cli("--show-rules", "--format", "sarif", cwd=tree)
    assert (result.returncode, result.stderr) == (
        2,
        "ckptlint: error: --show-rules prints text or json only\n",
    )


def test_a_bad_flag_is_one_line_with_a_suggestion(tree: Path) -> None:
    result = run_cli("--selct", "CKP001", cwd=tree)
    assert result.returncode == 2
    assert result.stderr == (
        "ckptlint: error: unrecognized arguments: --selct (did you mean --select?)\n"
    )


def test_output_format_is_ruffs_name_and_format_the_same_option(tree: Path) -> None:
    (tree / "a.py").write_text(MISSING)
    as_json = run_cli("--output-format", "json", ".", cwd=tree)
    assert as_json.returncode == 1 and json.loads(as_json.stdout)[0]["code"] == "CKP001"
    assert run_cli("--output-format=json", ".", cwd=tree).stdout == as_json.stdout
    assert run_cli("--format", "json", ".", cwd=tree).stdout == as_json.stdout


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            ["--format", "emacs", "."],
            "argument --output-format/--format: invalid choice: 'emacs' "
            "(choose from concise, full, json, github, gitlab, junit, sarif)",
        ),
        (
            ["--output-format", "sarf", "."],
            "argument --output-format/--format: invalid choice: 'sarf' "
            "(choose from concise, full, json, github, gitlab, junit, sarif; did you mean sarif?)",
        ),
        (
            ["--output-format", "gitlb", "."],
            "argument --output-format/--format: invalid choice: 'gitlb' "
            "(choose from concise, full, json, github, gitlab, junit, sarif; did you mean "
            "gitlab?)",
        ),
        (
            ["--output-formt", "json", "."],
            "unrecognized arguments: --output-formt (did you mean --output-format?)",
        ),
        (["--output-format"], "argument --output-format/--format: expected one argument"),
    ],
    ids=["invalid", "close", "close to another", "misspelt option", "no value"],
)
def test_a_usage_error_says_what_was_meant(tree: Path, arguments: list[str], message: str) -> None:
    (tree / "a.py").write_text(MISSING)
    result = run_cli(*arguments, cwd=tree)
    assert (result.returncode, result.stdout, result.stderr) == (
        2,
        "",
        f"ckptlint: error: {message}\n",
    )


def test_no_abbreviations(tree: Path) -> None:
    (tree / "a.py").write_text(MISSING)
    result = run_cli("--sel", "CKP101", ".", cwd=tree)
    assert result.returncode == 2
    assert result.stderr.startswith("ckptlint: error: unrecognized arguments: --sel")


def test_the_exit_status_says_findings(tree: Path) -> None:
    (tree / "a.py").write_text(MISSING)
    assert run_cli(".", cwd=tree).returncode == 1
    assert run_cli("--exit-zero", ".", cwd=tree).returncode == 0
    help_text = run_cli("--help", cwd=tree).stdout
    assert "1 findings" in " ".join(help_text.split())


def test_jobs_never_exceed_the_cpus_or_the_files() -> None:
    cpus = len(os.sched_getaffinity(0))
    assert worker_count(300, 1) == 1
    assert worker_count(300, 10_000) == cpus
    assert worker_count(None, 39) == 1
    assert worker_count(2, 1) == 1


def test_explain_points_to_the_guard_where_it_catches_the_bug(tree: Path) -> None:
    text = run_cli("--explain", "CKP202", cwd=tree).stdout
    assert "At run time, `ckptguard.enable()` raises `CheckpointMismatchError` (kind" in text
    assert "`closure`)" in text


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs for two workers")
def test_a_dead_worker_is_named_and_its_files_linted_again(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = []
    for index in range(8):
        path = tree / f"m{index}.py"
        path.write_text(MISSING)
        paths.append(str(path))
    parent = os.getpid()
    run = ckptlint.workers.FindingsTask.run

    def die_in_a_worker(self, analyser):  # noqa: ANN001, ANN202 - a stand-in
        if os.getpid() != parent and any(p.endswith("m1.py") for p in self.paths):
            os._exit(9)
        return run(self, analyser)

    monkeypatch.setattr(ckptlint.workers.FindingsTask, "run", die_in_a_worker)
    engine = Engine(Settings(root=tree), paths, jobs=2)
    results = engine.lint(paths)
    assert [len(r.findings) for r in results] == [1] * 8
    assert len(engine.notes) == 1
    assert engine.notes[0].startswith("a worker process died (exit code 9); its ")
    assert engine.notes[0].endswith(" were analysed again in the main process")


def test_the_readme_commands_say_what_exit_1_means() -> None:
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert "exits 1 when it reports findings" in readme


def test_the_cli_runs_as_a_module(tree: Path) -> None:
    (tree / "a.py").write_text(MISSING)
    result = subprocess.run(
        [sys.executable, "-m", "ckptlint", "--quiet", "."],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
    )
    assert result.returncode == 1 and result.stdout.startswith("a.py:3:5: CKP001 ")


ANALYSIS = {"ckptlint.analyser", "ckptlint.analysis", "ckptlint.rules.base"}


def modules_loaded(tree: Path, commands: str) -> set[str]:
    """The ckptlint modules a fresh interpreter loaded running ``commands`` (Python that
    calls ``main``, the CLI's entry) in ``tree``."""
    script = (
        "import contextlib, io, sys\n"
        "from ckptlint.cli import main\n"
        f"{commands}"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('ckptlint'))))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
    )
    assert result.returncode == 0, result.stderr
    return set(result.stdout.split())


def modules_of_a_run(tree: Path) -> set[str]:
    """The ckptlint modules one ``ckptlint .`` loaded."""
    return modules_loaded(
        tree, "with contextlib.redirect_stdout(io.StringIO()):\n    main(['.'])\n"
    )


def test_version_help_and_clean_never_import_the_analysis(tree: Path) -> None:
    """Issue 36: a run imports only what it needs. One interpreter runs the three commands
    and lists the ckptlint modules they loaded."""
    loaded = modules_loaded(
        tree,
        "for arguments in (['--version'], ['--help']):\n"
        "    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "        main(arguments)\n"
        "assert main(['clean', '.']) == 0\n",
    )
    assert "ckptlint.config" in loaded  # clean finds the project
    assert loaded & (ANALYSIS | {"ckptlint.engine"}) == set()


def test_a_warm_run_where_nothing_changed_never_imports_the_analysis(tree: Path) -> None:
    """Issue 36: every answer is in the cache, so the rules and the analysis stay unloaded;
    an edit loads them again (the check can fail)."""
    (tree / "a.py").write_text(MISSING)
    (tree / "b.py").write_text("import torch\n")
    assert run_cli(".", cwd=tree).returncode == 1  # cold: fills the cache
    assert modules_of_a_run(tree) & ANALYSIS == set()
    (tree / "b.py").write_text("import torch\nfrom torch.utils.checkpoint import checkpoint\n")
    assert modules_of_a_run(tree) >= ANALYSIS


def test_the_help_states_the_defaults_it_cannot_import() -> None:
    """The parser names two defaults as text (importing them would load the analysis)."""
    from ckptlint.cli import build_parser
    from ckptlint.project.cache import FOLDER
    from ckptlint.source import DEFAULT_MAX_FILE_SIZE

    text = " ".join(build_parser().format_help().split())
    assert f"{DEFAULT_MAX_FILE_SIZE}, 10 MiB" in text and f"default: {FOLDER} at" in text
