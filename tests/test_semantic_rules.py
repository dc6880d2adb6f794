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

from tests.conftest import lint, run_ckptlint

SEMANTIC = ("CKP101", "CKP201", "CKP202", "CKP203", "CKP301")


def semantic_codes(source: str) -> list[str]:
    return [f.code for f in lint(textwrap.dedent(source), select=SEMANTIC)]


# -- traps: nothing of these is a finding ------------------------------------------------

NOT_FINDINGS = {
    "loop variable bound by a default argument": """
        from torch.utils.checkpoint import checkpoint

        def forward(self, x):
            for i, layer in enumerate(self.layers):
                x = checkpoint(lambda h, layer=layer, i=i: layer(h) * i, x, use_reentrant=False)
            return x
        """,
    "loop variable bound by functools.partial": """
        import functools
        from torch.utils.checkpoint import checkpoint

        def forward(self, x):
            for layer in self.layers:
                def run(h, layer):
                    return layer(h) + h
                x = checkpoint(functools.partial(run, layer=layer), x, use_reentrant=False)
            return x
        """,
    "loop variable bound by a factory parameter": """
        from torch.utils.checkpoint import checkpoint

        def forward(self, x, output_attentions):
            for layer_module in self.layers:
                def create_custom_forward(module):
                    def custom_forward(*inputs):
                        return module(*inputs, output_attentions)
                    return custom_forward
                x = checkpoint(create_custom_forward(layer_module), x, use_reentrant=False)
            return x
        """,
    "the region is the loop variable itself": """
        from torch.utils.checkpoint import checkpoint

        def forward(self, x):
            for layer in self.layers:
                x = checkpoint(layer, x, use_reentrant=False)
            return x
        """,
    "loop rebinds a name to one constant before the call": """
        from torch.utils.checkpoint import checkpoint

        def forward(self, x, use_cache):
            for layer in self.layers:
                if use_cache:
                    use_cache = False
                def create_custom_forward(module):
                    def custom_forward(*inputs):
                        return module(*inputs, use_cache=use_cache)
                    return custom_forward
                x = checkpoint(create_custom_forward(layer), x, use_reentrant=False)
            return x
        """,
    "the loop runs the backward in the same iteration": """
        from torch.utils.checkpoint import checkpoint

        def train(model, batches):
            for batch in batches:
                loss = checkpoint(lambda h: model(h, batch.mask), batch.x, use_reentrant=False)
                loss.backward()
        """,
    "a helper def made again in each iteration": """
        from torch.utils.checkpoint import checkpoint

        def forward(self, x):
            for layer in self.layers:
                def unwrap(h):
                    return h.elem if hasattr(h, "elem") else h
                x = checkpoint(lambda h: unwrap(h).relu() * 2, x, use_reentrant=False)
            return x
        """,
    "region made in a loop but checkpointed after it": """
        from torch.utils.checkpoint import checkpoint

        def forward(self, x):
            for scale in (1.0, 2.0):
                def block(h):
                    return self.layer(h) * scale
            return checkpoint(block, x, use_reentrant=False)
        """,
    "constants bound once and imports are not mutable globals": """
        import math
        import torch
        from torch.utils.checkpoint import checkpoint

        HIDDEN = 64
        ACTIVATIONS = {"gelu": torch.nn.functional.gelu}

        def block(x):
            h = ACTIVATIONS["gelu"](x) * math.sqrt(HIDDEN)
            return torch.tanh(h) + h

        def forward(x):
            return checkpoint(block, x, use_reentrant=False)
        """,
    "relative imports are not mutable globals": """
        from torch.utils.checkpoint import checkpoint
        from .virtualized import V

        def set_handler(handler):
            V.handler = handler

        def block(x):
            return V.handler(x) + x

        def forward(x):
            return checkpoint(block, x, use_reentrant=False)
        """,
    "a registry filled at import time": """
        from torch.utils.checkpoint import checkpoint

        REGISTRY = {}

        def register(cls):
            REGISTRY[cls.__name__] = cls
            return cls

        @register
        class Gelu:
            pass

        def block(x):
            return REGISTRY["Gelu"]()(x) + x

        def forward(x):
            return checkpoint(block, x, use_reentrant=False)
        """,
    "a local variable named like a changed global": """
        from torch.utils.checkpoint import checkpoint

        SCALE = 1.0

        def set_scale(value):
            global SCALE
            SCALE = value

        def block(x, SCALE=2.0):
            return x.relu() * SCALE + x

        def forward(x):
            return checkpoint(block, x, use_reentrant=False)
        """,
    "nn.Sequential of several layers": """
        import torch.nn as nn
        from torch.utils.checkpoint import checkpoint

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.mlp = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8))

            def forward(self, x):
                return checkpoint(self.mlp, x, use_reentrant=False)
        """,
    "a method of several statements": """
        import torch.nn as nn
        from torch.utils.checkpoint import checkpoint

        class Block(nn.Module):
            def _block(self, x):
                h = self.fc1(x)
                return self.fc2(self.act(h))

            def forward(self, x):
                return checkpoint(self._block, x, use_reentrant=False)
        """,
    "a lambda of two ops": """
        import torch
        from torch.utils.checkpoint import checkpoint

        def forward(x, w):
            return checkpoint(lambda h: torch.relu(h @ w), x, use_reentrant=False)
        """,
    "unknown regions": """
        from torch.utils.checkpoint import checkpoint
        from mylib import make_block

        def forward(self, x, fn):
            x = checkpoint(fn, x, use_reentrant=False, preserve_rng_state=False)
            x = checkpoint(make_block(), x, use_reentrant=False, preserve_rng_state=False)
            x = checkpoint(self.blocks[0], x, use_reentrant=False, preserve_rng_state=False)
            return checkpoint(getattr(self, "block"), x, use_reentrant=False)
        """,
    "a module attribute assigned twice is unknown": """
        import torch.nn as nn
        from torch.utils.checkpoint import checkpoint

        class Block(nn.Module):
            def __init__(self, config):
                super().__init__()
                if config.gelu:
                    self.act = nn.GELU()
                else:
                    self.act = make_activation(config)

            def forward(self, x):
                return checkpoint(self.act, x, use_reentrant=False)
        """,
    "dropout with rng state preserved, or with p=0": """
        import torch.nn as nn
        import torch.nn.functional as F
        from torch.utils.checkpoint import checkpoint

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(8, 8)
                self.drop = nn.Dropout(0.0)

            def _a(self, x):
                return self.drop(self.fc(x)) + x

            def _b(self, x):
                return F.dropout(self.fc(x), 0.1) + x

            def forward(self, x):
                x = checkpoint(self._a, x, use_reentrant=False, preserve_rng_state=False)
                return checkpoint(self._b, x, use_reentrant=False)
        """,
    "the region's local containers": """
        from torch.utils.checkpoint import checkpoint

        def block(x):
            outputs = []
            outputs.append(x.relu())
            outputs.append(x.tanh())
            return sum(outputs)

        def forward(x):
            return checkpoint(block, x, use_reentrant=False)
        """,
    "a global changed only by seeding and initialisation functions": """
        from torch.utils.checkpoint import checkpoint

        _TRACKER = None
        _SEED = 0

        def initialize_tracker(force_reset=False):
            global _TRACKER
            if force_reset:
                _TRACKER = None
            if _TRACKER is None:
                _TRACKER = make_tracker()

        def get_tracker():
            initialize_tracker()
            return _TRACKER

        def manual_seed(seed):
            global _SEED
            _SEED = seed
            initialize_tracker(force_reset=True)

        def block(x):
            return get_tracker().fork(x + _SEED)

        def forward(x):
            return checkpoint(block, x, use_reentrant=False)
        """,
    "look-alike checkpoint methods": """
        COUNT = 0

        def block(x):
            global COUNT
            COUNT += 1
            return x.relu()

        class Trainer:
            def step(self, trainer, x):
                trainer.save_checkpoint(block)
                return self.checkpoint(block, x)
        """,
}


@pytest.mark.parametrize("source", NOT_FINDINGS.values(), ids=NOT_FINDINGS.keys())
def test_trap_is_not_reported(source: str) -> None:
    assert semantic_codes(source) == []


# -- what must be caught -----------------------------------------------------------------

FINDINGS = {
    "CKP101 nn.GELU assigned in __init__ through a one-line method": (
        """
        import torch.nn as nn
        from torch.utils.checkpoint import checkpoint

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.act = nn.GELU()

            def _act(self, x):
                \"\"\"Activation.\"\"\"
                return self.act(x)

            def forward(self, x):
                return checkpoint(self._act, x, use_reentrant=False)
        """,
        "CKP101",
    ),
    "CKP101 torch function through functools.partial": (
        """
        import functools
        import torch.nn.functional as F
        from torch.utils.checkpoint import checkpoint

        def forward(x):
            return checkpoint(functools.partial(F.dropout, p=0.1), x, use_reentrant=False)
        """,
        "CKP101",
    ),
    "CKP101 a factory's product calling a cheap module": (
        """
        import torch.nn as nn
        from torch.utils.checkpoint import checkpoint

        def create_custom_forward(module):
            def custom_forward(*inputs):
                return module(*inputs)
            return custom_forward

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.norm = nn.LayerNorm(8)

            def forward(self, x):
                return checkpoint(create_custom_forward(self.norm), x, use_reentrant=False)
        """,
        "CKP101",
    ),
    "CKP101 a method factory's product calling a cheap module": (
        """
        import torch.nn as nn
        from torch.utils.checkpoint import checkpoint

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.act = nn.SiLU()

            def _wrap(self, module):
                def run(*inputs):
                    return module(*inputs)
                return run

            def forward(self, x):
                return checkpoint(self._wrap(self.act), x, use_reentrant=False)
        """,
        "CKP101",
    ),
    "CKP301 dropout attribute also assigned by an unrelated class": (
        """
        import torch.nn as nn
        from torch.utils.checkpoint import checkpoint

        class Embeddings(nn.Module):
            def __init__(self):
                super().__init__()
                self.dropout = nn.Identity()

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(8, 8)
                self.dropout = nn.Dropout(0.1)

            def _block(self, x):
                return self.dropout(self.fc(x)) + x

            def forward(self, x):
                return checkpoint(self._block, x, use_reentrant=False, preserve_rng_state=False)
        """,
        "CKP301",
    ),
    "CKP202 comprehension variable": (
        """
        from torch.utils.checkpoint import checkpoint

        def forward(self, x, scales):
            return [checkpoint(lambda h: self.f(h) * s, x, use_reentrant=False) for s in scales]
        """,
        "CKP202",
    ),
    "CKP201 global read two calls deep, changed by augmented assignment": (
        """
        from torch.utils.checkpoint import checkpoint

        TEMPERATURE = 1.0

        def anneal():
            global TEMPERATURE
            TEMPERATURE *= 0.9

        def scaled(x):
            return x / TEMPERATURE

        def inner(x):
            return scaled(x).softmax(-1) @ x

        def block(x):
            return inner(x) + x

        def forward(x):
            return checkpoint(block, x, use_reentrant=False)
        """,
        "CKP201",
    ),
    "CKP201 global mutated by a method call": (
        """
        from torch.utils.checkpoint import checkpoint

        MASKS = []

        def add_mask(mask):
            MASKS.append(mask)

        def block(x):
            return x.masked_fill(MASKS[-1], 0.0) + x

        def forward(x):
            return checkpoint(block, x, use_reentrant=False)
        """,
        "CKP201",
    ),
    "CKP203 item assignment two calls deep": (
        """
        from torch.utils.checkpoint import checkpoint

        STATS = {}

        def record(name, h):
            STATS[name] = h.mean().item()

        def inner(x):
            h = x.relu()
            record("inner", h)
            return h

        def block(x):
            return inner(x) * 2

        def forward(x):
            return checkpoint(block, x, use_reentrant=False)
        """,
        "CKP203",
    ),
    "CKP301 dropout module of a class of this file": (
        """
        import torch.nn as nn
        from torch.utils.checkpoint import checkpoint

        class Mlp(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(8, 8)
                self.drop = nn.Dropout(0.1)

            def forward(self, x):
                return self.drop(self.fc(x).relu())

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.mlp = Mlp()

            def forward(self, x):
                return checkpoint(self.mlp, x, use_reentrant=False, preserve_rng_state=False)
        """,
        "CKP301",
    ),
    "CKP301 in-place sampler through a partial of checkpoint": (
        """
        import functools
        from torch.utils.checkpoint import checkpoint

        run = functools.partial(checkpoint, use_reentrant=False, preserve_rng_state=False)

        def noisy(x):
            return x + x.new_empty(x.shape).normal_() * 0.1

        def forward(x):
            return run(noisy, x)
        """,
        "CKP301",
    ),
}


@pytest.mark.parametrize(("source", "code"), FINDINGS.values(), ids=FINDINGS.keys())
def test_reported(source: str, code: str) -> None:
    assert semantic_codes(source) == [code]


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
        timeout=120,
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
