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
machine is simply not used. A key that other users can read is replaced by a new one.
Nothing is followed through a symbolic link or read from a special file; entries are written
to a fresh temporary file and renamed into place. No fix is ever stored: fixes are computed
from the bytes being fixed.

A repository can also put anything in the folder itself (a link ``findings -> ../data``), so
what deletes (pruning, ``ckptlint clean``) walks it through folder descriptors opened with
``O_NOFOLLOW``, never following a link, and deletes only what this code writes, where it
writes it: regular files of the user's, with the names and the first bytes it gives them.
Anything else is left alone and reported, once a run.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import re
import secrets
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptlint import __version__
from ckptlint.core import Finding
from ckptlint.project.dependencies import Dependencies, ScanKey, ShapeRead
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


def user_key(notes: list[str] | None = None) -> bytes | None:
    """The user's cache key, made on first use; None when it cannot be read or made. A key
    other users can read (a backup restored at 0644) may have been read: it is replaced by
    a new one, and ``notes`` says so."""
    path = user_key_file()
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
        except FileExistsError:
            key, mode = _read_key(path)
            if key is None or mode & 0o077 == 0:
                return key
            return _replace_key(path, mode, notes)
        with os.fdopen(descriptor, "wb") as stream:
            stream.write(secrets.token_bytes(_KEY_BYTES))
        return _read_key(path)[0]
    except OSError:
        return None


def _read_key(path: Path) -> tuple[bytes | None, int]:
    """The key's bytes (None unless a regular file of the user's of the right size) and
    its permission bits."""
    read = _read_owned(path, _KEY_BYTES)
    if read is None or len(read[0]) != _KEY_BYTES:
        return None, 0
    return read[0], stat.S_IMODE(read[1].st_mode)


def _replace_key(path: Path, mode: int, notes: list[str] | None) -> bytes | None:
    """A new key in place of one other users can read (renamed over it: never rewritten
    in place, where a reader could still hold it open)."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".key-")  # made 0600
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(secrets.token_bytes(_KEY_BYTES))
        os.replace(temporary, path)
    finally:
        if os.path.lexists(temporary):
            os.unlink(temporary)
    if notes is not None:
        notes.append(
            f"the cache key {path} could be read by other users (mode {mode:04o}): replaced "
            "by a new key (mode 0600); what was cached under the old one is not trusted"
        )
    return _read_key(path)[0]


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def _owned(status: os.stat_result) -> bool:
    return not hasattr(os, "getuid") or status.st_uid == os.getuid()


def _read_owned(
    path: Path | str, limit: int, *, folder: int | None = None, touch: bool = False
) -> tuple[bytes, os.stat_result] | None:
    """A regular file's bytes and status, read without following a link (``path`` relative
    to the ``folder`` descriptor when given); None for anything else. ``touch``: mark it
    used now (through the descriptor: never through a link)."""
    try:
        descriptor = os.open(path, os.O_RDONLY | _NOFOLLOW | _NONBLOCK, dir_fd=folder)
    except OSError:
        return None
    with os.fdopen(descriptor, "rb") as stream:
        status = os.fstat(stream.fileno())
        if not stat.S_ISREG(status.st_mode) or not _owned(status) or status.st_size > limit:
            return None
        data = stream.read(limit + 1)
        if touch:
            with contextlib.suppress(OSError):
                os.utime(stream.fileno())
    return (data, status) if len(data) <= limit else None


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
        self.notes: list[str] = []  # what the user should know: what was left alone...
        self._reported: set[str] = set()
        self._seen: dict[str, bytes] = {}  # entry -> its tag as this store last read or wrote it

    @classmethod
    def open(cls, folder: Path, key: str, notes: list[str] | None = None) -> Store | str:
        """The store, or why it cannot be used (no user key, a folder that is a link...).
        ``notes`` receives what the user should know (a key replaced)."""
        secret = user_key(notes)
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
        store = cls(folder, key, secret)
        if notes is not None:
            store.notes = notes
        return store

    # -- entries ----------------------------------------------------------------------------
    def read(self, name: str) -> Any:
        """The entry's content; None when it is missing, forged or malformed."""
        read = _read_owned(self.part / name, _MAX_ENTRY_BYTES, touch=True)  # used: pruned last
        if read is None or not read[0].startswith(_MAGIC):
            return None
        tag, _, body = read[0][len(_MAGIC) :].partition(b"\n")
        if not hmac.compare_digest(tag, self._tag(name, body)):
            return None
        try:
            content = json.loads(body)
        except (ValueError, RecursionError):
            return None
        self._seen[name] = tag
        return content

    def changed(self, name: str) -> bool:
        """Whether the entry may differ from what this store last read or wrote of it
        (another process wrote it since): its tag, a MAC of its body, tells without
        decoding it."""
        seen = self._seen.get(name)
        if seen is None:
            return True
        read = _read_owned(self.part / name, _MAX_ENTRY_BYTES)
        return read is None or not read[0].startswith(_MAGIC + seen + b"\n")

    def write(self, name: str, content: object) -> None:
        """Write the entry atomically; a cache that cannot be written is no error."""
        body = json.dumps(content, separators=(",", ":")).encode()
        tag = self._tag(name, body)
        data = _MAGIC + tag + b"\n" + body
        path = self.part / name
        try:
            handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        except OSError:
            return
        try:
            with os.fdopen(handle, "wb") as stream:
                stream.write(data)
            os.replace(temporary, path)
            self._seen[name] = tag
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
        """Past ``limit`` bytes, delete the least recently used entries down to half of it.
        Only entries this code writes are counted or deleted (see the module docstring)."""
        entries = []
        total = 0
        with _Folder.open(self.folder) as top:
            if top is None:
                return
            for part_name in top.survey(self._left_alone, _TOP_FILES, _PART_NAME)[1]:
                with top.child(part_name) as part:
                    if (
                        part is None
                        or "findings"
                        not in part.survey(self._left_alone, _PART_FILES, _FINDINGS)[1]
                    ):
                        continue
                    with part.child("findings") as findings:
                        if findings is None:
                            continue
                        for name, status in findings.survey(self._left_alone, _ENTRY, None)[0]:
                            entries.append((status.st_mtime_ns, part_name, name, status))
                            total += status.st_size
        if total <= limit:
            return
        for _, part_name, name, status in sorted(entries):
            if _delete(self.folder, (part_name, "findings"), name, status):
                total -= status.st_size
            else:
                self._left_alone(f"{self.folder}/{part_name}/findings/{name}", _NOT_WRITTEN)
            if total <= limit // 2:
                return

    def _left_alone(self, path: str, why: str) -> None:
        if path not in self._reported:
            self._reported.add(path)
            self.notes.append(f"{path}: left alone in the cache folder ({why})")


# What this code names its files and folders in a cache folder, at each level.
_TOP_FILES = re.compile(re.escape(TAG_FILE) + r"|\.gitignore")
_PART_NAME = re.compile(r"[0-9a-f]{24}")
_PART_FILES = re.compile(r"project\.json|lock|\.tmp-\w+")
_FINDINGS = re.compile("findings")
_ENTRY = re.compile(r"[0-9a-f]{32}\.json|\.tmp-\w+")
_NOT_WRITTEN = "a file ckptlint does not write"
_LeftAlone = Callable[[str, str], None]


class _Folder:
    """A folder of the cache, held open by a descriptor: opened with ``O_NOFOLLOW`` below
    a folder itself held so, so no name in it can lead out through a link."""

    def __init__(self, descriptor: int | None, path: str) -> None:
        self.descriptor = descriptor
        self.path = path

    @classmethod
    def open(cls, path: Path) -> _Folder:
        return cls(_open_folder(str(path), None), str(path))

    def child(self, name: str) -> _Folder:
        descriptor = None if self.descriptor is None else _open_folder(name, self.descriptor)
        return _Folder(descriptor, f"{self.path}/{name}")

    def __enter__(self) -> _Folder | None:
        return self if self.descriptor is not None else None

    def __exit__(self, *_: object) -> None:
        if self.descriptor is not None:
            os.close(self.descriptor)
            self.descriptor = None

    def survey(
        self, left_alone: _LeftAlone, files: re.Pattern[str], folders: re.Pattern[str] | None
    ) -> tuple[list[tuple[str, os.stat_result]], list[str]]:
        """The files (with their ``lstat``) and the sub-folders this code writes here, by
        name and kind, in name order; everything else goes to ``left_alone``."""
        assert self.descriptor is not None
        found = []
        with contextlib.suppress(OSError), os.scandir(self.descriptor) as scan:
            for entry in scan:
                with contextlib.suppress(OSError):
                    found.append((entry.name, entry.stat(follow_symlinks=False)))
        ours: list[tuple[str, os.stat_result]] = []
        subfolders: list[str] = []
        for name, status in sorted(found, key=lambda item: item[0]):
            if _is_ours(status) and files.fullmatch(name):
                ours.append((name, status))
            elif (
                folders is not None
                and stat.S_ISDIR(status.st_mode)
                and _owned(status)
                and folders.fullmatch(name)
            ):
                subfolders.append(name)
            else:
                left_alone(f"{self.path}/{name}", _kind(status))
        return ours, subfolders


def _open_folder(name: str, parent: int | None) -> int | None:
    """A descriptor of the folder ``name`` (relative to ``parent``), never through a link,
    and only when it is a folder of the user's."""
    try:
        descriptor = os.open(
            name, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC | _NONBLOCK, dir_fd=parent
        )
    except OSError:
        return None
    status = os.fstat(descriptor)
    if stat.S_ISDIR(status.st_mode) and _owned(status):
        return descriptor
    os.close(descriptor)
    return None


def _is_ours(status: os.stat_result) -> bool:
    """A regular file of the user's with no other name (a hard link elsewhere is not)."""
    return stat.S_ISREG(status.st_mode) and _owned(status) and status.st_nlink == 1


def _kind(status: os.stat_result) -> str:
    mode = status.st_mode
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a folder ckptlint does not make" if _owned(status) else "another user's folder"
    if not stat.S_ISREG(mode):
        return "not a regular file"
    if not _owned(status):
        return "another user's file"
    if status.st_nlink != 1:
        return "a file with other names (hard links)"
    return _NOT_WRITTEN


def _delete(folder: Path, parts: tuple[str, ...], name: str, seen: os.stat_result) -> bool:
    """Delete the file ``name`` of the folder ``parts`` below ``folder`` if it is still the
    file ``seen`` and one this code wrote (by its first bytes); False when it is not."""
    with contextlib.ExitStack() as stack:
        current: _Folder | None = stack.enter_context(_Folder.open(folder))
        for part in parts:
            if current is None:
                return False
            current = stack.enter_context(current.child(part))
        if current is None or current.descriptor is None:
            return False
        try:
            descriptor = os.open(
                name, os.O_RDONLY | _NOFOLLOW | _NONBLOCK, dir_fd=current.descriptor
            )
        except OSError:
            return False
        with os.fdopen(descriptor, "rb") as stream:
            status = os.fstat(stream.fileno())
            head = stream.read(len(_MAGIC)) if _is_ours(status) else b""
        if not _is_ours(status) or not _written_here(name, head):
            return False
        if (status.st_ino, status.st_dev) != (seen.st_ino, seen.st_dev):
            return False
        try:
            os.unlink(name, dir_fd=current.descriptor)
        except OSError:
            return False
    return True


def _written_here(name: str, head: bytes) -> bool:
    """Whether a file's first bytes are what this code writes under that name."""
    if name == TAG_FILE:
        return _TAG.encode().startswith(head) and bool(head)
    if name == ".gitignore":
        return head == b"*\n"
    if name == "lock":
        return head == b""
    if name.startswith(".tmp-"):
        return _MAGIC.startswith(head)  # possibly cut short by a crash
    return head == _MAGIC


def _mark(folder: Path) -> None:
    for name, text in ((TAG_FILE, _TAG), (".gitignore", "*\n")):
        with contextlib.suppress(OSError):
            descriptor = os.open(folder / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW)
            with os.fdopen(descriptor, "w", encoding="utf-8") as stream:
                stream.write(text)


@dataclass(frozen=True)
class Cleaned:
    """What ``clean`` did with a folder."""

    is_cache: bool  # it holds ckptlint's tag
    removed: bool  # and it is gone
    left_alone: tuple[str, ...] = ()  # what it holds that ckptlint did not write, and why


def clean(folder: Path) -> Cleaned:
    """Delete a cache folder made by ckptlint (it holds the tag): the files this code
    writes, then the folders they leave empty. Anything else stays, and is named."""
    left: list[str] = []

    def left_alone(path: str, why: str) -> None:
        left.append(f"{path} ({why})")

    with _Folder.open(folder) as top:
        if top is None or not _tagged(top):
            return Cleaned(False, False)
        top_files, parts = top.survey(left_alone, _TOP_FILES, _PART_NAME)
        for part_name in parts:
            with top.child(part_name) as part:
                if part is None:
                    continue
                part_files, findings = part.survey(left_alone, _PART_FILES, _FINDINGS)
                if findings:
                    with part.child("findings") as entries:
                        if entries is not None:
                            files = entries.survey(left_alone, _ENTRY, None)[0]
                            _delete_all(folder, (part_name, "findings"), files, left_alone)
                    with contextlib.suppress(OSError):
                        os.rmdir("findings", dir_fd=part.descriptor)
                _delete_all(folder, (part_name,), part_files, left_alone)
            with contextlib.suppress(OSError):
                os.rmdir(part_name, dir_fd=top.descriptor)
        _delete_all(folder, (), top_files, left_alone)
    with contextlib.suppress(OSError):
        os.rmdir(folder)
    return Cleaned(True, not os.path.lexists(folder), tuple(left))


def _delete_all(
    folder: Path,
    parts: tuple[str, ...],
    files: list[tuple[str, os.stat_result]],
    left_alone: _LeftAlone,
) -> None:
    for name, status in files:
        if not _delete(folder, parts, name, status):
            left_alone("/".join([str(folder), *parts, name]), _NOT_WRITTEN)


def _tagged(top: _Folder) -> bool:
    assert top.descriptor is not None
    read = _read_owned(TAG_FILE, len(_TAG) + 1, folder=top.descriptor)
    return read is not None and read[0] == _TAG.encode()


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
        [_encode_shape(path, read) for path, read in dependencies.shapes.items()],
    ]


def _encode_shape(path: str, read: ShapeRead) -> list:
    parts = [[key, digest] for key, digest in read.parts.items()]
    names = [[name, [list(item) for item in where]] for name, where in read.names.items()]
    return [path, read.digest, read.name, read.skeleton, parts, names, read.versions]


def _decode_shape(value: object) -> tuple[str, ShapeRead]:
    path, digest, name, skeleton, parts, names, versions = _list(value)
    if type(path) is not str or type(digest) is not str or type(name) is not str:
        raise Invalid
    if (skeleton is not None and type(skeleton) is not str) or (
        versions is not None and type(versions) is not bool
    ):
        raise Invalid
    read = ShapeRead(digest, name, skeleton, versions=versions)
    for key, part in _list(parts):
        if type(key) is not str or type(part) is not str:
            raise Invalid
        read.parts[key] = part
    for searched, where in _list(names):
        if type(searched) is not str:
            raise Invalid
        found = []
        for key, count in _list(where):
            if type(key) is not str or type(count) is not int:
                raise Invalid
            found.append((key, count))
        read.names[searched] = tuple(found)
    return path, read


def decode_dependencies(value: object) -> Dependencies:
    modules, resolved, packages, scans, shapes = _list(value)
    dependencies = Dependencies()
    for entry in _list(shapes):
        path, read = _decode_shape(entry)
        dependencies.shapes[path] = read
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
