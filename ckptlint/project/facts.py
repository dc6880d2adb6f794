"""The facts a computation reads of the project, one typed record per kind, and the
``Recorder`` that takes note of them.

The project index (``index``) and the layout (``layout``) record every answer they give a
computation as one fact: a module handed out, its skeleton, a definition's body, where a
name lies in it, whether it tests versions, a module name resolved, a folder asked about, a
text search over the project's files. A record's compared fields are the question asked;
its other fields are the answer read, which the question decides within a run (the project's
files do not change under it), so the run's ``Recorder`` (its solver) numbers facts by
question and keeps the first answer.

``dependencies_of`` files the facts a computation read into the ``Dependencies`` its stored
result is kept with: what was read of each module (its ``Shape``), or its whole text where
the computation depends on more than that.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from ckptlint.project.dependencies import Dependencies, ScanKey, ShapeRead


@dataclass(frozen=True, slots=True)
class ModuleRead:
    """A module handed out (``Project.module_at``): its file's digest and module name."""

    path: str
    digest: str = field(compare=False)
    name: str = field(compare=False)


@dataclass(frozen=True, slots=True)
class WholeRead:
    """A module read whole (digest and module name): a line of it cited in a message
    (``Module.cite``), its text searched (``Module.candidate_lines``), or its file unreadable
    (what a changed file gives then cannot be told from its shape)."""

    path: str
    digest: str = field(compare=False)
    name: str = field(compare=False)


@dataclass(frozen=True, slots=True)
class SkeletonRead:
    """A module's skeleton (what it defines and imports, bodies aside): its digest."""

    path: str
    skeleton: str = field(compare=False)

    def add_to(self, read: ShapeRead) -> None:
        read.skeleton = self.skeleton


@dataclass(frozen=True, slots=True)
class PartRead:
    """The body of one of a module's definitions (``key``, see ``project.shapes``)."""

    path: str
    key: str
    digest: str = field(compare=False)

    def add_to(self, read: ShapeRead) -> None:
        read.parts[self.key] = self.digest


@dataclass(frozen=True, slots=True)
class NamesRead:
    """Where ``name`` lies in a module (``Module.lines_naming``), positions aside."""

    path: str
    name: str
    where: tuple[tuple[str, int], ...] = field(compare=False)

    def add_to(self, read: ShapeRead) -> None:
        read.names[self.name] = self.where


@dataclass(frozen=True, slots=True)
class VersionsRead:
    """Whether a module's text may test a version (``Module.tests_versions``)."""

    path: str
    tests: bool = field(compare=False)

    def add_to(self, read: ShapeRead) -> None:
        read.versions = self.tests


@dataclass(frozen=True, slots=True)
class ResolvedRead:
    """The file of a module name (``Layout.find``), None where there is none."""

    name: str
    path: str | None = field(compare=False)


@dataclass(frozen=True, slots=True)
class PackageRead:
    """Whether a dotted name is a folder of the project (``Layout.is_project_package``)."""

    name: str
    found: bool = field(compare=False)


@dataclass(frozen=True, slots=True)
class ScanRead:
    """A text search over the project's files (``Project.files_matching``): those found."""

    key: ScanKey
    paths: tuple[str, ...] = field(compare=False)


# What was read of a module, positions aside: what its exports depend on of it.
ShapeFact = SkeletonRead | PartRead | NamesRead | VersionsRead
Fact = ModuleRead | WholeRead | ShapeFact | ResolvedRead | PackageRead | ScanRead


class Recorder(Protocol):
    """Takes note of what the computation in progress read (see ``resolution.solver``)."""

    def read(self, fact: Fact) -> None: ...


def dependencies_of(facts: Iterable[Hashable], module: Callable[[str], ShapeRead]) -> Dependencies:
    """What a computation that read ``facts`` depends on: what it read of each module,
    positions aside, and the whole text of those it read whole (``WholeRead``). ``module``:
    the record of a module whose shape was read where its own fact was not (read before)."""
    dependencies = Dependencies()
    shapes = dependencies.shapes
    for fact in facts:
        if isinstance(fact, WholeRead):
            dependencies.modules[fact.path] = (fact.digest, fact.name)
        elif isinstance(fact, ModuleRead):
            if fact.path not in shapes:
                shapes[fact.path] = ShapeRead(fact.digest, fact.name)
        elif isinstance(fact, (SkeletonRead, PartRead, NamesRead, VersionsRead)):
            read = shapes.get(fact.path)
            if read is None:
                read = shapes[fact.path] = module(fact.path)
            fact.add_to(read)
        elif isinstance(fact, ResolvedRead):
            dependencies.resolved[fact.name] = fact.path
        elif isinstance(fact, PackageRead):
            dependencies.packages[fact.name] = fact.found
        elif isinstance(fact, ScanRead):
            dependencies.scans[fact.key] = fact.paths
    for path in dependencies.modules:  # its digest says all its shape would
        shapes.pop(path, None)
    return dependencies
