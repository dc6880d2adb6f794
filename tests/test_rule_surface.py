"""The structure rules are written against, checked on the source so that it cannot rot: a rule
file imports from ckptlint only ``ckptlint.rules.base`` and asks the analysis only through
``ProjectAnalysis``'s queries; each layer of the pipeline's middle imports only the layers
below it; one rule, one file."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import ckptlint
import ckptlint.rules.base as base
from ckptlint.rules import ALL_RULES

PACKAGE = Path(ckptlint.__file__).parent
RULE_FILES = sorted(
    path for path in (PACKAGE / "rules").glob("*.py") if path.name not in ("__init__.py", "base.py")
)
# ProjectAnalysis's machinery: what answers its queries, not for rules to drive.
MACHINERY = frozenset({"evaluator", "finder", "reaches", "changes"})
# The pipeline's middle, lowest first: a module may import its own layer and those before it.
LAYERS = ["project", "resolution", "regions", "effects", "analysis", "rules"]


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _ckptlint_imports(path: Path) -> list[tuple[int, str]]:
    """The ckptlint modules a file imports (at any depth: also inside functions), by line."""
    found = []
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}:{node.lineno}: a relative import"
            names = [node.module or ""]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found.extend((node.lineno, name) for name in names if name.split(".")[0] == "ckptlint")
    return found


def _layer(module: str) -> str | None:
    """``ckptlint.regions.sites`` -> ``regions``; None outside the middle (cli, engine...)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def test_the_rule_files_are_found() -> None:
    assert len(RULE_FILES) == len(ALL_RULES)


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda path: path.name)
def test_a_rule_imports_from_ckptlint_only_its_surface(path: Path) -> None:
    outside = [
        f"{path.name}:{line}: {module}"
        for line, module in _ckptlint_imports(path)
        if module != "ckptlint.rules.base"
    ]
    assert outside == []


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda path: path.name)
def test_a_rule_asks_the_analysis_not_its_machinery(path: Path) -> None:
    reached = [
        f"{path.name}:{node.lineno}: .{node.attr}"
        for node in ast.walk(_tree(path))
        if isinstance(node, ast.Attribute) and node.attr in MACHINERY
    ]
    assert reached == []


def test_the_surface_exports_what_rules_use_and_nothing_else() -> None:
    used: set[str] = set()
    for path in RULE_FILES:
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ImportFrom) and node.module == "ckptlint.rules.base":
                used.update(alias.name for alias in node.names)
    exported = set(base.__all__)
    assert len(base.__all__) == len(exported)  # each name once
    assert all(hasattr(base, name) for name in exported)
    assert sorted(used - exported) == []  # a rule imports nothing the surface leaves out
    assert sorted(exported - used) == []  # and the surface declares nothing no rule asks for


def test_each_layer_imports_only_the_layers_below_it() -> None:
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(("ckptlint", *path.relative_to(PACKAGE).with_suffix("").parts))
        own = _layer(module)
        if own is None:
            continue
        for line, imported in _ckptlint_imports(path):
            theirs = _layer(imported)
            if theirs is not None and LAYERS.index(theirs) > LAYERS.index(own):
                upward.append(f"{path.relative_to(PACKAGE)}:{line}: {own} imports {imported}")
    assert upward == []


def test_one_rule_one_file() -> None:
    homes = [inspect.getmodule(type(rule)) for rule in ALL_RULES]
    assert len({home.__name__ for home in homes}) == len(ALL_RULES)
    for home in homes:
        rules = [
            value
            for value in vars(home).values()
            if inspect.isclass(value)
            and issubclass(value, base.Rule)
            and value is not base.Rule
            and value.__module__ == home.__name__
        ]
        assert len(rules) == 1, (home.__name__, rules)


def test_the_registry_names_every_rule_file_with_its_code_and_triggers() -> None:
    """The registry (what a run reads before it analyses anything) agrees with the rule
    files: each rule's code, file and class, every file registered once, and the union of
    the rules' triggers."""
    from ckptlint.rules import REGISTRY, TRIGGERS

    assert [rule.code for rule in ALL_RULES] == list(REGISTRY)
    for rule in ALL_RULES:
        module, cls = REGISTRY[rule.code]
        assert (type(rule).__module__, type(rule).__name__) == (f"ckptlint.rules.{module}", cls)
    assert sorted(module for module, _ in REGISTRY.values()) == [p.stem for p in RULE_FILES]
    assert set(TRIGGERS) == {word for rule in ALL_RULES for word in rule.TRIGGERS}
