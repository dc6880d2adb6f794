"""What a repository can hold that a linter must survive: FIFOs, sockets, devices (a
committed ``zero.py -> /dev/zero``), huge files, folders nested past the recursion limit,
and file names of any bytes; only regular files are read, whatever they are named, every
name is reported in every format, and ``-o`` into a missing folder is a usage error."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import socket
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest

from ckptlint.config import Settings
from ckptlint.discovery import files_to_lint
from ckptlint.source import CannotRead, FileTooLarge, read_bytes
from tests.conftest import SUBPROCESS_TIMEOUT, run_cli
from tests.test_cli_output import sarif_validator

MISSING = "import torch.utils.checkpoint as cp\n\ny = cp.checkpoint(block, x)\n"
CKP001 = (
    "`checkpoint()` called without `use_reentrant`; pass `use_reentrant=False` (recommended) "
    "or `use_reentrant=True` explicitly"
)
GIB = 1024**3
# The engine does not yet pass max-file-size to read_bytes, nor report FileTooLarge as
# CKP901 (it reports every CannotRead as CKP902): see read_bytes and FileTooLarge.


def make_socket(path: Path) -> None:
    """A Unix socket file at ``path`` (bound from its folder: socket paths are short)."""
    with contextlib.chdir(path.parent), socket.socket(socket.AF_UNIX) as server:
        server.bind(path.name)


def make_sparse(path: Path, size: int) -> None:
    """A file of ``size`` zero bytes that takes no room on disk."""
    with open(path, "wb") as handle:
        handle.truncate(size)


def run_limited(*arguments: str, cwd: Path, memory: int = 2 * GIB) -> subprocess.CompletedProcess:
    """``ckptlint ARGUMENTS`` in a process that may not map more than ``memory`` bytes and
    is killed if it does not finish (a FIFO read would block it forever)."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    return subprocess.run(
        [sys.executable, "-m", "ckptlint", "--no-cache", *arguments],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
        preexec_fn=limit,
    )


def entries(stdout: str) -> list[tuple[str, int, int, str, str]]:
    return [
        (item["path"], item["line"], item["column"], item["code"], item["message"])
        for item in json.loads(stdout)
    ]


@pytest.fixture
def hostile(tmp_path: Path) -> Path:
    """A git work tree whose special files would block or stream a naive reader: devices,
    FIFOs and sockets as sources, as .gitignore, as .git/info/exclude, as pyproject.toml."""
    repo = tmp_path / "repo"
    (repo / ".git" / "info").mkdir(parents=True)
    (repo / ".git" / "info" / "exclude").symlink_to("/dev/zero")
    os.mkfifo(repo / ".gitignore")
    (repo / "pyproject.toml").symlink_to("/dev/zero")
    (repo / "zero.py").symlink_to("/dev/zero")
    (repo / "urandom.py").symlink_to("/dev/urandom")
    os.mkfifo(repo / "fifo.py")
    make_socket(repo / "sock.py")
    (repo / "pkg").mkdir()
    (repo / "folder_link.py").symlink_to(repo / "pkg")
    (repo / "pkg" / "model.py").write_text(MISSING)
    (repo / "dangling.py").symlink_to(repo / "nowhere.py")
    (repo / "loop.py").symlink_to("loop.py")
    (repo / "ok.py").write_text(MISSING)
    return repo


def test_special_files_are_never_read(hostile: Path) -> None:
    """Found in a folder: skipped; named: CKP902 with what they are. The run ends at once,
    in little memory."""
    result = run_limited(
        "--format", "json", ".", "zero.py", "fifo.py", "sock.py", "folder_link.py", cwd=hostile
    )
    assert result.stderr == ""
    assert result.returncode == 1
    assert entries(result.stdout) == [
        ("dangling.py", 1, 1, "CKP902", "cannot read file: No such file or directory"),
        ("loop.py", 1, 1, "CKP902", "cannot read file: Too many levels of symbolic links"),
        ("ok.py", 3, 5, "CKP001", CKP001),
        ("pkg/model.py", 3, 5, "CKP001", CKP001),
        ("zero.py", 1, 1, "CKP902", "not a regular file: a character device"),
        ("fifo.py", 1, 1, "CKP902", "not a regular file: a FIFO"),
        ("sock.py", 1, 1, "CKP902", "not a regular file: a socket"),
    ]
    # folder_link.py leads to a folder: walked as the folder it is, its file linted once.
    with contextlib.chdir(hostile):
        assert files_to_lint([".", "zero.py"], Settings(root=hostile)) == [
            "dangling.py",
            "loop.py",
            "ok.py",
            "pkg/model.py",
        ]


def test_special_files_through_the_fix_and_diff_phases(hostile: Path) -> None:
    diff = run_limited("--diff", "--unsafe-fixes", ".", "fifo.py", cwd=hostile)
    assert (diff.returncode, diff.stderr) == (1, "")
    assert [line for line in diff.stdout.splitlines() if line.startswith("+++")] == [
        "+++ ok.py",
        "+++ pkg/model.py",
    ]
    result = run_limited("--fix", "--unsafe-fixes", "--quiet", ".", "fifo.py", cwd=hostile)
    assert (result.returncode, result.stderr) == (1, "")
    assert result.stdout.splitlines() == [
        "dangling.py:1:1: CKP902 cannot read file: No such file or directory",
        "loop.py:1:1: CKP902 cannot read file: Too many levels of symbolic links",
        "fifo.py:1:1: CKP902 not a regular file: a FIFO",
    ]
    fixed = MISSING.replace("(block, x)", "(block, x, use_reentrant=False)")
    assert (hostile / "ok.py").read_text() == fixed
    assert (hostile / "pkg" / "model.py").read_text() == fixed


def test_huge_files_are_ckp901_and_never_read(hostile: Path) -> None:
    """4 GiB (sparse) under a 2 GiB address-space limit: reading it whole would fail."""
    make_sparse(hostile / "huge.py", 4 * GIB)
    (hostile / "pkg" / "also_huge.py").write_bytes(b"#" * (10 * 1024 * 1024 + 1))
    result = run_limited("--format", "json", ".", "huge.py", cwd=hostile)
    assert result.stderr == ""
    too_large = "file too large: over max-file-size (10485760 bytes)"
    assert entries(result.stdout) == [
        ("dangling.py", 1, 1, "CKP902", "cannot read file: No such file or directory"),
        ("huge.py", 1, 1, "CKP901", too_large),
        ("loop.py", 1, 1, "CKP902", "cannot read file: Too many levels of symbolic links"),
        ("ok.py", 3, 5, "CKP001", CKP001),
        ("pkg/also_huge.py", 1, 1, "CKP901", too_large),
        ("pkg/model.py", 3, 5, "CKP001", CKP001),
    ]


def test_max_file_size_is_configurable(project: Path) -> None:
    cap = len(MISSING)
    (project / "pyproject.toml").write_text(f"[tool.ckptlint]\nmax-file-size = {cap}\n")
    (project / "small.py").write_text(MISSING)
    (project / "large.py").write_text(MISSING + "\n")
    result = run_cli("--format", "json", ".", cwd=project)
    assert entries(result.stdout) == [
        ("large.py", 1, 1, "CKP901", f"file too large: over max-file-size ({cap} bytes)"),
        ("small.py", 3, 5, "CKP001", CKP001),
    ]


@pytest.mark.parametrize("value", ["0", "-1", "true", '"10 MiB"', "1.5"])
def test_max_file_size_must_be_a_positive_number_of_bytes(project: Path, value: str) -> None:
    (project / "pyproject.toml").write_text(f"[tool.ckptlint]\nmax-file-size = {value}\n")
    (project / "m.py").write_text(MISSING)
    result = run_cli("m.py", cwd=project)
    assert result.returncode == 2
    shown = {"true": "True", '"10 MiB"': "'10 MiB'"}.get(value, value)
    assert result.stderr == (
        f"ckptlint: error: {project / 'pyproject.toml'}: [tool.ckptlint] max-file-size: "
        f"expected a positive number of bytes, got {shown}\n"
    )


class TestReadBytes:
    """The one function every reader of a source file goes through."""

    def test_special_files(self, hostile: Path) -> None:
        reasons = {}
        for name in ("zero.py", "urandom.py", "fifo.py", "sock.py", "folder_link.py", "loop.py"):
            with pytest.raises(CannotRead) as raised:
                read_bytes(str(hostile / name))
            assert not isinstance(raised.value, FileTooLarge)
            reasons[name] = raised.value.reason
        assert reasons == {
            "zero.py": "not a regular file: a character device",
            "urandom.py": "not a regular file: a character device",
            "fifo.py": "not a regular file: a FIFO",
            "sock.py": "not a regular file: a socket",
            "folder_link.py": "not a regular file: a folder",
            "loop.py": "cannot read file: Too many levels of symbolic links",
        }

    def test_the_cap(self, project: Path) -> None:
        path = project / "m.py"
        path.write_bytes(b"x" * 100)
        assert read_bytes(str(path), max_size=100) == b"x" * 100
        with pytest.raises(
            FileTooLarge, match=r"^file too large: over max-file-size \(99 bytes\)$"
        ):
            read_bytes(str(path), max_size=99)

    @pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs Linux's /proc")
    def test_a_file_whose_size_says_nothing_is_read_up_to_the_cap_only(self) -> None:
        """/proc files say they hold 0 bytes, then give more: never past the cap."""
        assert os.stat("/proc/self/maps").st_size == 0
        with pytest.raises(FileTooLarge):
            read_bytes("/proc/self/maps", max_size=10)
        assert len(read_bytes("/proc/self/maps", max_size=GIB)) > 10  # read in full

    def test_a_huge_file_is_not_read(self, project: Path) -> None:
        """In a process that cannot map 4 GiB: refused from its size, nothing allocated."""
        make_sparse(project / "huge.py", 4 * GIB)
        script = (
            "import resource, sys\n"
            f"resource.setrlimit(resource.RLIMIT_AS, ({GIB}, {GIB}))\n"
            "from ckptlint.source import FileTooLarge, read_bytes\n"
            "try:\n"
            "    read_bytes('huge.py', max_size=3 * 1024**3)\n"
            "except FileTooLarge as error:\n"
            "    print(error.reason)\n"
        )
        result = subprocess.run(
            [sys.executable, "-c", script],
            cwd=project,
            capture_output=True,
            text=True,
            timeout=SUBPROCESS_TIMEOUT,
        )
        assert (result.stdout, result.stderr) == (
            "file too large: over max-file-size (3221225472 bytes)\n",
            "",
        )


def test_folders_nested_past_the_recursion_limit(project: Path) -> None:
    depth = sys.getrecursionlimit() + 200
    folders = [project]
    for _ in range(depth):  # one level at a time: os.makedirs itself recurses
        folders.append(folders[-1] / "d")
        folders[-1].mkdir()
    (folders[-1] / "m.py").write_text(MISSING)
    try:
        result = run_cli("--format", "json", ".", cwd=project)
        assert result.stderr == ""
        assert entries(result.stdout) == [("d/" * depth + "m.py", 3, 5, "CKP001", CKP001)]
    finally:  # pytest's clean-up (shutil.rmtree) recurses too
        (folders[-1] / "m.py").unlink()
        for folder in reversed(folders[1:]):
            folder.rmdir()


# File names as bytes, and how text and GitHub output show them (git's quoting).
ODD_NAMES = {
    b"\xff bad.py": '"\\377 bad.py"',
    b"two\nlines.py": '"two\\nlines.py"',
    b"cr\rhere.py": '"cr\\rhere.py"',
    b"tab\there.py": '"tab\\there.py"',
    b'"quoted".py': '"\\"quoted\\".py"',
    b"back\\slash.py": "back\\slash.py",
    b"esc\x1b[31m.py": '"esc\\033[31m.py"',
    b"with space.py": "with space.py",
    "é.py".encode(): "é.py",
    b"caf\xe9.py": '"caf\\351.py"',
}
URIS = {
    b"\xff bad.py": "%FF%20bad.py",
    b"two\nlines.py": "two%0Alines.py",
    b"cr\rhere.py": "cr%0Dhere.py",
    b"tab\there.py": "tab%09here.py",
    b'"quoted".py': "%22quoted%22.py",
    b"back\\slash.py": "back%5Cslash.py",
    b"esc\x1b[31m.py": "esc%1B%5B31m.py",
    b"with space.py": "with%20space.py",
    "é.py".encode(): "%C3%A9.py",
    b"caf\xe9.py": "caf%E9.py",
}


@pytest.fixture
def odd_names(project: Path) -> list[str]:
    """The odd names, written as files, in the order the command line names them."""
    names = []
    for name in ODD_NAMES:
        with open(os.path.join(os.fsencode(project), name), "w") as handle:
            handle.write(MISSING)
        names.append(os.fsdecode(name))
    return names


@pytest.mark.parametrize("to_file", [False, True], ids=["stdout", "output-file"])
class TestEveryNameInEveryFormat:
    def report(self, project: Path, names: list[str], output: str, to_file: bool) -> str:
        arguments = ["--format", output, *(["-o", "report.out"] if to_file else []), *names]
        result = run_cli(*arguments, cwd=project)
        assert (result.returncode, result.stderr) == (1, "")
        if not to_file:
            return result.stdout
        assert result.stdout == ""
        return (project / "report.out").read_text(encoding="utf-8")

    def test_text(self, project: Path, odd_names: list[str], to_file: bool) -> None:
        lines = self.report(project, odd_names, "text", to_file).splitlines()
        assert lines == [
            *(f"{shown}:3:5: CKP001 {CKP001}" for shown in ODD_NAMES.values()),
            f"Found {len(ODD_NAMES)} findings.",
            f"{len(ODD_NAMES)} unsafe fixes available with `--fix --unsafe-fixes`.",
        ]

    def test_json(self, project: Path, odd_names: list[str], to_file: bool) -> None:
        found = json.loads(self.report(project, odd_names, "json", to_file))
        assert [os.fsencode(item["path"]) for item in found] == list(ODD_NAMES)

    def test_github(self, project: Path, odd_names: list[str], to_file: bool) -> None:
        lines = self.report(project, odd_names, "github", to_file).splitlines()
        assert lines == [
            f"::error file={shown},line=3,col=5,endLine=3,endColumn=28,"
            f"title=ckptlint (CKP001)::CKP001 {CKP001}"
            for shown in ODD_NAMES.values()
        ]

    def test_sarif(self, project: Path, odd_names: list[str], to_file: bool) -> None:
        log = json.loads(self.report(project, odd_names, "sarif", to_file))
        assert [error.message for error in sarif_validator().iter_errors(log)] == []
        (run,) = log["runs"]
        uris = [
            r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in run["results"]
        ]
        assert uris == list(URIS.values())
        assert [urllib.parse.unquote_to_bytes(uri) for uri in uris] == list(ODD_NAMES)


def test_problems_and_diffs_name_odd_files_too(project: Path, odd_names: list[str]) -> None:
    for name in odd_names:
        os.chmod(project / name, 0o444)
    result = run_cli("--fix", "--unsafe-fixes", "--quiet", *odd_names, cwd=project)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"ckptlint: warning: {shown}: fixes not written: the file is read-only (mode 0444)"
        for shown in ODD_NAMES.values()
    ]
    diff = run_cli("--diff", "--unsafe-fixes", odd_names[0], cwd=project)
    assert diff.stdout.startswith('--- "\\377 bad.py"\n+++ "\\377 bad.py"\n')


class TestOutputFile:
    def test_into_a_missing_folder_is_a_usage_error_before_anything_is_done(
        self, project: Path
    ) -> None:
        (project / "m.py").write_text(MISSING)
        result = run_cli("--fix", "--unsafe-fixes", "-o", "missing/report.txt", ".", cwd=project)
        assert (result.returncode, result.stdout) == (2, "")
        assert result.stderr == (
            "ckptlint: error: cannot write the report to missing/report.txt: no such folder\n"
        )
        assert (project / "m.py").read_text() == MISSING  # nothing fixed
        assert not (project / "missing").exists()

    def test_onto_a_folder_is_a_usage_error(self, project: Path) -> None:
        (project / "m.py").write_text(MISSING)
        (project / "out").mkdir()
        result = run_cli("-o", "out", "m.py", cwd=project)
        assert (result.returncode, result.stdout) == (2, "")
        assert result.stderr == "ckptlint: error: cannot write the report to out: Is a directory\n"

    def test_an_odd_name_is_quoted_in_the_error(self, project: Path) -> None:
        (project / "m.py").write_text(MISSING)
        missing = os.fsdecode(b"no\xffthere/r.txt")
        result = run_cli("-o", missing, "m.py", cwd=project)
        assert result.returncode == 2
        assert result.stderr == (
            'ckptlint: error: cannot write the report to "no\\377there/r.txt": no such folder\n'
        )
