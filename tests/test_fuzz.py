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

File names and kinds (``check_tree``): trees of files named with any bytes (non-UTF-8,
newlines, quotes, escapes) that are regular, empty, links into and out of the tree,
dangling links, FIFOs, sockets, huge (sparse) or unreadable (mode 0000). Linted by name,
every name comes back byte for byte from text, JSON, GitHub and SARIF output (to stdout
or ``-o``) with its exact verdict; walked, the special files are skipped; fixed, only
regular files inside the tree with a write bit change, and each refusal is reported. A
run that waits (on a FIFO, a device) fails after two minutes instead of hanging.

The default run is small (see ``DEFAULT``); ``pytest -m slow tests/test_fuzz.py`` runs the
large campaign (``CAMPAIGN``).
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import socket
import stat
import subprocess
import sys
import tempfile
import urllib.parse
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptlint.engine import TRIGGERS
from ckptlint.flake8_plugin import CheckpointChecker
from ckptlint.project.cache import FOLDER  # the results cache, not a leftover
from ckptlint.project.search import NAMES, matches
from ckptlint.regions.sources import SourceTable
from ckptlint.rules import ALL_RULES
from ckptlint.source import Prefilter, UnreadableSource, decode
from tests.conftest import SUBPROCESS_TIMEOUT, hang_guard, run_cli

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = settings(
    max_examples=250,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
CAMPAIGN = settings(DEFAULT, max_examples=10_000, derandomize=False)

# Real code to mutate: the examples, every rule's own examples and cases, and ckptlint's
# sources.
CORPUS = sorted(
    {
        *(path.read_text() for path in sorted((ROOT / "examples").glob("*.py"))),
        *(example for rule in ALL_RULES for example in (rule.EXAMPLE, rule.CORRECTED)),
        *(
            path.read_bytes().decode("utf-8", "replace")
            for path in sorted((ROOT / "tests" / "fixtures" / "rules").rglob("*.py"))
        ),
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


def is_candidate(data: bytes) -> bool:
    """Whether the engine analyses a file holding ``data`` (alone in its project)."""
    return TABLE_PREFILTER.passes(data) or any(matches(NAMES, w, data) for w in TRIGGERS)


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
        if not is_candidate(data):  # never parsed, from any entry point
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


def plugin_findings(text: str, filename: str) -> list[tuple[int, int, str]] | None:
    """What the plugin reports on the tree flake8 would build (None: flake8 would not
    call it, the file does not parse)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    checker = CheckpointChecker(tree, text.splitlines(True), filename)
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
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "fuzzed.py").write_bytes(data)
        saved = os.getcwd()
        os.chdir(folder)  # the plugin's project, as flake8 run in that folder sees it
        CheckpointChecker._engines, CheckpointChecker._roots = {}, {}
        try:
            from_plugin = plugin_findings(text, "fuzzed.py")
        finally:
            os.chdir(saved)
        if from_plugin is None:
            return
        assert all(code.startswith("CKP") for _, _, code in from_plugin)
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
        names = [f"f{index}.py" for index in range(len(texts))]
        for name, text in zip(names, texts, strict=True):
            (Path(folder) / name).write_bytes(as_bytes(text))
        saved = os.getcwd()
        os.chdir(folder)  # the 30 files are one project, as flake8 run there sees them
        CheckpointChecker._engines, CheckpointChecker._roots = {}, {}
        try:
            for name, text in zip(names, texts, strict=True):
                plain = "\f" not in text and "\v" not in text
                found = plugin_findings(text, name) if plain else None
                if found is not None and "noqa" not in text:
                    expected[name] = sorted(found)
        finally:
            os.chdir(saved)
        result = subprocess.run(
            [sys.executable, "-m", "flake8", "--select", "CKP", "."],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=SUBPROCESS_TIMEOUT,
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


# -- file names and file kinds -------------------------------------------------------------
# Names of any bytes (a slash or NUL cannot be in a name), and what a repository can hold
# under them. Each example is a tree linted by name in every format (to stdout or -o),
# walked, and fixed; every name must come back, byte for byte, from every format.

NAME_PIECES = [b"\xff", b"\xe9", b"\xc3\xa9", b"\n", b"\r", b"\t", b" ", b'"', b"\\", b":", b","]
NAME_PIECES += [b"%", b"#", b"\x1b[31m", b"\x7f", b"\xc2\x85", b"\xe2\x80\xae", b"-", b"."]
file_name = (
    st.lists(st.one_of(st.sampled_from(NAME_PIECES), st.binary(min_size=1, max_size=4)), max_size=6)
    .map(lambda pieces: b"".join(pieces).replace(b"/", b"_").replace(b"\0", b"_") + b".py")
    .filter(lambda name: len(name) <= 100)  # a socket's path is at most 107 bytes
)
KINDS = [
    "regular",
    "empty",
    "link into the tree",
    "link out of the tree",
    "dangling link",
    "fifo",
    "socket",
    "huge",
    "unreadable",
]
tree_files = st.lists(
    st.tuples(file_name, st.sampled_from(KINDS)), max_size=8, unique_by=lambda f: f[0]
)
MAX_FILE_SIZE = 10 * 1024 * 1024
UNFIXED = "import torch.utils.checkpoint as cp\n\ny = cp.checkpoint(block, x)\n"
FIXED_BYTES = UNFIXED.replace("(block, x)", "(block, x, use_reentrant=False)").encode()
IS_ROOT = os.geteuid() == 0
# Once the engine reports FileTooLarge as CKP901 (tests/test_hostile_paths.py NEEDS_ENGINE),
# this becomes CKP901.
TOO_LARGE = ("CKP901", f"file too large: over max-file-size ({MAX_FILE_SIZE} bytes)")


def build_tree(folder: Path, files: list[tuple[bytes, str]], huge: int) -> Path:
    """``folder/tree`` holding ``files``; link targets in ``tree/targets`` (``.txt``: not
    linted on their own) and in ``folder/outside``."""
    tree, outside = folder / "tree", folder / "outside"
    (tree / "targets").mkdir(parents=True)
    outside.mkdir()
    root = os.fsencode(tree)
    for index, (name, kind) in enumerate(files):
        path = os.path.join(root, name)
        if kind in ("regular", "unreadable"):
            with open(path, "w") as handle:
                handle.write(UNFIXED)
            if kind == "unreadable":
                os.chmod(path, 0)
        elif kind == "empty":
            open(path, "w").close()
        elif kind == "link into the tree":
            (tree / "targets" / f"t{index}.txt").write_text(UNFIXED)
            os.symlink(f"targets/t{index}.txt".encode(), path)
        elif kind == "link out of the tree":
            (outside / f"t{index}.py").write_text(UNFIXED)
            os.symlink(os.fsencode(outside / f"t{index}.py"), path)
        elif kind == "dangling link":
            os.symlink(b"nowhere/" + name, path)
        elif kind == "fifo":
            os.mkfifo(path)
        elif kind == "socket":
            with contextlib.chdir(tree), socket.socket(socket.AF_UNIX) as server:
                server.bind(name)
        else:
            with open(path, "wb") as handle:
                handle.truncate(huge)
    return tree


def named_verdict(kind: str) -> list[tuple[int, int, str, str | None]]:
    """What linting a file of ``kind`` by name reports (None: the CKP001 message)."""
    if kind in ("regular", "link into the tree", "link out of the tree") or (
        kind == "unreadable" and IS_ROOT
    ):
        return [(3, 5, "CKP001", None)]
    return {
        "empty": [],
        "dangling link": [(1, 1, "CKP902", "cannot read file: No such file or directory")],
        "fifo": [(1, 1, "CKP902", "not a regular file: a FIFO")],
        "socket": [(1, 1, "CKP902", "not a regular file: a socket")],
        "huge": [(1, 1, *TOO_LARGE)],
        "unreadable": [(1, 1, "CKP902", "cannot read file: Permission denied")],
    }[kind]


def unquote_name(shown: str) -> bytes:
    """The bytes of a name as text output shows it (git's quoting undone)."""
    if not shown.startswith('"'):
        assert shown.isprintable(), shown
        return shown.encode()
    assert shown.endswith('"') and len(shown) >= 2, shown
    body, result, index = shown[1:-1], bytearray(), 0
    escapes = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}
    while index < len(body):
        character = body[index]
        if character == "\\":
            following = body[index + 1]
            if following in escapes:
                result.append(escapes[following])
                index += 2
            else:
                result.append(int(body[index + 1 : index + 4], 8))
                index += 4
        else:
            assert character != '"' and character.isprintable(), shown
            result += character.encode()
            index += 1
    return bytes(result)


def unescape_github(text: str) -> str:
    for escaped, character in (("%2C", ","), ("%3A", ":"), ("%0A", "\n"), ("%0D", "\r")):
        text = text.replace(escaped, character)
    return text.replace("%25", "%")


def report_in(tree: Path, output: str, names: list[str], to_file: bool) -> str:
    arguments = ["--no-cache", "--format", output, *(["-o", "../report"] if to_file else [])]
    result = run_cli(*arguments, "--", *names, cwd=tree)
    assert result.returncode in (0, 1), result.stderr
    nothing = "ckptlint: warning: no Python file found under the given path(s)\n"
    assert result.stderr == ("" if names else nothing)
    if to_file:
        assert result.stdout == ""
        return (tree.parent / "report").read_text(encoding="utf-8")
    return result.stdout


def check_tree(files: list[tuple[bytes, str]], huge: int, to_file: bool) -> None:
    with tempfile.TemporaryDirectory() as folder, hang_guard(120, "the CLI"):
        tree = build_tree(Path(folder), files, huge)
        names = [os.fsdecode(name) for name, _ in files]
        expected = [
            (name, line, column, code, message)
            for name, (_, kind) in zip(names, files, strict=True)
            for line, column, code, message in named_verdict(kind)
        ]
        found = json.loads(report_in(tree, "json", names, to_file))
        assert [
            (
                e["path"],
                e["line"],
                e["column"],
                e["code"],
                None if e["code"] == "CKP001" else e["message"],
            )
            for e in found
        ] == expected

        # Text and GitHub output: one line per finding, its name the exact bytes.
        text = report_in(tree, "text", names, to_file).splitlines()
        github = report_in(tree, "github", names, to_file).splitlines()
        summary = text[len(found) :]
        del text[len(found) :]
        assert (
            summary[0].startswith(f"Found {len(found)} finding")
            if found
            else (summary == ["All checks passed!"])
        )
        assert len(text) == len(github) == len(found)
        for entry, line, annotation in zip(found, text, github, strict=True):
            mark = "[*] " if entry["fix_applicability"] == "safe" else ""  # no --unsafe-fixes
            suffix = f":{entry['line']}:{entry['column']}: {entry['code']} {mark}{entry['message']}"
            assert line.endswith(suffix), (line, suffix)
            assert unquote_name(line[: -len(suffix)]) == os.fsencode(entry["path"])
            assert annotation.startswith("::error file=")
            shown = annotation[len("::error file=") :].split(f",line={entry['line']},")[0]
            assert unquote_name(unescape_github(shown)) == os.fsencode(entry["path"])

        # SARIF: valid, its URIs the names' bytes, percent-encoded.
        log = json.loads(report_in(tree, "sarif", names, to_file))
        (run,) = log["runs"]
        uris = [
            r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in run["results"]
        ]
        assert [urllib.parse.unquote_to_bytes(uri) for uri in uris] == [
            os.fsencode(e["path"]) for e in found
        ]
        assert all(urllib.parse.quote(uri, safe="/%") == uri for uri in uris)

        # Walking the tree: the special files are skipped, the rest as when named.
        walked = run_cli("--no-cache", "--format", "json", ".", cwd=tree)
        linted = [kind for _, kind in files if kind not in ("fifo", "socket")]
        nothing = "ckptlint: warning: no Python file found under the given path(s)\n"
        assert walked.returncode in (0, 1) and walked.stderr == ("" if linted else nothing)
        skipped = ("fifo", "socket")
        assert sorted((e["path"], e["code"]) for e in json.loads(walked.stdout)) == sorted(
            (name, code)
            for name, (_, kind) in zip(names, files, strict=True)
            if kind not in skipped
            for _, _, code, _ in named_verdict(kind)
        )

        # Fixing the tree writes only what it may.
        fixed = run_cli("--no-cache", "--fix", "--unsafe-fixes", "--quiet", ".", cwd=tree)
        assert fixed.returncode in (0, 1) and "internal error" not in fixed.stderr
        refusals = []
        for index, (name, kind) in enumerate(files):
            path = os.path.join(os.fsencode(tree), name)
            outside = Path(folder) / "outside" / f"t{index}.py"
            if kind == "regular":
                assert Path(os.fsdecode(path)).read_bytes() == FIXED_BYTES
            elif kind == "link into the tree":
                assert (tree / "targets" / f"t{index}.txt").read_bytes() == FIXED_BYTES
                assert os.path.islink(path)
            elif kind == "link out of the tree":
                assert outside.read_text() == UNFIXED
                refusals.append(
                    (name, f"it leads outside the paths being linted, to {outside.resolve()}")
                )
            elif kind == "unreadable":
                assert os.stat(path).st_mode & 0o7777 == 0
                os.chmod(path, 0o600)
                assert Path(os.fsdecode(path)).read_text() == UNFIXED
                if IS_ROOT:
                    refusals.append((name, "the file is read-only (mode 0000)"))
            elif kind == "empty":
                assert os.stat(path).st_size == 0
            elif kind == "huge":
                assert os.stat(path).st_size == huge
            elif kind == "fifo":
                assert stat.S_ISFIFO(os.stat(path).st_mode)
            elif kind == "socket":
                assert stat.S_ISSOCK(os.stat(path).st_mode)
        problems = []
        for line in fixed.stderr.splitlines():
            if line == nothing.rstrip("\n"):
                continue
            shown, reason = line.removeprefix("ckptlint: warning: ").split(": fixes not written: ")
            problems.append((unquote_name(shown), reason))
        assert sorted(problems) == sorted(refusals)
        left = sorted(os.listdir(os.fsencode(tree)))
        assert left == sorted([b"targets", *(name for name, _ in files)])


huge_size = st.integers(MAX_FILE_SIZE + 1, 256 * 1024 * 1024)
TREES = settings(DEFAULT, max_examples=60)


@TREES
@given(tree_files, huge_size, st.booleans())
def test_every_name_and_kind_is_accounted_for_and_fixed_only_where_it_may(
    files: list[tuple[bytes, str]], huge: int, to_file: bool
) -> None:
    check_tree(files, huge, to_file)


@pytest.mark.slow
@settings(CAMPAIGN, max_examples=3000)
@given(tree_files, huge_size, st.booleans())
def test_campaign_names_and_kinds(files: list[tuple[bytes, str]], huge: int, to_file: bool) -> None:
    check_tree(files, huge, to_file)
