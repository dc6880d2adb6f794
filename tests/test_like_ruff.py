"""Where ckptlint and ruff share a flag, they behave alike: each case runs the real ruff and
ckptlint with the same flags on a file with the same kinds of findings (a finding whose only
fix is unsafe: ruff's E711, ckptlint's CKP001; one without a fix: E741, CKP101) and compares
the exit codes and the shape of standard output and standard error: which lines there are,
where ``[*]`` stands, the summary's wording, with the paths, codes, messages and numbers
left out. ckptlint says "finding" where ruff says "error"; its text format is ruff's
``concise``. ckptlint has no safe fix yet, so the summaries of safe fixes are compared
through the report functions, on findings shaped like ruff's."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest

from ckptlint import report
from ckptlint.core import Applicability, Finding
from tests.conftest import SUBPROCESS_TIMEOUT, run_cli

# The same kinds of finding in each tool: its code, and a line of a file that makes one.
RUFF = {
    "unsafe": ("E711", "if x == None:\n    pass\n"),
    "no fix": ("E741", "l = 1\n"),
}
CKPTLINT = {
    "unsafe": ("CKP001", "y = checkpoint(block, x)\n"),
    "no fix": ("CKP101", "z = checkpoint(torch.relu, x, use_reentrant=False)\n"),
}
RUFF_HEADER = "x = 1\n"
CKPTLINT_HEADER = "import torch\nfrom torch.utils.checkpoint import checkpoint\n\n"

FINDING = re.compile(r"^[^\s:]+:\d+:\d+: [A-Z]+\d+ (\[\*\] )?\S.*$")
STATISTICS_ROW = re.compile(r"^\d+\t[A-Z]+\d+\t(\[[* ]\] )?[a-z-]+$")
DIFF = re.compile(r"^(--- |\+\+\+ |@@ |[ +-])")


def shape(text: str) -> list[str]:
    """The lines of an output with what differs between the tools left out: a finding as
    ``FINDING`` (with its ``[*]``), diff lines as one ``DIFF``, statistics rows in sorted
    order (the tools order codes differently), numbers as ``N``, blank lines dropped."""
    shapes: list[str] = []
    rows: list[str] = []
    for line in text.splitlines():
        if STATISTICS_ROW.match(line):
            rows.append(
                "N\tCODE\t" + ("[*] " if "[*]" in line else "[ ] " if "[ ]" in line else "")
            )
            continue
        shapes.extend(sorted(rows))
        rows = []
        if FINDING.match(line):
            shapes.append("FINDING [*]" if " [*] " in line else "FINDING")
        elif DIFF.match(line):
            if shapes[-1:] != ["DIFF"]:
                shapes.append("DIFF")
        elif line:
            shapes.append(re.sub(r"\d+", "N", line).replace("error", "finding"))
    return shapes + sorted(rows)


def ruff(*arguments: str, cwd: Path, stdin: bytes = b"") -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "ruff", "check", "--isolated", "--no-cache", *arguments]
    if not any(a.startswith("--output-format") for a in arguments):
        command += ["--output-format", "concise"]  # ckptlint's text format
    return subprocess.run(
        command,
        cwd=cwd,
        input=stdin.decode(),
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
    )


def write_files(folder: Path, kinds: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """``r.py`` for ruff and ``c.py`` for ckptlint, with a finding of each kind; the
    ``--select`` arguments of each tool for them."""
    folder.mkdir(exist_ok=True)
    (folder / "r.py").write_text(RUFF_HEADER + "".join(RUFF[kind][1] for kind in kinds))
    (folder / "c.py").write_text(CKPTLINT_HEADER + "".join(CKPTLINT[k][1] for k in kinds))
    codes_of_ruff = ",".join(RUFF[kind][0] for kind in kinds) or "E711"
    codes_of_ckptlint = ",".join(CKPTLINT[kind][0] for kind in kinds) or "CKP001"
    return ["--select", codes_of_ruff], ["--isolated", "--no-cache", "--select", codes_of_ckptlint]


BOTH = ("unsafe", "no fix")
CASES = {
    "clean": ((), []),
    "unsafe fix": (("unsafe",), []),
    "no fix": (("no fix",), []),
    "both": (BOTH, []),
    "--unsafe-fixes": (BOTH, ["--unsafe-fixes"]),
    "--quiet": (BOTH, ["--quiet"]),
    "-q": (BOTH, ["-q"]),
    "--exit-zero": (BOTH, ["--exit-zero"]),
    "-e": (BOTH, ["-e"]),
    "--silent": (BOTH, ["--silent"]),
    "-s": (("unsafe",), ["-s"]),
    "-s clean": ((), ["-s"]),
    "--add-noqa": (BOTH, ["--add-noqa"]),
    "--add-noqa one": (("no fix",), ["--add-noqa"]),
    "--add-noqa clean": ((), ["--add-noqa"]),
    "--statistics": (BOTH, ["--statistics"]),
    "--statistics --unsafe-fixes": (BOTH, ["--statistics", "--unsafe-fixes"]),
    "--statistics no fix": (("no fix",), ["--statistics"]),
    "--statistics --quiet": (BOTH, ["--statistics", "--quiet"]),
    "--fix": (BOTH, ["--fix"]),
    "--fix --unsafe-fixes": (BOTH, ["--fix", "--unsafe-fixes"]),
    "--fix --unsafe-fixes all fixed": (("unsafe",), ["--fix", "--unsafe-fixes"]),
    "--fix --exit-non-zero-on-fix all fixed": (
        ("unsafe",),
        ["--fix", "--unsafe-fixes", "--exit-non-zero-on-fix"],
    ),
    "--fix --exit-non-zero-on-fix nothing fixed": (
        ("no fix",),
        ["--fix", "--exit-non-zero-on-fix"],
    ),
    "--exit-non-zero-on-fix clean": ((), ["--fix", "--exit-non-zero-on-fix"]),
    "--fix --statistics": (BOTH, ["--fix", "--unsafe-fixes", "--statistics"]),
    "--fix --quiet": (BOTH, ["--fix", "--unsafe-fixes", "--quiet"]),
    "--diff": (BOTH, ["--diff"]),
    "--diff no fix": (("no fix",), ["--diff"]),
    "--diff --unsafe-fixes": (BOTH, ["--diff", "--unsafe-fixes"]),
    "--diff --unsafe-fixes --quiet": (BOTH, ["--diff", "--unsafe-fixes", "--quiet"]),
    "--fix --diff": (BOTH, ["--fix", "--diff", "--unsafe-fixes"]),
    "--output-file": (BOTH, ["--output-file", "report.txt"]),
    "-o": (("unsafe",), ["-o", "report.txt"]),
}


@pytest.mark.parametrize(("kinds", "flags"), CASES.values(), ids=CASES.keys())
def test_the_same_flag_behaves_as_in_ruff(tmp_path: Path, kinds: tuple, flags: list) -> None:
    ruff_select, ckptlint_select = write_files(tmp_path, kinds)
    theirs = ruff(*ruff_select, *flags, "r.py", cwd=tmp_path)
    ours = run_cli(*ckptlint_select, *flags, "c.py", cwd=tmp_path)
    assert (ours.returncode, shape(ours.stdout), shape(ours.stderr)) == (
        theirs.returncode,
        shape(theirs.stdout),
        shape(theirs.stderr),
    ), f"ruff printed:\n{theirs.stdout}{theirs.stderr}\nckptlint printed:\n{ours.stdout}"
    if "--fix" in flags and "--diff" not in flags:  # the same fixes were written
        fixed_by_ruff = "x is None" in (tmp_path / "r.py").read_text()
        fixed_by_ckptlint = "(block, x, use_reentrant=False)" in (tmp_path / "c.py").read_text()
        assert fixed_by_ckptlint == fixed_by_ruff == ("--unsafe-fixes" in flags)
    if "--add-noqa" in flags:  # the same lines were given a comment, which suppresses them
        for name, tool in (("r.py", "ruff"), ("c.py", "ckptlint")):
            noqa = [line for line in (tmp_path / name).read_text().splitlines() if "# noqa" in line]
            assert len(noqa) == len(kinds), tool
        again = run_cli(*ckptlint_select, "c.py", cwd=tmp_path)
        assert (again.returncode, again.stdout) == (0, "All checks passed!\n")
    if "report.txt" in flags:
        written = shape((tmp_path / "report.txt").read_text())
        ruff(*ruff_select, *flags, "r.py", cwd=tmp_path)
        assert written == shape((tmp_path / "report.txt").read_text())


@pytest.mark.parametrize("fix", [False, True], ids=["lint", "--fix --unsafe-fixes"])
def test_standard_input_as_in_ruff(tmp_path: Path, fix: bool) -> None:
    ruff_select, ckptlint_select = write_files(tmp_path, BOTH)
    flags = ["--fix", "--unsafe-fixes"] if fix else []
    source = {name: (tmp_path / name).read_bytes() for name in ("r.py", "c.py")}
    arguments = [*flags, "--stdin-filename"]
    theirs = ruff(*ruff_select, *arguments, "r.py", "-", cwd=tmp_path, stdin=source["r.py"])
    ours = run_cli(*ckptlint_select, *arguments, "c.py", "-", cwd=tmp_path, stdin=source["c.py"])
    assert (ours.returncode, shape(ours.stderr)) == (theirs.returncode, shape(theirs.stderr))
    if fix:  # the fixed text on stdout, the report on stderr
        assert "x is None" in theirs.stdout and "use_reentrant=False)" in ours.stdout
    else:
        assert shape(ours.stdout) == shape(theirs.stdout)


@pytest.mark.parametrize("output_format", ["json", "github", "gitlab", "junit", "sarif"])
def test_shared_output_formats_as_in_ruff(tmp_path: Path, output_format: str) -> None:
    """The formats both tools have: the same exit code, one entry per finding, nothing on
    stderr; GitHub annotations with the same properties, SARIF logs with the same keys."""
    ruff_select, ckptlint_select = write_files(tmp_path, BOTH)
    flags = ["--output-format", output_format]
    theirs = ruff(*ruff_select, *flags, "r.py", cwd=tmp_path)
    ours = run_cli(*ckptlint_select, *flags, "c.py", cwd=tmp_path)
    assert (ours.returncode, ours.stderr) == (theirs.returncode, theirs.stderr) == (1, "")
    if output_format == "json":
        assert len(json.loads(ours.stdout)) == len(json.loads(theirs.stdout)) == 2
    elif output_format == "gitlab":

        def keys(issue: dict, prefix: str = "") -> set[str]:
            return {
                f"{prefix}{key}"
                for name, value in issue.items()
                for key in ([name] if not isinstance(value, dict) else keys(value, f"{name}."))
            }

        assert [keys(issue) for issue in json.loads(ours.stdout)] == [
            keys(issue) for issue in json.loads(theirs.stdout)
        ]
    elif output_format == "junit":
        ours_xml, theirs_xml = (
            ElementTree.fromstring(ours.stdout),
            ElementTree.fromstring(theirs.stdout),
        )
        assert ours_xml.tag == theirs_xml.tag == "testsuites"
        assert set(ours_xml.attrib) == set(theirs_xml.attrib)
        for tree in (ours_xml, theirs_xml):
            assert len(tree.findall("./testsuite/testcase/failure")) == 2
    elif output_format == "github":

        def properties(line: str) -> list[str]:
            command, _, _ = line.partition("::")[2].partition("::")
            return sorted(pair.split("=")[0] for pair in command.split(" ", 1)[1].split(","))

        assert [properties(line) for line in ours.stdout.splitlines()] == [
            properties(line) for line in theirs.stdout.splitlines()
        ]
    else:
        ours_log, theirs_log = json.loads(ours.stdout), json.loads(theirs.stdout)
        assert ours_log.keys() == theirs_log.keys()
        assert len(ours_log["runs"][0]["results"]) == len(theirs_log["runs"][0]["results"]) == 2


USAGE_ERRORS = {
    "unknown option": ["--no-such-option"],
    "invalid output format": ["--output-format", "yaml"],
    "unknown rule code": ["--select", "XYZ999"],
}


@pytest.mark.parametrize("flags", USAGE_ERRORS.values(), ids=USAGE_ERRORS.keys())
def test_usage_errors_exit_2_as_in_ruff(tmp_path: Path, flags: list[str]) -> None:
    write_files(tmp_path, BOTH)
    theirs = ruff(*flags, "r.py", cwd=tmp_path)
    ours = run_cli(*flags, "c.py", cwd=tmp_path)
    assert (ours.returncode, ours.stdout) == (theirs.returncode, theirs.stdout) == (2, "")
    assert ours.stderr.startswith("ckptlint: error: ") and ours.stderr.count("\n") == 1


# -- safe fixes, which no ckptlint rule has yet: ruff's wording through the report ------------
SAFE = "import os\n"  # F401, an unused import: a safe fix


def findings(applicabilities: list[Applicability | None]) -> report.Report:
    return [
        ("c.py", Finding(index + 1, 1, "CKP001", "m", index + 1, 2, fixable=applicability))
        for index, applicability in enumerate(applicabilities)
    ]


def ruff_on(tmp_path: Path, codes: list[str], *flags: str) -> str:
    """ruff's summary lines for a file with a finding of each code."""
    lines = {code: text for code, text in RUFF.values()}
    body = "".join(lines[code] for code in codes if code != "F401")
    (tmp_path / "r.py").write_text((SAFE if "F401" in codes else "") + RUFF_HEADER + body)
    result = ruff("--select", ",".join(codes), *flags, "r.py", cwd=tmp_path)
    kept = [
        line for line in result.stdout.splitlines() if not (FINDING.match(line) or DIFF.match(line))
    ]
    return "".join(line + "\n" for line in kept)


@pytest.mark.parametrize("unsafe_fixes", [False, True], ids=["default", "--unsafe-fixes"])
def test_the_summary_counts_safe_and_unsafe_fixes_as_ruff_does(
    tmp_path: Path, unsafe_fixes: bool
) -> None:
    flags = ["--unsafe-fixes"] if unsafe_fixes else []
    for codes, kinds in [
        (["F401"], ["safe"]),
        (["F401", "E711"], ["safe", "unsafe"]),
        (["F401", "E711", "E741"], ["safe", "unsafe", None]),
    ]:
        ours = report.text_summary(findings(kinds), unsafe_fixes=unsafe_fixes, fixed=0)
        assert shape(ours) == shape(ruff_on(tmp_path, codes, *flags)), codes
        if not unsafe_fixes:
            remaining = [kind for kind in kinds if kind != "safe"]
            fixed = report.text_summary(findings(remaining), unsafe_fixes=False, fixed=1)
            assert shape(fixed) == shape(ruff_on(tmp_path, codes, "--fix")), codes
        applied = sum(1 for kind in kinds if kind == "safe" or (kind and unsafe_fixes))
        would = report.diff_summary(findings(kinds), unsafe_fixes=unsafe_fixes, would_fix=applied)
        assert shape(would) == shape(ruff_on(tmp_path, codes, "--diff", *flags)), codes
