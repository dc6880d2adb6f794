"""The ckptlint command: in-process where a subprocess adds nothing, as a subprocess where
the installed entry points are the point."""

from __future__ import annotations

import json
import os
import re
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import run_ckptlint, run_cli

MISSING = "import torch.utils.checkpoint as cp\n\ny = cp.checkpoint(block, x)\n"
CLEAN = "import torch.utils.checkpoint as cp\n\ny = cp.checkpoint(block, x, use_reentrant=False)\n"


def write(folder: Path, name: str, text: str | bytes) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(textwrap.dedent(text))
    return path


def test_exit_codes_and_text_format(project: Path) -> None:
    write(project, "clean.py", CLEAN)
    assert run_cli("clean.py", cwd=project).returncode == 0
    write(project, "bad.py", MISSING)
    result = run_cli(cwd=project)
    assert result.returncode == 1
    first = result.stdout.splitlines()[0]
    assert first.startswith("bad.py:3:5: CKP001 `checkpoint()` ")  # its fix is unsafe: no [*]
    assert "use_reentrant" in first
    marked = run_cli("--unsafe-fixes", cwd=project).stdout.splitlines()[0]
    assert marked.startswith("bad.py:3:5: CKP001 [*] `checkpoint()` ")
    assert run_cli("--exit-zero", cwd=project).returncode == 0


def test_missing_path_is_reported_and_the_rest_is_linted(project: Path) -> None:
    write(project, "src/bad.py", MISSING)
    result = run_cli("src", "does_not_exist.py", cwd=project)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[0].startswith("src/bad.py:3:5: CKP001 ")
    assert lines[1] == "does_not_exist.py:1:1: CKP902 no such file or folder"
    assert result.stderr == ""
    assert run_cli("does_not_exist.py", "--ignore", "CKP902", cwd=project).returncode == 0


def test_unknown_option_is_a_usage_error(project: Path) -> None:
    assert run_cli("--no-such-flag", cwd=project).returncode == 2


def test_walk_skips_virtualenvs_build_and_excluded(project: Path) -> None:
    for folder in (".git", ".venv", "build", "__pycache__", "env_like", "vendored"):
        write(project, f"{folder}/m.py", MISSING)
    write(project, "env_like/pyvenv.cfg", "home = /usr\n")
    write(project, "pkg/m.py", MISSING)
    write(project, "pyproject.toml", '[tool.ckptlint]\nexclude = ["vendored"]\n')
    result = run_cli("--format", "json", cwd=project)
    assert [item["path"] for item in json.loads(result.stdout)] == [os.path.join("pkg", "m.py")]


def test_json_fields(project: Path) -> None:
    write(project, "bad.py", MISSING)
    (item,) = json.loads(run_cli("--format", "json", "bad.py", cwd=project).stdout)
    assert item == {
        "path": "bad.py",
        "line": 3,
        "column": 5,
        "end_line": 3,
        "end_column": 28,
        "code": "CKP001",
        "message": item["message"],
        "fixable": True,
        "fix_applicability": "unsafe",
    }


def test_github_format(project: Path) -> None:
    write(project, "bad.py", MISSING)
    output = run_cli("--format", "github", "bad.py", cwd=project).stdout
    assert output.startswith("::error file=bad.py,line=3,col=5,endLine=3,endColumn=28,")
    assert "::CKP001 " in output


def test_sarif_format_is_valid_2_1_0(project: Path) -> None:
    write(project, "bad.py", MISSING)
    log = json.loads(run_cli("--format", "sarif", "bad.py", cwd=project).stdout)
    assert log["version"] == "2.1.0"
    (run,) = log["runs"]
    rules = run["tool"]["driver"]["rules"]
    assert {rule["id"] for rule in rules} >= {"CKP001", "CKP901"}
    (result,) = run["results"]
    assert rules[result["ruleIndex"]]["id"] == result["ruleId"] == "CKP001"
    region = result["locations"][0]["physicalLocation"]["region"]
    assert (region["startLine"], region["startColumn"]) == (3, 5)
    uri = result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
    assert uri == "bad.py"


def test_select_and_ignore(project: Path) -> None:
    write(project, "bad.py", MISSING)
    assert run_cli("--ignore", "CKP001", cwd=project).returncode == 0
    assert run_cli("--select", "CKP9", cwd=project).returncode == 0
    assert run_cli("--select", "CKP0", cwd=project).returncode == 1


def test_config_select_ignore_and_cli_wins(project: Path) -> None:
    """Layers as in ruff: a command-line --select replaces the configuration's select and
    ignore; a command-line --ignore adds to them."""
    write(project, "bad.py", MISSING)
    write(project, "pyproject.toml", '[tool.ckptlint]\nignore = ["CKP001"]\n')
    assert run_cli(cwd=project).returncode == 0
    assert run_cli("--ignore", "CKP9", cwd=project).returncode == 0
    assert run_cli("--select", "CKP001", cwd=project).returncode == 1
    assert run_cli("--select", "CKP", cwd=project).returncode == 1
    assert run_cli("--select", "CKP001", "--ignore", "CKP0", cwd=project).returncode == 1
    assert run_cli("--select", "CKP0", "--ignore", "CKP001", cwd=project).returncode == 0
    write(project, "pyproject.toml", '[tool.ckptlint]\nselect = ["CKP9"]\n')
    assert run_cli(cwd=project).returncode == 0
    assert run_cli("--select", "CKP001", cwd=project).returncode == 1


def test_isolated_ignores_the_configuration(project: Path) -> None:
    write(project, "bad.py", MISSING)
    write(project, "pyproject.toml", '[tool.ckptlint]\nexclude = ["bad.py"]\n')
    assert run_cli(cwd=project).returncode == 0
    assert run_cli("--isolated", cwd=project).returncode == 1


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        (("--select", "CPK001"), "'CPK001'"),
        (("--select", ""), "empty rule code"),
        (("--select", "CKP001,"), "empty rule code"),
        (("--ignore", "CKP999"), "'CKP999'"),
        (("--select", "E501"), "'E501'"),
    ],
)
def test_unknown_codes_on_the_command_line_are_usage_errors(
    project: Path, arguments: tuple[str, ...], named: str
) -> None:
    write(project, "bad.py", MISSING)
    result = run_cli(*arguments, cwd=project)
    assert result.returncode == 2
    assert named in result.stderr and result.stdout == ""


@pytest.mark.parametrize(
    "config",
    [
        'select = ["CPK"]',
        'ignore = ["CKP1", "X100"]',
        'select = [""]',
        '[tool.ckptlint.per-file-ignores]\n"tests/*" = ["CKP0001"]',
    ],
)
def test_unknown_codes_in_config_are_usage_errors(project: Path, config: str) -> None:
    write(project, "bad.py", MISSING)
    write(project, "pyproject.toml", f"[tool.ckptlint]\n{config}\n")
    result = run_cli(cwd=project)
    assert result.returncode == 2
    assert "pyproject.toml: [tool.ckptlint]" in result.stderr
    assert "rule code" in result.stderr


def test_per_file_ignores(project: Path) -> None:
    write(project, "tests/test_m.py", MISSING)
    write(project, "src/m.py", MISSING)
    write(
        project,
        "pyproject.toml",
        '[tool.ckptlint.per-file-ignores]\n"tests/*" = ["CKP001"]\n',
    )
    result = run_cli("--format", "json", cwd=project)
    assert [item["path"] for item in json.loads(result.stdout)] == [os.path.join("src", "m.py")]


def test_extend_checkpoint_functions_from_config(project: Path) -> None:
    write(project, "m.py", "from mylib.mem import ckpt\nckpt(f, x)\n")
    assert run_cli(cwd=project).returncode == 0
    write(
        project,
        "pyproject.toml",
        '[tool.ckptlint]\nextend-checkpoint-functions = ["mylib.mem.ckpt"]\n',
    )
    result = run_cli(cwd=project)
    assert result.returncode == 1 and "m.py:2:1: CKP001" in result.stdout


def test_extend_checkpoint_functions_with_other_kinds(project: Path) -> None:
    """A configured module wrapper makes its argument a region like checkpoint_wrapper."""
    write(
        project,
        "m.py",
        "import torch.nn as nn\nfrom mylib.mem import wrap_block\n\n"
        "class Block(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.dropout = nn.Dropout(0.1)\n\n"
        "    def forward(self, x):\n"
        "        return self.dropout(x) + 1\n\n"
        "block = wrap_block(Block(), preserve_rng_state=False)\n",
    )
    assert run_cli(cwd=project).returncode == 0
    write(
        project,
        "pyproject.toml",
        "[tool.ckptlint]\nextend-checkpoint-functions = [\n"
        '  { name = "mylib.mem.wrap_block", kind = "module", region = 0 },\n]\n',
    )
    result = run_cli(cwd=project)
    assert result.returncode == 1 and "m.py:12:9: CKP301" in result.stdout


@pytest.mark.parametrize(
    ("entry", "named"),
    [
        ('{ kind = "module" }', "a table with a name"),
        ('{ name = "a.b", kind = "decorator" }', "kind must be one of"),
        ('{ name = "a.b", region = -1 }', "region must be a position"),
        ('{ name = "a.b", regoin = 1 }', "unknown key(s): regoin"),
    ],
)
def test_bad_extra_sources_are_usage_errors(project: Path, entry: str, named: str) -> None:
    write(project, "m.py", CLEAN)
    write(project, "pyproject.toml", f"[tool.ckptlint]\nextend-checkpoint-functions = [{entry}]\n")
    result = run_cli(cwd=project)
    assert result.returncode == 2 and named in result.stderr


def test_invalid_config_is_a_usage_error(project: Path) -> None:
    write(project, "m.py", CLEAN)
    write(project, "pyproject.toml", "[tool.ckptlint]\nselekt = ['CKP']\n")
    result = run_cli(cwd=project)
    assert result.returncode == 2 and "unknown option(s): selekt" in result.stderr
    write(project, "pyproject.toml", "[tool.ckptlint\n")
    result = run_cli(cwd=project)
    assert result.returncode == 2 and "cannot read configuration" in result.stderr


def test_noqa(project: Path) -> None:
    write(project, "a.py", MISSING.replace("x)\n", "x)  # noqa\n"))
    write(project, "b.py", MISSING.replace("x)\n", "x)  # noqa: CKP001\n"))
    write(project, "c.py", MISSING.replace("x)\n", "x)  # noqa: E501\n"))
    result = run_cli("--format", "json", cwd=project)
    assert [item["path"] for item in json.loads(result.stdout)] == ["c.py"]


def test_explain(project: Path) -> None:
    result = run_cli("--explain", "ckp001", cwd=project)
    assert result.returncode == 0
    assert "use_reentrant" in result.stdout
    headings = re.findall(r"^## (.+)$", result.stdout, flags=re.MULTILINE)
    assert headings == [
        "What it does",
        "Why is this bad?",
        "Example",
        "Use instead",
        "Fix safety",
        "Not reported",
    ]
    late_binding = run_cli("--explain", "CKP202", cwd=project).stdout
    assert re.findall(r"^## (.+)$", late_binding, flags=re.MULTILINE)[-1] == "At run time"
    assert run_cli("--explain", "CKP999", cwd=project).returncode == 2


def test_version(project: Path) -> None:
    result = run_cli("--version", cwd=project)
    assert result.returncode == 0 and result.stdout.startswith("ckptlint ")


def test_jobs_give_the_same_report(project: Path) -> None:
    for index in range(30):
        write(project, f"pkg/m{index}.py", MISSING if index % 3 else CLEAN)
    one = run_cli("--jobs", "1", "--format", "json", cwd=project)
    two = run_cli("--jobs", "2", "--format", "json", cwd=project)
    assert one.returncode == two.returncode == 1
    assert one.stdout == two.stdout
    assert len(json.loads(one.stdout)) == 20


def test_python_dash_m_and_console_script_agree(project: Path) -> None:
    import shutil
    import subprocess

    write(project, "bad.py", MISSING)
    # The script pip installed next to this interpreter (the venv may not be on PATH).
    script = shutil.which("ckptlint", path=str(Path(sys.executable).parent))
    assert script, "the ckptlint console script is installed"
    direct = subprocess.run([script, "bad.py"], cwd=project, capture_output=True, text=True)
    assert direct.stdout == run_ckptlint("bad.py", cwd=project).stdout


class TestBadInput:
    def test_syntax_error_is_reported_and_run_goes_on(self, project: Path) -> None:
        write(project, "broken.py", "import torch.utils.checkpoint\ndef f(:\n    pass\n")
        write(project, "bad.py", MISSING)
        result = run_cli("--format", "json", cwd=project)
        assert result.returncode == 1
        found = {(item["path"], item["code"]) for item in json.loads(result.stdout)}
        assert found == {("broken.py", "CKP901"), ("bad.py", "CKP001")}
        assert "Traceback" not in result.stderr

    def test_explicit_file_with_syntax_error(self, project: Path) -> None:
        write(project, "broken.py", "import torch.utils.checkpoint\ndef f(:\n    pass\n")
        result = run_cli("broken.py", cwd=project)
        assert result.returncode == 1
        assert result.stdout.startswith("broken.py:2:7: CKP901 syntax error")

    def test_a_file_that_cannot_reach_a_checkpoint_is_not_parsed_even_named(
        self, project: Path
    ) -> None:
        """One answer: named alone or found in its folder, an unrelated file is not parsed
        (its syntax errors are flake8's and ruff's E999)."""
        write(project, "broken.py", "def f(:\n    pass\n")
        for arguments in (["broken.py"], ["."]):
            result = run_cli(*arguments, cwd=project)
            assert (result.returncode, result.stdout) == (0, "All checks passed!\n")

    def test_undecodable_bytes(self, project: Path) -> None:
        write(project, "latin.py", b"import torch.utils.checkpoint\nname = '\xe9'\n")
        result = run_cli("latin.py", cwd=project)
        assert result.returncode == 1
        assert "latin.py:2:1: CKP901 cannot decode file as utf-8" in result.stdout

    def test_nul_byte(self, project: Path) -> None:
        write(project, "nul.py", b"import torch.utils.checkpoint\nx = 1\x00\n")
        result = run_cli("nul.py", cwd=project)
        assert result.returncode == 1
        assert "nul.py:2:1: CKP901 cannot parse file: it contains a NUL byte" in result.stdout

    def test_unreadable_file(self, project: Path) -> None:
        (project / "dangling.py").symlink_to(project / "nowhere.py")
        write(project, "pkg/ok.py", CLEAN)
        result = run_cli("--format", "json", ".", cwd=project)
        (item,) = json.loads(result.stdout)
        assert item["path"] == "dangling.py" and item["code"] == "CKP902"
        assert item["message"] == "cannot read file: No such file or directory"
        assert result.returncode == 1

    def test_syntax_error_in_a_lazily_parsed_body_is_reported(self, project: Path) -> None:
        """No rule reads ``unrelated``'s body, yet its syntax error is reported, at the
        place ``ast.parse`` names, for named files and for files found in folders."""
        source = (
            "import torch.utils.checkpoint as cp\n\n"
            "def unrelated(x):\n    return x +\n\n"
            "def forward(self, x):\n    return cp.checkpoint(self.block, x, use_reentrant=False)\n"
        )
        write(project, "pkg/broken.py", source)
        with pytest.raises(SyntaxError) as expected:
            compile(source, "broken.py", "exec", flags=0x400)  # ast.PyCF_ONLY_AST
        place = f"{expected.value.lineno}:{expected.value.offset}"
        for path in ("pkg/broken.py", "pkg"):
            result = run_cli(path, cwd=project)
            assert result.returncode == 1
            assert result.stdout.startswith(f"pkg/broken.py:{place}: CKP901 syntax error: ")

    def test_lines_that_only_look_like_definitions_are_no_syntax_error(self, project: Path) -> None:
        source = (
            "import torch.utils.checkpoint as cp\n\n"
            "def helper(x):\n    y = (\n1)\n    return y\n\n"
            "def forward(self, x):\n    return cp.checkpoint(self.block, x, use_reentrant=False)\n"
        )
        write(project, "m.py", source)
        result = run_cli("m.py", cwd=project)
        assert (result.returncode, result.stdout) == (0, "All checks passed!\n")

    @pytest.mark.parametrize("terms", [400, 3000])
    def test_deeply_nested_expression_is_reported_never_a_crash(
        self, project: Path, terms: int
    ) -> None:
        chain = " + ".join(["a"] * terms)
        write(
            project,
            "deep.py",
            f"import torch.utils.checkpoint as cp\ny = cp.checkpoint(lambda a: {chain}, x)\n",
        )
        write(project, "bad.py", MISSING)
        result = run_cli("--format", "json", ".", cwd=project)
        assert result.returncode == 1 and result.stderr == ""
        found = {(i["path"], i["code"]) for i in json.loads(result.stdout)}
        assert ("bad.py", "CKP001") in found
        deep = {code for path, code in found if path == "deep.py"}
        assert deep in ({"CKP001"}, {"CKP901"})
        if deep == {"CKP901"}:
            (item,) = [i for i in json.loads(result.stdout) if i["path"] == "deep.py"]
            assert item["message"].startswith("too deeply nested to analyse")

    def test_parser_limits_are_reported(self, project: Path) -> None:
        write(
            project,
            "parens.py",
            "import torch.utils.checkpoint\nx = " + "(" * 300 + ")" * 300 + "\n",
        )
        result = run_cli("parens.py", cwd=project)
        assert result.returncode == 1
        assert result.stdout.startswith("parens.py:2:")
        assert "CKP901 syntax error: too many nested parentheses" in result.stdout

    def test_bom_and_coding_declaration_are_honoured(self, project: Path) -> None:
        write(project, "bom.py", "\ufeff".encode() + MISSING.encode())
        latin = (
            b"# -*- coding: latin-1 -*-\n"
            b"import torch.utils.checkpoint as cp\n"
            b"s = '\xe9'; cp.checkpoint(f, x)\n"
        )
        write(project, "latin.py", latin)
        result = run_cli("--format", "json", "bom.py", "latin.py", cwd=project)
        found = [(i["path"], i["line"], i["column"], i["code"]) for i in json.loads(result.stdout)]
        assert found == [("bom.py", 3, 5, "CKP001"), ("latin.py", 3, 10, "CKP001")]


def test_bundled_example_shows_every_rule() -> None:
    """README's first command: each mistake marked in examples/model.py is found."""
    root = Path(__file__).resolve().parent.parent
    result = run_cli("--no-cache", "--format", "json", "examples/model.py", cwd=root)
    found = sorted(item["code"] for item in json.loads(result.stdout))
    marked = sorted(
        line.split("# ", 1)[1].split(":", 1)[0]
        for line in (root / "examples" / "model.py").read_text().splitlines()
        if line.strip().startswith("# CKP")
    )
    assert found == marked == ["CKP001", "CKP101", "CKP201", "CKP202", "CKP301"]


def test_warnings_of_the_parser_neither_print_nor_fail(project: Path) -> None:
    """An invalid escape sequence makes Python's parser warn; under ``-W error`` that warning
    would be a SyntaxError. ckptlint lints the file as Python runs it."""
    import warnings

    write(project, "m.py", 'import re\npattern = re.compile("\\d+")\n' + MISSING)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = run_cli("--format", "json", "m.py", cwd=project)
    assert [item["code"] for item in json.loads(result.stdout)] == ["CKP001"]
    assert result.stderr == ""
