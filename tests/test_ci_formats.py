"""The report formats CI systems read (GitLab Code Quality, JUnit XML) and ruff's ``full`` and
``concise``, with exact expectations."""

from __future__ import annotations

import json
from pathlib import Path
from xml.etree import ElementTree

import jsonschema

from tests.conftest import run_cli

MODEL = """\
import torch
from torch.utils.checkpoint import checkpoint


def forward(block, x):
    x = checkpoint(block, x)
    return checkpoint(torch.relu, x, use_reentrant=False)
"""
OTHER = "import torch.utils.checkpoint as cp\n\ny = cp.checkpoint(f, x)\n"

# GitLab's documented fields of a Code Quality report (docs.gitlab.com, "Code Quality report
# format"): a list of issues, each with a description, a check name, a unique fingerprint, a
# severity of five, and a location whose path is relative to the repository and whose first
# line is ``lines.begin`` or ``positions.begin.line``.
GITLAB_SCHEMA = {
    "type": "array",
    "items": {
        "type": "object",
        "required": ["description", "check_name", "fingerprint", "severity", "location"],
        "properties": {
            "description": {"type": "string", "minLength": 1},
            "check_name": {"type": "string", "minLength": 1},
            "fingerprint": {"type": "string", "minLength": 1},
            "severity": {"enum": ["info", "minor", "major", "critical", "blocker"]},
            "location": {
                "type": "object",
                "required": ["path"],
                "properties": {
                    "path": {"type": "string", "pattern": "^[^/]"},
                    "lines": {
                        "type": "object",
                        "required": ["begin"],
                        "properties": {"begin": {"type": "integer", "minimum": 1}},
                    },
                    "positions": {
                        "type": "object",
                        "required": ["begin"],
                        "properties": {
                            "begin": {
                                "type": "object",
                                "required": ["line"],
                                "properties": {"line": {"type": "integer", "minimum": 1}},
                            }
                        },
                    },
                },
                "anyOf": [{"required": ["lines"]}, {"required": ["positions"]}],
            },
        },
    },
}


def write_tree(root: Path) -> None:
    (root / ".git").mkdir(exist_ok=True)
    (root / "model.py").write_text(MODEL)
    (root / "other.py").write_text(OTHER)


def gitlab(root: Path, *paths: str) -> list[dict]:
    result = run_cli("--output-format", "gitlab", *paths, cwd=root)
    assert (result.returncode, result.stderr) == (1, "")
    issues = json.loads(result.stdout)
    jsonschema.validate(issues, GITLAB_SCHEMA)
    return issues


def test_gitlab_issues_hold_the_documented_fields(tmp_path: Path) -> None:
    write_tree(tmp_path)
    issues = gitlab(tmp_path, ".")
    assert [
        (i["check_name"], i["location"]["path"], i["location"]["positions"]["begin"])
        for i in issues
    ] == [
        ("CKP001", "model.py", {"line": 6, "column": 9}),
        ("CKP101", "model.py", {"line": 7, "column": 12}),
        ("CKP001", "other.py", {"line": 3, "column": 5}),
    ]
    assert issues[0]["description"].startswith("CKP001: `checkpoint()` called without ")
    assert {issue["severity"] for issue in issues} == {"major"}
    assert len({issue["fingerprint"] for issue in issues}) == 3
    # Paths named absolutely are still the repository's (GitLab matches them to its files).
    absolute = gitlab(tmp_path, str(tmp_path / "model.py"))
    assert [issue["location"]["path"] for issue in absolute] == ["model.py", "model.py"]


def test_gitlab_fingerprints_stay_when_lines_move_and_differ_for_twins(tmp_path: Path) -> None:
    write_tree(tmp_path)
    before = {i["fingerprint"]: i for i in gitlab(tmp_path, ".")}
    (tmp_path / "model.py").write_text("# a comment\n\n\n" + MODEL)
    after = {i["fingerprint"]: i for i in gitlab(tmp_path, ".")}
    assert after.keys() == before.keys()
    moved = [fp for fp in before if after[fp]["location"] != before[fp]["location"]]
    assert len(moved) == 2  # the two findings of model.py, three lines down
    # The same line twice in a file: two issues, two fingerprints.
    (tmp_path / "other.py").write_text(OTHER + "y = cp.checkpoint(f, x)\n")
    twins = [i for i in gitlab(tmp_path, "other.py")]
    assert len(twins) == 2 and twins[0]["fingerprint"] != twins[1]["fingerprint"]


def test_junit_has_one_failure_per_finding(tmp_path: Path) -> None:
    write_tree(tmp_path)
    result = run_cli("--output-format", "junit", ".", cwd=tmp_path)
    assert (result.returncode, result.stderr) == (1, "")
    root = ElementTree.fromstring(result.stdout)
    assert (root.tag, root.get("tests"), root.get("failures"), root.get("errors")) == (
        "testsuites",
        "3",
        "3",
        "0",
    )
    suites = {suite.get("name"): suite for suite in root.findall("testsuite")}
    assert list(suites) == ["model.py", "other.py"]
    cases = [
        (case.get("name"), case.get("classname"), case.get("line"), case.get("column"))
        for case in root.iter("testcase")
    ]
    assert cases == [
        ("ckptlint.CKP001", "model", "6", "9"),
        ("ckptlint.CKP101", "model", "7", "12"),
        ("ckptlint.CKP001", "other", "3", "5"),
    ]
    failures = root.findall("./testsuite/testcase/failure")
    assert len(failures) == 3
    assert failures[0].text.startswith("line 6, col 9, `checkpoint()` called without")


def test_junit_of_a_clean_run_is_one_passing_case(tmp_path: Path) -> None:
    (tmp_path / "clean.py").write_text("x = 1\n")
    result = run_cli("--output-format", "junit", ".", cwd=tmp_path)
    root = ElementTree.fromstring(result.stdout)
    assert (result.returncode, root.get("tests"), root.get("failures")) == (0, "1", "0")
    assert [case.get("name") for case in root.iter("testcase")] == ["No findings"]
    assert root.find(".//failure") is None


def test_junit_holds_any_file_name(tmp_path: Path) -> None:
    """A name with a control character still makes well-formed XML (shown as git shows it)."""
    (tmp_path / "odd\x01name.py").write_text(OTHER)
    result = run_cli("--output-format", "junit", ".", cwd=tmp_path)
    root = ElementTree.fromstring(result.stdout)
    assert [suite.get("name") for suite in root.iter("testsuite")] == ['"odd\\001name.py"']


FULL = """\
CKP001 `checkpoint()` called without `use_reentrant`; pass `use_reentrant=False` \
(recommended) or `use_reentrant=True` explicitly
 --> model.py:6:9
  |
4 |
5 | def forward(block, x):
6 |     x = checkpoint(block, x)
  |         ^^^^^^^^^^^^^^^^^^^^
7 |     return checkpoint(torch.relu, x, use_reentrant=False)
  |

"""


def test_full_shows_the_code_around_each_finding(tmp_path: Path) -> None:
    write_tree(tmp_path)
    result = run_cli("--output-format", "full", "--select", "CKP001", "model.py", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stdout == (
        FULL + "Found 1 finding.\n1 unsafe fix available with `--fix --unsafe-fixes`.\n"
    )
    # From standard input, the text given is what is shown.
    piped = run_cli(
        "--output-format",
        "full",
        "--select",
        "CKP001",
        "--stdin-filename",
        "model.py",
        "-",
        cwd=tmp_path,
        stdin=MODEL.encode(),
    )
    assert piped.stdout == result.stdout


def test_concise_is_text_and_the_default(tmp_path: Path) -> None:
    write_tree(tmp_path)
    default = run_cli(".", cwd=tmp_path)
    assert run_cli("--output-format", "concise", ".", cwd=tmp_path).stdout == default.stdout
    assert run_cli("--output-format", "text", ".", cwd=tmp_path).stdout == default.stdout
    assert default.stdout.startswith("model.py:6:9: CKP001 ")
