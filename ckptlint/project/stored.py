"""What the cache keeps of a project between runs, besides each file's findings.

Discovery learns *words* (``Words``: the names that reach a region source, the classes that
derive from a layer source) round by round (``Round``), each file's part in a round being
its exports (``Exported``), computed for the words it names (``file_words``: a word learned
elsewhere that a file does not name leaves its results valid). The stored project
(``StoredProject``, ``project.json``: see ``project.cache``) keeps the file table, the text
searches run over the project (``updated_scans`` makes them true for the files changed
since), the rounds and every file's exports, each with the ``Dependencies`` it read; a
file's findings (``Analysed``) are stored one entry per file.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Protocol

from ckptlint.core import Finding
from ckptlint.project import cache
from ckptlint.project.dependencies import Dependencies, ScanKey
from ckptlint.project.files import Snapshot, StoredFile
from ckptlint.project.search import matches
from ckptlint.source import UnreadableSource, may_name


@dataclass(frozen=True)
class Words:
    """The words of interest: names that reach a region source when called (``calls``), and
    classes deriving from a layer source (``classes``)."""

    calls: frozenset[str]
    classes: frozenset[str] = frozenset()

    @cached_property
    def names(self) -> frozenset[str]:
        return self.calls | self.classes

    @cached_property
    def digest(self) -> str:
        return _words_digest(self.calls, self.classes)

    def digest_within(self, names: frozenset[bytes]) -> str:
        """The digest of the words a file names (``names``: its ``names_in_bytes``): all that one
        file's exports and findings depend on of the words, since the words decide only which
        of its own lines and classes are looked at. A word learned elsewhere that the file
        does not name leaves its stored results valid."""
        named = set(may_name(self.names, names))
        return _words_digest(self.calls & named, self.classes & named)


def _words_digest(calls: frozenset[str] | set[str], classes: frozenset[str] | set[str]) -> str:
    text = "\0".join(sorted(calls)) + "\1" + "\0".join(sorted(classes))
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


@dataclass(frozen=True)
class Exported:
    """One file's part in a discovery round: the names it exports, or why it has none."""

    path: str
    digest: str
    words: str  # the digest of the round's words
    calls: frozenset[str]
    classes: frozenset[str]
    error: Finding | None  # CKP901: the file cannot be decoded or parsed
    internal_error: str | None  # a bug of ours
    dependencies: Dependencies


@dataclass(frozen=True)
class Analysed:
    """One file's findings, before selection and suppressions."""

    path: str
    findings: tuple[Finding, ...]
    internal_error: str | None
    dependencies: Dependencies


@dataclass(frozen=True)
class Round:
    """One discovery round: its new words, and the files it analysed: those its new words
    bring in (``pending``, by the prefilter), and those analysed before that name one of
    them (``reprocess``)."""

    new: Words
    pending: tuple[str, ...]
    reprocess: tuple[str, ...]


def file_words(files: Snapshot, path: str, words: Words) -> str:
    """``words.digest_within`` the identifiers of the file at ``path`` (unreadable: none)."""
    key = (files.digest(path), words.digest)
    named = _NAMED.get(key)
    if named is None:
        try:
            names = files.names(path)
        except UnreadableSource:
            names = frozenset()
        named = _NAMED[key] = words.digest_within(names)
    return named


# (file digest, words digest): what ``file_words`` gave; the bytes and the words decide it.
# Not the identifiers themselves: kept for every file of transformers 5.24, 49 MiB.
_NAMED: dict[tuple[str, str], str] = {}


def updated_scans(
    scans: Mapping[ScanKey, tuple[str, ...]],
    snapshot: Snapshot,
    paths: Sequence[str],
    changed: set[str],
) -> dict[ScanKey, tuple[str, ...]]:
    """Searches made over other bytes, made true for these: their results are kept for the
    files that did not change and searched again in those that did (or are new)."""
    order = {path: index for index, path in enumerate(paths)}
    updated = {}
    for key, found in scans.items():
        kept = [p for p in found if p in order and p not in changed]
        kept.extend(p for p in changed if p in order and _matches(snapshot, p, key))
        updated[key] = tuple(sorted(set(kept), key=order.__getitem__))
    return updated


def _matches(snapshot: Snapshot, path: str, key: ScanKey) -> bool:
    try:
        return matches(*key, snapshot.data(path))
    except UnreadableSource:
        return False


@dataclass(frozen=True)
class StoredProject:
    files: dict[str, StoredFile]
    scans: dict[ScanKey, tuple[str, ...]]
    rounds: list[Round]
    exported: dict[tuple[str, str], Exported]
    named: dict[tuple[str, str], str]


class Known(Protocol):
    """What a run knows of the project that the store keeps (the engine's state)."""

    paths: list[str]
    snapshot: Snapshot
    scans: dict[ScanKey, tuple[str, ...]]
    rounds: list[Round]
    exported: dict[tuple[str, str], Exported]
    named: dict[tuple[str, str], str]


def encode_project(state: Known) -> dict[str, Any]:
    digests = {state.snapshot.digest(path) for path in state.paths}
    words = Words(frozenset())
    used = set()
    for each in state.rounds:  # the words each round looked for: what the next run asks
        words = Words(words.calls | each.new.calls, words.classes | each.new.classes)
        used.add(words.digest)
    return {
        "named": [
            [digest, words, named]
            for (digest, words), named in state.named.items()
            if digest in digests and words in used
        ],
        "files": cache.encode_files(state.snapshot.stored()),
        "scans": cache.encode_scans(state.scans),
        "rounds": [
            [sorted(r.new.calls), sorted(r.new.classes), list(r.pending), list(r.reprocess)]
            for r in state.rounds
        ],
        "exported": [
            [
                e.path,
                e.digest,
                e.words,
                sorted(e.calls),
                sorted(e.classes),
                None if e.error is None else cache.encode_finding(e.error),
                cache.encode_dependencies(e.dependencies),
            ]
            for e in state.exported.values()
            if e.internal_error is None  # a bug of ours: computed again next time
        ],
    }


def decode_project(content: object) -> StoredProject:
    if not isinstance(content, dict):
        raise cache.Invalid
    rounds = []
    for entry in cache._list(content["rounds"]):
        calls, classes, pending, reprocess = cache._list(entry)
        new = Words(frozenset(cache._strings(calls)), frozenset(cache._strings(classes)))
        rounds.append(Round(new, tuple(cache._strings(pending)), tuple(cache._strings(reprocess))))
    exported = {}
    for entry in cache._list(content["exported"]):
        path, digest, words, calls, classes, error, dependencies = cache._list(entry)
        result = Exported(
            cache._str(path),
            cache._str(digest),
            cache._str(words),
            frozenset(cache._strings(calls)),
            frozenset(cache._strings(classes)),
            None if error is None else cache.decode_finding(error),
            None,
            cache.decode_dependencies(dependencies),
        )
        exported[(result.path, result.words)] = result
    named = {}
    for entry in cache._list(content.get("named", [])):  # absent from stores before it
        digest, words, file_named = (cache._str(item) for item in cache._list(entry))
        named[(digest, words)] = file_named
    return StoredProject(
        cache.decode_files(content["files"]),
        cache.decode_scans(content["scans"]),
        rounds,
        exported,
        named,
    )
