"""What a repository carries can neither delete a file, hang a run nor exhaust memory: a
link committed into the cache folder, configurations of any size and depth, a
``max-file-size`` raised by the repository itself, a cache key others can read. Each case
is a real folder on disk, run through the real command line."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from ckptlint.config import MAX_ITEMS
from ckptlint.project import cache
from tests.conftest import SUBPROCESS_TIMEOUT, run_cli

MISSING = "import torch.utils.checkpoint as cp\n\ny = cp.checkpoint(block, x)\n"
MIB = 1024**2
GIB = 1024**3


def digests(folder: Path) -> dict[str, tuple[str, int, int]]:
    """Every file under ``folder``: a digest of its first MiB, its size and its modification
    time (reading all of the 600 MiB of sparse files at each check cost seconds of CPU; any
    write changes the time)."""
    found = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not path.is_symlink():
            with open(path, "rb") as stream:
                head = hashlib.blake2b(stream.read(MIB)).hexdigest()
            status = path.stat()
            found[str(path.relative_to(folder))] = (head, status.st_size, status.st_mtime_ns)
    return found


def make_sparse(path: Path, size: int, head: bytes) -> None:
    """``head``, then zeros up to ``size`` bytes that take no room on disk."""
    with open(path, "wb") as stream:
        stream.write(head)
        stream.truncate(size)


@pytest.fixture
def committed_links(tmp_path: Path) -> tuple[Path, Path]:
    """A work tree whose committed ``.ckptlint_cache`` leads out of it through links, at
    every level the cache writes, to a folder of JSON files over the cache's size limit."""
    data = tmp_path / "data"  # beside the repository: a COCO-style annotation folder
    data.mkdir()
    for index in range(3):
        make_sparse(data / f"annotations_{index}.json", 200 * MIB, f'{{"n": {index}}}'.encode())
    (data / "small.json").write_text('{"keep": true}\n')
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "model.py").write_text(MISSING)
    folder = repo / cache.FOLDER
    folder.mkdir()
    (folder / cache.TAG_FILE).write_text(cache._TAG)  # so that `clean` takes it for a cache
    (folder / "zz").mkdir()
    (folder / "zz" / "findings").symlink_to("../../../data")
    part = folder / ("a" * 24)  # named as the cache names its folders
    (part / "findings").mkdir(parents=True)
    (part / "findings" / ("b" * 32 + ".json")).symlink_to("../../../../data/small.json")
    (part / "project.json").symlink_to("../../../data/small.json")
    (folder / ("c" * 24)).symlink_to("../../data")
    return repo, data


def test_links_in_the_cache_folder_lead_nowhere(committed_links: tuple[Path, Path]) -> None:
    repo, data = committed_links
    before = digests(data)
    assert sum(size for _, size, _ in before.values()) > cache.MAX_CACHE_BYTES
    for _ in range(2):  # cold, then warm
        result = run_cli("--format", "json", ".", cwd=repo)
        assert result.returncode == 1, result.stderr
        assert [item["code"] for item in json.loads(result.stdout)] == ["CKP001"]
        assert digests(data) == before
    result = run_cli("clean", cwd=repo)
    assert result.returncode == 0
    assert digests(data) == before
    folder = repo / cache.FOLDER
    left = sorted(line.split(": ", 3)[-1] for line in result.stderr.splitlines())
    assert left == sorted(
        [
            f"{folder / ('a' * 24) / 'findings' / ('b' * 32 + '.json')} (a symbolic link)",
            f"{folder / ('a' * 24) / 'project.json'} (a symbolic link)",
            f"{folder / ('c' * 24)} (a symbolic link)",
            f"{folder / 'zz'} (a folder ckptlint does not make)",
        ]
    )
    # What ckptlint wrote is gone; the links are where they were.
    assert (folder / "zz" / "findings").is_symlink()
    assert not (folder / cache.TAG_FILE).exists()


def test_pruning_deletes_only_entries_it_wrote(tmp_path: Path) -> None:
    """Past its size, the store deletes its own least recently used entries; a link, a
    file of the right name that it did not write, a hard link to a file elsewhere are left
    alone and reported once."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.json").write_text("mine\n")
    folder = tmp_path / cache.FOLDER
    key = "d" * 24
    store = cache.Store.open(folder, key)
    assert isinstance(store, cache.Store)
    for index in range(40):
        store.write(f"findings/{index:032x}.json", ["x" * 1000])
    findings = folder / key / "findings"
    (findings / ("e" * 32 + ".json")).symlink_to(outside / "precious.json")
    (findings / ("f" * 32 + ".json")).write_text("not an entry\n" + "y" * 2000)
    os.utime(findings / ("f" * 32 + ".json"), (0, 0))  # the least recently used
    os.link(outside / "precious.json", findings / ("1" * 32 + ".json"))
    before = digests(outside)
    for _ in range(2):
        store.prune(limit=20_000)
    ours = [p for p in findings.iterdir() if p.name < "1" * 32]
    assert 0 < len(ours) < 40 and sum(p.stat().st_size for p in ours) <= 10_000
    assert digests(outside) == before
    assert (findings / ("f" * 32 + ".json")).read_text().startswith("not an entry")
    assert sorted(store.notes) == [
        f"{findings / ('1' * 32 + '.json')}: left alone in the cache folder "
        "(a file with other names (hard links))",
        f"{findings / ('e' * 32 + '.json')}: left alone in the cache folder (a symbolic link)",
        f"{findings / ('f' * 32 + '.json')}: left alone in the cache folder "
        "(a file ckptlint does not write)",
    ]


def test_a_cache_folder_whose_part_is_a_link_is_not_used(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "model.py").write_text(MISSING)
    assert run_cli(".", cwd=repo).returncode == 1
    (part,) = [p for p in (repo / cache.FOLDER).iterdir() if p.is_dir()]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (part / "findings").rename(tmp_path / "old-findings")
    (part / "findings").symlink_to(elsewhere)
    result = run_cli(".", cwd=repo)
    assert result.returncode == 1
    assert f"cache not used: {part / 'findings'} is not a folder of yours" in result.stderr
    assert list(elsewhere.iterdir()) == []


def test_a_cache_key_others_can_read_is_replaced(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home-cache"))
    (project / ".git").mkdir()
    (project / "model.py").write_text(MISSING)
    assert run_cli(".", cwd=project).stderr == ""
    key = cache.user_key_file()
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    old = key.read_bytes()
    key.chmod(0o644)  # restored from a backup
    result = run_cli("--format", "json", ".", cwd=project)
    assert result.stderr == (
        f"ckptlint: warning: the cache key {key} could be read by other users (mode 0644): "
        "replaced by a new key (mode 0600); what was cached under the old one is not trusted\n"
    )
    assert [item["code"] for item in json.loads(result.stdout)] == ["CKP001"]
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert key.read_bytes() != old and len(key.read_bytes()) == len(old)
    assert run_cli(".", cwd=project).stderr == ""  # once


# The child reports its own peak: the kernel's ru_maxrss of a child also counts the image it
# was forked from (the test process's, over 1 GiB late in a full run), VmHWM does not.
_MEASURED = (
    "import os, sys\n"
    "from ckptlint.cli import main\n"
    "code = main(sys.argv[1:])\n"
    "sys.stdout.flush()\n"
    "status = open('/proc/self/status').read().split('VmHWM:')[1].split()[0]\n"
    "open(os.environ['CKPTLINT_PEAK'], 'w').write(status)\n"
    "os._exit(code)\n"
)


def run_measured(*arguments: str, cwd: Path) -> tuple[subprocess.CompletedProcess, int]:
    """``ckptlint --no-cache ARGUMENTS`` in a child process; its output and its own peak
    resident memory in bytes."""
    peak_file = cwd.parent / f"{cwd.name}.peak"
    result = subprocess.run(
        [sys.executable, "-c", _MEASURED, "--no-cache", *arguments],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
        env={**os.environ, "CKPTLINT_PEAK": str(peak_file)},
    )
    return result, int(peak_file.read_text()) * 1024


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux's /proc")
def test_the_configuration_cannot_raise_the_file_size_ceiling(project: Path) -> None:
    (project / "pyproject.toml").write_text("[tool.ckptlint]\nmax-file-size = 100000000\n")
    with open(project / "huge.py", "w") as stream:  # 50 MB, one line
        stream.write("from torch.utils.checkpoint import checkpoint\nx = [" + "1," * 25_000_000)
        stream.write("]\n")
    result, peak = run_measured("--format", "json", ".", cwd=project)
    assert (result.returncode, json.loads(result.stdout)) == (
        1,
        [
            {
                "path": "huge.py",
                "line": 1,
                "column": 1,
                "end_line": 1,
                "end_column": 1,
                "code": "CKP901",
                "message": "file too large: over max-file-size (10485760 bytes)",
                "fixable": False,
                "fix_applicability": None,
            }
        ],
    )
    assert result.stderr == (
        f"ckptlint: warning: {project / 'pyproject.toml'}: [tool.ckptlint] max-file-size: "
        "100000000 bytes is over the ceiling of 10485760 that only the command line "
        "(--max-file-size) can raise; the ceiling applies\n"
    )
    assert peak < GIB
    # The command line can, as the user's explicit choice; the analysis's own bound (one
    # token per 20 bytes of the cap) holds.
    result, peak = run_measured("--max-file-size", "60000000", "--quiet", ".", cwd=project)
    assert result.stdout == (
        "huge.py:1:1: CKP901 file too large to analyse: over 3000000 tokens (the parser alone "
        "would hold hundreds of bytes for each)\n"
    )
    assert (result.returncode, result.stderr) == (1, "")
    assert peak < GIB


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux's /proc")
def test_a_dense_file_under_the_size_ceiling_is_refused_before_parsing(project: Path) -> None:
    """2 MB of one list: parsing it alone took 946 MiB; refused from its tokens."""
    (project / "dense.py").write_text(
        "from torch.utils.checkpoint import checkpoint\nx = [" + "1," * 1_000_000 + "]\n"
    )
    (project / "ok.py").write_text(MISSING)
    result, peak = run_measured("--format", "json", ".", cwd=project)
    assert [(i["path"], i["code"]) for i in json.loads(result.stdout)] == [
        ("dense.py", "CKP901"),
        ("ok.py", "CKP001"),
    ]
    assert peak < GIB


def test_standard_input_is_read_up_to_the_ceiling(project: Path) -> None:
    data = b"x = [" + b"1," * (6 * MIB) + b"]\n"  # 12 MiB
    result = run_cli("--quiet", "--stdin-filename", "big.py", "-", cwd=project, stdin=data)
    assert (
        result.stdout == "big.py:1:1: CKP901 file too large: over max-file-size (10485760 bytes)\n"
    )
    fixed = run_cli("--fix", "--stdin-filename", "big.py", "-", cwd=project, stdin=data)
    assert fixed.stdout_bytes == data  # handed back whole and unchanged


def write_config(project: Path, text: str) -> None:
    (project / "pyproject.toml").write_text("[tool.ckptlint]\n" + text)
    (project / "m.py").write_text(MISSING)


def test_a_configuration_nested_too_deeply_is_a_configuration_error(project: Path) -> None:
    write_config(project, "exclude = " + "[" * 100_000 + "]" * 100_000 + "\n")
    result = run_cli(".", cwd=project)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        f"ckptlint: error: {project / 'pyproject.toml'}: cannot read configuration: "
        "nested too deeply\n"
    )


def test_a_list_nested_within_the_readers_reach_is_named_briefly(project: Path) -> None:
    write_config(project, "exclude = " + "[" * 200 + "]" * 200 + "\n")
    result = run_cli(".", cwd=project)
    assert result.returncode == 2
    assert result.stderr == (
        f"ckptlint: error: {project / 'pyproject.toml'}: [tool.ckptlint] exclude: expected a "
        "list of strings, got [[[...]]]\n"
    )


@pytest.mark.parametrize(
    ("key", "text", "count"),
    [
        ("exclude", "exclude = [{}]\n", 200_000),
        ("extend-checkpoint-functions", "extend-checkpoint-functions = [{}]\n", 100_000),
        ("select", "select = [{}]\n", 20_000),
    ],
)
def test_lists_over_the_bound_are_configuration_errors(
    project: Path, key: str, text: str, count: int
) -> None:
    items = ", ".join(
        f'"CKP{index % 10}"' if key == "select" else f'"m{index}"' for index in range(count)
    )
    write_config(project, text.format(items))
    result = run_cli(".", cwd=project)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        f"ckptlint: error: {project / 'pyproject.toml'}: [tool.ckptlint] {key}: {count} "
        f"entries, more than the {MAX_ITEMS} a configuration may hold\n"
    )


def test_too_many_per_file_ignores_are_a_configuration_error(project: Path) -> None:
    write_config(
        project,
        "[tool.ckptlint.per-file-ignores]\n"
        + "".join(f'"dir{index}/*.py" = ["CKP001"]\n' for index in range(50_000)),
    )
    result = run_cli(".", cwd=project)
    assert result.returncode == 2
    assert result.stderr == (
        f"ckptlint: error: {project / 'pyproject.toml'}: [tool.ckptlint] per-file-ignores: "
        f"50000 entries, more than the {MAX_ITEMS} a configuration may hold\n"
    )


def test_an_entry_over_the_length_bound_is_a_configuration_error(project: Path) -> None:
    write_config(project, f'exclude = ["{"a" * 5000}"]\n')
    result = run_cli(".", cwd=project)
    assert result.returncode == 2
    assert "[tool.ckptlint] exclude: an entry of 5000 characters" in result.stderr


def test_lists_at_the_bound_are_honoured(project: Path) -> None:
    """MAX_ITEMS of each list (their cost: benchmarks/hostile_config.py)."""
    (project / ".git").mkdir()
    for index in range(20):
        folder = project / f"pkg{index % 4}"
        folder.mkdir(exist_ok=True)
        (folder / f"m{index}.py").write_text(MISSING)
    excluded = [f"dir{index}/sub*/m.py" for index in range(MAX_ITEMS - 1)] + ["pkg0/"]
    ignores = "".join(f'"dir{index}/*.py" = ["CKP001"]\n' for index in range(MAX_ITEMS - 1))
    names = ", ".join(f'"mylib.m{index}.wrap"' for index in range(MAX_ITEMS))
    (project / "pyproject.toml").write_text(
        "[tool.ckptlint]\n"
        f"exclude = {json.dumps(excluded)}\n"
        f"extend-checkpoint-functions = [{names}]\n"
        "[tool.ckptlint.per-file-ignores]\n" + ignores + '"pkg1/" = ["CKP001"]\n'
    )
    result = run_cli("--format", "json", "--no-cache", ".", cwd=project)
    assert result.returncode == 1, result.stderr
    assert sorted(item["path"] for item in json.loads(result.stdout)) == sorted(
        f"pkg{index % 4}/m{index}.py" for index in range(20) if index % 4 in (2, 3)
    )


def test_an_ignore_file_is_read_up_to_the_bound(project: Path) -> None:
    (project / ".git").mkdir()
    (project / "a.py").write_text(MISSING)
    (project / "b.py").write_text(MISSING)
    lines = [f"nothing{index}" for index in range(MAX_ITEMS)] + ["b.py"]
    (project / ".gitignore").write_text("\n".join(lines) + "\n")
    result = run_cli("--format", "json", ".", cwd=project)
    assert sorted(item["path"] for item in json.loads(result.stdout)) == ["a.py", "b.py"]
    assert result.stderr == (
        f"ckptlint: warning: .gitignore: {MAX_ITEMS + 1} patterns, {MAX_ITEMS} "
        f"in force at most: only the first {MAX_ITEMS} are honoured\n"
    )
