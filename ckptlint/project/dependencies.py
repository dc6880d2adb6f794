"""What one computation (a module's exports, a file's findings) read of the project.

The project index records every module it hands out, every module name it resolves, every
folder it asks about and every text search it runs over the project's files (the records of
``project.facts``, filed here by ``facts.dependencies_of``). A stored
result is reused only while all of these give the same answers: that is the whole of the
cache's reasoning, so a result never outlives what it was computed from, whichever files a
run names and in whatever order it computes them.

A result depends on what was read of each module (``shapes``: its skeleton, the definitions
whose bodies were read, where the names searched for lie, positions aside; see
``project.shapes``), so an edit it never looked at (a body, lines moved) leaves it valid:
early cutoff. A module read whole (``modules``) is compared by its digest: a message cites
a line of it, its text was searched, or it could not be read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# A text search over the project's files: (kind, word), see ``Project.files_matching``.
ScanKey = tuple[str, str]


@dataclass
class ShapeRead:
    """What a computation read of one module, positions aside (see ``project.shapes``)."""

    digest: str  # the file's digest then: while it is the same, everything holds
    name: str  # its module name
    skeleton: str | None = None  # the skeleton's digest, when read
    parts: dict[str, str] = field(default_factory=dict)  # definition: digest, bodies read
    names: dict[str, tuple[tuple[str, int], ...]] = field(default_factory=dict)  # searched
    versions: bool | None = None  # whether it tests versions, when asked


@dataclass
class Dependencies:
    modules: dict[str, tuple[str, str]] = field(default_factory=dict)  # path: (digest, name)
    shapes: dict[str, ShapeRead] = field(default_factory=dict)  # path: what was read of it
    resolved: dict[str, str | None] = field(default_factory=dict)  # module name: its file
    packages: dict[str, bool] = field(default_factory=dict)  # name: a project folder
    scans: dict[ScanKey, tuple[str, ...]] = field(default_factory=dict)  # key: files found
