"""Settings: ``[tool.ckptlint]`` in the nearest pyproject.toml, overridden by the command line."""

from __future__ import annotations

import fnmatch
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

KNOWN_KEYS = {"select", "ignore", "exclude", "per-file-ignores", "extend-checkpoint-functions"}


class ConfigError(Exception):
    """The configuration is invalid; the message says where and why."""


@dataclass(frozen=True)
class Settings:
    select: tuple[str, ...] = ("CKP",)
    ignore: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    per_file_ignores: tuple[tuple[str, tuple[str, ...]], ...] = ()
    extend_checkpoint_functions: tuple[str, ...] = ()
    root: Path = field(default_factory=Path.cwd)

    def is_selected(self, code: str) -> bool:
        """flake8's rule: the longest matching prefix decides; ignore wins a tie."""
        selected = max((len(p) for p in self.select if code.startswith(p)), default=-1)
        ignored = max((len(p) for p in self.ignore if code.startswith(p)), default=-1)
        return selected > ignored

    def is_ignored_in(self, code: str, path: str) -> bool:
        if not self.per_file_ignores:
            return False
        relative = self.relative(path)
        return any(
            code.startswith(prefix)
            for pattern, prefixes in self.per_file_ignores
            if _matches(relative, pattern)
            for prefix in prefixes
        )

    def is_excluded(self, path: str) -> bool:
        if not self.exclude:
            return False
        relative = self.relative(path)
        return any(_matches(relative, pattern) for pattern in self.exclude)

    def relative(self, path: str) -> PurePosixPath:
        absolute = Path(path).absolute()
        try:
            return PurePosixPath(absolute.relative_to(self.root).as_posix())
        except ValueError:
            return PurePosixPath(absolute.as_posix())


def _matches(relative: PurePosixPath, pattern: str) -> bool:
    """A pattern matches the path, any parent folder of it, or its file name (like ruff)."""
    pattern = pattern.rstrip("/")
    if "/" not in pattern and any(fnmatch.fnmatchcase(part, pattern) for part in relative.parts):
        return True
    candidates = [relative, *relative.parents]
    return any(fnmatch.fnmatchcase(str(candidate), pattern) for candidate in candidates)


def find_pyproject(start: Path) -> Path | None:
    """The nearest pyproject.toml at or above ``start`` that has a [tool.ckptlint] table."""
    start = start.absolute()
    for folder in [start, *start.parents] if start.is_dir() else start.parents:
        candidate = folder / "pyproject.toml"
        if candidate.is_file() and "ckptlint" in _read_toml(candidate).get("tool", {}):
            return candidate
    return None


def _read_toml(path: Path) -> dict:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"{path}: cannot read configuration: {error}") from None


def load_settings(start: Path) -> Settings:
    pyproject = find_pyproject(start)
    if pyproject is None:
        return Settings()
    table = _read_toml(pyproject)["tool"]["ckptlint"]
    where = f"{pyproject}: [tool.ckptlint]"
    unknown = sorted(set(table) - KNOWN_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown option(s): {', '.join(unknown)}")
    settings = Settings(root=pyproject.parent)
    if "select" in table:
        settings = replace(settings, select=_codes(table["select"], f"{where} select"))
    if "ignore" in table:
        settings = replace(settings, ignore=_codes(table["ignore"], f"{where} ignore"))
    if "exclude" in table:
        settings = replace(settings, exclude=_strings(table["exclude"], f"{where} exclude"))
    if "extend-checkpoint-functions" in table:
        names = _strings(
            table["extend-checkpoint-functions"], f"{where} extend-checkpoint-functions"
        )
        settings = replace(settings, extend_checkpoint_functions=names)
    if "per-file-ignores" in table:
        ignores = table["per-file-ignores"]
        if not isinstance(ignores, dict):
            raise ConfigError(f"{where} per-file-ignores: expected a table of pattern = [codes]")
        settings = replace(
            settings,
            per_file_ignores=tuple(
                (pattern, _codes(codes, f"{where} per-file-ignores {pattern!r}"))
                for pattern, codes in ignores.items()
            ),
        )
    return settings


def _strings(value: object, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ConfigError(f"{where}: expected a list of strings, got {value!r}")
    return tuple(value)


def _codes(value: object, where: str) -> tuple[str, ...]:
    return tuple(code.strip().upper() for code in _strings(value, where) if code.strip())


def parse_code_list(text: Iterable[str]) -> tuple[str, ...]:
    """``--select CKP001,CKP2`` (repeatable) to a tuple of code prefixes."""
    return tuple(code.strip().upper() for part in text for code in part.split(",") if code.strip())
