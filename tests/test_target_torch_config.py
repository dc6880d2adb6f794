"""``target-torch``: set in ``[tool.ckptlint]``, else read from the project's own ``torch``
requirement (the lower bound), else not known."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptlint.config import ConfigError, Settings, declared_torch, load_settings, project_root
from tests.conftest import run_cli


def settings_of(path: Path) -> Settings:
    """The settings of the project ``path`` belongs to, found as the CLI finds them."""
    return load_settings(project_root(path))


def write(folder: Path, name: str, text: str) -> None:
    (folder / name).write_text(text)


def test_set_in_the_configuration(tmp_path: Path) -> None:
    write(tmp_path, "pyproject.toml", '[tool.ckptlint]\ntarget-torch = "2.1.0"\n')
    assert settings_of(tmp_path).target_torch == "2.1.0"


def test_the_configuration_wins_over_the_requirement(tmp_path: Path) -> None:
    write(
        tmp_path,
        "pyproject.toml",
        '[project]\nname = "p"\ndependencies = ["torch>=1.9"]\n'
        '[tool.ckptlint]\ntarget-torch = "2.4"\n',
    )
    assert settings_of(tmp_path).target_torch == "2.4"


@pytest.mark.parametrize(
    ("dependencies", "expected"),
    [
        ('["numpy", "torch>=2.1,<3"]', "2.1"),
        ("[\"Torch >= 1.13.1 ; python_version >= '3.8'\"]", "1.13.1"),
        ('["torch==2.3.*"]', "2.3"),
        ('["torch~=2.2"]', "2.2"),
        ('["torch>1.11", "torch>=1.12"]', "1.12"),
        ('["torch<2"]', None),  # an upper bound only
        ('["torch"]', None),
        ('["torchvision>=0.15"]', None),
        ('["not a requirement !!"]', None),
    ],
)
def test_read_from_pyproject_dependencies(
    tmp_path: Path, dependencies: str, expected: str | None
) -> None:
    write(
        tmp_path,
        "pyproject.toml",
        f'[project]\nname = "p"\ndependencies = {dependencies}\n[tool.ckptlint]\n',
    )
    assert settings_of(tmp_path).target_torch == expected


def test_read_from_setup_cfg(tmp_path: Path) -> None:
    write(tmp_path, "setup.cfg", "[options]\ninstall_requires =\n    numpy\n    torch>=1.10.2\n")
    assert settings_of(tmp_path / "missing-file.py").target_torch == "1.10.2"


def test_read_from_requirements_txt(tmp_path: Path) -> None:
    write(tmp_path, "pyproject.toml", "[tool.ckptlint]\n")
    write(tmp_path, "requirements.txt", "-r base.txt\n# torch>=9\ntorch>=2.0  # pinned\n")
    assert settings_of(tmp_path).target_torch == "2.0"


def test_a_project_without_ckptlint_configuration_still_has_its_requirement(
    tmp_path: Path,
) -> None:
    write(tmp_path, "pyproject.toml", '[project]\nname = "p"\ndependencies = ["torch>=2.2"]\n')
    (tmp_path / "src").mkdir()
    assert settings_of(tmp_path / "src").target_torch == "2.2"


def test_nothing_declared(tmp_path: Path) -> None:
    write(tmp_path, "pyproject.toml", "[tool.ckptlint]\n")
    assert settings_of(tmp_path).target_torch is None
    assert declared_torch(tmp_path) is None


def test_broken_metadata_files_declare_nothing(tmp_path: Path) -> None:
    write(tmp_path, "pyproject.toml", "[project\nbroken")
    write(tmp_path, "setup.cfg", "[options\ninstall_requires = torch>=2")
    (tmp_path / "requirements.txt").write_bytes(b"\xff\xfetorch>=2\n")  # not UTF-8
    assert declared_torch(tmp_path) is None


@pytest.mark.parametrize("value", ['"two"', "2.1", '["2.1"]', '""'])
def test_an_invalid_target_is_a_configuration_error(tmp_path: Path, value: str) -> None:
    write(tmp_path, "pyproject.toml", f"[tool.ckptlint]\ntarget-torch = {value}\n")
    with pytest.raises(ConfigError, match="target-torch: expected a torch version"):
        settings_of(tmp_path)


def test_an_invalid_target_is_a_usage_error_on_the_command_line(tmp_path: Path) -> None:
    write(tmp_path, "pyproject.toml", '[tool.ckptlint]\ntarget-torch = "two"\n')
    write(tmp_path, "m.py", "x = 1\n")
    result = run_cli(cwd=tmp_path)
    assert result.returncode == 2
    assert "target-torch: expected a torch version such as \"2.1\", got 'two'" in result.stderr
