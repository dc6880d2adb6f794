"""Shared helpers for the linter tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ckptlint.config import Settings
from ckptlint.core import Finding
from ckptlint.engine import Linter


def lint(source: str, **settings: object) -> list[Finding]:
    """Findings the CLI would report for ``source`` as a file (noqa and selection applied)."""
    return Linter(Settings(**settings)).lint_text(source, "example.py")  # type: ignore[arg-type]


def codes(source: str, **settings: object) -> list[str]:
    return [finding.code for finding in lint(source, **settings)]


def run_ckptlint(*arguments: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ckptlint", *arguments],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """An empty project folder (the tests write files and a pyproject.toml into it)."""
    return tmp_path
