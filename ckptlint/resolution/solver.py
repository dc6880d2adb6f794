"""Memoised queries that answer the same whatever was asked before, and always end.

Every recursive question the analysis asks (what an expression may be, a class's bases, the
callers of a function, whether a function is a wrapper...) goes through one ``Solver``, which
keeps three promises (docs/analysis-semantics.md states them with their tests):

- **Order does not matter.** An answer is kept for the rest of the run only when computing it
  met no cycle: then it is what the question gives when asked first, in any process. An answer
  that met a cycle (a question still being answered, itself included, gave a stand-in) is
  *provisional*: it is reused only until the outermost question returns, and computed again
  by the next one. So the outermost answers never depend on what was asked before them, and
  an outermost answer is kept to answer the same question asked again as an outermost one
  (every rule asks for a file's sites): computed again, it would be the same. Asked inside
  another question, a provisional answer is still computed again, since the cycle it met
  must then be cut where that question entered it.
- **It always ends.** A question asked while it is being answered is cut (the query's
  ``fallback``); the number of distinct questions is finite (contexts are bounded where they
  are made), so a run ends. A chain of questions deeper than ``height_limit`` stops the whole
  outermost question, with the fallback and a note; whether that happens depends only on the
  question, since every kept answer remembers how deep its computation went. So does a
  question that uses more than ``size_limit`` answers (each answer counts itself and the
  distinct answers it used, so a question asked again by the same one costs nothing more).
- **One failure is one answer.** An exception raised while computing an answer (a bug, code
  that cannot be parsed) makes that answer the fallback, with a note naming what was raised;
  the questions around it go on.

Each answer also remembers what it read of the project (``read``: a set of facts, as a
bit mask), so that a computation reusing it records those reads as its own: that is what lets
a stored result be reused only while everything it read holds.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

# How deep a chain of questions may go before the outermost one gives up.
HEIGHT_LIMIT = 100
# How many distinct answers an outermost question may use, itself and everything below it
# counted once (so the count depends on the question alone, not on what was kept before it).
SIZE_LIMIT = 2_000_000
TOO_DEEP = "too deeply nested to analyse"
TOO_BIG = "too much to analyse"


@dataclass(frozen=True)
class Fault:
    """Why an answer is only its fallback: a question too deep to follow, or an exception
    raised while computing it. ``where`` names the code, ``what`` the reason."""

    where: str
    what: str


class _TooDeep(Exception):
    """Raised inside the solver to stop an outermost question whose chain is too deep."""


class _TooBig(Exception):
    """Raised inside the solver to stop an outermost question that uses too many answers."""


@dataclass(slots=True)
class _Answer:
    value: Any
    height: int  # 1 + the deepest chain of questions below it (a summary below counts 1)
    # An upper bound of the distinct answers its computation used, itself included: 1 + the
    # bounds of the answers it asked (one shared below two of those counts in each); exact
    # (see ``_join``) once that bound passes the limit.
    size: int
    reads: int  # facts read (bit mask)
    faults: tuple[Fault, ...]
    used: tuple[Hashable, ...]  # the questions it asked (what its distinct count walks)
    flat: bool  # a summary: composed bottom-up, so using it costs one level of a chain


@dataclass(slots=True)
class _Frame:
    key: Hashable
    depth: int
    height: int = 1
    size: int = 1
    reads: int = 0
    cut: bool = False  # met a question still in progress (or a provisional answer)
    faults: tuple[Fault, ...] = ()
    used: set[Hashable] = field(default_factory=set)  # the questions it asked
    # The distinct answers used so far, once ``size`` (the cheap bound) passed the limit.
    closure: set[Hashable] | None = None


@dataclass
class Unit:
    """What the outermost questions of one computation (a file's findings) read and met."""

    reads: int = 0
    faults: list[Fault] = field(default_factory=list)

    def note(self, faults: tuple[Fault, ...]) -> None:
        for fault in faults:
            if fault not in self.faults:
                self.faults.append(fault)


class Solver:
    """The memo of one analysis (see the module docstring)."""

    def __init__(
        self,
        height_limit: int = HEIGHT_LIMIT,
        size_limit: int = SIZE_LIMIT,
        place: Callable[[Hashable], str | None] = lambda key: None,
    ) -> None:
        self.height_limit = height_limit
        self.size_limit = size_limit
        self.place = place  # where the code a question is about lies ("path:line"), if known
        self._cut_at = ""  # where the chain of the question that went too deep was cut
        self.largest = 0  # the largest size an outermost question reached
        self._final: dict[Hashable, _Answer] = {}
        self._provisional: dict[Hashable, _Answer] = {}
        # Provisional answers of outermost questions, for the same question asked outermost.
        self._outermost: dict[Hashable, _Answer] = {}
        self._stack: list[_Frame] = []
        self._active: set[Hashable] = set()
        self._units: list[Unit] = []
        self.computed = 0  # answers computed (not reused): the work done
        self.recomputed = 0  # of those, provisional ones (computed again by later questions)
        self._facts: dict[Hashable, int] = {}
        self.facts_read: list[Hashable] = []  # by bit: the first fact read is bit 0

    # -- questions ----------------------------------------------------------------------------
    def ask(
        self,
        key: Hashable,
        compute: Callable[..., T],
        *args: object,
        fallback: T,
        where: Callable[[], str] | None = None,
        flat: bool = False,
    ) -> T:
        """The answer to ``key``, computed by ``compute(*args)`` unless known; ``fallback``
        stands in for a question that is cut, too deep or failed; ``where`` names its code
        in notes. ``flat``: a summary its caller composes bottom-up (see the module
        docstring), whose use adds one level to a chain of questions."""
        stack = self._stack
        answer = self._final.get(key)
        if answer is None:
            if stack:
                answer = self._provisional.get(key)
                if answer is not None:
                    stack[-1].cut = True
            else:
                answer = self._outermost.get(key)
        if answer is not None:  # reused (most questions): inline, as it is the hot path
            if not stack:
                self._record(answer)
                return answer.value
            parent = stack[-1]
            if parent.depth + 1 + (1 if answer.flat else answer.height) > self.height_limit:
                raise self._too_deep(key)
            self._join(parent, key, answer)
            return answer.value
        if key in self._active:
            stack[-1].cut = True
            return fallback
        depth = len(stack)
        if depth >= self.height_limit:
            raise self._too_deep(key)
        frame = _Frame(key, depth)
        stack.append(frame)
        self._active.add(key)
        try:
            value = compute(*args)
        except (_TooDeep, _TooBig, RecursionError) as limit:
            if depth:
                raise
            value = fallback  # the whole question gives up: its limits are its own
            frame.cut = False
            place = where() if where is not None else ""
            if isinstance(limit, _TooDeep):
                place = place or self._cut_at
            frame.faults = (Fault(place, self._limit(limit)),)
        except (MemoryError, KeyboardInterrupt):
            raise
        except Exception as error:  # one failure is one answer: the fallback, noted
            value = fallback
            frame.faults = (
                *frame.faults,
                Fault(where() if where is not None else "", _describe(error)),
            )
        finally:
            stack.pop()
            self._active.discard(key)
        self.computed += 1
        size = frame.size if frame.closure is None else len(frame.closure)
        used = tuple(frame.used)
        answer = _Answer(value, frame.height, size, frame.reads, frame.faults, used, flat)
        if frame.cut:
            self._provisional[key] = answer
            self.recomputed += 1
        else:
            self._final[key] = answer
        if stack:
            parent = stack[-1]
            parent.cut = parent.cut or frame.cut
            self._join(parent, key, answer)
        else:
            if frame.cut:
                self._outermost[key] = answer
            self._provisional.clear()
            self.largest = max(self.largest, size)
            self._record(answer)
        return value

    def note(self, fault: Fault) -> None:
        """Record that the question being answered gave up part of its work (a limit cut
        it), so that the computation using it reports a note."""
        if self._stack:
            frame = self._stack[-1]
            if fault not in frame.faults:
                frame.faults = (*frame.faults, fault)
        else:
            for unit in self._units:
                unit.note((fault,))

    def settled(self, key: Hashable) -> bool:
        """Whether ``key`` has an answer kept for the run."""
        return key in self._final

    def _too_deep(self, key: Hashable) -> _TooDeep:
        """The stop of a chain too deep, noting the code that led into it: the outermost
        question on it about code with a place. Outermost, so that the note is the same in
        any order: the chain's first questions are asked whatever was kept before them,
        while where it stops moves up to an answer kept meanwhile."""
        keys = [*(frame.key for frame in self._stack), key]
        self._cut_at = next((p for p in map(self.place, keys) if p), "")
        return _TooDeep()

    def _limit(self, error: Exception) -> str:
        if isinstance(error, _TooBig):
            return f"{TOO_BIG}: it uses more than {self.size_limit:,} answers"
        return f"{TOO_DEEP}: a chain of more than {self.height_limit} lookups"

    def _join(self, parent: _Frame, key: Hashable, answer: _Answer) -> None:
        height = 1 if answer.flat else answer.height  # a summary below counts one level
        if height >= parent.height:
            parent.height = height + 1
        parent.reads |= answer.reads
        if answer.faults:
            parent.faults = (*parent.faults, *(f for f in answer.faults if f not in parent.faults))
        if key in parent.used:  # asked again by the same question: no new work
            return
        parent.used.add(key)
        limit = self.size_limit
        if parent.closure is None:
            parent.size = min(parent.size + answer.size, limit + 1)
            if parent.size <= limit:
                return
            # The bound counts an answer shared below two others twice (a name bound in
            # each of many branches, each reading the one before): count distinct ones.
            parent.closure = {parent.key}
            for used in parent.used:
                self._walk(parent.closure, used)
        else:
            self._walk(parent.closure, key)
        if len(parent.closure) > limit:
            raise _TooBig

    def _walk(self, closure: set[Hashable], key: Hashable) -> None:
        """Add ``key`` and every answer below it to ``closure`` (stopping past the limit)."""
        stack = [key]
        limit = self.size_limit
        while stack and len(closure) <= limit:
            key = stack.pop()
            if key in closure:
                continue
            closure.add(key)
            answer = self._final.get(key) or self._provisional.get(key)
            if answer is not None:
                stack.extend(answer.used)

    def _record(self, answer: _Answer) -> None:
        for unit in self._units:
            unit.reads |= answer.reads
            unit.note(answer.faults)

    # -- what questions read ------------------------------------------------------------------
    def read(self, fact: Hashable) -> None:
        """Record that the question being answered read ``fact`` (one of
        ``project.facts``: equal facts are one, the first one read kept)."""
        bit = self._facts.get(fact)
        if bit is None:
            bit = self._facts[fact] = 1 << len(self.facts_read)
            self.facts_read.append(fact)
        if self._stack:
            self._stack[-1].reads |= bit
        else:
            for unit in self._units:
                unit.reads |= bit

    def facts(self, reads: int) -> Iterator[Hashable]:
        """The facts of a bit mask, as they were first read."""
        facts = self.facts_read
        while reads:
            lowest = reads & -reads  # one set bit at a time: as many steps as facts read
            yield facts[lowest.bit_length() - 1]
            reads ^= lowest

    @contextmanager
    def unit(self) -> Iterator[Unit]:
        """Collect what the outermost questions asked inside the block read and met."""
        unit = Unit()
        self._units.append(unit)
        try:
            yield unit
        finally:
            self._units.remove(unit)

    @contextmanager
    def guard(self, key: Hashable) -> Iterator[bool]:
        """Enter ``key`` unless it is entered already (an expansion that reaches itself):
        False then, and what is being answered is cut there, as by a question in progress."""
        if key in self._active:
            if self._stack:
                self._stack[-1].cut = True
            yield False
            return
        self._active.add(key)
        try:
            yield True
        finally:
            self._active.discard(key)

    @property
    def busy(self) -> bool:
        """Whether a question is being answered (callers that cache must use ``ask``)."""
        return bool(self._stack)


def _describe(error: Exception) -> str:
    text = str(error)
    name = type(error).__name__
    return f"{name}: {text}" if text else name
