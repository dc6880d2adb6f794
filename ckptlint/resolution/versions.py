"""Torch versions: the ranges a branch runs on, decided as ruff decides ``sys.version_info``.

A test of the torch version (``is_torch_version(">=", "1.11.0")``, ``torch.__version__ <
"2.0"``, ``version.parse(torch.__version__) >= version.parse("1.11")``...) is true for a
set of versions: a ``VersionRange``. The code under a branch runs on the versions its tests
allow, intersected with the torch the project targets (a lower bound: the project's own
``torch`` requirement, or ``target-torch``). A branch whose range is empty never runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

# How code spells the installed torch's version, parses versions, and asks about them.
TORCH_VERSION = "torch.__version__"
_TORCH_VERSION_NAMES = (TORCH_VERSION, "torch.version.__version__")
_SAME_VERSION_ATTRIBUTES = ("base_version", "public")  # ``parse(v).base_version``
VERSION_PARSERS = frozenset(
    {
        "packaging.version.parse",
        "packaging.version.Version",
        "pkg_resources.parse_version",
        "distutils.version.LooseVersion",
        "distutils.version.StrictVersion",
    }
)
DISTRIBUTION_VERSIONS = frozenset({"importlib.metadata.version", "importlib_metadata.version"})
# Helpers of transformers and diffusers, by name: the operator (None: the first argument).
TEST_HELPERS: dict[str, str | None] = {
    "is_torch_version": None,
    "is_torch_greater_or_equal": ">=",
}
_OPERATORS = frozenset({">=", ">", "<", "<=", "==", "!="})


def names_torch_version(name: str) -> bool:
    """``torch.__version__`` (or ``.base_version`` of it, parsed): the installed torch's."""
    for spelling in _TORCH_VERSION_NAMES:
        if name == spelling:
            return True
        if name.startswith(spelling + "."):
            return name[len(spelling) + 1 :] in _SAME_VERSION_ATTRIBUTES
    return False


def helper_test(name: str, arguments: list[object]) -> VersionRange | None:
    """``is_torch_version(">=", "1.11.0")`` and the like, from their constant arguments."""
    if name not in TEST_HELPERS:
        return None
    operator = TEST_HELPERS[name]
    if operator is None:
        if len(arguments) < 2:
            return None
        operator, arguments = arguments[0], arguments[1:]  # type: ignore[assignment]
    version = parse_version(arguments[0]) if arguments else None
    if version is None or operator not in _OPERATORS:
        return None
    return VersionRange.compared(operator, version)


# A point between versions: (v, 0) just below v, (v, 1) just above it; None is the end.
Bound = tuple[Version, int]


@dataclass(frozen=True)
class VersionRange:
    """A union of disjoint intervals ``[low, high)`` of bounds, in ascending order; a low
    of None is unbounded below, a high of None unbounded above."""

    intervals: tuple[tuple[Bound | None, Bound | None], ...]

    @classmethod
    def compared(cls, operator: str, version: Version) -> VersionRange:
        """The versions ``v`` for which ``v <operator> version`` holds."""
        below, above = (version, 0), (version, 1)
        ranges = {
            ">=": ((below, None),),
            ">": ((above, None),),
            "<": ((None, below),),
            "<=": ((None, above),),
            "==": ((below, above),),
            "!=": ((None, below), (above, None)),
        }
        return cls(ranges[operator])

    @property
    def empty(self) -> bool:
        return not self.intervals

    def contains(self, version: Version) -> bool:
        point = (version, 0)  # a version itself lies just above its "just below" bound
        return any(
            (low is None or low <= point) and (high is None or point < high)
            for low, high in self.intervals
        )

    def lower(self) -> Version | None:
        """The least version of the range (None: unbounded below, or empty)."""
        if not self.intervals or self.intervals[0][0] is None:
            return None
        return self.intervals[0][0][0]

    def below(self, version: Version) -> bool:
        """Whether every version of the range is older than ``version``."""
        return self.intersect(VersionRange.compared(">=", version)).empty

    def intersect(self, other: VersionRange) -> VersionRange:
        found = []
        for low, high in self.intervals:
            for other_low, other_high in other.intervals:
                start = _later(low, other_low)
                end = _earlier(high, other_high)
                if start is None or end is None or start < end:
                    found.append((start, end))
        return VersionRange(tuple(sorted(found, key=_start_key)))

    def complement(self) -> VersionRange:
        if not self.intervals:
            return EVERY_VERSION
        found: list[tuple[Bound | None, Bound | None]] = []
        first_low = self.intervals[0][0]
        if first_low is not None:
            found.append((None, first_low))
        for (_, high), (next_low, _) in zip(self.intervals, self.intervals[1:], strict=False):
            found.append((high, next_low))
        last_high = self.intervals[-1][1]
        if last_high is not None:
            found.append((last_high, None))
        return VersionRange(tuple(found))

    def union(self, other: VersionRange) -> VersionRange:
        return self.complement().intersect(other.complement()).complement()


EVERY_VERSION = VersionRange(((None, None),))
NO_VERSION = VersionRange(())


def at_least(version: Version | None) -> VersionRange:
    """The versions a project targets: from its lower bound on (every one when unknown)."""
    return EVERY_VERSION if version is None else VersionRange.compared(">=", version)


def parse_version(text: object) -> Version | None:
    """A version written as a string (``"1.11.0"``) or a tuple of ints (``(1, 11)``)."""
    if isinstance(text, tuple) and text and all(isinstance(p, int) for p in text):
        text = ".".join(str(part) for part in text)
    if not isinstance(text, str):
        return None
    try:
        return Version(text)
    except InvalidVersion:
        return None


def _start_key(interval: tuple[Bound | None, Bound | None]) -> tuple:
    low = interval[0]
    return (0,) if low is None else (1, low)


def _later(a: Bound | None, b: Bound | None) -> Bound | None:
    """The later of two lower bounds (None is unbounded below)."""
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)


def _earlier(a: Bound | None, b: Bound | None) -> Bound | None:
    """The earlier of two upper bounds (None is unbounded above)."""
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)
