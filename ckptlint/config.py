"""Settings: ``[tool.ckptlint]`` in the nearest pyproject.toml, overridden by the command line.

Rule selection works in layers, as in ruff: the defaults (``select = ["CKP"]``), then the
configuration file, then the command line. A layer that has a ``select`` starts afresh from
it and drops the ``ignore`` of the layers below; a layer without one keeps what the layers
below enabled. Inside a layer the longest matching prefix decides, and ``ignore`` wins a tie
(flake8's rule). So ``--select CKP101`` reports CKP101 even when the configuration ignores
it, while ``--ignore CKP9`` adds to the configuration's ``ignore``.

Paths in ``exclude`` and ``per-file-ignores`` are gitignore patterns (``ckptlint.patterns``:
git's rules, in time linear in the path), relative to the folder of the pyproject.toml that
holds them.

A repository's configuration is untrusted input: every list is bounded (``MAX_ITEMS``
entries, ``MAX_TEXT`` characters each), a table nested past what the TOML reader can follow
is a configuration error, and ``max-file-size`` can lower the ceiling on what is read
(``MAX_FILE_SIZE_CEILING``) but not raise it: only the command line can.
"""

from __future__ import annotations

import configparser
import difflib
import reprlib
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from pathlib import Path, PurePosixPath

from packaging.version import InvalidVersion, Version

from ckptlint.memos import process_cache
from ckptlint.patterns import Patterns, compiled
from ckptlint.rules import REGISTRY
from ckptlint.source import DEFAULT_MAX_FILE_SIZE, CannotRead, read_bytes

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

KNOWN_KEYS = {
    "select",
    "ignore",
    "exclude",
    "per-file-ignores",
    "extend-checkpoint-functions",
    "respect-gitignore",
    "max-file-size",
    "target-torch",
}


# Bounds on what a configuration may hold: far above any real project's (ruff's own
# configuration lists a few dozen patterns), far below what would make a run crawl.
MAX_ITEMS = 10_000
MAX_TEXT = 4096
# Patterns cost every path walked and are compiled character by character: those of the
# ignore files in force at once hold at most this many characters in all, as those of a
# configuration do (its file is read up to 10 MiB).
MAX_PATTERN_TEXT = 10 * 1024 * 1024


class ConfigError(Exception):
    """The configuration is invalid; the message says where and why."""


@dataclass(frozen=True)
class RuleSelection:
    """The command line's ``--select`` (None when not given) and ``--ignore``."""

    select: tuple[str, ...] | None = None
    extend_select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()


@dataclass(frozen=True)
class Settings:
    select: tuple[str, ...] = ("CKP",)
    ignore: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    per_file_ignores: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # Names like torch's checkpoint (strings) or table rows of other kinds (ExtraSource).
    extend_checkpoint_functions: tuple[str | ExtraSource, ...] = ()
    respect_gitignore: bool = True
    max_file_size: int = DEFAULT_MAX_FILE_SIZE  # bytes; a larger file is CKP901, never read
    # The oldest torch the project runs on ("2.1"): branches testing the torch version are
    # decided against it. Read from the project's own torch requirement when not set.
    target_torch: str | None = None
    command_line: RuleSelection = RuleSelection()
    root: Path = field(default_factory=Path.cwd)
    config_file: Path | None = None
    # The configuration's max-file-size was over the ceiling (what to tell the user), unless
    # the command line set it.
    held_to_ceiling: str | None = None

    @property
    def analysis_identity(self) -> object:
        """What, besides the files, decides the analysis's results (the cache keys by it)."""
        extra = [repr(item) for item in self.extend_checkpoint_functions]
        return [extra, self.max_file_size, self.target_torch]

    def is_selected(self, code: str) -> bool:
        """The configuration's layer, then the command line's (see the module docstring)."""
        enabled = False
        layers = ((self.select, self.ignore), (self.command_line.select, self.command_line.ignore))
        for select, ignore in layers:
            if select is not None:
                selected = _longest_prefix(select, code)
            else:
                selected = 0 if enabled else -1
            enabled = selected > _longest_prefix(ignore, code)
        extended = _longest_prefix(self.command_line.extend_select, code)
        if extended > _longest_prefix(self.command_line.ignore, code):
            enabled = True
        return enabled

    def is_ignored_in(self, code: str, path: str) -> bool:
        if not self.per_file_ignores:
            return False
        prefixes = self._ignored_by_path.get(path)
        if prefixes is None:
            relative = self._matched_path(path)
            prefixes = self._ignored_by_path[path] = tuple(
                prefix
                for patterns, codes in self._per_file_patterns
                if patterns.excludes(relative, is_folder=False)
                for prefix in codes
            )
        return code.startswith(prefixes)

    def is_excluded(self, path: str, *, is_folder: bool = False, walked: bool = False) -> bool:
        """Whether ``exclude`` leaves the path out. ``walked``: found in a folder walk, so
        the folders above it were asked already (only the path itself is matched)."""
        if not self.exclude:
            return False
        relative = self._matched_path(path)
        if relative in ("", "."):  # the root itself is never excluded
            return False
        if walked:
            return bool(self._exclude_patterns.verdict(relative, is_folder=is_folder))
        return self._exclude_patterns.excludes(relative, is_folder=is_folder)

    def relative(self, path: str) -> PurePosixPath:
        absolute = Path(path).absolute()
        try:
            return PurePosixPath(absolute.relative_to(self.root).as_posix())
        except ValueError:
            return PurePosixPath(absolute.as_posix())

    def _matched_path(self, path: str) -> str:
        """The path as patterns see it: relative to the root (a path outside it, from the
        top of the file system)."""
        return str(self.relative(path)).lstrip("/")

    @cached_property
    def _exclude_patterns(self) -> Patterns:
        return compiled(self.exclude)

    @cached_property
    def _per_file_patterns(self) -> list[tuple[Patterns, tuple[str, ...]]]:
        """One matcher for each list of codes: a path is ignored for them when any of its
        patterns matches it (a ``!`` pattern, which excludes nothing, matches no path)."""
        by_codes: dict[tuple[str, ...], list[str]] = {}
        for pattern, prefixes in self.per_file_ignores:
            if not pattern.startswith("!"):
                by_codes.setdefault(prefixes, []).append(pattern)
        return [(compiled(tuple(patterns)), codes) for codes, patterns in by_codes.items()]

    @cached_property
    def _ignored_by_path(self) -> dict[str, tuple[str, ...]]:
        """The code prefixes per-file-ignores ignores in each path asked about so far."""
        return {}


def _longest_prefix(prefixes: Iterable[str], code: str) -> int:
    return max((len(p) for p in prefixes if code.startswith(p)), default=-1)


def _is_folder(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:
        return False


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:
        return False


def _read_toml(path: Path) -> dict:
    """The file's TOML (not to be changed: one reading serves every caller). A run reads
    a pyproject.toml up to four times (project root, settings, torch requirement)."""
    try:
        data = read_bytes(str(path))
    except CannotRead as error:
        raise ConfigError(f"{path}: cannot read configuration: {error}") from None
    return _parsed_toml(data, str(path))


@process_cache
@lru_cache(maxsize=4)
def _parsed_toml(data: bytes, where: str) -> dict:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{where}: cannot read configuration: {error}") from None
    return _parse_toml(text, where)


def _parse_toml(text: str, where: str) -> dict:
    """``tomllib.loads``, every failure (nesting too deep for its reader included) a
    ConfigError naming ``where``."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{where}: cannot read configuration: {error}") from None
    except (RecursionError, MemoryError):
        raise ConfigError(f"{where}: cannot read configuration: nested too deeply") from None


@dataclass(frozen=True)
class ProjectRoot:
    """The folder a run treats as the project: every Python file under it is known to the
    analysis, whichever of them a run reports on. ``reason`` says how it was found;
    ``pyproject`` is where its settings come from (None: the defaults)."""

    folder: Path
    reason: str  # a marker file's name, "git", "package" or "folder"
    pyproject: Path | None = None


# What makes a folder a project's, as Python packaging finds one (and a git work tree).
MARKERS = ("pyproject.toml", "setup.py", "setup.cfg")


def project_root(path: Path, *, isolated: bool = False) -> ProjectRoot:
    """The project of ``path``: the nearest folder at or above it that holds
    pyproject.toml (with or without [tool.ckptlint]), setup.py, setup.cfg or a git work
    tree; else the top of its package (the ``__init__.py`` chain), else its folder. Never a
    folder above those because it is the working folder. Settings come from the nearest
    pyproject.toml with [tool.ckptlint] at or above the path (none when ``isolated``)."""
    return RootFinder(isolated=isolated).root(path)


class RootFinder:
    """``project_root`` for many paths, each folder looked at once: pre-commit names
    thousands of files, and reading the same pyproject.toml for each cost seconds.
    Folders that cannot be read (no permission) are passed over, never an error."""

    def __init__(self, *, isolated: bool = False) -> None:
        self.isolated = isolated
        self._pyprojects: dict[Path, Path | None] = {}
        self._projects: dict[Path, Path | None] = {}

    def root(self, path: Path) -> ProjectRoot:
        start = path.absolute()
        folder = start if _is_folder(start) else start.parent
        while not _is_folder(folder) and folder != folder.parent:
            folder = folder.parent  # a path that does not exist (standard input's name)
        pyproject = None
        if not self.isolated:
            pyproject = _nearest(folder, self._pyprojects, _configuring_pyproject)
        marked = _nearest(folder, self._projects, _marked_project)
        if marked is not None:
            reason = next((m for m in MARKERS if _is_file(marked / m)), "git")
            return ProjectRoot(marked, reason, pyproject)
        top = folder
        while _is_file(top / "__init__.py") and _is_file(top.parent / "__init__.py"):
            top = top.parent
        reason = "package" if _is_file(top / "__init__.py") else "folder"
        return ProjectRoot(top, reason, pyproject)


def _nearest(
    folder: Path, known: dict[Path, Path | None], test: Callable[[Path], Path | None]
) -> Path | None:
    """The first answer of ``test`` at ``folder`` or above; every folder asked on the way
    learns it too (it is the nearest for each of them)."""
    asked: list[Path] = []
    found: Path | None = None
    for current in [folder, *folder.parents]:
        if current in known:
            found = known[current]
            break
        asked.append(current)
        found = test(current)
        if found is not None:
            break
    for current in asked:
        known[current] = found
    return found


def _configuring_pyproject(folder: Path) -> Path | None:
    candidate = folder / "pyproject.toml"
    if _is_file(candidate) and "ckptlint" in _read_toml(candidate).get("tool", {}):
        return candidate
    return None


def _marked_project(folder: Path) -> Path | None:
    if any(_is_file(folder / marker) for marker in MARKERS) or _exists(folder / ".git"):
        return folder
    return None


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:
        return False


def parse_override(text: str) -> dict[str, object] | None:
    """``--config "ignore = ['CKP101']"``: one TOML ``KEY = VALUE`` pair (a dotted key
    allowed, as in ruff), as a table; None when ``text`` is not TOML (a file name)."""
    try:
        table = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError, MemoryError):
        return None
    if len(table) != 1 or text.lstrip().startswith("["):  # one pair, not a [table]
        return None
    return table


def load_settings(
    root: ProjectRoot,
    *,
    config: Path | None = None,
    overrides: Iterable[tuple[str, dict[str, object]]] = (),
) -> Settings:
    """The settings of a project: the [tool.ckptlint] table of its ``pyproject``, or
    ``config`` instead (``--config FILE``: a pyproject.toml's [tool.ckptlint], or another
    TOML file's top level), then each of ``overrides`` (``--config KEY=VALUE``, with the
    text given) on top. Patterns are relative to the folder of the pyproject.toml holding
    them; those of ``config`` and ``overrides``, to the project root (as if they were
    written in a pyproject.toml there)."""
    source = config or root.pyproject
    settings = Settings(root=root.folder)
    if source is not None:
        content = _read_toml(source)
        if source.name == "pyproject.toml":
            table = content.get("tool", {}).get("ckptlint", {})
            where = f"{source}: [tool.ckptlint]"
        else:  # a file of ckptlint's own (``--config ckptlint.toml``): its top level
            table, where = content, str(source)
        base = source.parent if config is None else root.folder
        settings = _apply(replace(settings, root=base, config_file=source), table, where)
    for text, table in overrides:
        settings = _apply(settings, table, f"--config {text!r}", trusted=True)
    if settings.target_torch is None:
        metadata = _project_folder(root.folder)
        target = None if metadata is None else declared_torch(metadata)
        if target is None and source is not None:
            target = declared_torch(source.parent)
        settings = replace(settings, target_torch=target)
    return settings


def _apply(settings: Settings, table: dict, where: str, *, trusted: bool = False) -> Settings:
    """``settings`` with the keys of one configuration ``table`` set. A repository's file
    cannot raise max-file-size past the ceiling; what the user types (``trusted``) can."""
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: expected a table, got {_shown(table)}")
    unknown = sorted(set(table) - KNOWN_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown option(s): {_listed(unknown)}{_meant(unknown)}")
    if "select" in table:
        settings = replace(settings, select=_codes(table["select"], f"{where} select"))
    if "ignore" in table:
        settings = replace(settings, ignore=_codes(table["ignore"], f"{where} ignore"))
    if "exclude" in table:
        settings = replace(settings, exclude=_strings(table["exclude"], f"{where} exclude"))
    if "extend-checkpoint-functions" in table:
        sources = _sources(
            table["extend-checkpoint-functions"], f"{where} extend-checkpoint-functions"
        )
        settings = replace(settings, extend_checkpoint_functions=sources)
    if "respect-gitignore" in table:
        value = table["respect-gitignore"]
        if not isinstance(value, bool):
            raise ConfigError(
                f"{where} respect-gitignore: expected true or false, got {_shown(value)}"
            )
        settings = replace(settings, respect_gitignore=value)
    if "max-file-size" in table:
        value = table["max-file-size"]
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(
                f"{where} max-file-size: expected a positive number of bytes, got {_shown(value)}"
            )
        held = None
        if value > DEFAULT_MAX_FILE_SIZE and not trusted:
            held = (
                f"{where} max-file-size: {value} bytes is over the ceiling of "
                f"{DEFAULT_MAX_FILE_SIZE} that only the command line (--max-file-size) can "
                "raise; the ceiling applies"
            )
            value = DEFAULT_MAX_FILE_SIZE
        settings = replace(settings, max_file_size=value, held_to_ceiling=held)
    if "target-torch" in table:
        target = torch_version(table["target-torch"])
        if target is None:
            shown = _shown(table["target-torch"])
            raise ConfigError(f"{where} target-torch: {TORCH_VERSION_EXPECTED}, got {shown}")
        settings = replace(settings, target_torch=target)
    if "per-file-ignores" in table:
        ignores = table["per-file-ignores"]
        if not isinstance(ignores, dict):
            raise ConfigError(f"{where} per-file-ignores: expected a table of pattern = [codes]")
        _bounded(list(ignores), f"{where} per-file-ignores")
        settings = replace(
            settings,
            per_file_ignores=tuple(
                (pattern, _codes(codes, f"{where} per-file-ignores {_shown(pattern)}"))
                for pattern, codes in ignores.items()
            ),
        )
    return settings


def declared_torch(folder: Path) -> str | None:
    """The lower bound of the project's own ``torch`` requirement: ``[project]
    dependencies`` of its pyproject.toml, else ``install_requires`` of its setup.cfg, else
    its requirements.txt. None when it declares none (or only an upper bound)."""
    for requirements in (
        _pyproject_dependencies(folder / "pyproject.toml"),
        _setup_cfg_requirements(folder / "setup.cfg"),
        _requirement_lines(folder / "requirements.txt"),
    ):
        bounds = [bound for text in requirements if (bound := _torch_lower_bound(text))]
        if bounds:
            return str(max(bounds))
    return None


def _project_folder(start: Path) -> Path | None:
    """The nearest folder at or above ``start`` that holds packaging metadata."""
    start = start.absolute()
    for folder in [start, *start.parents] if _is_folder(start) else start.parents:
        if any(_is_file(folder / name) for name in ("pyproject.toml", "setup.cfg")):
            return folder
    return None


def _pyproject_dependencies(path: Path) -> list[str]:
    if not _is_file(path):
        return []
    try:
        dependencies = _read_toml(path).get("project", {}).get("dependencies", [])
    except (ConfigError, AttributeError):
        return []  # not the configuration: a broken or odd file declares nothing here
    return [d for d in dependencies if isinstance(d, str)] if isinstance(dependencies, list) else []


def _setup_cfg_requirements(path: Path) -> list[str]:
    if not _is_file(path):
        return []
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(path, encoding="utf-8")
        text = parser.get("options", "install_requires", fallback="")
    except (configparser.Error, OSError, UnicodeDecodeError):
        return []
    return [line.strip() for line in text.splitlines() if line.strip()]


def _requirement_lines(path: Path) -> list[str]:
    if not _is_file(path):
        return []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return []
    found = []
    for line in lines:
        line = line.split(" #", 1)[0].strip()
        if line and not line.startswith(("#", "-")):  # options, -r other.txt, -e ...
            found.append(line)
    return found


def _torch_lower_bound(text: str) -> Version | None:
    """``torch>=2.1,<3`` -> 2.1 (also ``==``, ``~=``, ``>``, ``==2.1.*``)."""
    if "torch" not in text.lower():
        return None  # another requirement (and packaging's parser stays unimported)
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    try:
        requirement = Requirement(text)
    except InvalidRequirement:
        return None
    if canonicalize_name(requirement.name) != "torch":
        return None
    bounds = []
    for specifier in requirement.specifier:
        if specifier.operator in (">=", ">", "==", "~=", "==="):
            version = _version(specifier.version.removesuffix(".*"))
            if version is not None:
                bounds.append(Version(version))
    return max(bounds, default=None)


# A torch version is a few short numbers ("2.1", "2.13.0"); far longer text is no version
# (packaging turns each number into an int: 5,000 digits exceed what int() converts).
MAX_VERSION_TEXT = 64
TORCH_VERSION_EXPECTED = 'expected a torch version such as "2.1"'


def torch_version(value: object) -> str | None:
    """``target-torch`` (configuration or ``--target-torch``) as packaging normalises it, or
    None when it is no version."""
    return _version(value) if isinstance(value, str) else None


def _version(text: str) -> str | None:
    """A version as packaging normalises it ("2.1"), or None when it is not one."""
    if len(text) > MAX_VERSION_TEXT:
        return None
    try:
        return str(Version(text))
    except (InvalidVersion, ValueError):
        return None


SOURCE_KINDS = ("function", "sequence", "module", "layer")


@dataclass(frozen=True)
class ExtraSource:
    """A region source the user declares: ``{ name = "mylib.wrap", kind = "module" }``.

    ``kind``: the ``function`` called (like torch's checkpoint), each module of a
    ``sequence``, the ``module`` wrapped, or the ``forward`` of every subclass of a
    ``layer`` class; ``region``: the position of the argument that is the region.
    """

    name: str
    kind: str = "function"
    region: int = 0


def _sources(value: object, where: str) -> tuple[str | ExtraSource, ...]:
    """Dotted names (strings) or inline tables with ``name``, ``kind`` and ``region``."""
    if not isinstance(value, list):
        raise ConfigError(
            f"{where}: expected a list of dotted names or tables, got {_shown(value)}"
            + _as_list_hint(value)
        )
    found: list[str | ExtraSource] = []
    for item in _bounded(value, where):
        if isinstance(item, str):
            found.append(_dotted(item, where))
            continue
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise ConfigError(
                f"{where}: expected a name or a table with a name, got {_shown(item)}"
            )
        name = _shown(_dotted(_bounded_text(item["name"], where), where))
        unknown = sorted(set(item) - {"name", "kind", "region"})
        kind = item.get("kind", "function")
        region = item.get("region", 0)
        if unknown:
            raise ConfigError(f"{where} {name}: unknown key(s): {_listed(unknown)}")
        if kind not in SOURCE_KINDS:
            raise ConfigError(f"{where} {name}: kind must be one of {SOURCE_KINDS}")
        if not isinstance(region, int) or isinstance(region, bool) or region < 0:
            raise ConfigError(f"{where} {name}: region must be a position (0, 1, ...)")
        found.append(ExtraSource(item["name"], kind, region))
    return tuple(found)


def _strings(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ConfigError(
            f"{where}: expected a list of strings, got {_shown(value)}" + _as_list_hint(value)
        )
    return tuple(_bounded(value, where))


def _as_list_hint(value: object) -> str:
    """What to write instead of a single string where a list belongs (as ruff, which
    takes no string for a list either)."""
    if isinstance(value, str) and len(value) <= MAX_TEXT:
        return f" (a list of one: [{_shown(value)}])"
    return ""


def _dotted(name: str, where: str) -> str:
    """A qualified name (``mylib.memory.checkpoint_block``): a bare name says nothing about
    which module defines it, so it could never be resolved."""
    parts = name.split(".")
    if len(parts) < 2 or not all(part.isidentifier() for part in parts):
        raise ConfigError(
            f"{where}: expected a dotted name such as mylib.memory.checkpoint_block (the "
            f"module, then the function), got {_shown(name)}"
        )
    return name


def _bounded(items: list, where: str) -> list:
    """``items``, when there are at most MAX_ITEMS of them and each string is at most
    MAX_TEXT characters long; else a ConfigError naming the key."""
    if len(items) > MAX_ITEMS:
        raise ConfigError(
            f"{where}: {len(items)} entries, more than the {MAX_ITEMS} a configuration may hold"
        )
    for item in items:
        if isinstance(item, str):
            _bounded_text(item, where)
    return items


def _bounded_text(text: str, where: str) -> str:
    if len(text) > MAX_TEXT:
        raise ConfigError(
            f"{where}: an entry of {len(text)} characters ({_shown(text)}), more than the "
            f"{MAX_TEXT} a configuration entry may hold"
        )
    return text


_SHORT = reprlib.Repr()
_SHORT.maxlevel = 2
_SHORT.maxstring = 60
_SHORT.maxother = 60


def _shown(value: object) -> str:
    """A value as an error message quotes it: short, however large or deep it is."""
    return _SHORT.repr(value)


def _meant(unknown: list[str]) -> str:
    """ "did you mean" for a misspelt key (``per_file_ignores``, ``exlude``)."""
    if len(unknown) != 1:
        return ""
    close = difflib.get_close_matches(unknown[0].replace("_", "-"), sorted(KNOWN_KEYS), n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def _listed(names: list[str]) -> str:
    """Names as an error message lists them: the first few."""
    shown = ", ".join(name[:60] for name in names[:10])
    return shown + (f" (and {len(names) - 10} more)" if len(names) > 10 else "")


def _codes(value: object, where: str) -> tuple[str, ...]:
    return checked_codes((code.strip().upper() for code in _strings(value, where)), where)


def parse_code_list(text: Iterable[str], where: str) -> tuple[str, ...]:
    """``--select CKP001,CKP2`` (repeatable) to a tuple of code prefixes."""
    return checked_codes((code.strip().upper() for part in text for code in part.split(",")), where)


def checked_codes(codes: Iterable[str], where: str) -> tuple[str, ...]:
    """The codes, each the prefix of at least one rule's code; else a ConfigError naming it."""
    result = []
    for code in codes:
        if not code:
            raise ConfigError(f"{where}: empty rule code")
        if not any(known.startswith(code) for known in REGISTRY):
            raise ConfigError(
                f"{where}: unknown rule code or prefix {_shown(code)} "
                f"(known: {', '.join(REGISTRY)})"
            )
        result.append(code)
    return tuple(result)
