"""The README and docs/ hold together: every relative link leads to a file and every anchor to
a heading of it, the README lists every rule, and it stays a five-minute read."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ckptlint.rules import ALL_RULES

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]


def anchors(page: Path) -> set[str]:
    """GitHub's anchors: a heading lowercased, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#+\s+(.*)$", page.read_text(), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for link in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        if re.match(r"[a-z]+:", link):
            continue
        target, _, anchor = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        if not path.exists():
            broken.append(f"{link}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{link}: no such heading")
    assert broken == []


def test_the_readme_lists_every_rule_and_stays_short() -> None:
    readme = (ROOT / "README.md").read_text()
    assert [rule.code for rule in ALL_RULES if rule.code not in readme] == []
    assert len(readme.splitlines()) <= 250


def test_install_lines_work_from_a_clone() -> None:
    """No release is published: a line installing ckptlint by its name fails for everyone
    who copies it; from a clone it is ``pip install -e '.[extra]'``."""
    sources = [*PAGES, ROOT / "ckptguard" / "__init__.py"]
    by_name = re.compile(r"pip install\s+(-U\s+)?['\"]?ckptlint\b")
    assert [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sources
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if by_name.search(line)
    ] == []
