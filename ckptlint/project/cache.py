"""The on-disk cache: a run's results, reused while nothing they depend on has changed.

A region in one file can be changed by an edit in another, so results are kept per run (one
entry per set of paths and settings) together with what the run depended on: every file's
size, modification time and content digest, the modules the analysis read, the module
names it looked for and did not find, and the words it ended with. A later run reuses the
results when each changed file is one the analysis never read, that names none of those
words and provides none of the missing modules: its results are then known to be empty
without parsing anything. Any other change re-runs the analysis (and stores its results).

Like ``.ruff_cache``: a folder of its own (``.ckptlint_cache`` next to the configuration),
tagged and ignored by git; entries are written atomically, so concurrent or killed runs
leave either the old entry or the new one; an unreadable entry is a miss.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ckptlint import __version__
from ckptlint.core import AddKeyword, Finding, Fix, ReplaceText

FOLDER = ".ckptlint_cache"
WORDS = "words.json"
_TAG = "Signature: 8a477f597d28d172789f06886806bc55\n# ckptlint's cache: safe to delete.\n"


@dataclass
class FileState:
    size: int
    mtime_ns: int
    digest: str
    findings: list[Finding] = field(default_factory=list)
    internal_error: str | None = None


@dataclass
class CachedRun:
    files: dict[str, FileState]
    loaded: set[str]  # files the analysis parsed (candidates and the modules they import)
    missing: set[str]  # module names the analysis looked for and did not find
    words: frozenset[str]  # the words of interest the run ended with


class RunCache:
    """The cache entry of one run: ``key`` names the paths and settings it lints."""

    def __init__(self, folder: Path, key: str) -> None:
        self.folder = folder
        self.key = key

    @classmethod
    def for_run(cls, folder: Path, arguments: list[str], settings: object) -> RunCache:
        identity = json.dumps([__version__, sorted(arguments), repr(settings)])
        return cls(folder, hashlib.sha256(identity.encode()).hexdigest()[:32])

    @property
    def path(self) -> Path:
        return self.folder / f"run-{self.key}.json"

    def load(self) -> CachedRun | None:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
            return CachedRun(
                {path: _state(entry) for path, entry in raw["files"].items()},
                set(raw["loaded"]),
                set(raw["missing"]),
                frozenset(raw["words"]),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def store(self, run: CachedRun) -> None:
        """Write the entry atomically; a cache that cannot be written is no error."""
        data = {
            "files": {path: _entry(state) for path, state in run.files.items()},
            "loaded": sorted(run.loaded),
            "missing": sorted(run.missing),
            "words": sorted(run.words),
        }
        try:
            self._prepare()
            _write_atomically(self.path, data)
            # The flake8 plugin sees one file at a time: it learns the project's words here.
            _write_atomically(self.folder / WORDS, sorted(run.words))
        except OSError:
            pass

    def _prepare(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        for name, text in (("CACHEDIR.TAG", _TAG), (".gitignore", "*\n")):
            marker = self.folder / name
            if not marker.exists():
                marker.write_text(text, encoding="utf-8")


def project_words(start: Path) -> frozenset[str]:
    """The words the last CLI run over the project found, from the cache folder nearest
    above ``start`` (none when there is no cache)."""
    for folder in (start, *start.parents):
        try:
            words = json.loads((folder / FOLDER / WORDS).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(words, list) and all(isinstance(w, str) for w in words):
            return frozenset(words)
    return frozenset()


def _write_atomically(path: Path, data: object) -> None:
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            json.dump(data, stream)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def _entry(state: FileState) -> list:
    return [
        state.size,
        state.mtime_ns,
        state.digest,
        [_finding_entry(f) for f in state.findings],
        state.internal_error,
    ]


def _state(entry: list) -> FileState:
    size, mtime_ns, digest, findings, internal_error = entry
    return FileState(size, mtime_ns, digest, [_finding(f) for f in findings], internal_error)


def _finding_entry(finding: Finding) -> list:
    fix = None
    if finding.fix is not None:
        edit = finding.fix.edit
        kind = "add" if isinstance(edit, AddKeyword) else "replace"
        fix = [kind, list(edit.__dict__.values()), finding.fix.applicability]
    values = [finding.line, finding.column, finding.code, finding.message]
    return [*values, finding.end_line, finding.end_column, fix]


def _finding(entry: list) -> Finding:
    line, column, code, message, end_line, end_column, fix = entry
    made = None
    if fix is not None:
        kind, fields, applicability = fix
        edit = AddKeyword(*fields) if kind == "add" else ReplaceText(*fields)
        made = Fix(edit, applicability)
    return Finding(line, column, code, message, end_line, end_column, made)
