"""The processes a run shares its work among.

A run's work is sent as tasks (``ExportsTask``, ``FindingsTask``: a share of the files, the
words to use), each run by a process's ``Analyser``. ``Workers`` forks the processes (they
inherit the bytes read and the parsed modules) and splits each task's files among them;
the process itself takes back the share of a worker that dies, with a note saying so.
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ckptlint.project.stored import Analysed, Exported, Words

if TYPE_CHECKING:
    import multiprocessing
    from multiprocessing.connection import Connection

    from ckptlint.analyser import Analyser

# Below this many files to analyse per process, a worker costs more than it saves.
FILES_PER_PROCESS = 40


@dataclass(frozen=True)
class ExportsTask:
    """Compute the exports of ``paths`` for a discovery round's ``words``."""

    words: Words
    paths: tuple[str, ...]

    def run(self, analyser: Analyser) -> list[Exported]:
        analyser.use(self.words)
        return [analyser.exports(path) for path in self.paths]


@dataclass(frozen=True)
class FindingsTask:
    """Compute the findings of ``paths`` for the project's final ``words``."""

    words: Words
    paths: tuple[str, ...]
    fixes: bool = False

    def run(self, analyser: Analyser) -> list[Analysed]:
        analyser.use(self.words)
        return [analyser.findings(path, self.fixes) for path in self.paths]


Task = ExportsTask | FindingsTask


class Workers:
    """The processes a run shares its work among (forked: they inherit the bytes read), and
    the process itself, which takes back the share of a worker that dies."""

    def __init__(self, local: Analyser, count: int) -> None:
        self.local = local
        self.notes: list[str] = []
        self._workers: list[tuple[multiprocessing.process.BaseProcess, Connection]] = []
        if count > 1:
            self._fork(count)

    def _fork(self, count: int) -> None:
        import multiprocessing  # here: a run in one process (most warm runs) never needs it

        if "fork" not in multiprocessing.get_all_start_methods():
            return  # the process does the work alone
        context = multiprocessing.get_context("fork")
        for _ in range(count):
            ours, theirs = context.Pipe()
            process = context.Process(target=_serve, args=(self.local, theirs), daemon=True)
            process.start()
            theirs.close()
            self._workers.append((process, ours))

    @property
    def size(self) -> int:
        return max(1, len(self._workers))

    def run(self, make: Callable[[tuple[str, ...]], Task], paths: Sequence[str]) -> list[Any]:
        """``make(share)`` is the task of one share of ``paths``; results in ``paths`` order."""
        if not paths:
            return []
        if not self._workers:
            return make(tuple(paths)).run(self.local)
        shares = [tuple(paths[i :: len(self._workers)]) for i in range(len(self._workers))]
        sent: list[tuple[multiprocessing.process.BaseProcess, Connection | None, tuple[str, ...]]]
        sent = []
        for (process, connection), share in zip(self._workers, shares, strict=True):
            if share:
                try:
                    connection.send(make(share))
                    sent.append((process, connection, share))
                except OSError:
                    sent.append((process, None, share))
        by_path: dict[str, Any] = {}
        for process, reply, share in sent:
            try:
                if reply is None:
                    raise EOFError
                kind, payload = reply.recv()
            except (EOFError, OSError):
                process.join(timeout=1)
                self.notes.append(_dead_worker(process, len(share)))
                payload, kind = make(share).run(self.local), "ok"
                self._workers = [w for w in self._workers if w[0] is not process]
            if kind == "error":
                raise RuntimeError(payload)
            for result in payload:
                by_path[result.path] = result
        return [by_path[path] for path in paths]

    def close(self) -> None:
        for process, connection in self._workers:
            with contextlib.suppress(OSError):
                connection.send(None)
            connection.close()
            process.join(timeout=5)


def _dead_worker(process: multiprocessing.process.BaseProcess, files: int) -> str:
    code = process.exitcode
    how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
    return (
        f"a worker process died ({how}); its {files} file{'s' if files != 1 else ''}"
        " were analysed again in the main process"
    )


def _serve(analyser: Analyser, connection: Connection) -> None:
    """A worker's loop: run the tasks the coordinator sends."""
    gc.disable()
    while True:
        task = connection.recv()
        if task is None:
            return
        try:
            connection.send(("ok", task.run(analyser)))
        except Exception as error:  # reported by the coordinator, never a silent hang
            connection.send(("error", f"{type(error).__name__}: {error}"))


def worker_count(jobs: int | None, files: int) -> int:
    """Processes for ``files`` files: never more than the CPUs or the files; by default one
    per ``FILES_PER_PROCESS`` files, as a worker costs more than it saves below that."""
    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    limit = max(1, min(available or 1, files))
    if jobs is not None:
        return min(jobs, limit)
    return max(1, min(limit, files // FILES_PER_PROCESS))
