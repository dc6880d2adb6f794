"""The real pre-commit, with this repository as a hook repository.

``pre-commit try-repo`` builds the hooks' environment afresh each time (a pip install of
this package, most of its time); the tests instead point a configuration at one commit of
the working tree, as try-repo does, so that pre-commit builds the environment once.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import SUBPROCESS_TIMEOUT, run_cli

ROOT = Path(__file__).resolve().parent.parent
NO_REGISTRY = ("NewConnectionError", "Temporary failure in name resolution", "No route to host")
MISSING = "import torch.utils.checkpoint as cp\n\ny = cp.checkpoint(block, x)\n"
FIX_HOOK = "ckptlint (apply fixes, including unsafe ones)"  # its name in .pre-commit-hooks.yaml


def git(*arguments: str, cwd: Path) -> str:
    return subprocess.run(
        ["git", *arguments], cwd=cwd, capture_output=True, text=True, check=True
    ).stdout


@pytest.fixture(scope="module")
def pre_commit_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pre-commit-home")


@pytest.fixture(scope="module")
def hooks(tmp_path_factory: pytest.TempPathFactory, pre_commit_home: Path) -> Hooks:
    """This working tree committed in a repository of its own (what try-repo calls its
    shadow repository), with pre-commit's home for the module."""
    shadow = tmp_path_factory.mktemp("hook-repository")
    listed = git("ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=ROOT)
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():  # not a file deleted in the working tree
            (shadow / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, shadow / name)
    git("init", "-q", cwd=shadow)
    git("add", "-A", cwd=shadow)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "tree", cwd=shadow)
    return Hooks(shadow, git("rev-parse", "HEAD", cwd=shadow).strip(), pre_commit_home)


@dataclass(frozen=True)
class Hooks:
    repository: Path
    rev: str
    home: Path

    def run(
        self, where: Path, ids: list[str], *files: str, environment: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """``pre-commit run`` in ``where`` of the hooks ``ids`` on ``files`` (all files when
        none), its configuration kept outside the repository being checked."""
        listed = "".join(f"      - id: {hook}\n" for hook in ids)
        config = where.parent / f"{where.name}-pre-commit.yaml"
        config.write_text(
            f"repos:\n  - repo: {self.repository}\n    rev: {self.rev}\n    hooks:\n{listed}"
        )
        selection = ["--files", *files] if files else ["--all-files"]
        result = subprocess.run(
            [sys.executable, "-m", "pre_commit", "run", "-c", str(config), *selection],
            cwd=where,
            capture_output=True,
            text=True,
            timeout=SUBPROCESS_TIMEOUT,
            env={
                **os.environ,
                "PRE_COMMIT_HOME": str(self.home),
                "PRE_COMMIT_COLOR": "never",
                **(environment or {}),
            },
        )
        output = result.stdout + result.stderr
        if any(marker in output for marker in NO_REGISTRY):
            pytest.skip("the package registry cannot be reached to build the hook's environment")
        return result


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "model.py").write_text(MISSING)
    subprocess.run(["git", "add", "model.py"], cwd=tmp_path, check=True)
    return tmp_path


def hook_results(output: str) -> dict[str, str]:
    """Each hook's verdict in pre-commit's output (``ckptlint....Failed``)."""
    verdicts = {}
    for line in output.splitlines():
        name, dots, verdict = line.partition("...")
        if dots and verdict.strip(". ") in ("Passed", "Failed"):
            verdicts[name.strip()] = verdict.strip(". ")
    return verdicts


def test_the_hooks_report_then_fix(repository: Path, hooks: Hooks) -> None:
    """Both hooks: ``ckptlint`` reports the finding and changes nothing, then
    ``ckptlint-fix`` adds the keyword; a second run passes."""
    result = hooks.run(repository, ["ckptlint", "ckptlint-fix"], "model.py")
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert hook_results(result.stdout) == {"ckptlint": "Failed", FIX_HOOK: "Failed"}
    assert "model.py:3:5: CKP001" in result.stdout
    assert "files were modified by this hook" in result.stdout  # pre-commit fails that hook
    fixed = (repository / "model.py").read_text()
    assert fixed == MISSING.replace("(block, x)", "(block, x, use_reentrant=False)")
    again = hooks.run(repository, ["ckptlint", "ckptlint-fix"], "model.py")
    assert again.returncode == 0, again.stdout
    assert hook_results(again.stdout) == {"ckptlint": "Passed", FIX_HOOK: "Passed"}


def test_hook_installs_without_torch() -> None:
    """pre-commit installs the project's base dependencies: torch must not be one of them."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any(dep.lower().startswith("torch") for dep in project["dependencies"])
    assert project["optional-dependencies"]["guard"] == ["torch>=2.8"]


def readme_local_hook() -> str:
    """The .pre-commit-config.yaml snippet of README.md's pre-commit section."""
    section = (ROOT / "README.md").read_text().split("### pre-commit", 1)[1]
    snippet = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    assert "repo: local" in snippet
    return snippet


def test_readme_local_hook_works(repository: Path, pre_commit_home: Path) -> None:
    """The README's snippet as users paste it: no tag needed, the installed ckptlint runs."""
    (repository / ".pre-commit-config.yaml").write_text(readme_local_hook())
    subprocess.run(["git", "add", ".pre-commit-config.yaml"], cwd=repository, check=True)
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    environment = {**os.environ, "PRE_COMMIT_HOME": str(pre_commit_home), "PATH": path}
    result = subprocess.run(
        [sys.executable, "-m", "pre_commit", "run", "--all-files"],
        cwd=repository,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
        env={**environment, "PRE_COMMIT_COLOR": "never"},
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "model.py:3:5: CKP001" in result.stdout


def test_readme_names_no_tag_that_does_not_exist() -> None:
    """A `rev:` in the README must be a tag of this repository."""
    import re

    tags = subprocess.run(
        ["git", "tag", "--list"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    named = re.findall(r"^\s*rev:\s*(\S+)", (ROOT / "README.md").read_text(), re.MULTILINE)
    assert set(named) <= set(tags)


def test_every_chunking_reports_the_cross_file_finding(tmp_path: Path, hooks: Hooks) -> None:
    """pre-commit passes the staged files in chunks, one a CPU: a wrapper defined in one file
    and called in a loop in another is found whatever chunk each lands in, as by the CLI."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "mylib").mkdir()
    (tmp_path / "pkg").mkdir()
    (tmp_path / "mylib" / "__init__.py").write_text("")
    (tmp_path / "mylib" / "memory.py").write_text(
        "from torch.utils.checkpoint import checkpoint\n\n\n"
        "def checkpoint_block(fn, *args):\n"
        "    return checkpoint(fn, *args, use_reentrant=False)\n"
    )
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "model.py").write_text(
        "from mylib.memory import checkpoint_block\n\n\n"
        "def run(layers, h):\n"
        "    for layer in layers:\n"
        "        h = checkpoint_block(lambda h: layer(h), h)\n"
        "    return h\n"
    )
    for index in range(60):
        (tmp_path / "pkg" / f"filler_{index:02}.py").write_text(f"VALUE = {index}\n")
    subprocess.run(["git", "add", "."], cwd=tmp_path, check=True)
    expected = "pkg/model.py:6:13: CKP202"
    cli = run_cli("--no-cache", ".", cwd=tmp_path)
    assert expected in cli.stdout, cli.stdout + cli.stderr
    for concurrency in ({"PRE_COMMIT_NO_CONCURRENCY": "1"}, {}):  # one chunk; a chunk a CPU
        result = hooks.run(tmp_path, ["ckptlint"], environment=concurrency)
        output = result.stdout + result.stderr
        assert result.returncode == 1 and expected in result.stdout, output
        assert result.stdout.count("CKP202") == 1, output
