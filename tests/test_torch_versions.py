"""Branches that test the torch version, decided as ruff decides ``sys.version_info``.

Without a target (the project declares no torch), no branch is decided, but CKP001 never
fires on code that runs only on a torch older than ``use_reentrant`` (1.11): there the
keyword does not exist. With a target, code that cannot run on it is no code at all.
"""

from __future__ import annotations

import operator
import textwrap
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from packaging.version import Version

from ckptlint.analyser import analyze
from ckptlint.analysis import ProjectAnalysis
from ckptlint.project.index import Project
from ckptlint.project.layout import Layout
from ckptlint.regions.sources import SourceTable
from ckptlint.resolution.versions import VersionRange
from tests.conftest import lint_tree, messages_of, run_cli

# -- ranges ----------------------------------------------------------------------------------

VERSIONS = [Version(v) for v in ("1.4", "1.9", "1.11", "1.11.0.post1", "1.13.1", "2.0", "2.4")]
OPERATORS = {
    ">=": operator.ge,
    ">": operator.gt,
    "<": operator.lt,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
}


@st.composite
def conditions(draw: st.DrawFn, depth: int = 0):
    """A random boolean formula over version comparisons, as a range and as a predicate."""
    if depth > 2 or draw(st.booleans()):
        name = draw(st.sampled_from(sorted(OPERATORS)))
        version = draw(st.sampled_from(VERSIONS))
        return VersionRange.compared(name, version), lambda v: OPERATORS[name](v, version)
    kind = draw(st.sampled_from(["and", "or", "not"]))
    left, holds_left = draw(conditions(depth + 1))
    if kind == "not":
        return left.complement(), lambda v: not holds_left(v)
    right, holds_right = draw(conditions(depth + 1))
    if kind == "and":
        return left.intersect(right), lambda v: holds_left(v) and holds_right(v)
    return left.union(right), lambda v: holds_left(v) or holds_right(v)


@given(conditions(), st.sampled_from([*VERSIONS, Version("1.0"), Version("1.12"), Version("3")]))
def test_a_range_holds_exactly_the_versions_its_condition_does(condition, version) -> None:
    versions, holds = condition
    assert versions.contains(version) == holds(version)
    if versions.empty:
        assert not any(holds(v) for v in VERSIONS)


# -- projects --------------------------------------------------------------------------------

UTILS = """
    import importlib.metadata
    from packaging import version

    _torch_version = importlib.metadata.version("torch")

    def is_torch_version(operation, wanted):
        return compare_versions(version.parse(_torch_version), operation, wanted)
"""

PYTORCH_UTILS = """
    import torch
    from packaging import version

    parsed_torch_version_base = version.parse(version.parse(torch.__version__).base_version)
    is_torch_greater_or_equal_than_1_11 = parsed_torch_version_base >= version.parse("1.11")
"""

# Every gate below sends torch < 1.11 to the call without use_reentrant.
GATES = {
    "helper": ('if is_torch_version(">=", "1.11.0"):', "use_reentrant=False"),
    "negated helper": ('if not is_torch_version(">=", "1.11.0"):', None),
    "helper or a flag": ('if is_torch_version(">=", "1.11") or self.force:', "x"),
    "constant of another module": ("if is_torch_greater_or_equal_than_1_11:", "x"),
    "parsed versions": (
        'if version.parse(torch.__version__) >= version.parse("1.11"):',
        "x",
    ),
    "torch.__version__ against a tuple": ("if torch.__version__ >= (1, 11):", "x"),
    "mirrored": ('if "1.11" <= torch.__version__:', "x"),
    "older first": ('if torch.__version__ < "1.11":', None),
}


def gated(gate: str, new_first: bool) -> str:
    new = "return checkpoint(self.block, x, use_reentrant=False)"
    old = "return checkpoint(self.block, x)"
    first, second = (new, old) if new_first else (old, new)
    return textwrap.dedent(
        f"""
        import torch
        from packaging import version
        from torch.utils.checkpoint import checkpoint

        from pkg.pytorch_utils import is_torch_greater_or_equal_than_1_11
        from pkg.utils import is_torch_version


        class Model(torch.nn.Module):
            def forward(self, x):
                {gate}
                    {first}
                else:
                    {second}
        """
    )


def files_with(model: str) -> dict[str, str]:
    return {
        "pkg/__init__.py": "",
        "pkg/utils.py": UTILS,
        "pkg/pytorch_utils.py": PYTORCH_UTILS,
        "pkg/model.py": model,
    }


@pytest.mark.parametrize(("gate", "kind"), GATES.values(), ids=GATES.keys())
def test_no_ckp001_on_a_branch_for_torch_older_than_use_reentrant(
    tmp_path: Path, gate: str, kind: str | None
) -> None:
    model = gated(gate, new_first=kind is not None)
    assert lint_tree(tmp_path, files_with(model)) == []


def test_the_branch_for_newer_torch_is_still_checked(tmp_path: Path) -> None:
    model = gated('if is_torch_version(">=", "1.11.0"):', new_first=True)
    model = model.replace("self.block, x, use_reentrant=False", "self.block, x")
    assert lint_tree(tmp_path, files_with(model)) == [("pkg/model.py", 13, 20, "CKP001")]


def test_an_else_branch_that_also_runs_on_new_torch_is_checked(tmp_path: Path) -> None:
    """``else`` of ``>= 2.0`` runs on 1.11 to 1.13 too: there the keyword exists."""
    model = gated('if is_torch_version(">=", "2.0"):', new_first=True)
    assert lint_tree(tmp_path, files_with(model)) == [("pkg/model.py", 15, 20, "CKP001")]


def test_no_fix_where_the_code_also_runs_on_a_torch_without_the_keyword(tmp_path: Path) -> None:
    """Under ``>= 1.9`` the call runs on 1.9 and 1.10 too: ``use_reentrant=False`` would be a
    TypeError there, so the finding stands without a fix."""
    model = textwrap.dedent(
        """
        from torch.utils.checkpoint import checkpoint

        from pkg.utils import is_torch_version


        def forward(block, x):
            if is_torch_version(">=", "1.9.0"):
                return checkpoint(block, x)
            return block(x)
        """
    )
    files = files_with(model)
    [message] = messages_of(tmp_path, files)
    assert message.endswith(
        "; no fix is offered: this code also runs on torch 1.9.0, whose `checkpoint()` has no"
        " `use_reentrant` (added in 1.11)"
    )
    assert "[*]" not in run_cli("--no-cache", ".", cwd=tmp_path).stdout


def test_an_if_expression_is_a_branch_too(tmp_path: Path) -> None:
    model = textwrap.dedent(
        """
        from torch.utils.checkpoint import checkpoint

        from pkg.utils import is_torch_version


        def forward(block, x):
            return (
                checkpoint(block, x, use_reentrant=False)
                if is_torch_version(">=", "1.11")
                else checkpoint(block, x)
            )
        """
    )
    assert lint_tree(tmp_path, files_with(model)) == []


# -- a target ----------------------------------------------------------------------------------


def lint_for_target(root: Path, files: dict[str, str], target: str | None) -> list[tuple]:
    """The project's findings with the analysis deciding branches for ``target``: (path,
    line, column, code, fixable). Every module names ``checkpoint``, so one pass finds all."""
    for relative, source in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    table = SourceTable.build()
    paths = sorted(str(p) for p in root.rglob("*.py"))
    project = Project(Layout(paths), eager_words=table.words)
    target_torch = None if target is None else Version(target)
    analysis = ProjectAnalysis(project, table, target_torch=target_torch)
    found = []
    for path in paths:
        module = project.module_at(path)
        assert module is not None
        relative = Path(path).relative_to(root).as_posix()
        for f in analyze(module, analysis):
            found.append((relative, f.line, f.column, f.code, f.fix is not None))
    return sorted(found)


OLD_AND_NEW = {
    "pkg/__init__.py": "",
    "pkg/utils.py": textwrap.dedent(UTILS) + "\nfrom torch.utils.checkpoint import checkpoint\n",
    "pkg/model.py": """
        import torch
        from torch.utils.checkpoint import checkpoint

        from pkg.utils import is_torch_version

        CALLS = []

        if is_torch_version("<", "2.0"):
            run = checkpoint
        else:
            import functools

            run = functools.partial(checkpoint, use_reentrant=False)


        def block(x):
            if torch.__version__ < "2.0":
                CALLS.append(1)
            return x * 2


        def forward(x):
            if is_torch_version(">=", "1.11.0"):
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = checkpoint(block, x)
            return run(block, x) + checkpoint(block, x)
    """,
}


def test_without_a_target_every_branch_may_run(tmp_path: Path) -> None:
    """Only CKP001 skips the ``else`` for torch < 1.11 (line 27): the keyword does not exist
    there. ``block`` may append (torch < 2.0), ``run`` may be ``checkpoint`` itself."""
    assert lint_for_target(tmp_path, OLD_AND_NEW, None) == [
        ("pkg/model.py", 25, 13, "CKP203", False),
        ("pkg/model.py", 27, 13, "CKP203", False),
        ("pkg/model.py", 28, 12, "CKP001", True),
        ("pkg/model.py", 28, 12, "CKP203", False),
        ("pkg/model.py", 28, 28, "CKP001", True),
        ("pkg/model.py", 28, 28, "CKP203", False),
    ]


def test_branches_the_target_never_runs_are_no_code(tmp_path: Path) -> None:
    """On torch 2.1 the ``< 2.0`` branches never run: ``run`` is the partial, ``block``
    appends nothing, the ``else`` call for torch < 1.11 does not exist."""
    assert lint_for_target(tmp_path, OLD_AND_NEW, "2.1") == [
        ("pkg/model.py", 28, 28, "CKP001", True),
    ]


def test_a_target_older_than_use_reentrant_gets_no_fix(tmp_path: Path) -> None:
    """A project that supports torch 1.9 gets its CKP001 findings without the fix that
    would break it there; every branch may run."""
    assert lint_for_target(tmp_path, OLD_AND_NEW, "1.9") == [
        ("pkg/model.py", 25, 13, "CKP203", False),
        ("pkg/model.py", 27, 13, "CKP203", False),
        ("pkg/model.py", 28, 12, "CKP001", False),
        ("pkg/model.py", 28, 12, "CKP203", False),
        ("pkg/model.py", 28, 28, "CKP001", False),
        ("pkg/model.py", 28, 28, "CKP203", False),
    ]


def test_target_torch_from_the_configuration_reaches_the_analysis(tmp_path: Path) -> None:
    files = {**OLD_AND_NEW, "pyproject.toml": '[tool.ckptlint]\ntarget-torch = "2.1"\n'}
    found = lint_tree(tmp_path, files, target_torch="2.1")
    assert found == [("pkg/model.py", 28, 28, "CKP001")]
