"""The bytes of a project's files as one run sees them, each read at most once.

A ``Snapshot`` gives every file's content digest; what the run is handed instead of the disk
(standard input, the text flake8 read) overrides a file's bytes. A digest stored by an earlier
run is trusted without reading the file only while the file's size, modification time, change
time and inode are those recorded, and only if the file had not been touched for
``RACY_SECONDS`` when it was read: an edit made in the same clock tick as the read, or a
modification time put back afterwards (``cp -p``, ``rsync -a``, which still move the change
time), is caught by reading again, as git does with its index.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from ckptlint.source import UnreadableSource, names_in_bytes, read_bytes

RACY_SECONDS = 2
_RACY_NS = RACY_SECONDS * 1_000_000_000

Signature = tuple[int, int, int, int]  # size, mtime_ns, ctime_ns, inode
MISSING = ""  # the digest of a file that does not exist


@dataclass(frozen=True)
class StoredFile:
    """What a run learned of one file: its stat signature, digest, and when it was read."""

    signature: Signature
    digest: str
    read_ns: int

    def trusted(self, signature: Signature) -> bool:
        size, mtime_ns, ctime_ns, _ = signature
        return signature == self.signature and max(mtime_ns, ctime_ns) + _RACY_NS < self.read_ns


def digest_of(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


class Snapshot:
    """Digests and bytes of files, read on demand and kept for the run.

    ``digest`` of a file that cannot be read is ``!`` and the reason; of a missing one,
    ``MISSING``. ``stored`` lists what the next run may trust.
    """

    def __init__(
        self,
        overrides: Mapping[str, bytes] | None = None,
        previous: Mapping[str, StoredFile] | None = None,
        read: Callable[[str], bytes] = read_bytes,
    ) -> None:
        self._overrides = {os.path.abspath(p): data for p, data in (overrides or {}).items()}
        self._previous = dict(previous or {})
        self._read = read
        self._data: dict[str, bytes] = dict(self._overrides)
        self._digests: dict[str, str] = {p: digest_of(d) for p, d in self._overrides.items()}
        self._errors: dict[str, UnreadableSource] = {}
        # The ``names_in_bytes`` of the files the run analyses (those of every file: 110 MiB
        # on transformers 5.24), scanned once for discovery's words, the cache's and a
        # module's searches.
        self._names: dict[str, frozenset[bytes]] = {}
        self._stored: dict[str, StoredFile] = {}
        self.reads = 0  # files read from disk (what the next run trusts changed)

    @property
    def overridden(self) -> frozenset[str]:
        return frozenset(self._overrides)

    def overlay(self, overrides: Mapping[str, bytes]) -> Snapshot:
        """This snapshot with some files' bytes replaced (what was read stays shared)."""
        child = Snapshot({**self._overrides, **overrides}, self._previous, self._read)
        for path, data in self._data.items():
            child._data.setdefault(path, data)
        for path, digest in self._digests.items():
            child._digests.setdefault(path, digest)
        for path, error in self._errors.items():
            if path not in child._overrides:
                child._errors[path] = error
        for path, names in self._names.items():
            if path not in child._overrides:
                child._names[path] = names
        child._stored = self._stored
        return child

    def digest(self, path: str) -> str:
        """The digest of the file at ``path`` (absolute, as every path of a snapshot is)."""
        found = self._digests.get(path)
        if found is None:
            found = self._digests[path] = self._find_digest(path)
        return found

    def data(self, path: str) -> bytes:
        """The file's bytes; raises ``UnreadableSource`` (``CannotRead`` included)."""
        data = self._data.get(path)
        if data is None:
            if path in self._errors:
                raise self._errors[path]
            data = self._read_now(path, None)
        return data

    def names(self, path: str, known: frozenset[bytes] | None = None) -> frozenset[bytes]:
        """The file's ``names_in_bytes`` (``known``: already scanned), kept for the run;
        raises as ``data`` does."""
        names = self._names.get(path)
        if names is None:
            names = known if known is not None else names_in_bytes(self.data(path))
            self._names[path] = names
        return names

    def stored(self) -> dict[str, StoredFile]:
        """What this run learned, for the next one (files it never looked at excluded)."""
        return dict(self._stored)

    def read_all(self, paths: Iterable[str]) -> None:
        """Read files ahead (before forking workers, which then share the bytes)."""
        for path in paths:
            try:
                self.data(path)
            except UnreadableSource:
                pass

    def _find_digest(self, path: str) -> str:
        try:
            status = os.stat(path)
        except FileNotFoundError:
            return MISSING
        except OSError as error:
            return f"!cannot stat file: {error.strerror or error}"
        signature = (status.st_size, status.st_mtime_ns, status.st_ctime_ns, status.st_ino)
        previous = self._previous.get(path)
        if previous is not None and previous.trusted(signature):
            self._stored[path] = previous
            return previous.digest
        try:
            self._read_now(path, signature)
        except UnreadableSource as error:
            return f"!{error.reason}"
        return self._digests[path]

    def _read_now(self, path: str, signature: Signature | None) -> bytes:
        read_ns = time.time_ns()
        if signature is None:
            try:
                status = os.stat(path)
                signature = (status.st_size, status.st_mtime_ns, status.st_ctime_ns, status.st_ino)
            except OSError:
                signature = None
        self.reads += 1
        try:
            data = self._read(path)
        except UnreadableSource as error:
            self._errors[path] = error
            self._digests[path] = f"!{error.reason}"
            raise
        self._data[path] = data
        digest = self._digests[path] = digest_of(data)
        if signature is not None:
            self._stored[path] = StoredFile(signature, digest, read_ns)
        return data
