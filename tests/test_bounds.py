"""The bounds a repository's files cannot get past: the cost of patterns, ignore files over
10 MiB, torch versions nobody can mean, source in UTF-16 or UTF-32. Each is an error naming
the key (exit 2), a warning, or a CKP901 naming the encoding; none costs hours."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckptlint.config import MAX_ITEMS, MAX_PATTERN_TEXT
from ckptlint.source import DEFAULT_MAX_FILE_SIZE
from tests.conftest import hang_guard, run_cli

MISSING = "import torch.utils.checkpoint as cp\n\ny = cp.checkpoint(f, x)\n"


def two_hundred_files(root: Path) -> list[str]:
    (root / ".git").mkdir()
    for index in range(200):
        package = root / f"pkg{index % 10}"
        package.mkdir(exist_ok=True)
        (package / f"m{index}.py").write_text(MISSING)
    (root / ("a" * 57 + ".py")).write_text(MISSING)
    return sorted([f"pkg{i % 10}/m{i}.py" for i in range(200)] + ["a" * 57 + ".py"])


# 10,000 distinct patterns of 901 characters none of the files matches, each starting with
# its number: many stars with one literal character between (each name either lacks the
# character or is far shorter than the pattern), ``?`` only, classes only, and a long path.
SHAPES = {
    "stars and a letter": lambda i: (f"{i:x}" + "*a" * 450)[:901].ljust(901, "*"),
    "question marks": lambda i: (f"{i:x}" + "*?" * 450)[:901].ljust(901, "?"),
    "classes": lambda i: (f"{i:x}" + "*[a-z0-9_.]" * 82)[:901].ljust(901, "z"),
    "paths": lambda i: (f"dir{i}/sub*/" + "m" * 901)[:901],
}


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_ten_thousand_patterns_of_901_characters_end_on_200_files(tmp_path: Path, shape) -> None:
    """9 MB of exclude patterns, inside every bound: each pattern's literal and least
    length are computed once, so a path meets most patterns in one test (the run took more
    than 300 s before; its figures: benchmarks/hostile_config.py)."""
    files = two_hundred_files(tmp_path)
    patterns = [shape(index) for index in range(MAX_ITEMS)]
    assert {len(pattern) for pattern in patterns} == {901}
    assert len(set(patterns)) == MAX_ITEMS
    (tmp_path / "pyproject.toml").write_text(f"[tool.ckptlint]\nexclude = {json.dumps(patterns)}\n")
    with hang_guard(240, "10,000 patterns of 901 characters on 200 files"):
        result = run_cli("--no-cache", "--format", "json", ".", cwd=tmp_path)
    assert (result.returncode, result.stderr) == (1, "")
    assert sorted(item["path"] for item in json.loads(result.stdout)) == files


def test_an_ignore_file_over_10_mib_is_honoured_in_its_first_10_mib(project: Path) -> None:
    (project / ".git").mkdir()
    for name in ("a.py", "b.py", "c.py"):
        (project / name).write_text(MISSING)
    filler = ("#" + "x" * 1022 + "\n") * (DEFAULT_MAX_FILE_SIZE // 1024)  # comments: 10 MiB
    (project / ".gitignore").write_text("a.py\n" + filler + "b.py\n")
    result = run_cli("--format", "json", ".", cwd=project)
    assert sorted(item["path"] for item in json.loads(result.stdout)) == ["b.py", "c.py"]
    assert result.stderr == (
        f"ckptlint: warning: .gitignore: over {DEFAULT_MAX_FILE_SIZE} bytes: only its first "
        "lines are read\n"
    )


def test_ignore_files_past_the_total_text_are_honoured_in_part(project: Path) -> None:
    """Each file within 10 MiB, together over MAX_PATTERN_TEXT characters of patterns."""
    (project / ".git" / "info").mkdir(parents=True)
    for name in ("a.py", "b.py"):
        (project / name).write_text(MISSING)
    long = "\n".join("*" + "x" * 1_999_999 for _ in range(5))  # 10,000,000 characters
    (project / ".git" / "info" / "exclude").write_text(long + "\n")
    (project / ".gitignore").write_text("a.py\n*" + "y" * 999_999 + "\nb.py\n")
    result = run_cli("--format", "json", ".", cwd=project)
    assert [item["path"] for item in json.loads(result.stdout)] == ["b.py"]
    assert result.stderr == (
        f"ckptlint: warning: .gitignore: patterns of more than {MAX_PATTERN_TEXT} characters "
        "in all are not in force at once: only the first 1 are honoured\n"
    )


ENCODINGS = {
    "utf-16": "UTF-16-LE",  # Python writes a byte order mark
    "utf-16-be": "UTF-16-BE",  # none: told by its NUL bytes
    "utf-32": "UTF-32-LE",
    "utf-32-be": "UTF-32-BE",
}


@pytest.mark.parametrize(("encoding", "named"), ENCODINGS.items(), ids=ENCODINGS.keys())
def test_source_in_utf16_or_utf32_is_ckp901_naming_the_encoding(
    project: Path, encoding: str, named: str
) -> None:
    (project / "wide.py").write_bytes(MISSING.encode(encoding))
    (project / "plain.py").write_bytes("x = 1\n".encode(encoding))  # no checkpoint in it
    message = (
        f"CKP901 cannot decode file: it is encoded in {named}; Python reads source files as "
        "UTF-8 (or the encoding a coding declaration names)"
    )
    walked = run_cli("-q", ".", cwd=project)
    assert walked.stdout == f"plain.py:1:1: {message}\nwide.py:1:1: {message}\n"
    assert run_cli("-q", "wide.py", cwd=project).stdout == f"wide.py:1:1: {message}\n"
    piped = run_cli(
        "-q", "--stdin-filename", "wide.py", "-", cwd=project, stdin=MISSING.encode(encoding)
    )
    assert piped.stdout == f"wide.py:1:1: {message}\n"
