"""The analysis always ends, answers the same in any order, and one file's failure is that
file's finding (docs/analysis-semantics.md, "What the analysis promises").

- Generated packages (tests/generated_projects.py: mutual recursion through parameters and
  attributes, names that collide, star-import cycles, partials, decorators, edited
  ``**kwargs``) each end within a fixed amount of work, counted in answers computed (no
  clock), with no internal error: 500 in the default run, 10,000 under ``-m slow``.
- Every file of a package, linted one at a time after the others in a random order by one
  engine (whose analysis is shared), gets the findings the whole-tree run gives it.
- A region that is too deeply nested to analyse, a body that does not parse and a chain of
  lookups past the analysis's limit each stay the finding of their own file: another file's
  finding is still reported and the run exits 1, not 2.
"""

from __future__ import annotations

import ast
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptlint import source
from ckptlint.analyser import Analyser
from ckptlint.config import Settings
from ckptlint.engine import Engine
from ckptlint.memos import clear_memos
from ckptlint.resolution.solver import TOO_DEEP, Solver
from tests.conftest import hang_guard, run_cli
from tests.generated_projects import hypothesis_chooser, project

# Answers a generated package may take: over 30x the most any of 2,000 seeded packages took
# (2,893; the median 197); one that loops, or whose contexts multiply, takes millions.
WORK_BUDGET = 100_000
# Only a hang outlives this: a generated package takes well under a second.
HANG_SECONDS = 120


def write(root: Path, files: dict[str, str]) -> list[str]:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return sorted(str(root / relative) for relative in files)


def findings_of(engine: Engine, paths: list[str]) -> dict[str, list[tuple[int, int, str, str]]]:
    found = {}
    for result in engine.lint(paths):
        assert result.internal_error is None, (result.path, result.internal_error)
        found[result.path] = [(f.line, f.column, f.code, f.message) for f in result.findings]
    return found


def check_generated(files: dict[str, str], order: list[int]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        paths = write(root, files)
        saved = os.getcwd()
        os.chdir(root)
        try:
            with hang_guard(HANG_SECONDS, "the analysis"):
                whole = Engine(Settings(root=root), paths, jobs=1)
                reference = findings_of(whole, paths)
                assert whole.work <= WORK_BUDGET, f"{whole.work} answers"
                # a few small modules hold no chain of 100 lookups: one is a context grown
                too_deep = [f for found in reference.values() for f in found if TOO_DEEP in f[3]]
                assert not too_deep, too_deep
                one_by_one = Engine(Settings(root=root), paths, jobs=1)
                for index in order:
                    path = paths[index % len(paths)]
                    assert findings_of(one_by_one, [path])[path] == reference[path], path
        finally:
            os.chdir(saved)


GENERATED = settings(
    max_examples=50,
    deadline=None,
    derandomize=True,  # the same examples every run; the campaign draws new ones
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@GENERATED
@given(data=st.data(), order=st.lists(st.integers(0, 100), min_size=1, max_size=8))
def test_generated_packages_end_and_answer_the_same_in_any_order(
    data: st.DataObject, order: list[int]
) -> None:
    check_generated(project(hypothesis_chooser(data)), order)


@pytest.mark.slow
@settings(GENERATED, max_examples=10_000, derandomize=False)
@given(data=st.data(), order=st.lists(st.integers(0, 100), min_size=1, max_size=8))
def test_campaign_generated_packages_end_and_answer_the_same_in_any_order(
    data: st.DataObject, order: list[int]
) -> None:
    check_generated(project(hypothesis_chooser(data)), order)


def test_the_nine_lines_of_issue_32_end() -> None:
    """A region calling a function that recurses through its parameter's attributes and a
    second function: each level made a new context, and the lookups multiplied."""
    files = {
        "wrap.py": (
            "from torch.utils.checkpoint import checkpoint\n\n"
            "def forward(x, layer):\n"
            "    return checkpoint(layer, x, use_reentrant=False)\n"
        ),
        "other.py": (
            "def first(region, analysis):\n"
            "    if region.kind:\n"
            "        return first(region.inner, analysis)\n"
            '    forward = analysis.member(region, "forward")\n'
            "    return second(forward, analysis)\n\n\n"
            "def second(function, analysis):\n"
            "    return first(analysis.evaluate(function), analysis)\n"
        ),
    }
    check_generated(files, [0, 1])


def test_the_generator_is_not_vacuous() -> None:
    """Its packages reach regions through their wrappers and decorators: across a few
    seeds they give findings of several rules."""
    from tests.generated_projects import random_chooser

    codes: set[str] = set()
    for seed in range(40):
        files = project(random_chooser(seed))
        with tempfile.TemporaryDirectory() as folder:
            root = Path(folder)
            paths = write(root, files)
            saved = os.getcwd()
            os.chdir(root)
            try:
                found = findings_of(Engine(Settings(root=root), paths, jobs=1), paths)
            finally:
                os.chdir(saved)
        codes.update(code for items in found.values() for _, _, code, _ in items)
    assert {"CKP001", "CKP201", "CKP202", "CKP203"} <= codes, codes


# -- one file's failure is that file's finding ------------------------------------------------
KNOWN = (
    "from torch.utils.checkpoint import checkpoint\n\n\n"
    "def forward(self, x):\n"
    "    return checkpoint(self.block, x)\n"
)


def lint_folder(root: Path, files: dict[str, str]) -> tuple[int, dict[str, list[str]]]:
    write(root, files)
    (root / ".git").mkdir()
    result = run_cli("--output-format", "json", "--no-cache", ".", cwd=root)
    import json

    found: dict[str, list[str]] = {}
    for item in json.loads(result.stdout):
        found.setdefault(item["path"], []).append(
            f"{item['line']}:{item['code']}:{item['message']}"
        )
    assert "internal error" not in result.stderr, result.stderr
    return result.returncode, found


def test_a_region_too_deep_to_analyse_is_its_files_finding(tmp_path: Path) -> None:
    terms = " + ".join(["x"] * 3000)
    deep = (
        "from torch.utils.checkpoint import checkpoint\n\n\n"
        f"def region(x):\n    return {terms}\n\n\n"
        "def forward(x):\n    return checkpoint(region, x, use_reentrant=False)\n"
    )
    code, found = lint_folder(tmp_path, {"deep.py": deep, "known.py": KNOWN})
    assert code == 1
    assert [f.split(":")[:2] for f in found["known.py"]] == [["5", "CKP001"]]
    (deep_finding,) = found["deep.py"]
    assert deep_finding.split(":")[1] == "CKP901" and "too deeply nested" in deep_finding


def test_a_body_that_does_not_parse_is_its_files_finding_only(tmp_path: Path) -> None:
    """Modules that star-import each other, two with an invalid expression in a function
    body that the others' analysis reads lazily: those two get CKP901 at the error, the
    rest their own findings (once every file got an internal error)."""
    broken = (
        "from torch.utils.checkpoint import checkpoint\n"
        "from pkg.{other} import *\n\n\n"
        "def helper_{name}(region):\n"
        "    x = {{'k': 1.region}}['k']\n"
        "    return region\n"
    )
    files = {
        "pkg/__init__.py": "",
        "pkg/a.py": broken.format(other="b", name="a"),
        "pkg/b.py": broken.format(other="c", name="b"),
        "pkg/c.py": (
            "from torch.utils.checkpoint import checkpoint\n"
            "from pkg.a import *\n\n\n"
            "def forward(self, x):\n"
            "    return checkpoint(helper_a(self.block), x)\n"
        ),
    }
    code, found = lint_folder(tmp_path, files)
    assert code == 1
    for name in ("pkg/a.py", "pkg/b.py"):
        (finding,) = found[name]
        assert finding.startswith("6:CKP901:syntax error"), finding
    assert [f.split(":")[:2] for f in found["pkg/c.py"]] == [["6", "CKP001"]]


def test_a_body_the_parser_gives_up_on_is_one_finding_at_its_definition(tmp_path: Path) -> None:
    """A method body of 5,000 attribute lookups in a row: CPython cannot build its tree
    (``RecursionError`` during ast construction), so neither can Python import the file. Read
    lazily (the whole folder) or whole (stdin), it is one CKP901 at the class, and the other
    file keeps its finding."""
    deep = (
        "from torch.utils.checkpoint import checkpoint\n\n\n"
        "def forward(self, x):\n"
        "    return checkpoint(self.block, x)\n\n\n"
        "class Deep:\n"
        "    def method(self, x):\n"
        f"        return x{'.a' * 5000}\n"
    )
    code, found = lint_folder(tmp_path, {"deep.py": deep, "known.py": KNOWN})
    assert code == 1
    assert [f.split(":")[:2] for f in found["known.py"]] == [["5", "CKP001"]]
    gave_up = "CKP901:too deeply nested to analyse: the parser gave up"
    assert found["deep.py"] == [
        f"8:{gave_up} (maximum recursion depth exceeded during ast construction)"
    ]
    one_file = run_cli("--no-cache", "deep.py", cwd=tmp_path)
    from_stdin = run_cli(
        "--no-cache", "--stdin-filename", "deep.py", "-", cwd=tmp_path, stdin=deep.encode()
    )
    for result in (one_file, from_stdin):
        assert result.returncode == 1, result.stderr
        assert result.stdout.splitlines()[0].startswith(
            f"deep.py:8:1: {gave_up.replace(':', ' ', 1)}"
        )


@pytest.mark.parametrize("other", ["None", "previous"])
def test_use_reentrant_through_thousands_of_conditionals_costs_a_bounded_amount(
    tmp_path: Path, other: str
) -> None:
    """``r1 = r0 if c else None`` ... 3,000 times (and ``r1 = r0 if c else r0``: two ways
    down at each step), then ``use_reentrant=r2999``: CKP001 follows it only so far and
    does not report it, and the same file's other call is still reported (once, following
    every branch ran out of stack and the file was one CKP901)."""
    chain = "".join(
        f"r{i} = r{i - 1} if c else {'None' if other == 'None' else f'r{i - 1}'}\n"
        for i in range(1, 3000)
    )
    text = (
        "import os\nfrom torch.utils.checkpoint import checkpoint\n\n"
        f"c = os.environ.get('X')\nr0 = None\n{chain}\n\n"
        "def decided(block, x):\n    return checkpoint(block, x, use_reentrant=r2999)\n\n\n"
        "def forward(block, x):\n    return checkpoint(block, x)\n"
    )
    code, found = lint_folder(tmp_path, {"conditionals.py": text})
    assert code == 1
    assert [f.split(":")[:2] for f in found["conditionals.py"]] == [["3012", "CKP001"]]


def test_a_chain_past_the_lookup_limit_is_its_files_finding(tmp_path: Path) -> None:
    """A region read through 150 assignments in a row: the lookup gives up (a CKP901 saying
    so, at the region whose analysis led into the chain) and the other file's finding
    stays; the note is the same when the file is linted alone."""
    chain = "".join(f"f{i} = f{i - 1}\n" for i in range(1, 150))
    long_chain = (
        "from torch.utils.checkpoint import checkpoint\n"
        "import torch.nn as nn\n\n"
        "f0 = nn.Dropout(0.5)\n"
        f"{chain}\n\n"
        "def forward(x):\n"
        "    return checkpoint(f149, x, use_reentrant=False, preserve_rng_state=False)\n"
    )
    code, found = lint_folder(tmp_path, {"chain.py": long_chain, "known.py": KNOWN})
    assert code == 1
    assert [f.split(":")[:2] for f in found["known.py"]] == [["5", "CKP001"]]
    assert [f.split(":")[:2] for f in found["chain.py"]] == [["157", "CKP901"]]
    assert "too deeply nested to analyse" in found["chain.py"][0]
    assert found["chain.py"][0].endswith("at line 157; findings that depend on it may be missing")
    alone = run_cli("--no-cache", "--isolated", "--output-format", "json", "chain.py", cwd=tmp_path)
    assert [f"{f['line']}:{f['code']}:{f['message']}" for f in json.loads(alone.stdout)] == (
        found["chain.py"]
    )


# -- the size limit counts what a question asks once ----------------------------------------
def _asked_thrice(solver: Solver, level: int) -> int:
    """A question at ``level`` asking the one below three times (a wrapper reading its
    callee's keywords, result and signature): 3**level uses, level + 1 answers."""
    if level == 0:
        return 1
    key = ("level", level - 1)
    return sum(solver.ask(key, _asked_thrice, solver, level - 1, fallback=0) for _ in range(3))


def test_a_question_asked_again_by_the_same_one_counts_once_against_the_size_limit() -> None:
    """Wrappers forwarding ``**kwargs`` through each other ask about the same callee several
    times: 60 levels are 3**60 uses but 61 answers, within a limit of 1,000 (the pinned
    trees' largest question fell from 796,418 to 39,668); a limit of 50 still stops it,
    whichever level was asked first."""
    solver = Solver(size_limit=1_000)
    with solver.unit() as unit:
        assert solver.ask(("top",), _asked_thrice, solver, 60, fallback=-1) == 3**60
    assert unit.faults == [] and solver.largest == 61
    for first in (None, 40, 5):
        small = Solver(size_limit=50)
        if first is not None:  # answers below the limit are kept: asked first, reused later
            small.ask(("level", first), _asked_thrice, small, first, fallback=-1)
        with small.unit() as unit:
            assert small.ask(("top",), _asked_thrice, small, 60, fallback=-1) == -1
        assert [fault.what for fault in unit.faults] == [
            "too much to analyse: it uses more than 50 answers"
        ]


def _cycle() -> tuple[Solver, list[str], Callable[[], object], Callable[[], object]]:
    """A solver and two questions asking each other (``a`` and ``b``), with a log of what
    was computed."""
    solver, computed = Solver(), []

    def a() -> object:
        computed.append("a")
        return ("a", solver.ask("b", b, fallback="b cut"))

    def b() -> object:
        computed.append("b")
        return ("b", solver.ask("a", a, fallback="a cut"))

    return solver, computed, a, b


def test_an_outermost_answer_that_met_a_cycle_is_reused_outermost_only() -> None:
    """Asked outermost again, a question whose cycle closed on itself is not computed again
    (every rule asks for a file's sites, whose answers meet cycles); the other question of
    the cycle, asked outermost, still enters it where it is asked, as in a fresh solver."""
    solver, computed, a, b = _cycle()
    assert solver.ask("a", a, fallback=None) == ("a", ("b", "a cut"))
    assert solver.ask("a", a, fallback=None) == ("a", ("b", "a cut"))
    assert computed == ["a", "b"]
    assert solver.ask("b", b, fallback=None) == ("b", ("a", "b cut"))
    fresh, _, _, fresh_b = _cycle()
    assert fresh.ask("b", fresh_b, fallback=None) == ("b", ("a", "b cut"))
    inner, computed, a, b = _cycle()
    inner.ask("a", a, fallback=None)
    assert inner.ask("top", lambda: inner.ask("a", a, fallback=None), fallback=None) == (
        "a",
        ("b", "a cut"),
    )
    assert computed == ["a", "b", "a", "b"]  # asked inside another question: computed again


def _isinstance_zoo(branches: int) -> str:
    """A method wrapping a module in one of ``branches`` ``elif isinstance(module, BlockN):``
    branches, each rebinding ``module`` with ``checkpoint_wrapper(...)``, and a last branch
    calling itself on each element of a ``ModuleList`` (a public model zoo's shape)."""
    lines = [
        "import torch.nn as nn",
        "from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (",
        "    checkpoint_wrapper,",
        ")",
        "",
    ]
    for index in range(branches):
        lines += [
            f"class Block{index}(nn.Module):",
            "    def __init__(self):",
            "        super().__init__()",
            "        self.drop = nn.Dropout(0.1)",
            "",
            "    def forward(self, x):",
            "        return self.drop(x) * 2",
            "",
        ]
    blocks = ", ".join(f"Block{index}()" for index in range(branches))
    lines += [
        "class Model(nn.Module):",
        "    def __init__(self, use_checkpoint):",
        "        super().__init__()",
        "        self.use_checkpoint = use_checkpoint",
        f"        self.layers = self._wrap(nn.ModuleList([{blocks}]))",
        "",
        "    def _wrap(self, module):",
    ]
    for index in range(branches):
        keyword = "if" if index == 0 else "elif"
        lines += [
            f"        {keyword} isinstance(module, Block{index}):",
            "            module = (",
            "                checkpoint_wrapper(module, preserve_rng_state=False)",
            "                if self.use_checkpoint",
            "                else module",
            "            )",
        ]
    lines += [
        "        elif isinstance(module, nn.ModuleList):",
        "            for j, m in enumerate(module):",
        "                module[j] = self._wrap(m)",
        "        return module",
    ]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("branches", [9, 20, 50])
def test_a_name_rebound_in_each_of_many_branches_is_analysed(branches: int, tmp_path: Path) -> None:
    """Issue 36: each branch reads ``module`` as the branches before it may have bound it,
    so the answers shared below grew exponentially when counted once per use ('too much to
    analyse' at 9 branches) and the chain of them passed the depth limit at 50. Branches of
    one ``if``/``elif`` chain are exclusive, and the size counts distinct answers: the
    regions are analysed (the blocks' dropout found through ``_wrap``), with no CKP901."""
    text = _isinstance_zoo(branches)
    (tmp_path / "zoo.py").write_text(text)
    result = run_cli("--no-cache", "--isolated", "--output-format", "json", "zoo.py", cwd=tmp_path)
    lines = text.splitlines()
    found = [
        (f["code"], lines[f["line"] - 1].index("self._wrap(") + 1 == f["column"])
        for f in json.loads(result.stdout)
    ]
    assert found and set(found) == {("CKP301", True)}, result.stdout


RECURSIVE_UNWRAP = """\
from torch.utils.checkpoint import checkpoint


def unwrap(model, recursive=False):
    if recursive:

        def _recursive_unwrap(module):
            if hasattr(module, "module"):
                unwrapped = _recursive_unwrap(module.module)
            else:
                unwrapped = module
            for name, child in unwrapped.named_children():
                setattr(unwrapped, name, _recursive_unwrap(child))
            return unwrapped

        model = _recursive_unwrap(model)
    return model


def run(block, x):
    return checkpoint(unwrap(block, recursive=True), x)
"""


def test_a_nested_function_calling_itself_is_analysed(tmp_path: Path) -> None:
    """accelerate 1.16's ``extract_model_from_parallel``: a nested function that calls
    itself was bound in the context of its previous activation, so each level's context
    held every level's parameters and the chain ran past the depth limit: a false CKP901,
    and the true CKP001 of the region lost."""
    (tmp_path / "unwrap.py").write_text(RECURSIVE_UNWRAP)
    result = run_cli(
        "--no-cache", "--isolated", "--output-format", "json", "unwrap.py", cwd=tmp_path
    )
    found = [(f["code"], f["line"], f["column"]) for f in json.loads(result.stdout)]
    assert found == [("CKP001", 21, 12)], result.stdout


SELF_DELEGATING = """\
import torch.nn as nn
from torch.utils.checkpoint import checkpoint


class Wrapper(nn.Module):
    def forward(self, x):
        return Wrapper(self)(x)


def run(x):
    return checkpoint(Wrapper(), x)
"""


def test_a_forward_delegating_to_its_own_class_is_analysed(tmp_path: Path) -> None:
    """CKP101 asks whether a region is one cheap op through the calls its body delegates
    to; a ``forward`` returning a new instance of its own class called it again without
    end: Python's recursion limit, a false CKP901, and the file's true CKP001 lost (found
    by the generated packages)."""
    (tmp_path / "wrapper.py").write_text(SELF_DELEGATING)
    result = run_cli(
        "--no-cache", "--isolated", "--output-format", "json", "wrapper.py", cwd=tmp_path
    )
    found = [(f["code"], f["line"], f["column"]) for f in json.loads(result.stdout)]
    assert found == [("CKP001", 11, 12)], result.stdout


@pytest.mark.parametrize(
    "declared", ["global ckpt", "if ready: global ckpt", "ready = 1; global ckpt"]
)
def test_a_global_bound_inside_a_method_is_known_whoever_asks_first(
    declared: str, tmp_path: Path
) -> None:
    """``checkpoint`` reaches ``hub.ckpt`` only through a method's ``global`` statement. The
    module's scopes are built with its bodies left for later, and the binding used to be
    known only once something asked for that method's scope: a run that computed the
    findings of hub.py first gave user.py a CKP001 that a run starting with user.py (a warm
    run where only user.py changed) did not."""
    files = {
        "hub.py": (
            "from torch.utils.checkpoint import checkpoint\n\nckpt = None\nready = 0\n\n\n"
            f"class Installer:\n    def install(self):\n        {declared}\n"
            "        ckpt = checkpoint\n"
        ),
        "user.py": "from hub import *\n\n\ndef forward(f, x):\n    return ckpt(f, x)\n",
    }
    paths = write(tmp_path, files)
    expected = [(5, 12, "CKP001")]
    engine = Engine(Settings(root=tmp_path), paths, jobs=1)
    state = engine._state_for({})  # discovery, in an analysis of its own
    for order in (paths, paths[::-1]):
        clear_memos()
        analyser = Analyser(engine.table, state.layout, state.snapshot, state.paths)
        analyser.use(state.words)
        for path in order:
            found = analyser.findings(path, fixes=False).findings
            if path.endswith("user.py"):
                assert [(f.line, f.column, f.code) for f in found] == expected, order


def test_a_lambda_a_function_binds_to_a_global_closes_over_that_function(
    tmp_path: Path,
) -> None:
    """``global step; step = lambda h: block(h)`` in a loop: the lambda reads ``block``
    from the function, whatever asked for ``step`` first. Evaluated through the global
    (as the module's exports do), the lambda was made in the module's scope, its own scope
    was kept with the module as parent, and CKP202 then found no ``block`` to be late
    bound: the finding depended on whether the exports ran first in the process."""
    files = {
        "hub.py": (
            "from torch.utils.checkpoint import checkpoint\n\nstep = None\n\n\n"
            "def forward(x, blocks):\n    global step\n    for block in blocks:\n"
            "        step = lambda h: block(h)\n"
            "        x = checkpoint(step, x, use_reentrant=False)\n    return x\n"
        ),
    }
    (path,) = write(tmp_path, files)
    engine = Engine(Settings(root=tmp_path), [path], jobs=1)
    state = engine._state_for({})
    for exports_first in (False, True):
        clear_memos()
        analyser = Analyser(engine.table, state.layout, state.snapshot, state.paths)
        analyser.use(state.words)
        if exports_first:
            analyser.exports(path)
        found = analyser.findings(path, fixes=False).findings
        assert [(f.line, f.code) for f in found] == [(10, "CKP202")], exports_first


# One module of N definitions (or statements) of one shape: its analysis must grow linearly
# in N. Each shape once cost time quadratic in N: bodies holding ``global`` are read at
# load, each parsed after as many blank lines as come before it; ``**kwargs`` edits and
# ``self.x = ...`` searches filtered every line naming the name in the module; chunks were
# tested against every line of interest; CKP401 walked a forward's every statement for
# each of its checkpointed layers; each use of a name the module rebinds in each of N
# branches evaluated the N bindings again.
def _repeated(text: str) -> Callable[[int], str]:
    return lambda count: "".join(text.format(i=i) for i in range(count))


def _checkpointed_layers(count: int) -> str:
    return (
        "class Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        + "".join(f"        self.l{i} = nn.Linear(4, 4)\n" for i in range(count))
        + "    def forward(self, x):\n"
        + "".join(
            f"        x = checkpoint(self.l{i}, x, use_reentrant=True)\n" for i in range(count)
        )
        + "        return x\n"
    )


GROWING_SHAPES: dict[str, Callable[[int], str]] = {
    "global_rebound": _repeated("def f{i}():\n    global X\n    X = {i}\n"),
    "method_global": _repeated(
        "class C{i}:\n    def m(self):\n        global X\n        X = {i}\n"
    ),
    "checkpoint_calls": _repeated("def f{i}(m, x):\n    return checkpoint(m, x)\n"),
    "kwargs_wrappers": _repeated("def f{i}(m, x, **kw):\n    return checkpoint(m, x, **kw)\n"),
    "global_per_function": _repeated("def f{i}():\n    global X{i}\n    X{i} = checkpoint\n"),
    "checkpointed_layers": _checkpointed_layers,
    "rebound_in_branches": _repeated(
        "if X:\n    ckpt = checkpoint\ndef f{i}(m, x):\n    return ckpt(m, x)\n"
    ),
}


def growing_module(shape: str, count: int) -> str:
    """A module of ``count`` definitions of ``shape``, ending in a call that is CKP001."""
    return (
        "from torch import nn\nfrom torch.utils.checkpoint import checkpoint\nX = 0\n"
        + GROWING_SHAPES[shape](count)
        + "def forward(m, x):\n    return checkpoint(m, x)\n"
    )


def work_to_lint(root: Path, shape: str, count: int) -> tuple[int, int, int, bool]:
    """Python lines run, characters parsed and characters searched for a word to lint one
    module of ``count`` definitions of ``shape`` (counted, not timed: the same on any
    machine), and whether the call at its last line got its CKP001."""
    text = growing_module(shape, count)
    (path,) = write(root, {f"{shape}_{count}.py": text})
    lines_run = parsed = searched = 0
    real_parse, real_search = ast.parse, source.word_starts

    def counting_parse(source: str, *args: object, **kwargs: object) -> ast.AST:
        nonlocal parsed
        parsed += len(source)
        return real_parse(source, *args, **kwargs)  # type: ignore[call-overload]

    def counting_search(text: str, word: str) -> Iterator[int]:
        nonlocal searched
        searched += len(text)
        return real_search(text, word)

    def trace(frame: object, event: str, arg: object) -> Callable[..., object]:
        nonlocal lines_run
        lines_run += event == "line"
        return trace

    clear_memos()
    engine = Engine(Settings(root=root), [path], jobs=1)
    ast.parse = counting_parse  # type: ignore[assignment]
    source.word_starts = counting_search  # type: ignore[assignment]
    sys.settrace(trace)
    try:
        (result,) = engine.lint([path])
    finally:
        sys.settrace(None)
        ast.parse, source.word_starts = real_parse, real_search
    last = (text.count("\n"), "CKP001")
    return lines_run, parsed, searched, last in [(f.line, f.code) for f in result.findings]


@pytest.mark.parametrize("shape", sorted(GROWING_SHAPES))
def test_a_module_of_many_definitions_costs_work_linear_in_their_number(
    shape: str, tmp_path: Path
) -> None:
    """Four times the definitions: at most 4.6 times the work by each count."""
    small = work_to_lint(tmp_path, shape, 400)
    large = work_to_lint(tmp_path, shape, 1600)
    assert small[-1] and large[-1]
    counts = ("lines run", "characters parsed", "characters searched")
    for name, few, many in zip(counts, small, large, strict=False):
        assert many <= 4.6 * few, f"{name}: {few} for 400 definitions, {many} for 1,600"
