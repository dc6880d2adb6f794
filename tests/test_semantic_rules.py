"""The semantic rules (CKP101, CKP201, CKP202, CKP203, CKP301) on the traps that make a
linter cry wolf, on what they must catch, and through flake8."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import SUBPROCESS_TIMEOUT, lint, messages_of, run_ckptlint

SEMANTIC = ("CKP101", "CKP201", "CKP202", "CKP203", "CKP301")


def semantic_codes(source: str) -> list[str]:
    return [f.code for f in lint(textwrap.dedent(source), select=SEMANTIC)]


# The traps that must not be reported and the forms that must, as exact cases (line,
# column, code): tests/fixtures/rules/CKP101, CKP201, CKP202, CKP203, CKP301.


def test_mutable_global_message_names_global_and_both_lines() -> None:
    source = """\
from torch.utils.checkpoint import checkpoint

SCALE = 1.0

def set_scale(value):
    global SCALE
    SCALE = value

def block(x):
    return x.relu() * SCALE + x

def forward(x):
    return checkpoint(block, x, use_reentrant=False)
"""
    [finding] = lint(source, select=("CKP201",))
    assert finding.line == 13
    assert "`SCALE`" in finding.message
    assert "(line 10)" in finding.message  # where the region reads it
    assert "changed at line 7" in finding.message
    assert "functools.partial" in finding.message  # what to write instead


def test_mutable_state_of_another_module_is_named_with_the_place_that_changes_it(
    tmp_path: Path,
) -> None:
    """A class attribute and an imported registry, each changed by a training loop in a
    third module: the message says what is read, where, and the file and line of the write."""
    files = {
        "pyproject.toml": "[tool.ckptlint]\n",
        "pkg/__init__.py": "",
        "pkg/config.py": "class Config:\n    scale = 1.0\n\nREGISTRY = {}\n",
        "pkg/model.py": """\
            from torch.utils.checkpoint import checkpoint

            from .config import REGISTRY, Config

            def block(x):
                return REGISTRY["act"](x) * Config.scale

            def forward(x):
                return checkpoint(block, x, use_reentrant=False)
            """,
        "pkg/train.py": """\
            from .config import REGISTRY, Config

            def step(model, x, i):
                loss = model(x).sum()
                Config.scale = 1.0 / (i + 1)
                REGISTRY["act"] = lambda h: h * i
                loss.backward()
            """,
    }
    train = tmp_path / "pkg" / "train.py"
    messages = sorted(messages_of(tmp_path, files, select=("CKP201",)))
    assert [m.split(": the recompute")[0] for m in messages] == [
        "`checkpoint()` region reads class attribute `Config.scale` (line 6), which is changed"
        f" at {train}:5",
        f"`checkpoint()` region reads module global `REGISTRY` (line 6), which is changed at"
        f" {train}:6",
    ]


def test_tiny_region_message_names_each_op_a_list_filled_in_a_loop_may_hold() -> None:
    source = """\
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.parts = nn.ModuleList()
        for part in (nn.LayerNorm(8), nn.GELU(), nn.Dropout(0.1)):
            self.parts.append(part)

    def forward(self, x):
        for part in self.parts:
            x = checkpoint(part, x, use_reentrant=False)
        return x
"""
    [finding] = lint(source, select=("CKP101",))
    assert (finding.line, finding.column) == (13, 17)
    assert finding.message == (
        "`checkpoint()` region is a single cheap op (`nn.LayerNorm`, `nn.GELU` or"
        " `nn.Dropout`): its input stays alive as the checkpoint input, so the checkpoint"
        " saves (almost) no memory and adds a recompute; call it directly or checkpoint a"
        " larger block containing it"
    )


def test_late_binding_message_names_variable_and_loop() -> None:
    source = """\
from torch.utils.checkpoint import checkpoint

def forward(self, x):
    for layer in self.layers:
        x = checkpoint(lambda h: layer(h), x, use_reentrant=False)
    return x
"""
    [finding] = lint(source, select=("CKP202",))
    assert "`layer`" in finding.message and "loop at line 4" in finding.message
    assert "layer=layer" in finding.message


IN_PLACE = """\
from torch.utils.checkpoint import checkpoint

def forward(self, x, cfg, **kwargs):
    for index, layer in enumerate(self.layers):
        window = index % 2 == 0
        {change}

        def make_forward(module):
            def custom_forward(*inputs):
                return module(*inputs, {read})

            return custom_forward

        x = checkpoint(make_forward(layer), x, use_reentrant=False)
    return x
"""


@pytest.mark.parametrize(
    ("change", "read", "flagged"),
    [
        ('kwargs["window"] = window', "**kwargs", True),
        ('kwargs["window"] = window', 'kwargs["window"]', True),
        ('kwargs["window"] = window', 'window=kwargs.get("window")', True),
        ("kwargs.update(window=window)", "**kwargs", True),
        ("cfg.window = window", "cfg.window", True),
        ('kwargs["calls"] += 1', "**kwargs", True),
        ('kwargs["window"] = window', 'kwargs["mask"]', False),  # another item
        ("cfg.window = window", "cfg.mask", False),  # another attribute
        ('kwargs["mask"] = self.mask', "**kwargs", False),  # the same value every iteration
    ],
)
def test_late_binding_of_an_object_changed_in_place(change: str, read: str, flagged: bool) -> None:
    """The loop changes, in place, what the region reads through its closure: the recompute
    sees the object's last state (unsloth's Gemma2 path updates ``kwargs`` per layer)."""
    source = IN_PLACE.format(change=change, read=read)
    found = lint(source, select=("CKP202",))
    if not flagged:
        assert found == [], source
        return
    [finding] = found
    assert (finding.line, finding.column) == (14, 13)
    name = "cfg" if change.startswith("cfg") else "kwargs"
    assert f"reads `{name}` (line 10)" in finding.message
    assert "loop at line 4 changes it in place (line 6)" in finding.message
    assert "sees the last state" in finding.message


def test_noqa_silences_a_semantic_finding() -> None:
    source = """\
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

def forward(x):
    return checkpoint(F.gelu, x, use_reentrant=False)  # noqa: CKP101
"""
    assert lint(source) == []


# -- random compositions -----------------------------------------------------------------

UNARY_OPS = ["torch.relu({})", "F.gelu({})", "torch.tanh({})", "{}.sigmoid()", "-{}"]
BINARY_OPS = ["{} * {}", "{} + {}", "torch.mul({}, {})"]


@st.composite
def expressions(draw: st.DrawFn, depth: int) -> tuple[str, int]:
    """An expression over ``h`` and ``v`` and how many ops it applies."""
    if depth == 0 or draw(st.booleans()):
        return draw(st.sampled_from(["h", "v"])), 0
    if draw(st.booleans()):
        inner, ops = draw(expressions(depth - 1))
        return draw(st.sampled_from(UNARY_OPS)).format(inner), ops + 1
    left, left_ops = draw(expressions(depth - 1))
    right, right_ops = draw(expressions(depth - 1))
    return draw(st.sampled_from(BINARY_OPS)).format(left, right), left_ops + right_ops + 1


@settings(max_examples=60, deadline=None)
@given(
    body=expressions(3),
    form=st.sampled_from(["lambda", "def"]),
    binding=st.sampled_from(["closure", "default", "partial"]),
)
def test_random_regions(body: tuple[str, int], form: str, binding: str) -> None:
    """One op is tiny, several are not; a loop variable read through the closure is late
    bound, one bound by a default argument or a partial is not."""
    expression, ops = body
    parameters = {"closure": "h", "default": "h, v=v", "partial": "h, v"}[binding]
    if form == "lambda":
        region = f"(lambda {parameters}: {expression})"
        made = ""
    else:
        region = "block"
        made = f"        def block({parameters}):\n            return {expression}\n"
    if binding == "partial":
        region = f"functools.partial({region}, v=v)"
    source = (
        "import functools\n"
        "import torch\n"
        "import torch.nn.functional as F\n"
        "from torch.utils.checkpoint import checkpoint\n\n"
        "def forward(x, values):\n"
        "    for v in values:\n"
        f"{made}"
        f"        x = checkpoint({region}, x, use_reentrant=False)\n"
        "    return x\n"
    )
    found = semantic_codes(source)
    assert ("CKP101" in found) == (ops == 1), source
    names = {n.id for n in ast.walk(ast.parse(expression)) if isinstance(n, ast.Name)}
    late = binding == "closure" and "v" in names
    assert ("CKP202" in found) == late, source


# -- flake8 and the command line agree ---------------------------------------------------

EVERY_RULE = textwrap.dedent(
    """\
    import functools
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint

    STEPS = 0
    SCALE = 1.0


    def set_scale(value):
        global SCALE
        SCALE = value


    def counted(x):
        global STEPS
        STEPS += 1
        return x.relu() * 2 + x


    def scaled(x):
        return x.relu() * SCALE + x


    def noisy(x):
        return x + torch.randn_like(x)


    def forward(x, layers):
        x = checkpoint(F.gelu, x, use_reentrant=False)
        x = checkpoint(scaled, x, use_reentrant=False)
        for layer in layers:
            x = checkpoint(lambda h: layer(h) + h, x, use_reentrant=False)
        x = checkpoint(counted, x, use_reentrant=False)
        x = checkpoint(noisy, x, use_reentrant=False, preserve_rng_state=False)
        return checkpoint(noisy, x)
    """
)


def test_flake8_and_cli_report_the_same_semantic_findings(project: Path) -> None:
    (project / "model.py").write_text(EVERY_RULE)
    result = subprocess.run(
        [sys.executable, "-m", "flake8", "--select", "CKP", "model.py"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
    )
    from_flake8 = [tuple(line.split(" ", 2)[:2]) for line in result.stdout.splitlines()]
    cli = json.loads(run_ckptlint("--format", "json", "model.py", cwd=project).stdout)
    from_cli = [(f"model.py:{i['line']}:{i['column']}:", i["code"]) for i in cli]
    assert from_flake8 == from_cli
    assert {code for _, code in from_cli} == {"CKP001", *SEMANTIC}


def test_memo_and_lazy_initialisation_are_not_side_effects() -> None:
    source = """
        from torch.utils.checkpoint import checkpoint

        _MASKS = {}
        _KERNEL = None

        def load_kernel():
            global _KERNEL
            if _KERNEL is None:
                _KERNEL = compile_kernel()
            return _KERNEL

        def causal_mask(n):
            if n not in _MASKS:
                _MASKS[n] = build_mask(n)
            return _MASKS[n]

        def block(x):
            return load_kernel()(x, causal_mask(x.shape[0])) + x

        def forward(x):
            return checkpoint(block, x, use_reentrant=False)
        """
    assert semantic_codes(source) == []


@pytest.mark.parametrize(
    ("call", "codes"),
    [
        ("initialize_tracker()", []),
        ("initialize_tracker(force_reset=False)", []),
        ("initialize_tracker(None, False)", []),
        ("initialize_tracker(force_reset=True)", ["CKP203"]),
        ("initialize_tracker(None, True)", ["CKP203"]),
        ("initialize_tracker(**options)", ["CKP203"]),
        ("Holder().initialize(True)", ["CKP203"]),
        ("Holder().initialize()", []),
    ],
)
def test_a_branch_behind_a_false_default_runs_only_for_callers_that_pass_it(
    call: str, codes: list[str]
) -> None:
    source = f"""
        from torch.utils.checkpoint import checkpoint

        _TRACKER = None

        def initialize_tracker(kind=None, force_reset=False):
            global _TRACKER
            if force_reset:
                _TRACKER = None

        class Holder:
            def initialize(self, force_reset=False):
                global _TRACKER
                if force_reset:
                    _TRACKER = None

        def block(x, options):
            {call}
            return x * 2

        def forward(x):
            return checkpoint(block, x, {{}}, use_reentrant=False)
        """
    assert semantic_codes(source) == codes


def test_a_method_a_subclass_overrides_is_unknown() -> None:
    source = """
        import torch.nn as nn
        from torch.utils.checkpoint import checkpoint

        class Base(nn.Module):
            def __init__(self):
                super().__init__()
                self.act = nn.GELU()

            def _block(self, x):
                return self.act(x)

            def forward(self, x):
                x = checkpoint(self._block, x, use_reentrant=False)
                return checkpoint(self.act, x, use_reentrant=False)

        class Deep(Base):
            def __init__(self):
                super().__init__()
                self.act = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8))

            def _block(self, x):
                h = self.act(x)
                return self.act(h) + x
        """
    assert semantic_codes(source) == []
