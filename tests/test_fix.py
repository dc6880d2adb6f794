"""--fix / --unsafe-fixes / --diff: formatting kept, atomic writes, idempotent, and never a
file corrupted: each fix checked on its own, the result compiled, written only over the
bytes that were linted."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

import ckptlint.fixes
from ckptlint.core import AddKeyword, Finding, Fix
from ckptlint.fixes import FixFailed, compile_error, fix_text, write_if_unchanged
from ckptlint.project.cache import FOLDER  # the results cache, not a leftover
from tests.conftest import lint, run_cli

HEADER = "import torch.utils.checkpoint as cp\n"

ROUND_TRIPS = {
    "one line": ("y = cp.checkpoint(f, x)\n", "y = cp.checkpoint(f, x, use_reentrant=False)\n"),
    "one line, trailing comma": (
        "y = cp.checkpoint(f, x,)\n",
        "y = cp.checkpoint(f, x, use_reentrant=False,)\n",
    ),
    "multi-line with trailing comma and comment": (
        """\
        y = cp.checkpoint(
            f,
            x,  # the input
        )
        """,
        """\
        y = cp.checkpoint(
            f,
            x,  # the input
            use_reentrant=False,
        )
        """,
    ),
    "multi-line without trailing comma": (
        """\
        def forward(self, x):
            if self.gradient_checkpointing:
                return cp.checkpoint(
                    create_custom_forward(self.layer),
                    x,
                    mask
                )
        """,
        """\
        def forward(self, x):
            if self.gradient_checkpointing:
                return cp.checkpoint(
                    create_custom_forward(self.layer),
                    x,
                    mask,
                    use_reentrant=False
                )
        """,
    ),
    "hanging indent": (
        """\
        y = cp.checkpoint(f,
                          x)
        """,
        """\
        y = cp.checkpoint(f,
                          x, use_reentrant=False)
        """,
    ),
    "starred positional": (
        "y = cp.checkpoint(f, *inputs)\n",
        "y = cp.checkpoint(f, *inputs, use_reentrant=False)\n",
    ),
    "nested in another call": (
        "out = norm(cp.checkpoint(f, x) + 1)  # keep this comment\n",
        "out = norm(cp.checkpoint(f, x, use_reentrant=False) + 1)  # keep this comment\n",
    ),
    "partial never called here": (
        "import functools\nrun = functools.partial(cp.checkpoint)\n",
        "import functools\nrun = functools.partial(cp.checkpoint, use_reentrant=False)\n",
    ),
}


@pytest.mark.parametrize(("before", "after"), ROUND_TRIPS.values(), ids=ROUND_TRIPS.keys())
def test_fix_round_trip(project: Path, before: str, after: str) -> None:
    path = project / "model.py"
    path.write_text(HEADER + textwrap.dedent(before))
    result = run_cli("--fix", "--unsafe-fixes", "model.py", cwd=project)
    assert result.returncode == 0, result.stdout + result.stderr
    assert path.read_text() == HEADER + textwrap.dedent(after)
    assert result.stdout == "Found 1 finding (1 fixed, 0 remaining).\n"
    # A second run finds nothing to change.
    again = run_cli("--fix", "--unsafe-fixes", "model.py", cwd=project)
    assert again.returncode == 0 and path.read_text() == HEADER + textwrap.dedent(after)


def test_fix_without_unsafe_fixes_changes_nothing(project: Path) -> None:
    path = project / "model.py"
    path.write_text(HEADER + "y = cp.checkpoint(f, x)\n")
    result = run_cli("--fix", "model.py", cwd=project)
    assert result.returncode == 1
    assert path.read_text() == HEADER + "y = cp.checkpoint(f, x)\n"
    assert result.stdout.endswith(
        "Found 1 finding.\n1 unsafe fix available with `--fix --unsafe-fixes`.\n"
    )


def test_diff_prints_and_writes_nothing(project: Path) -> None:
    path = project / "model.py"
    path.write_text(HEADER + "y = cp.checkpoint(f, x)\n")
    result = run_cli("--diff", "--unsafe-fixes", "model.py", cwd=project)
    assert result.returncode == 1
    assert (
        "-y = cp.checkpoint(f, x)\n+y = cp.checkpoint(f, x, use_reentrant=False)\n" in result.stdout
    )
    assert result.stdout.startswith("--- model.py\n+++ model.py\n")
    assert result.stdout.endswith("\n\nWould fix 1 finding.\n")  # as ruff: after a blank line
    assert path.read_text() == HEADER + "y = cp.checkpoint(f, x)\n"
    clean = project / "clean.py"
    clean.write_text(HEADER + "y = cp.checkpoint(f, x, use_reentrant=True)\n")
    assert run_cli("--diff", "--unsafe-fixes", "clean.py", cwd=project).stdout == ""


def test_fix_keeps_encoding_bom_and_mode(project: Path) -> None:
    path = project / "latin.py"
    source = "# -*- coding: latin-1 -*-\n" + HEADER + "s = 'é'; y = cp.checkpoint(f, x)\n"
    path.write_bytes(source.encode("latin-1"))
    bom = project / "bom.py"
    bom.write_bytes(b"\xef\xbb\xbf" + (HEADER + "y = cp.checkpoint(f, x)\n").encode())
    os.chmod(path, 0o640)
    result = run_cli("--fix", "--unsafe-fixes", "latin.py", "bom.py", cwd=project)
    assert result.returncode == 0, result.stderr
    expected = source.replace("(f, x)", "(f, x, use_reentrant=False)")
    assert path.read_bytes() == expected.encode("latin-1")
    assert bom.read_bytes().startswith(b"\xef\xbb\xbf")
    assert b"use_reentrant=False" in bom.read_bytes()
    assert os.stat(path).st_mode & 0o777 == 0o640
    assert sorted(p.name for p in project.iterdir() if p.name != FOLDER) == [
        "bom.py",
        "latin.py",
    ]  # no temp left


def test_fix_through_symlink_replaces_the_target(project: Path) -> None:
    real = project / "real.py"
    real.write_text(HEADER + "y = cp.checkpoint(f, x)\n")
    (project / "link.py").symlink_to(real)
    run_cli("--fix", "--unsafe-fixes", "link.py", cwd=project)
    assert (project / "link.py").is_symlink()
    assert "use_reentrant=False" in real.read_text()


def test_fix_keeps_crlf_and_fixes_nested_calls(project: Path) -> None:
    path = project / "model.py"
    source = HEADER + "y = cp.checkpoint(f, cp.checkpoint(g, x))\nz = 1\n"
    path.write_bytes(source.replace("\n", "\r\n").encode())
    result = run_cli("--fix", "--unsafe-fixes", "model.py", cwd=project)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == "Found 2 findings (2 fixed, 0 remaining).\n"
    expected = (
        HEADER + "y = cp.checkpoint(f, cp.checkpoint(g, x, use_reentrant=False), "
        "use_reentrant=False)\nz = 1\n"
    )
    assert path.read_bytes() == expected.replace("\n", "\r\n").encode()


def test_use_reentrant_none_is_replaced_where_it_is_written(project: Path) -> None:
    path = project / "model.py"
    source = (
        "import functools\n"
        "from torch.utils.checkpoint import checkpoint, checkpoint_sequential\n"
        "run = functools.partial(checkpoint, use_reentrant=None)\n"
        "a = run(f, x)\n"
        "b = run(g, x)\n"
        "c = checkpoint(f, x, use_reentrant=None)\n"
        "d = checkpoint_sequential(fs, 2, x, None)\n"
    )
    path.write_text(source)
    report = run_cli("model.py", cwd=project)
    assert [line.split(" ", 2)[:2] for line in report.stdout.splitlines()[:4]] == [
        ["model.py:4:5:", "CKP001"],
        ["model.py:5:5:", "CKP001"],
        ["model.py:6:5:", "CKP001"],
        ["model.py:7:5:", "CKP001"],
    ]
    assert "use_reentrant=None" in report.stdout
    result = run_cli("--fix", "--unsafe-fixes", "model.py", cwd=project)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == "Found 4 findings (4 fixed, 0 remaining).\n"
    assert path.read_text() == source.replace("None", "False")


class TestNeverCorrupt:
    def test_the_same_file_reached_many_ways_is_fixed_once(self, project: Path) -> None:
        path = project / "model.py"
        path.write_text(HEADER + "y = cp.checkpoint(f, x)\n")
        (project / "link.py").symlink_to(path)
        spellings = (".", "./model.py", "model.py", str(path), "link.py", str(project))
        report = run_cli(*spellings, cwd=project)
        assert report.stdout.count("CKP001") == 1, report.stdout
        result = run_cli("--fix", "--unsafe-fixes", *spellings, cwd=project)
        assert result.stdout == "Found 1 finding (1 fixed, 0 remaining).\n"
        assert result.returncode == 0
        fixed = path.read_text()
        assert fixed == HEADER + "y = cp.checkpoint(f, x, use_reentrant=False)\n"
        compile(fixed, "model.py", "exec")

    def test_an_unfixable_call_does_not_block_the_others(self, project: Path) -> None:
        path = project / "model.py"
        path.write_text(HEADER + "a = cp.checkpoint(t for t in items)\nb = cp.checkpoint(f, x)\n")
        result = run_cli("--fix", "--unsafe-fixes", "model.py", cwd=project)
        assert result.returncode == 1
        assert path.read_text() == HEADER + (
            "a = cp.checkpoint(t for t in items)\nb = cp.checkpoint(f, x, use_reentrant=False)\n"
        )
        assert result.stdout.startswith("model.py:2:5: CKP001 [*] ")
        assert result.stdout.endswith(
            "Found 2 findings (1 fixed, 1 remaining).\n[*] 1 fixable with `--fix`.\n"
        )
        assert (
            "ckptlint: warning: model.py:2:5: CKP001 not fixed: the fixed call would not be "
            "valid Python (Generator expression must be parenthesized)"
        ) in result.stderr

    def test_file_edited_while_being_fixed_is_not_overwritten(
        self, project: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        path = project / "model.py"
        path.write_text(HEADER + "y = cp.checkpoint(f, x)\n")
        edited = HEADER + "# an editor saved this meanwhile\ny = cp.checkpoint(f, x)\n"
        check = ckptlint.fixes.compile_error

        def edit_then_check(data: bytes, name: str) -> str | None:
            path.write_text(edited)
            return check(data, name)

        monkeypatch.setattr(ckptlint.fixes, "compile_error", edit_then_check)
        result = run_cli("--fix", "--unsafe-fixes", "model.py", cwd=project)
        assert path.read_text() == edited
        assert result.returncode == 1
        assert "model.py: fixes not written: the file changed on disk since it was read" in (
            result.stderr
        )
        assert result.stdout.startswith("model.py:2:5: CKP001 ")  # as linted, still reported
        assert sorted(p.name for p in project.iterdir() if p.name != FOLDER) == [
            "model.py"
        ]  # no temp file left

    def test_write_if_unchanged_refuses_a_changed_file(self, project: Path) -> None:
        path = project / "m.py"
        path.write_bytes(b"x = 1\n")
        with pytest.raises(FixFailed, match="changed on disk"):
            write_if_unchanged(str(path), b"x = 0\n", b"x = 2\n", roots=[str(project)])
        assert path.read_bytes() == b"x = 1\n"
        write_if_unchanged(str(path), b"x = 1\n", b"x = 2\n", roots=[str(project)])
        assert path.read_bytes() == b"x = 2\n"

    def test_a_file_the_system_refuses_to_open_is_reported_and_the_run_goes_on(
        self, project: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The operating system refuses to open a file for writing (simulated: the tests
        may run as root, whom permission bits do not stop). Fixes are written in place, so
        a read-only folder alone no longer stops them."""
        (project / "locked").mkdir()
        locked = project / "locked" / "a.py"
        locked.write_text(HEADER + "y = cp.checkpoint(f, x)\n")
        free = project / "b.py"
        free.write_text(HEADER + "y = cp.checkpoint(f, x)\n")
        system_open = ckptlint.fixes.os.open

        def refuse_locked(path: str, flags: int, *arguments: object, **keywords: object) -> int:
            if flags & os.O_RDWR and Path(path) == locked.resolve():
                raise PermissionError(13, "Permission denied")
            return system_open(path, flags, *arguments, **keywords)  # the cache's dir_fd

        monkeypatch.setattr(ckptlint.fixes.os, "open", refuse_locked)
        result = run_cli("--fix", "--unsafe-fixes", ".", cwd=project)
        assert result.returncode == 1
        assert "use_reentrant=False" in free.read_text()
        assert "use_reentrant" not in locked.read_text()
        assert result.stderr == (
            "ckptlint: warning: locked/a.py: fixes not written: cannot open the file for "
            "writing: Permission denied\n"
        )
        assert result.stdout.startswith("locked/a.py:2:5: CKP001 ")
        assert "Found 2 findings (1 fixed, 1 remaining).\n" in result.stdout

    def test_internal_error_in_the_fix_phase_names_the_file(
        self, project: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        (project / "a.py").write_text(HEADER + "y = cp.checkpoint(f, x)\n")
        (project / "b.py").write_text(HEADER + "y = cp.checkpoint(f, x)\n")
        fix = ckptlint.fixes.fix_text

        def fail_on_a(text: str, findings: list) -> object:
            if "a.py" in str(Path.cwd() / "a.py") and fail_on_a.calls == 0:
                fail_on_a.calls += 1
                raise RuntimeError("boom")
            return fix(text, findings)

        fail_on_a.calls = 0
        monkeypatch.setattr(ckptlint.fixes, "fix_text", fail_on_a)
        result = run_cli("--fix", "--unsafe-fixes", "--format", "json", ".", cwd=project)
        assert result.returncode == 2
        entries = json.loads(result.stdout)
        assert [(e["path"], e["code"]) for e in entries] == [("a.py", "CKP001"), ("a.py", None)]
        assert entries[1]["message"] == "internal error: fix phase: RuntimeError: boom"
        assert "use_reentrant=False" in (project / "b.py").read_text()
        assert "ckptlint: internal error: a.py: fix phase: RuntimeError: boom" in result.stderr

    def test_deeply_nested_input_does_not_crash_the_fix(self, project: Path) -> None:
        deep_argument = HEADER + "y = cp.checkpoint(f, " + "g(" * 150 + "x" + ")" * 150 + ")\n"
        (project / "deep_argument.py").write_text(deep_argument)
        nested = HEADER + "y = " + "cp.checkpoint(f, " * 150 + "x" + ")" * 150 + "\n"
        (project / "nested.py").write_text(nested)
        (project / "plain.py").write_text(HEADER + "y = cp.checkpoint(f, x)\n")
        result = run_cli("--fix", "--unsafe-fixes", ".", cwd=project)
        assert (result.returncode, result.stderr) == (0, "")
        assert result.stdout == "Found 152 findings (152 fixed, 0 remaining).\n"
        counts = {}
        for name in ("deep_argument.py", "nested.py", "plain.py"):
            text = (project / name).read_text()
            compile(text, name, "exec")
            counts[name] = text.count("use_reentrant=False")
        assert counts == {"deep_argument.py": 1, "nested.py": 150, "plain.py": 1}

    def test_a_fix_that_would_repeat_a_keyword_is_refused(self) -> None:
        """compile(), not ast.parse, is the judge: ast.parse accepts a repeated keyword."""
        text = "f(x, use_reentrant=True)\n"
        finding = Finding(
            1,
            1,
            "CKP001",
            "m",
            end_line=1,
            end_column=25,
            fix=Fix(AddKeyword(1, 1, "use_reentrant", "False"), "unsafe"),
        )
        fixed = fix_text(text, [finding])
        assert fixed.text == text and not fixed.applied
        assert fixed.failed == (
            (finding, "the fixed call would repeat the keyword `use_reentrant`"),
        )
        assert (
            compile_error(b"f(x, a=1, a=2)\n", "m.py") == "keyword argument repeated: a at line 1"
        )

    def test_a_fix_that_does_not_match_a_call_is_refused(self) -> None:
        finding = Finding(
            1,
            1,
            "CKP001",
            "m",
            end_line=1,
            end_column=6,
            fix=Fix(AddKeyword(1, 1, "use_reentrant", "False"), "unsafe"),
        )
        fixed = fix_text("x = 1\n", [finding])
        assert fixed.failed == ((finding, "no call found where the finding is"),)

    def test_a_file_that_does_not_compile_is_never_written(self, project: Path) -> None:
        source = HEADER + "y = cp.checkpoint(f, x)\nreturn y\n"  # parses, does not compile
        path = project / "model.py"
        path.write_text(source)
        assert [f.code for f in lint(source)] == ["CKP001"]
        result = run_cli("--fix", "--unsafe-fixes", "model.py", cwd=project)
        assert path.read_text() == source
        assert (
            "fixes not applied: the file does not compile as it is ('return' outside function"
            in (result.stderr)
        )
        assert result.returncode == 1


class TestStdin:
    def test_fix_writes_the_fixed_text_to_stdout(self, project: Path) -> None:
        source = HEADER + "y = cp.checkpoint(f, x)\n"
        result = run_cli(
            "--fix",
            "--unsafe-fixes",
            "--stdin-filename",
            "pkg/model.py",
            "-",
            cwd=project,
            stdin=source.encode(),
        )
        assert result.stdout == HEADER + "y = cp.checkpoint(f, x, use_reentrant=False)\n"
        assert result.stderr == "Found 1 finding (1 fixed, 0 remaining).\n"
        assert result.returncode == 0
        assert [p for p in project.iterdir() if p.name != FOLDER] == []  # nothing written

    def test_diff_of_stdin(self, project: Path) -> None:
        source = HEADER + "y = cp.checkpoint(f, x)\n"
        result = run_cli(
            "--diff",
            "--unsafe-fixes",
            "--stdin-filename",
            "m.py",
            cwd=project,
            stdin=source.encode(),
        )
        assert result.returncode == 1
        assert result.stdout.startswith("--- m.py\n+++ m.py\n")
        assert "+y = cp.checkpoint(f, x, use_reentrant=False)\n" in result.stdout

    def test_fix_of_clean_or_excluded_stdin_echoes_it(self, project: Path) -> None:
        source = HEADER + "y = cp.checkpoint(f, x)\n"
        (project / "pyproject.toml").write_text('[tool.ckptlint]\nexclude = ["vendored"]\n')
        result = run_cli(
            "--fix",
            "--unsafe-fixes",
            "--stdin-filename",
            "vendored/m.py",
            "-",
            cwd=project,
            stdin=source.encode(),
        )
        assert result.stdout == source and result.returncode == 0


def test_fix_in_worker_processes(project: Path) -> None:
    for index in range(12):
        (project / f"m{index}.py").write_text(HEADER + "y = cp.checkpoint(f, x)\n" * (index % 3))
    result = run_cli("--fix", "--unsafe-fixes", "--jobs", "2", ".", cwd=project)
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == "Found 12 findings (12 fixed, 0 remaining).\n"
    for index in range(12):
        text = (project / f"m{index}.py").read_text()
        assert text.count("use_reentrant=False") == index % 3


UNFIXED = HEADER + "y = cp.checkpoint(f, x)\n"
FIXED = HEADER + "y = cp.checkpoint(f, x, use_reentrant=False)\n"
FINDING = (
    "2:5: CKP001 [*] `checkpoint()` called without `use_reentrant`; pass "
    "`use_reentrant=False` (recommended) or `use_reentrant=True` explicitly"
)


class TestWritesOnlyWhatItMay:
    """--fix writes only regular files inside the paths it was given, never one without a
    write permission bit (also as root, as CI runs), and in place: owner, group, mode and
    hard links stay as they were."""

    def test_a_link_leading_out_of_the_tree_is_left_alone(self, tmp_path: Path) -> None:
        outside = tmp_path / "outside.py"
        outside.write_text(UNFIXED)
        tree = tmp_path / "tree"
        (tree / "pkg").mkdir(parents=True)
        (tree / "link.py").symlink_to(outside)
        (tree / "pkg" / "up.py").symlink_to(tree / "own.py")  # out of pkg, inside the tree
        (tree / "own.py").write_text(UNFIXED)
        result = run_cli("--fix", "--unsafe-fixes", ".", cwd=tree)
        assert result.returncode == 1
        assert result.stderr == (
            "ckptlint: warning: link.py: fixes not written: it leads outside the paths being "
            f"linted, to {outside.resolve()}\n"
        )
        assert result.stdout == (
            f"link.py:{FINDING}\n"
            "Found 2 findings (1 fixed, 1 remaining).\n[*] 1 fixable with `--fix`.\n"
        )
        assert outside.read_text() == UNFIXED and (tree / "own.py").read_text() == FIXED

        (tree / "own.py").write_text(UNFIXED)
        result = run_cli("--fix", "--unsafe-fixes", "pkg", cwd=tree)  # own.py is outside pkg
        assert result.stderr == (
            "ckptlint: warning: pkg/up.py: fixes not written: it leads outside the paths being "
            f"linted, to {(tree / 'own.py').resolve()}\n"
        )
        assert (tree / "own.py").read_text() == UNFIXED

    def test_a_link_named_on_the_command_line_is_resolved(self, tmp_path: Path) -> None:
        """Named, a link is the file it leads to: the user chose it."""
        outside = tmp_path / "shared.py"
        outside.write_text(UNFIXED)
        (tmp_path / "tree").mkdir()
        (tmp_path / "tree" / "link.py").symlink_to(outside)
        result = run_cli("--fix", "--unsafe-fixes", "link.py", cwd=tmp_path / "tree")
        assert (result.returncode, result.stderr) == (0, "")
        assert outside.read_text() == FIXED and (tmp_path / "tree" / "link.py").is_symlink()

    @pytest.mark.parametrize("mode", [0o444, 0o400, 0o555])
    def test_a_file_without_a_write_bit_is_left_alone_even_by_root(
        self, project: Path, mode: int
    ) -> None:
        path = project / "ro.py"
        path.write_text(UNFIXED)
        path.chmod(mode)
        (project / "rw.py").write_text(UNFIXED)
        result = run_cli("--fix", "--unsafe-fixes", ".", cwd=project)
        assert result.returncode == 1
        assert result.stderr == (
            "ckptlint: warning: ro.py: fixes not written: the file is read-only "
            f"(mode {mode:04o})\n"
        )
        assert result.stdout.startswith(
            f"ro.py:{FINDING}\nFound 2 findings (1 fixed, 1 remaining).\n"
        )
        assert path.read_text() == UNFIXED and os.stat(path).st_mode & 0o7777 == mode
        assert (project / "rw.py").read_text() == FIXED

    @pytest.mark.skipif(os.geteuid() != 0, reason="giving a file away takes root")
    def test_owner_group_mode_and_inode_are_kept(self, project: Path) -> None:
        path = project / "theirs.py"
        path.write_text(UNFIXED)
        os.chown(path, 12345, 23456)
        path.chmod(0o640)
        before = os.stat(path)
        result = run_cli("--fix", "--unsafe-fixes", "theirs.py", cwd=project)
        assert (result.returncode, result.stderr) == (0, "")
        after = os.stat(path)
        assert path.read_bytes() == FIXED.encode()
        assert (after.st_uid, after.st_gid, after.st_mode & 0o7777) == (12345, 23456, 0o640)
        assert (after.st_ino, after.st_dev) == (before.st_ino, before.st_dev)

    def test_hard_links_stay_one_file(self, tmp_path: Path) -> None:
        (tmp_path / "tree").mkdir()
        first = tmp_path / "tree" / "a.py"
        first.write_text(UNFIXED)
        os.link(first, tmp_path / "tree" / "b.py")
        os.link(first, tmp_path / "elsewhere.py")  # a link outside the tree: the same file
        result = run_cli("--fix", "--unsafe-fixes", ".", cwd=tmp_path / "tree")
        assert (result.returncode, result.stderr) == (0, "")
        assert result.stdout == "Found 1 finding (1 fixed, 0 remaining).\n"
        names = [first, tmp_path / "tree" / "b.py", tmp_path / "elsewhere.py"]
        assert [name.read_text() for name in names] == [FIXED] * 3
        assert {os.stat(name).st_ino for name in names} == {os.stat(first).st_ino}
        assert os.stat(first).st_nlink == 3

    def test_a_write_that_fails_half_way_puts_the_bytes_back(
        self, project: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        path = project / "m.py"
        path.write_text(UNFIXED)
        system_fsync = ckptlint.fixes.os.fsync
        calls = []

        def disk_full_once(descriptor: int) -> None:
            calls.append(descriptor)
            if len(calls) == 1:
                raise OSError(28, "No space left on device")
            system_fsync(descriptor)

        monkeypatch.setattr(ckptlint.fixes.os, "fsync", disk_full_once)
        result = run_cli("--fix", "--unsafe-fixes", "m.py", cwd=project)
        assert result.returncode == 1 and len(calls) == 2
        assert result.stderr == (
            "ckptlint: warning: m.py: fixes not written: cannot write the file: No space left "
            "on device; it is as it was\n"
        )
        assert path.read_text() == UNFIXED
