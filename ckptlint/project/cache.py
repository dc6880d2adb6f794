"""The cache: facts earlier runs computed, reused while what they were computed from holds.

The folder (``.ckptlint_cache`` at the project root unless ``--cache-dir`` says otherwise,
tagged ``CACHEDIR.TAG`` and ignored by git, like ruff's) holds one sub-folder per *analysis
key*: the ckptlint version, the Python version and the settings that change what the
analysis computes. In it, ``project.json`` keeps the project's file table (stat signature
and digest of each file), the text searches run over the project and the trace of the
discovery of the project's own region sources; ``findings/`` keeps one entry per file's
findings, named by the file, its digest and the words it was analysed for. Every stored
result carries the ``Dependencies`` it was computed from, and is used only while they hold.

Whatever is read from the folder is untrusted input: a repository can ship one, and anyone
who can write to it can put anything there. So each entry is authenticated with an HMAC
under a key of the user's that lives outside every project (``$XDG_CACHE_HOME/ckptlint/key``,
made 0600 on first use): an entry that does not verify, or whose content does not validate,
is a miss, never an error, and a cache committed to a repository or copied from another
machine is simply not used. Nothing is followed through a symbolic link or read from a
special file; entries are written to a fresh temporary file and renamed into place. No fix
is ever stored: fixes are computed from the bytes being fixed.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
import stat
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptlint import __version__
from ckptlint.core import Finding
from ckptlint.project.dependencies import Dependencies, ScanKey
from ckptlint.project.files import StoredFile
from ckptlint.project.search import KINDS

FOLDER = ".ckptlint_cache"
TAG_FILE = "CACHEDIR.TAG"
_TAG = "Signature: 8a477f597d28d172789f06886806bc55\n# ckptlint's cache: safe to delete.\n"
_MAGIC = b"ckptlint-cache 2\n"
_KEY_BYTES = 32
_MAX_ENTRY_BYTES = 256 * 1024 * 1024
# The cache folder is pruned to half this size, least recently used entries first, past it.
MAX_CACHE_BYTES = 512 * 1024 * 1024


class Invalid(Exception):
    """Stored content that does not have the expected shape."""


def user_key_file() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ckptlint" / "key"


def user_key() -> bytes | None:
    """The user's cache key, made on first use; None when it cannot be read or made."""
    path = user_key_file()
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
        except FileExistsError:
            key = _read_owned(path, _KEY_BYTES)
            return key if key is not None and len(key) == _KEY_BYTES else None
        with os.fdopen(descriptor, "wb") as stream:
            stream.write(secrets.token_bytes(_KEY_BYTES))
        return _read_owned(path, _KEY_BYTES)
    except OSError:
        return None


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


def _owned(status: os.stat_result) -> bool:
    return not hasattr(os, "getuid") or status.st_uid == os.getuid()


def _read_owned(path: Path, limit: int) -> bytes | None:
    """A regular file's bytes, read without following a link; None for anything else."""
    try:
        descriptor = os.open(path, os.O_RDONLY | _NOFOLLOW | _NONBLOCK)
    except OSError:
        return None
    with os.fdopen(descriptor, "rb") as stream:
        status = os.fstat(stream.fileno())
        if not stat.S_ISREG(status.st_mode) or not _owned(status) or status.st_size > limit:
            return None
        data = stream.read(limit + 1)
    return data if len(data) <= limit else None


def _usable_folder(path: Path) -> bool:
    """A real folder of the user's (no link), made when it does not exist."""
    try:
        status = os.lstat(path)
    except FileNotFoundError:
        try:
            path.mkdir()  # never its parents: a project folder is not ours to make
            status = os.lstat(path)
        except OSError:
            return False
    except OSError:
        return False
    return stat.S_ISDIR(status.st_mode) and _owned(status)


def analysis_key(settings_identity: object) -> str:
    """Names what decides the analysis's results besides the files themselves."""
    identity = json.dumps(
        [__version__, sys.implementation.name, list(sys.version_info[:3]), settings_identity],
        sort_keys=True,
        default=repr,
    )
    return hashlib.sha256(identity.encode()).hexdigest()[:24]


class Store:
    """One analysis key's part of a cache folder; ``open`` says whether it can be used."""

    def __init__(self, folder: Path, key: str, secret: bytes) -> None:
        self.folder = folder
        self.part = folder / key
        self._secret = secret
        self._key = key.encode()

    @classmethod
    def open(cls, folder: Path, key: str) -> Store | str:
        """The store, or why it cannot be used (no user key, a folder that is a link...)."""
        secret = user_key()
        if secret is None:
            return f"no cache key at {user_key_file()} (it cannot be read or made)"
        new = not os.path.lexists(folder)
        if not _usable_folder(folder):
            return f"{folder} is not a folder of yours (a link, a file, another owner)"
        if new:
            _mark(folder)
        for part in (folder / key, folder / key / "findings"):
            if not _usable_folder(part):
                return f"{part} is not a folder of yours (a link, a file, another owner)"
        return cls(folder, key, secret)

    # -- entries ----------------------------------------------------------------------------
    def read(self, name: str) -> Any:
        """The entry's content; None when it is missing, forged or malformed."""
        path = self.part / name
        data = _read_owned(path, _MAX_ENTRY_BYTES)
        if data is None or not data.startswith(_MAGIC):
            return None
        tag, _, body = data[len(_MAGIC) :].partition(b"\n")
        if not hmac.compare_digest(tag, self._tag(name, body)):
            return None
        try:
            content = json.loads(body)
        except (ValueError, RecursionError):
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used: pruned last
        return content

    def write(self, name: str, content: object) -> None:
        """Write the entry atomically; a cache that cannot be written is no error."""
        body = json.dumps(content, separators=(",", ":")).encode()
        data = _MAGIC + self._tag(name, body) + b"\n" + body
        path = self.part / name
        try:
            handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        except OSError:
            return
        try:
            with os.fdopen(handle, "wb") as stream:
                stream.write(data)
            os.replace(temporary, path)
        except OSError:
            pass
        finally:
            if os.path.lexists(temporary):
                with contextlib.suppress(OSError):
                    os.unlink(temporary)

    def _tag(self, name: str, body: bytes) -> bytes:
        message = self._key + b"\0" + name.encode() + b"\0" + body
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest().encode()

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Exclusive while held, across processes (where the platform has ``flock``)."""
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows
            yield
            return
        try:
            descriptor = os.open(self.part / "lock", os.O_RDWR | os.O_CREAT | _NOFOLLOW, 0o600)
        except OSError:
            yield
            return
        try:
            # A record lock, not flock: a worker forked while it is held does not hold it too
            # (an flock would stay held by the fork's copy of the descriptor).
            fcntl.lockf(descriptor, fcntl.LOCK_EX)
            yield
        finally:
            os.close(descriptor)

    def prune(self, limit: int = MAX_CACHE_BYTES) -> None:
        """Past ``limit`` bytes, delete the least recently used entries down to half of it."""
        entries = []
        total = 0
        for path in self.folder.glob("*/findings/*.json"):
            with contextlib.suppress(OSError):
                status = os.lstat(path)
                entries.append((status.st_mtime_ns, status.st_size, path))
                total += status.st_size
        if total <= limit:
            return
        for _, size, path in sorted(entries):
            with contextlib.suppress(OSError):
                path.unlink()
                total -= size
            if total <= limit // 2:
                return


def _mark(folder: Path) -> None:
    for name, text in ((TAG_FILE, _TAG), (".gitignore", "*\n")):
        with contextlib.suppress(OSError):
            descriptor = os.open(folder / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW)
            with os.fdopen(descriptor, "w", encoding="utf-8") as stream:
                stream.write(text)


def clean(folder: Path) -> bool:
    """Delete a cache folder made by ckptlint (it holds the tag); False when it is not one."""
    import shutil

    try:
        status = os.lstat(folder)
    except OSError:
        return False
    if not stat.S_ISDIR(status.st_mode) or not os.path.isfile(folder / TAG_FILE):
        return False
    shutil.rmtree(folder, ignore_errors=True)
    return True


# -- stored shapes ------------------------------------------------------------------------------
# Decoding checks every field's type and raises Invalid: a stored entry is either exactly what
# an earlier run wrote, or a miss.


def _list(value: object) -> list:
    if not isinstance(value, list):
        raise Invalid
    return value


def _str(value: object) -> str:
    if not isinstance(value, str):
        raise Invalid
    return value


def _int(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise Invalid
    return value


def _optional_str(value: object) -> str | None:
    return None if value is None else _str(value)


def _strings(value: object) -> list[str]:
    return [_str(item) for item in _list(value)]


def encode_files(files: dict[str, StoredFile]) -> list:
    return [[path, *state.signature, state.digest, state.read_ns] for path, state in files.items()]


def decode_files(value: object) -> dict[str, StoredFile]:
    found = {}
    for entry in _list(value):
        path, size, mtime, ctime, inode, digest, read_ns = _list(entry)
        signature = (_int(size), _int(mtime), _int(ctime), _int(inode))
        found[_str(path)] = StoredFile(signature, _str(digest), _int(read_ns))
    return found


def encode_scans(scans: dict[ScanKey, tuple[str, ...]]) -> list:
    return [[kind, word, list(paths)] for (kind, word), paths in scans.items()]


def decode_scans(value: object) -> dict[ScanKey, tuple[str, ...]]:
    found = {}
    for entry in _list(value):
        kind, word, paths = _list(entry)
        if kind not in KINDS:
            raise Invalid
        found[(kind, _str(word))] = tuple(_strings(paths))
    return found


def encode_dependencies(dependencies: Dependencies) -> list:
    return [
        [[path, digest, name] for path, (digest, name) in dependencies.modules.items()],
        [[name, path] for name, path in dependencies.resolved.items()],
        [[name, found] for name, found in dependencies.packages.items()],
        encode_scans(dependencies.scans),
    ]


def decode_dependencies(value: object) -> Dependencies:
    modules, resolved, packages, scans = _list(value)
    dependencies = Dependencies()
    found_modules = dependencies.modules
    for path, digest, name in _list(modules):
        if type(path) is not str or type(digest) is not str or type(name) is not str:
            raise Invalid
        found_modules[path] = (digest, name)
    found_resolved = dependencies.resolved
    for name, path in _list(resolved):
        if type(name) is not str or (path is not None and type(path) is not str):
            raise Invalid
        found_resolved[name] = path
    found_packages = dependencies.packages
    for name, found in _list(packages):
        if type(name) is not str or type(found) is not bool:
            raise Invalid
        found_packages[name] = found
    dependencies.scans = decode_scans(scans)
    return dependencies


def encode_finding(finding: Finding) -> list:
    values = [finding.line, finding.column, finding.code, finding.message]
    return [*values, finding.end_line, finding.end_column, finding.fixable]


def decode_finding(value: object) -> Finding:
    line, column, code, message, end_line, end_column, fixable = _list(value)
    if fixable not in (None, "safe", "unsafe"):
        raise Invalid
    return Finding(
        _int(line),
        _int(column),
        _str(code),
        _str(message),
        _int(end_line),
        _int(end_column),
        fixable=fixable,
    )


@dataclass(frozen=True)
class StoredFindings:
    """A file's findings (before selection and suppressions), as a run computed them. An
    internal error is a bug of ours, not a fact about the file: never stored."""

    findings: tuple[Finding, ...]
    dependencies: Dependencies


def encode_findings(entry: StoredFindings) -> list:
    return [[encode_finding(f) for f in entry.findings], encode_dependencies(entry.dependencies)]


def decode_findings(value: object) -> StoredFindings:
    findings, dependencies = _list(value)
    return StoredFindings(
        tuple(decode_finding(f) for f in _list(findings)), decode_dependencies(dependencies)
    )


def findings_name(path: str, digest: str, words: str) -> str:
    identity = f"{path}\0{digest}\0{words}".encode(errors="surrogatepass")
    return f"findings/{hashlib.sha256(identity).hexdigest()[:32]}.json"
