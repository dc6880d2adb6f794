"""What one computation (a module's exports, a file's findings) read of the project.

The project index records into the active ``Dependencies`` every module it hands out, every
module name it resolves, every folder it asks about and every text search it runs over the
project's files. A stored result is reused only while all of these give the same answers:
that is the whole of the cache's reasoning, so a result never outlives what it was computed
from, whichever files a run names and in whatever order it computes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# A text search over the project's files: (kind, word), see ``Project.files_matching``.
ScanKey = tuple[str, str]


@dataclass
class Dependencies:
    modules: dict[str, tuple[str, str]] = field(default_factory=dict)  # path: (digest, name)
    resolved: dict[str, str | None] = field(default_factory=dict)  # module name: its file
    packages: dict[str, bool] = field(default_factory=dict)  # name: a project folder
    scans: dict[ScanKey, tuple[str, ...]] = field(default_factory=dict)  # key: files found

    def merge(self, other: Dependencies) -> None:
        self.modules.update(other.modules)
        self.resolved.update(other.resolved)
        self.packages.update(other.packages)
        self.scans.update(other.scans)
