"""The cache: reused while what a result read still holds, and untrusted as input.

Every test compares with ``--no-cache``, the answer the cache may never change.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ckptlint.analyser
import ckptlint.project.files
import ckptlint.project.index
import ckptlint.project.state
from ckptlint.project import cache
from tests.conftest import SUBPROCESS_TIMEOUT, run_cli

BLOCK = """
import torch.nn as nn

SCALE = 1.0

class Block(nn.Module):
    def forward(self, x):
        h = x.relu()
        return h * SCALE
"""
MODEL = """
from torch.utils.checkpoint import checkpoint
from blocks import Block

def forward(x):
    return checkpoint(Block(), x, use_reentrant=False)
"""
SETTER = """

def set_scale(value):
    global SCALE
    SCALE = value
"""
HELPERS = """
from torch.utils.checkpoint import checkpoint

def run(fn, *args, **kwargs):
    return checkpoint(fn, *args, **kwargs)

def unrelated(x):
    return x + 1
"""
MISSING_KEYWORD = "import torch.utils.checkpoint as cp\n\ny = cp.checkpoint(f, x)\n"


def write(root: Path, name: str, text: str) -> None:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


def findings(root: Path, *arguments: str) -> list[tuple[str, int, str]]:
    result = run_cli("--format", "json", *arguments, cwd=root)
    assert result.returncode in (0, 1), result.stderr
    return sorted((i["path"], i["line"], i["code"]) for i in json.loads(result.stdout))


def agree(root: Path, *paths: str) -> list[tuple[str, int, str]]:
    """The findings with the cache, checked against ``--no-cache``."""
    paths = paths or (".",)
    warm = findings(root, *paths)
    assert warm == findings(root, "--no-cache", *paths)
    return warm


def _calls_of(monkeypatch: pytest.MonkeyPatch, name: str) -> list[object]:
    """The calls made from now on of ``ckptlint.project.state``'s function ``name``."""
    calls: list[object] = []
    original = getattr(ckptlint.project.state, name)
    monkeypatch.setattr(
        ckptlint.project.state, name, lambda argument: calls.append(1) or original(argument)
    )
    return calls


@pytest.fixture
def tree(project: Path) -> Path:
    (project / ".git").mkdir()  # a work tree: the project root
    write(project, "blocks.py", BLOCK)
    write(project, "model.py", MODEL)
    write(project, "unrelated.py", "def add(a, b):\n    return a + b\n")
    return project


def test_a_second_run_parses_nothing(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = findings(tree, ".")
    folder = tree / ".ckptlint_cache"
    assert (folder / "CACHEDIR.TAG").is_file() and (folder / ".gitignore").read_text() == "*\n"

    def no_parse(*arguments: object, **keywords: object) -> None:
        raise AssertionError("parsed although nothing changed")

    monkeypatch.setattr(ckptlint.project.index, "parse", no_parse)
    assert findings(tree, ".") == first
    assert findings(tree, "model.py") == [f for f in first if f[0] == "model.py"]


def test_a_second_run_reads_no_file_to_find_its_stored_results(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stored results are keyed by the words each file names; a warm run takes those from
    the store (reading every file's identifiers again once took 60 % of a warm run)."""
    first = findings(tree, ".")

    def no_reading(*arguments: object) -> None:
        raise AssertionError("read a file's words although nothing changed")

    monkeypatch.setattr(ckptlint.project.state, "file_words", no_reading)
    assert findings(tree, ".") == first
    assert findings(tree, "model.py") == [f for f in first if f[0] == "model.py"]


def test_after_an_edit_that_keeps_a_modules_shape_the_next_run_reads_nothing(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A body edit in helpers.py leaves what wrap.py's stored exports read of it (early
    cutoff); the run that sees the edit reads helpers.py once, and the stored exports then
    hold for its new bytes, so the run after it does not read it (once, every warm run read
    helpers.py again to compare its shape, and rewrote the stored project)."""
    monkeypatch.setattr(ckptlint.project.files, "_RACY_NS", 0)  # trust a fresh mtime
    write(tree, "helpers.py", HELPERS)
    write(
        tree,
        "wrap.py",
        "from helpers import run\n\ndef ckpt(fn, x, **kw):\n    return run(fn, x, **kw)\n",
    )
    write(tree, "user.py", "from wrap import ckpt\n\ndef forward(f, x):\n    return ckpt(f, x)\n")
    first = agree(tree, ".")
    assert ("user.py", 4, "CKP001") in first  # wrap.py exports ckpt, through helpers.run
    write(tree, "helpers.py", HELPERS.replace("x + 1", "x + 2"))
    assert findings(tree, "user.py") == [f for f in first if f[0] == "user.py"]

    read_now = ckptlint.project.files.Snapshot._read_now

    def no_reading(self: ckptlint.project.files.Snapshot, path: str, *rest: object) -> bytes:
        assert not path.endswith("helpers.py"), "read helpers.py although it did not change"
        return read_now(self, path, *rest)  # user.py's own text: its # noqa comments

    monkeypatch.setattr(ckptlint.project.files.Snapshot, "_read_now", no_reading)
    assert findings(tree, "user.py") == [f for f in first if f[0] == "user.py"]


def test_an_edit_to_a_file_no_result_read_parses_nothing(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = findings(tree, ".")
    write(tree, "unrelated.py", "def add(a, b):\n    return a - b\n")
    monkeypatch.setattr(ckptlint.project.index, "parse", None)  # any parse would raise
    assert findings(tree, ".") == first


def _analysed_files(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files whose findings are computed from now on (not taken from the store)."""
    analysed: list[str] = []
    original = ckptlint.analyser.Analyser.findings

    def counted(self: ckptlint.analyser.Analyser, path: str, fixes: bool) -> object:
        analysed.append(os.path.basename(path))
        return original(self, path, fixes)

    monkeypatch.setattr(ckptlint.analyser.Analyser, "findings", counted)
    return analysed


def test_an_edit_to_a_body_no_finding_read_reanalyses_that_file_alone(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Early cutoff for findings: user.py's findings read what ``run`` does in helpers.py,
    not the body of ``unrelated`` beside it; editing that body keeps them."""
    write(tree, "helpers.py", HELPERS)
    write(tree, "user.py", "from helpers import run\n\ndef forward(f, x):\n    return run(f, x)\n")
    first = agree(tree, ".")
    assert ("user.py", 4, "CKP001") in first
    write(tree, "helpers.py", HELPERS.replace("x + 1", "x * 3 + 2"))
    analysed = _analysed_files(monkeypatch)
    assert findings(tree, ".") == first
    assert analysed == ["helpers.py"]
    assert findings(tree, "--no-cache", ".") == first


def test_an_edit_to_a_body_a_finding_read_is_seen(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same edit one function up, in the wrapper's own body, changes the finding."""
    write(tree, "helpers.py", HELPERS)
    write(tree, "user.py", "from helpers import run\n\ndef forward(f, x):\n    return run(f, x)\n")
    assert ("user.py", 4, "CKP001") in agree(tree, ".")
    fixed = HELPERS.replace("*args, **kwargs)\n", "*args, use_reentrant=False)\n", 1)
    write(tree, "helpers.py", fixed.replace("def run(fn, *args, **kwargs):", "def run(fn, *args):"))
    analysed = _analysed_files(monkeypatch)
    assert ("user.py", 4, "CKP001") not in agree(tree, ".")
    assert "user.py" in analysed


def test_a_message_citing_a_line_of_another_module_follows_that_line(tree: Path) -> None:
    """A comment added above ``SCALE`` keeps blocks.py's shape, but moves the lines that
    model.py's CKP201 names: a module whose line a message cites is read whole."""

    def messages(*arguments: str) -> list[str]:
        result = run_cli("--format", "json", *arguments, ".", cwd=tree)
        return [item["message"] for item in json.loads(result.stdout)]

    write(tree, "blocks.py", BLOCK + SETTER)
    before = messages()
    assert len(before) == 1 and "(blocks.py:9)" in before[0]
    write(tree, "blocks.py", "# a comment moves every line\n" + BLOCK + SETTER)
    after = messages()
    assert after == messages("--no-cache") and "(blocks.py:10)" in after[0]


def test_an_edit_to_a_module_a_region_runs_is_seen(tree: Path) -> None:
    assert agree(tree) == []
    write(tree, "blocks.py", BLOCK + SETTER)
    assert agree(tree) == [("model.py", 6, "CKP201")]
    assert agree(tree, "model.py") == [("model.py", 6, "CKP201")]


def test_a_same_size_edit_with_its_times_put_back_is_seen(tree: Path) -> None:
    """``cp -p`` and ``rsync -a`` put the modification time back: the change time moves."""
    write(tree, "blocks.py", BLOCK + SETTER)
    assert agree(tree) == [("model.py", 6, "CKP201")]
    path = tree / "blocks.py"
    status = path.stat()
    path.write_text(path.read_text().replace("SCALE = value", "SCALX = value"))
    os.utime(path, ns=(status.st_atime_ns, status.st_mtime_ns))
    assert path.stat().st_size == status.st_size and path.stat().st_mtime_ns == status.st_mtime_ns
    assert findings(tree, ".") == findings(tree, "--no-cache", ".") == []


def test_a_new_file_naming_a_word_of_interest_is_linted(tree: Path) -> None:
    agree(tree)
    write(tree, "new.py", MISSING_KEYWORD)
    assert agree(tree) == [("new.py", 3, "CKP001")]


def test_a_new_file_providing_a_missing_module_is_seen(tree: Path) -> None:
    write(tree, "model.py", MODEL.replace("from blocks", "from layers"))
    assert agree(tree) == []
    write(tree, "layers.py", BLOCK + SETTER)
    assert agree(tree) == [("model.py", 6, "CKP201")]


def test_a_new_package_shadowing_a_module_is_seen(tree: Path) -> None:
    """Python imports ``pkg/blocks/__init__.py`` over ``pkg/blocks.py``."""
    write(tree, "pkg/__init__.py", "")
    write(tree, "pkg/blocks.py", BLOCK)
    write(tree, "pkg/model.py", MODEL.replace("from blocks", "from pkg.blocks"))
    assert agree(tree) == []
    write(tree, "pkg/blocks/__init__.py", BLOCK + SETTER)
    assert agree(tree) == [("pkg/model.py", 6, "CKP201")]


def test_a_write_in_another_module_counts_from_every_entry_point(tree: Path) -> None:
    write(
        tree,
        "blocks.py",
        BLOCK.replace("h * SCALE", "h * config.SCALE").replace(
            "import torch.nn as nn", "import torch.nn as nn\nimport config"
        ),
    )
    write(tree, "config.py", "SCALE = 1.0\n")
    assert agree(tree) == []
    write(tree, "train.py", "import config\n\ndef step():\n    config.SCALE = 2.0\n")
    expected = [("model.py", 6, "CKP201")]
    assert agree(tree) == expected
    assert agree(tree, "model.py") == expected


def test_a_run_decodes_the_project_entry_again_only_if_another_run_wrote_it(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that learned something saves it, keeping what a concurrent run stored
    meanwhile; an entry still as this run read or wrote it holds nothing new, and decoding
    it again was a fifth of a pre-commit run's CPU on transformers 5.24."""
    first = findings(tree, ".")
    decoded = _calls_of(monkeypatch, "decode_project")
    write(tree, "model.py", MODEL + "\nedited = 1\n")
    assert findings(tree, "model.py") == [f for f in first if f[0] == "model.py"]
    assert len(decoded) == 1


def test_a_run_after_an_edit_writes_the_project_entry_once(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The entry is written when discovery's view of the edited project is known (so that a
    concurrent chunk of pre-commit reuses it), with the words the findings' lookup asks of
    the changed file; the findings then teach nothing new, and a second write of the whole
    entry was an eighth of a pre-commit run's CPU on transformers 5.24. The run after it
    learns nothing, and writes nothing."""
    monkeypatch.setattr(ckptlint.project.files, "_RACY_NS", 0)  # trust a fresh mtime
    first = findings(tree, ".")
    encoded = _calls_of(monkeypatch, "encode_project")
    write(tree, "model.py", MODEL + "\nedited = 1\n")
    assert findings(tree, "model.py") == [f for f in first if f[0] == "model.py"]
    assert len(encoded) == 1
    assert findings(tree, "model.py") == [f for f in first if f[0] == "model.py"]
    assert findings(tree, ".") == first
    assert len(encoded) == 1


def test_findings_read_other_modules_only_through_recorded_facts(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a file's findings read of another module is a recorded fact (its skeleton, the
    bodies read, where a name lies), never its raw text: the precondition for keying them,
    like exports, on what they read of each module rather than its whole digest. The
    searches for run-time changes tested lines of other modules' text directly."""
    write(tree, "config.py", "SCALE = 1.0\n")
    write(
        tree,
        "model.py",
        "from torch.utils.checkpoint import checkpoint\nimport config\n\n"
        "def scaled(x):\n    h = x.relu()\n    return h * config.SCALE\n\n"
        "def forward(x):\n    return checkpoint(scaled, x, use_reentrant=False)\n",
    )
    write(tree, "train.py", "import config\n\ndef step():\n    config.SCALE = 2.0\n")
    write(tree, "loop.py", "import train\n\ndef run():\n    train.step()\n")
    analysed: list[str] = []
    raw_reads: list[tuple[str, str, str]] = []
    module_class = ckptlint.project.index.Module
    attribute_of = module_class.__getattribute__

    def watched(module: object, name: str) -> object:
        reader = sys._getframe(1).f_code.co_filename  # the index records what it reads
        if name in ("text", "lines") and analysed and reader != ckptlint.project.index.__file__:
            path = attribute_of(module, "path")
            if path != analysed[-1]:
                raw_reads.append((analysed[-1], path, name))
        return attribute_of(module, name)

    findings_of = ckptlint.analyser.Analyser.findings

    def watched_findings(self: object, path: str, *arguments: object) -> object:
        analysed.append(path)
        try:
            return findings_of(self, path, *arguments)  # type: ignore[arg-type]
        finally:
            analysed.pop()

    monkeypatch.setattr(module_class, "__getattribute__", watched)
    monkeypatch.setattr(ckptlint.analyser.Analyser, "findings", watched_findings)
    assert findings(tree, "--no-cache", ".") == [("model.py", 9, "CKP201")]
    assert raw_reads == []


def test_the_store_tells_an_entry_another_process_wrote(tmp_path: Path) -> None:
    ours, theirs = (cache.Store.open(tmp_path / "cache", "part") for _ in range(2))
    assert isinstance(ours, cache.Store) and isinstance(theirs, cache.Store)
    assert ours.changed("project.json")  # never read: it may hold anything
    ours.write("project.json", [1])
    assert not ours.changed("project.json")
    assert theirs.read("project.json") == [1] and not theirs.changed("project.json")
    theirs.write("project.json", [2])
    assert ours.changed("project.json") and not theirs.changed("project.json")
    assert ours.read("project.json") == [2] and not ours.changed("project.json")


def test_the_analysis_key_names_the_python_version(monkeypatch: pytest.MonkeyPatch) -> None:
    key = cache.analysis_key(["root", []])
    monkeypatch.setattr(cache.sys, "version_info", (3, 99, 0, "final", 0))
    assert cache.analysis_key(["root", []]) != key


def test_settings_are_part_of_the_key(tree: Path) -> None:
    """A wrapper declared a region source makes a finding appear, cold and warm."""
    write(tree, "blocks.py", BLOCK + SETTER)
    write(tree, "mylib.py", "def wrap(function, *args):\n    return function(*args)\n")
    model = MODEL.replace("checkpoint(Block(), x,", "wrap(Block(), x,")
    write(
        tree,
        "model.py",
        model.replace("from torch.utils.checkpoint import checkpoint", "from mylib import wrap"),
    )
    write(tree, "pyproject.toml", "[tool.ckptlint]\n")
    assert agree(tree) == []
    write(tree, "pyproject.toml", '[tool.ckptlint]\nextend-checkpoint-functions = ["mylib.wrap"]\n')
    assert agree(tree) == [("model.py", 6, "CKP201")]


def test_no_cache_writes_nothing(tree: Path) -> None:
    findings(tree, "--no-cache", ".")
    assert not (tree / ".ckptlint_cache").exists()


# -- the cache as hostile input ---------------------------------------------------------------
def forge(folder: Path, secret: bytes = b"\0" * 32) -> int:
    """Rewrite every entry of a cache folder, signed with another key and its findings
    emptied: what a cache committed to a repository could hold. Returns the count."""
    count = 0
    for part in folder.iterdir():
        if not part.is_dir():
            continue
        store = cache.Store(folder, part.name, secret)
        for path in part.rglob("*.json"):
            name = path.relative_to(part).as_posix()
            content = json.loads(path.read_bytes().split(b"\n", 2)[2])
            if name.startswith("findings/"):
                content[0] = []
            store.write(name, content)
            count += 1
    return count


def test_a_cache_signed_with_another_key_is_ignored(tree: Path) -> None:
    write(tree, "model.py", MISSING_KEYWORD)
    expected = agree(tree)
    assert expected == [("model.py", 3, "CKP001")]
    assert forge(tree / ".ckptlint_cache") > 0
    assert findings(tree, ".") == expected


def test_a_cache_committed_from_another_machine_is_a_miss(
    tree: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tree, "model.py", MISSING_KEYWORD)
    expected = agree(tree)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("other-user")))
    assert findings(tree, ".") == expected


def test_fixes_are_never_read_from_the_cache(tree: Path) -> None:
    """The stored findings hold no edit: ``--fix`` computes it from the bytes it fixes."""
    write(tree, "model.py", MISSING_KEYWORD)
    agree(tree)
    for path in (tree / ".ckptlint_cache").rglob("findings/*.json"):
        body = path.read_bytes()
        assert b"checkpoint(f, x" not in body  # no edit, no text to write
    result = run_cli("--fix", "--unsafe-fixes", ".", cwd=tree)
    assert result.returncode == 0, result.stdout + result.stderr
    fixed = "import torch.utils.checkpoint as cp\n\ny = cp.checkpoint(f, x, use_reentrant=False)\n"
    assert (tree / "model.py").read_text() == fixed


def test_a_cache_folder_that_is_a_link_is_not_used(tree: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tree / ".ckptlint_cache").symlink_to(elsewhere)
    write(tree, "model.py", MISSING_KEYWORD)
    assert agree(tree) == [("model.py", 3, "CKP001")]
    assert list(elsewhere.iterdir()) == []  # nothing written through the link


def test_entries_that_are_links_or_special_files_are_misses(tree: Path) -> None:
    write(tree, "model.py", MISSING_KEYWORD)
    expected = agree(tree)
    entries = list((tree / ".ckptlint_cache").rglob("*.json"))
    assert entries
    for index, path in enumerate(entries):
        path.unlink()
        if index % 2:
            path.symlink_to("/dev/zero")
        else:
            os.mkfifo(path)
    assert findings(tree, ".") == expected  # no hang on the FIFO, no read of /dev/zero


def test_a_symlinked_project_file_outside_the_tree_is_never_written(
    tree: Path, tmp_path: Path
) -> None:
    """A forged entry cannot make --fix write: fixes are computed, and only for the files
    the run fixes."""
    library = tmp_path / "site-packages" / "lib.py"
    library.parent.mkdir()
    library.write_text("x = 1\n")
    write(tree, "model.py", MISSING_KEYWORD)
    agree(tree)
    forge(tree / ".ckptlint_cache")
    run_cli("--fix", "--unsafe-fixes", ".", cwd=tree)
    assert library.read_text() == "x = 1\n"


def test_clean_deletes_the_cache(tree: Path) -> None:
    agree(tree)
    assert (tree / ".ckptlint_cache").is_dir()
    result = run_cli("clean", cwd=tree)
    assert result.returncode == 0 and "Removed" in result.stdout
    assert not (tree / ".ckptlint_cache").exists()


def test_clean_leaves_a_folder_that_is_not_a_cache_alone(tree: Path) -> None:
    (tree / ".ckptlint_cache").mkdir()
    (tree / ".ckptlint_cache" / "precious.txt").write_text("mine\n")
    result = run_cli("clean", cwd=tree)
    assert "not a ckptlint cache" in result.stderr
    assert (tree / ".ckptlint_cache" / "precious.txt").read_text() == "mine\n"


def test_the_cache_is_pruned_past_its_size(tree: Path) -> None:
    write(tree, "model.py", MISSING_KEYWORD)
    agree(tree)
    folder = tree / ".ckptlint_cache"
    (part,) = [p for p in folder.iterdir() if p.is_dir()]
    store = cache.Store.open(folder, part.name)
    assert isinstance(store, cache.Store)
    for index in range(50):
        store.write(f"findings/{index:032x}.json", ["x" * 1000])
    store.prune(limit=10_000)
    remaining = sum(p.stat().st_size for p in folder.rglob("findings/*.json"))
    assert remaining <= 5_000


# Entries as a fuzzer (or a repository) could leave them: random content, the real entries
# with bytes flipped, the real content under another key. Without the user's key none is
# trusted: the findings are exactly --no-cache's.
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=12,
)


def _entries(root: Path) -> tuple[Path, cache.Store, list[str]]:
    folder = root / ".ckptlint_cache"
    (part,) = [p for p in folder.iterdir() if p.is_dir()]
    store = cache.Store.open(folder, part.name)
    assert isinstance(store, cache.Store)
    return part, store, sorted(p.relative_to(part).as_posix() for p in part.rglob("*.json"))


@given(
    which=st.integers(0, 10_000),
    mode=st.sampled_from(["flip", "random", "other-key"]),
    data=st.binary(max_size=64),
    offset=st.integers(0, 10_000),
)
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_entries_without_the_users_key_are_never_trusted(
    corrupted_tree: tuple[Path, list], which: int, mode: str, data: bytes, offset: int
) -> None:
    root, expected = corrupted_tree
    part, store, entries = _entries(root)
    name = entries[which % len(entries)]
    path = part / name
    original = path.read_bytes()
    try:
        if mode == "flip":
            position = offset % len(original)
            path.write_bytes(
                original[:position] + bytes([original[position] ^ 0xFF]) + original[position + 1 :]
            )
        elif mode == "random":
            path.write_bytes(original[: offset % 120] + data)
        else:
            content = store.read(name)
            cache.Store(part.parent, part.name, bytes(32)).write(name, content)
        result = run_cli("--format", "json", ".", cwd=root)
        assert result.returncode == 1 and result.stderr == ""
        found = sorted((i["path"], i["line"], i["code"]) for i in json.loads(result.stdout))
        assert found == expected
    finally:
        path.write_bytes(original)


# Entries of the right key whose content has the wrong shape (a bug of an older ckptlint, a
# disk error): a miss, never an internal error.
@given(replacement=_JSON, which=st.integers(0, 10_000), mode=st.sampled_from(["swap", "whole"]))
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_malformed_entries_never_give_an_internal_error(
    corrupted_tree: tuple[Path, list], replacement: object, which: int, mode: str
) -> None:
    root, expected = corrupted_tree
    part, store, entries = _entries(root)
    name = entries[which % len(entries)]
    original = (part / name).read_bytes()
    content = store.read(name)
    if mode == "whole" or not isinstance(content, (list, dict)) or not content:
        content = replacement
    else:
        slots = list(content) if isinstance(content, dict) else list(range(len(content)))
        content[slots[which % len(slots)]] = replacement
    try:
        store.write(name, content)
        result = run_cli("--format", "json", ".", cwd=root)
        assert result.returncode in (0, 1) and result.stderr == ""
        assert all(item["code"] is not None for item in json.loads(result.stdout))
    finally:
        (part / name).write_bytes(original)


@pytest.fixture(scope="module")
def corrupted_tree(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list]:
    root = tmp_path_factory.mktemp("corrupted")
    (root / ".git").mkdir()
    write(root, "blocks.py", BLOCK + SETTER)
    write(root, "model.py", MODEL)
    write(root, "other.py", MISSING_KEYWORD)
    expected = findings(root, "--no-cache", ".")
    assert expected == [("model.py", 6, "CKP201"), ("other.py", 3, "CKP001")]
    findings(root, ".")
    yield root, expected
    shutil.rmtree(root, ignore_errors=True)


def test_workers_forked_under_the_lock_never_hold_it(tree: Path) -> None:
    """Workers are forked while the cache's lock is held: they must not keep holding it,
    or the run's last write of the cache would wait for them forever."""
    for index in range(8):
        write(tree, f"m{index}.py", MISSING_KEYWORD)
    command = [sys.executable, "-m", "ckptlint", "--jobs", "2", "--quiet", "."]
    for _ in range(2):  # cold, then warm
        result = subprocess.run(
            command, cwd=tree, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT
        )
        assert result.returncode == 1 and result.stdout.count("CKP001") == 8, result.stderr
