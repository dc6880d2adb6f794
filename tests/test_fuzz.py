"""Hypothesis-generated bad input for the CLI (in-process) and the flake8 plugin (in-process
for the bulk, the real flake8 executable on a sample): random bytes, deeply nested and very
long expressions, and random edits of real files.

Promises checked on every input:
- no exception escapes, no internal error (exit 0 or 1, never 2), nothing on stderr;
- every file is accounted for: a file Python cannot parse gets CKP901 (at the line and
  column ``ast.parse`` names, for syntax errors); a file it parses gets CKP901 only as
  "too deeply nested to analyse";
- ``--fix --unsafe-fixes`` leaves each file unchanged or compiling;
- the plugin, given the tree flake8 would hand it, reports what the CLI reports.

The default run is small (see ``DEFAULT``); ``pytest -m slow tests/test_fuzz.py`` runs the
large campaign (``CAMPAIGN``).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptlint.flake8_plugin import CheckpointChecker
from ckptlint.project.cache import FOLDER  # the results cache, not a leftover
from ckptlint.regions.sources import SourceTable
from ckptlint.rules import ALL_RULES
from ckptlint.source import Prefilter, UnreadableSource, decode
from tests.conftest import run_cli

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = settings(
    max_examples=800,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
CAMPAIGN = settings(DEFAULT, max_examples=10_000, derandomize=False)

# Real code to mutate: the examples, every rule's own examples, and ckptlint's sources.
CORPUS = sorted(
    {
        *(path.read_text() for path in sorted((ROOT / "examples").glob("*.py"))),
        *(example for rule in ALL_RULES for example in (*rule.INVALID, *rule.VALID)),
        *(path.read_text() for path in sorted((ROOT / "ckptlint").rglob("*.py"))),
    }
)
# Pieces that break Python in interesting ways.
FRAGMENTS = [
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    ":",
    ",",
    "\n",
    "\r\n",
    "\r",
    "    ",
    "\t",
    "\\\n",
    "#",
    '"""',
    "'''",
    '"',
    "'",
    "\x00",
    "\x0c",
    "é",
    "\ufeff",
    "\u2028",
    "lambda x: ",
    "checkpoint(",
    "cp.checkpoint(f, ",
    "use_reentrant=None",
    "use_reentrant=False, ",
    "**kwargs",
    "*args",
    "def f(",
    "class C:",
    "@dec\n",
    "async ",
    "await ",
    "yield ",
    "global g\n",
    "nonlocal n\n",
    "# noqa\n",
    "# flake8: noqa\n",
    "# ckptlint: noqa: CKP1\n",
    "# -*- coding: latin-1 -*-\n",
    "import torch.utils.checkpoint as cp\n",
    "from torch.utils.checkpoint import checkpoint\n",
    "functools.partial(checkpoint, ",
]

random_bytes = st.binary(max_size=3000)


@st.composite
def nested_or_long(draw: st.DrawFn) -> str:
    """An expression deep or long enough to reach the limits of a recursive analysis."""
    shape = draw(
        st.sampled_from(["sum", "parens", "calls", "lists", "attributes", "unary", "lambdas"])
    )
    depth = draw(st.integers(1, 3000 if shape in ("sum", "attributes", "unary") else 220))
    expression = {
        "sum": " + ".join(["a"] * depth),
        "parens": "(" * depth + "a" + ")" * depth,
        "calls": "f(" * depth + "a" + ")" * depth,
        "lists": "[" * depth + "]" * depth,
        "attributes": "a" + ".b" * depth,
        "unary": "-" * depth + "a",
        "lambdas": "lambda: " * depth + "a",
    }[shape]
    where = draw(
        st.sampled_from(
            [
                "y = cp.checkpoint(lambda a: {e}, x)\n",
                "y = cp.checkpoint(f, {e})\n",
                "def f(a):\n    return {e}\n\ny = cp.checkpoint(f, x)\n",
                "y = {e}\n",
                "def g():\n    z = {e}\n    return cp.checkpoint(g, z)\n",
            ]
        )
    )
    return "import torch.utils.checkpoint as cp\n\n" + where.format(e=expression)


@st.composite
def nested_blocks(draw: st.DrawFn) -> str:
    """Nested definitions or blocks, up to past Python's 100-level indentation limit."""
    depth = draw(st.integers(1, 105))
    opener = draw(st.sampled_from(["def f{i}(x):", "if x:", "for i in x:", "class C{i}:"]))
    lines = ["import torch.utils.checkpoint as cp"]
    lines += ["    " * i + opener.format(i=i) for i in range(depth)]
    lines.append("    " * depth + "y = cp.checkpoint(lambda a: a, x)")
    return "\n".join(lines) + "\n"


@st.composite
def edited_real_file(draw: st.DrawFn) -> str:
    text = draw(st.sampled_from(CORPUS))
    for _ in range(draw(st.integers(1, 6))):
        position = draw(st.integers(0, len(text)))
        action = draw(st.sampled_from(["insert", "delete", "duplicate", "truncate"]))
        if action == "insert":
            text = text[:position] + draw(st.sampled_from(FRAGMENTS)) + text[position:]
        elif action == "delete":
            text = text[:position] + text[position + draw(st.integers(1, 80)) :]
        elif action == "duplicate":
            text = text[:position] + text[position : position + 200] + text[position:]
        else:
            text = text[:position]
    return text


def as_bytes(text: str) -> bytes:
    return text.encode("utf-8", errors="surrogatepass")


bad_input = st.one_of(
    random_bytes,
    nested_or_long().map(as_bytes),
    nested_blocks().map(as_bytes),
    edited_real_file().map(as_bytes),
)


def python_verdict(data: bytes) -> tuple[str, int, int] | None:
    """Why Python itself cannot parse ``data`` (kind, line, column), or None."""
    try:
        text = decode(data)
    except UnreadableSource:
        return ("undecodable", 0, 0)
    if "\0" in text:
        return ("nul", 0, 0)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ast.parse(text)
    except SyntaxError as error:
        return ("syntax", error.lineno or 1, error.offset or 1)
    except (RecursionError, MemoryError, ValueError):
        return ("limit", 0, 0)
    return None


TABLE_PREFILTER = Prefilter(SourceTable.build().words)


def exempted(data: bytes) -> bool:
    """A suppression comment may hide the finding (``# noqa`` on its line, file level)."""
    return b"noqa" in data.lower()


def check_cli(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as folder:
        project = Path(folder)
        (project / "fuzzed.py").write_bytes(data)
        result = run_cli("--format", "json", "fuzzed.py", cwd=project)
        assert result.returncode in (0, 1), result.stderr
        assert result.stderr == ""
        findings = json.loads(result.stdout)
        assert all(item["code"] is not None for item in findings)
        unreadable = [item for item in findings if item["code"] == "CKP901"]
        verdict = python_verdict(data)
        if not TABLE_PREFILTER.passes(data):  # never parsed, from any entry point
            assert findings == [], findings
        elif verdict is None:
            assert all(i["message"].startswith("too deeply nested") for i in unreadable), findings
        elif not exempted(data):
            assert len(unreadable) == 1, (verdict, findings)
            kind, line, column = verdict
            if kind == "syntax":
                assert (unreadable[0]["line"], unreadable[0]["column"]) == (line, column)

        fixed = run_cli("--fix", "--unsafe-fixes", "--quiet", ".", cwd=project)
        assert fixed.returncode in (0, 1) and "internal error" not in fixed.stderr
        after = (project / "fuzzed.py").read_bytes()
        if after != data:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                compile(after, "fuzzed.py", "exec", dont_inherit=True)
        assert sorted(p.name for p in project.iterdir() if p.name != FOLDER) == ["fuzzed.py"]


def plugin_findings(text: str) -> list[tuple[int, int, str]] | None:
    """What the plugin reports on the tree flake8 would build (None: flake8 would not
    call it, the file does not parse)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    checker = CheckpointChecker(tree, text.splitlines(True))
    return [
        (line, column + 1, message.split(" ", 1)[0]) for line, column, message, _ in checker.run()
    ]


def check_plugin(data: bytes) -> None:
    try:
        text = decode(data)
    except UnreadableSource:
        return
    if "\0" in text or "\f" in text or "\v" in text:  # flake8 splits lines differently
        return
    from_plugin = plugin_findings(text)
    if from_plugin is None:
        return
    assert all(code.startswith("CKP") for _, _, code in from_plugin)
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "fuzzed.py").write_bytes(data)
        result = run_cli("--format", "json", "fuzzed.py", cwd=Path(folder))
    from_cli = [(i["line"], i["column"], i["code"]) for i in json.loads(result.stdout)]
    assert sorted(from_plugin) == sorted(from_cli)


@DEFAULT
@given(bad_input)
def test_cli_never_crashes_and_accounts_for_every_file(data: bytes) -> None:
    check_cli(data)


@DEFAULT
@given(bad_input)
def test_plugin_never_raises_and_agrees_with_the_cli(data: bytes) -> None:
    check_plugin(data)


@pytest.mark.slow
@CAMPAIGN
@given(bad_input)
def test_campaign_cli(data: bytes) -> None:
    check_cli(data)


@pytest.mark.slow
@CAMPAIGN
@given(bad_input)
def test_campaign_plugin(data: bytes) -> None:
    check_plugin(data)


flake8_sample = st.lists(
    st.one_of(
        edited_real_file(),
        nested_blocks(),
        nested_or_long().filter(lambda text: text.count("a") < 250),
    ),
    min_size=30,
    max_size=30,
)


@settings(DEFAULT, max_examples=1)
@given(flake8_sample)
def test_real_flake8_on_a_fuzzed_sample(texts: list[str]) -> None:
    """The real flake8 executable on 30 generated files: it finishes, and reports for each
    file exactly what the in-process plugin reports (depths stay below the ~330-term limit
    where flake8's own pyflakes fails and stops the run)."""
    expected: dict[str, list] = {}
    with tempfile.TemporaryDirectory() as folder:
        for index, text in enumerate(texts):
            name = f"f{index}.py"
            (Path(folder) / name).write_bytes(as_bytes(text))
            found = plugin_findings(text) if "\f" not in text and "\v" not in text else None
            if found is not None and "noqa" not in text:
                expected[name] = sorted(found)
        result = subprocess.run(
            [sys.executable, "-m", "flake8", "--select", "CKP", "."],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert result.returncode in (0, 1), result.stderr
    assert "failed during execution" not in result.stdout + result.stderr
    reported: dict[str, list] = {name: [] for name in expected}
    for line in result.stdout.splitlines():
        place, code = line.split(" ", 2)[:2]
        path, row, column = place.rstrip(":").rsplit(":", 2)
        name = Path(path).name
        if name in reported:
            reported[name].append((int(row), int(column), code))
    assert {name: sorted(found) for name, found in reported.items()} == expected
