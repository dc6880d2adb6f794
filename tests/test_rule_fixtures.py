"""Every rule's cases, exactly: each finding's path, line, column and code, through the real
CLI and the real flake8 plugin, and nothing more.

The cases are the files under tests/fixtures/rules/<CODE>/ plus each rule's own ``EXAMPLE``
and ``CORRECTED`` (what ``--explain`` shows), written next to them as
``<CODE>/explain_example.py`` and ``<CODE>/explain_corrected.py``. A finding is expected on
the line of its comment::

    return checkpoint(self.block, x)  # expect: CKP001@12
    x = checkpoint(self.block, x, debug=True)  # expect: CKP001@9 CKP002@9

``CODE@COLUMN``, the column 1-based in characters, several separated by one space. A line
without the comment expects no finding, so a file without any is a case that must not be
reported. tests/fixtures/rules/README.md says the same for contributors.

The whole tree (copied into a temporary folder, where it is one project: its own
pyproject.toml) is linted once by ``python -m ckptlint --format json`` and once by
``python -m flake8 -j auto``: the CLI analyses the whole project, flake8 hands the plugin one
file at a time, and both must give each file the same findings (one answer). Columns: the
CLI's JSON reports 1-based character columns; the plugin gives flake8 ``column - 1`` (flake8's
offsets are 0-based) and flake8 prints that offset plus one, so both are compared 1-based.

flake8 never hands the plugin a file it cannot parse: it reports E999 itself. Such a file
(a syntax error, a NUL byte) is expected to have E999 and no CKP finding under flake8.

CKP902 is about paths that cannot be read, not about code: its examples are command lines
with their output, run in a folder holding a clean ``src/model.py``.

Each rule's folder pins the message of every finding in it too: ``<CODE>/messages.txt``
holds the CLI's line for each (``path:line:column: CODE message``). After a change of
wording, refresh them with ``python tests/test_rule_fixtures.py --update`` and review the
diff.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from ckptlint import report
from ckptlint.project.layout import Layout
from ckptlint.rules import ALL_RULES
from ckptlint.rules.base import shown
from tests.conftest import SUBPROCESS_TIMEOUT, run_cli

FIXTURES = Path(__file__).parent / "fixtures" / "rules"
EXPECTATION = re.compile(r"  # expect: (CKP[0-9]{3}@[1-9][0-9]*(?: CKP[0-9]{3}@[1-9][0-9]*)*)$")
COMMAND_LINE_RULES = {"CKP902"}
EXPLAINED = {
    f"{rule.code}/explain_{kind}.py": text
    for rule in ALL_RULES
    if rule.code not in COMMAND_LINE_RULES
    for kind, text in (("example", rule.EXAMPLE), ("corrected", rule.CORRECTED))
}

Place = tuple[int, int, str]  # line, column, code


def fixture_files() -> list[str]:
    on_disk = [p.relative_to(FIXTURES).as_posix() for p in sorted(FIXTURES.rglob("*.py"))]
    return [*on_disk, *EXPLAINED]


def text_of(relative: str) -> str:
    if relative in EXPLAINED:
        return EXPLAINED[relative]
    return (FIXTURES / relative).read_bytes().decode("utf-8-sig", "replace")


def expectations(text: str) -> list[Place]:
    """Every ``# expect:`` comment's findings; a comment not in the exact form is an error
    (a mistyped expectation must not pass as a line that expects nothing)."""
    found = []
    for number, line in enumerate(re.split(r"\r\n|\r|\n", text), 1):  # Python's lines
        if "# expect" not in line:
            continue
        match = EXPECTATION.search(line)
        if match is None:
            raise ValueError(f"line {number}: malformed expectation: {line.strip()!r}")
        for item in match.group(1).split(" "):
            code, column = item.split("@")
            found.append((number, int(column), code))
    return sorted(found)


def compiles(relative: str) -> bool:
    """Whether the file's text is Python that compiles: flake8 runs the plugin on no other
    (it decodes a file that is not UTF-8 as latin-1, so such a file does reach the plugin)."""
    try:
        compile(text_of(relative), relative, "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True


class Runs:
    """What the CLI and flake8 reported for the whole tree, by file."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        cli = subprocess.run(
            [sys.executable, "-m", "ckptlint", "--no-cache", "--format", "json", "."],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=SUBPROCESS_TIMEOUT,
        )
        assert cli.returncode in (0, 1) and cli.stderr == "", cli.stderr
        self.cli: dict[str, list[Place]] = defaultdict(list)
        self.cli_fixable: set[str] = set()
        self.messages: dict[str, list[str]] = defaultdict(list)  # by rule folder
        for item in json.loads(cli.stdout):
            self.cli[item["path"]].append((item["line"], item["column"], item["code"]))
            line = (
                f"{item['path']}:{item['line']}:{item['column']}: {item['code']} {item['message']}"
            )
            self.messages[item["path"].split("/")[0]].append(line)
            if item["fixable"]:
                self.cli_fixable.add(item["code"])
        flake8 = subprocess.run(
            [
                sys.executable,
                "-m",
                "flake8",
                "--isolated",
                "--select",
                "CKP,E999",
                "-j",
                "auto",
                "--format",
                "%(path)s\t%(row)d\t%(col)d\t%(code)s",
                ".",
            ],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=SUBPROCESS_TIMEOUT,
        )
        assert flake8.returncode in (0, 1) and flake8.stderr == "", flake8.stderr
        self.flake8: dict[str, list[Place]] = defaultdict(list)
        for line in flake8.stdout.splitlines():
            path, row, column, code = line.split("\t")
            relative = Path(path).as_posix().removeprefix("./")
            self.flake8[relative].append((int(row), int(column), code))


def copied_fixtures(place: Path) -> Path:
    """The fixtures and the rules' examples, in a folder of their own under ``place``."""
    folder = place / "rules"
    shutil.copytree(FIXTURES, folder, symlinks=True)
    for relative, text in EXPLAINED.items():
        assert not (folder / relative).exists(), f"{relative}: a fixture takes the example's name"
        (folder / relative).write_text(text)
    return folder


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(copied_fixtures(tmp_path_factory.mktemp("fixtures")))


def pinned_messages(code: str) -> list[str]:
    path = FIXTURES / code / MESSAGES
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


MESSAGES = "messages.txt"
RULE_FOLDERS = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())


@pytest.mark.parametrize("case", fixture_files())
def test_the_cli_reports_exactly_the_expected_findings(runs: Runs, case: str) -> None:
    assert sorted(runs.cli.get(case, [])) == expectations(text_of(case))


@pytest.mark.parametrize("case", fixture_files())
def test_flake8_reports_exactly_the_expected_findings(runs: Runs, case: str) -> None:
    found = sorted(runs.flake8.get(case, []))
    if compiles(case):
        assert found == expectations(text_of(case))
    else:  # flake8 reports E999 itself and never runs the plugin on the file
        assert [code for *_, code in found] == ["E999"]


@pytest.mark.parametrize("code", RULE_FOLDERS)
def test_each_findings_message_is_pinned(runs: Runs, code: str) -> None:
    assert sorted(runs.messages.get(code, [])) == pinned_messages(code), (
        f"the messages of tests/fixtures/rules/{code}/ changed: if the new ones are right, "
        "run `python tests/test_rule_fixtures.py --update` and review the diff"
    )


def test_nothing_is_reported_for_a_file_that_is_no_case(runs: Runs) -> None:
    cases = set(fixture_files())
    assert set(runs.cli) <= cases and set(runs.flake8) <= cases


def test_rules_with_a_fix_are_the_rules_whose_findings_are_fixable(runs: Runs) -> None:
    assert runs.cli_fixable == {rule.code for rule in ALL_RULES if rule.FIX is not None}


@pytest.mark.parametrize("rule", ALL_RULES, ids=lambda rule: rule.code)
def test_every_rule_has_cases_that_are_reported_and_cases_that_are_not(rule) -> None:
    if rule.code in COMMAND_LINE_RULES:
        return  # its cases are the command lines below
    assert rule.code in {code for *_, code in expectations(rule.EXAMPLE)}
    assert expectations(rule.CORRECTED) == []
    folder = FIXTURES / rule.code
    cases = [text_of(p.relative_to(FIXTURES).as_posix()) for p in folder.rglob("*.py")]
    assert any(rule.code in {code for *_, code in expectations(text)} for text in cases)
    assert any(text.strip() and not expectations(text) for text in cases)


def test_every_fixture_has_a_module_name_of_its_own() -> None:
    """The tree is one project: two files of one module name could import each other's code."""
    paths = [str(p) for p in FIXTURES.rglob("*.py")]
    layout = Layout(paths)
    names = [layout.module_name(path) for path in paths]
    assert len(names) == len(set(names))


@pytest.mark.parametrize(
    ("code", "example", "reported"),
    [
        pytest.param(rule.code, text, reported, id=f"{rule.code}-{kind}")
        for rule in ALL_RULES
        if rule.code in COMMAND_LINE_RULES
        for kind, text, reported in (
            ("example", rule.EXAMPLE, True),
            ("corrected", rule.CORRECTED, False),
        )
    ],
)
def test_command_line_examples_print_their_findings(
    code: str, example: str, reported: bool, tmp_path: Path
) -> None:
    command, *expected = example.splitlines()
    model = tmp_path / "src" / "model.py"
    model.parent.mkdir()
    model.write_text("import torch\n")
    result = run_cli(*shlex.split(command)[2:], cwd=tmp_path)
    printed = result.stdout.splitlines()
    findings = [line for line in printed if re.match(r"\S+:\d+:\d+: CKP\d{3} ", line)]
    assert findings == [line for line in expected if re.match(r"\S+:\d+:\d+: ", line)]
    assert set(expected) <= set(printed), result.stdout
    assert (result.returncode == 1) == reported


@pytest.mark.parametrize("rule", ALL_RULES, ids=lambda rule: rule.code)
def test_rule_carries_explanation_and_examples(rule) -> None:
    assert rule.__doc__ and len(rule.__doc__.split()) > 20
    headings = [heading for heading, _ in report.rule_sections(rule)]
    required = ["What it does", "Why is this bad?", "Example", "Use instead", "Not reported"]
    assert [h for h in headings if h in required] == required  # ruff's, in ruff's order
    assert ("Fix safety" in headings) == (rule.FIX is not None)
    assert ("At run time" in headings) == (rule.GUARD is not None)
    assert rule.EXAMPLE and rule.CORRECTED and "# expect" not in shown(rule.EXAMPLE)
    assert rule.code.startswith("CKP") and len(rule.code) == 6


def update_messages() -> None:
    """Write each rule folder's ``messages.txt`` from what the CLI reports now."""
    import tempfile

    with tempfile.TemporaryDirectory() as place:
        found = Runs(copied_fixtures(Path(place))).messages
    for code in RULE_FOLDERS:
        lines = sorted(found.get(code, []))
        (FIXTURES / code / MESSAGES).write_text("".join(f"{line}\n" for line in lines))
        print(f"tests/fixtures/rules/{code}/{MESSAGES}: {len(lines)} messages")


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit("usage: python tests/test_rule_fixtures.py --update")
    update_messages()
