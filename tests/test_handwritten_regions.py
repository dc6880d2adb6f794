"""Regions people write themselves, found as wrappers are, with their own semantics:

- a ``torch.autograd.Function`` that runs a function under ``no_grad`` in ``forward`` and
  again in ``backward`` (fairscale's and fairseq's ``CheckpointFunction``): ``C.apply`` is a
  source; it restores the RNG state only if its code saves and sets it back; it takes no
  ``use_reentrant``;
- a decorator that puts a method under checkpoint (nanotron's ``@checkpoint_method``):
  the decorated ``def`` is the site, the decorator's own checkpoint call decides the rest;
- a module class whose ``forward`` checkpoints the module it was given (MONAI's
  ``ActivationCheckpointWrapper``): constructing one is the site.

Each fixture is a multi-file package; the recompute Functions are also run with torch to
show that what the rules say about them is what happens.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import SUBPROCESS_TIMEOUT, lint_tree, messages_of

RECOMPUTE = """
    import torch
    from torch.utils.checkpoint import detach_variable


    def get_rng_state():
        return torch.get_rng_state()


    def set_rng_state(state):
        torch.set_rng_state(state)


    class CheckpointFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, run_function, *args):
            ctx.run_function = run_function
            ctx.fwd_rng_state = get_rng_state()
            ctx.save_for_backward(*args)
            with torch.no_grad():
                return run_function(*args)

        @staticmethod
        def backward(ctx, *grads):
            inputs = detach_variable(ctx.saved_tensors)
            state = get_rng_state()
            set_rng_state(ctx.fwd_rng_state)
            with torch.enable_grad():
                outputs = ctx.run_function(*inputs)
            set_rng_state(state)
            torch.autograd.backward(outputs, grads)
            return (None, *[x.grad for x in inputs])


    class NoRngFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, run_function, *args):
            ctx.run_function = run_function
            ctx.save_for_backward(*args)
            with torch.no_grad():
                return run_function(*args)

        @staticmethod
        def backward(ctx, *grads):
            inputs = detach_variable(ctx.saved_tensors)
            with torch.enable_grad():
                outputs = ctx.run_function(*inputs)
            torch.autograd.backward(outputs, grads)
            return (None, *[x.grad for x in inputs])


    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, factor):
            ctx.factor = factor
            return x * factor

        @staticmethod
        def backward(ctx, grad):
            return grad * ctx.factor, None


    def checkpointed(function, *args):
        return CheckpointFunction.apply(function, *args)
"""

BLOCKS = """
    import torch.nn as nn

    STEPS = []


    class Drops(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(4, 4)
            self.drop = nn.Dropout(0.5)

        def forward(self, x):
            return self.drop(self.linear(x))


    class Counts(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(4, 4)

        def forward(self, x):
            STEPS.append(1)
            return self.linear(x).relu() * 2
"""

USES = """
    from mylib.recompute import CheckpointFunction, NoRngFunction, Scale, checkpointed
    from pkg.blocks import Counts, Drops


    def forward(drops: Drops, counts: Counts, x):
        x = CheckpointFunction.apply(drops, x)
        x = NoRngFunction.apply(drops, x)
        x = checkpointed(drops, x)
        x = CheckpointFunction.apply(counts, x)
        return Scale.apply(x, 2.0)
"""


def recompute_package() -> dict[str, str]:
    return {
        "mylib/__init__.py": "",
        "mylib/recompute.py": RECOMPUTE,
        "pkg/__init__.py": "",
        "pkg/blocks.py": BLOCKS,
        "pkg/uses.py": USES,
    }


def test_a_recompute_function_is_a_region_source(tmp_path: Path) -> None:
    """Only the Function that does not set the RNG state back gets CKP301; a side effect
    runs twice under any of them (CKP203); none takes ``use_reentrant`` (no CKP001); a
    Function that recomputes nothing (``Scale``) is no source."""
    assert lint_tree(tmp_path, recompute_package()) == [
        ("pkg/uses.py", 8, 9, "CKP301"),
        ("pkg/uses.py", 10, 9, "CKP203"),
    ]
    message = messages_of(tmp_path, recompute_package())[0].replace(f"{tmp_path}/", "")
    assert message.startswith(
        "`NoRngFunction.apply()` region runs under `NoRngFunction.apply`, which does not"
        " restore the RNG state, and draws random numbers (`nn.Dropout` at pkg/blocks.py:11)"
    )


RUN = """
import torch
from mylib.recompute import CheckpointFunction, NoRngFunction
from pkg.blocks import Drops

def grads(function):
    torch.manual_seed(0)
    block, x = Drops(), torch.randn(8, 4, requires_grad=True)
    torch.manual_seed(1)
    out = block(x) if function is None else function.apply(block, x)
    out.sum().backward()
    return block.linear.weight.grad

plain = grads(None)
print(torch.equal(plain, grads(CheckpointFunction)), torch.equal(plain, grads(NoRngFunction)))
"""


@pytest.mark.torch
def test_what_the_rules_say_is_what_torch_does(tmp_path: Path) -> None:
    """Gradients through the Function that restores RNG equal the unchecked ones, those
    through the one that does not differ (its recompute draws another dropout mask)."""
    lint_tree(tmp_path, recompute_package())
    run = subprocess.run(
        [sys.executable, "-c", RUN],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout == "True False\n"


DECORATOR = """
    import functools
    import inspect

    from torch.utils.checkpoint import checkpoint


    def checkpoint_method(attr_name: str, preserve: bool = True):
        def decorator(func):
            @functools.wraps(func)
            def wrapper(*args, **kwargs):
                if getattr(args[0], attr_name):
                    all_args = list(args)
                    for i, (name, value) in enumerate(inspect.signature(func).parameters.items()):
                        if i >= len(args):
                            all_args.append(kwargs.get(name, value.default))
                    return checkpoint(
                        func, *all_args, use_reentrant=False, preserve_rng_state=preserve
                    )
                return func(*args, **kwargs)

            return wrapper

        return decorator


    def recomputed(func):
        def run(*args):
            return checkpoint(func, *args)

        return run
"""

DECORATED = """
    import torch.nn as nn

    from mylib.decorators import checkpoint_method, recomputed

    CALLS = []


    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(8, 8)
            self.drop = nn.Dropout(0.1)
            self.checkpoint_attention = True

        @checkpoint_method(attr_name="checkpoint_attention", preserve=False)
        def forward(self, x):
            return self.drop(self.proj(x))


    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(8, 8)
            self.drop = nn.Dropout(0.1)
            self.checkpointed = True

        @checkpoint_method("checkpointed")
        def forward(self, x):
            return self.drop(self.proj(x))


    @recomputed
    def counted(x):
        CALLS.append(x)
        return x * 2


    @functools_free
    def untouched(x):
        CALLS.append(x)
        return x
"""


def decorator_package() -> dict[str, str]:
    return {
        "mylib/__init__.py": "",
        "mylib/decorators.py": DECORATOR,
        "pkg/__init__.py": "",
        "pkg/model.py": DECORATED,
    }


def test_a_decorated_method_is_a_site(tmp_path: Path) -> None:
    """The decorated ``def`` is reported (RNG off through the decorator's argument, a side
    effect in a decorated function); CKP001 goes to the decorator's own call that leaves
    ``use_reentrant`` out, not to the methods it decorates."""
    assert lint_tree(tmp_path, decorator_package()) == [
        ("mylib/decorators.py", 29, 16, "CKP001"),  # recomputed's checkpoint(func, *args)
        ("pkg/model.py", 17, 5, "CKP301"),  # Attention.forward, preserve=False
        ("pkg/model.py", 34, 1, "CKP201"),  # counted reads CALLS, which it changes
        ("pkg/model.py", 34, 1, "CKP203"),  # counted appends to CALLS: twice per step
    ]
    messages = messages_of(tmp_path, decorator_package())
    assert any(
        m.startswith(
            "`Attention.forward` (recomputed by `@checkpoint_method`) runs with"
            " `preserve_rng_state=False`"
        )
        for m in messages
    )


WRAPPERS = """
    import torch
    import torch.nn as nn
    from torch.utils.checkpoint import checkpoint


    class ActivationCheckpointWrapper(nn.Module):
        def __init__(self, module: nn.Module) -> None:
            super().__init__()
            self.module = module

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return checkpoint(self.module, x, use_reentrant=False, preserve_rng_state=False)


    class Recomputed(nn.Module):
        def __init__(self, module, use_reentrant=None):
            super().__init__()
            self.module = module
            self.use_reentrant = use_reentrant

        def forward(self, *args):
            return checkpoint(self.module, *args, use_reentrant=self.use_reentrant)


    class Owns(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8))

        def forward(self, x):
            return checkpoint(self.inner, x, use_reentrant=False, preserve_rng_state=False)
"""

WRAPPED = """
    import torch.nn as nn

    from mylib.wrappers import ActivationCheckpointWrapper, Owns, Recomputed


    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(8, 8)
            self.drop = nn.Dropout(0.1)

        def forward(self, x):
            return self.drop(self.linear(x))


    class Plain(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(8, 8)

        def forward(self, x):
            return self.linear(x).relu() * 2


    def build(depth):
        layers = [ActivationCheckpointWrapper(Block()), ActivationCheckpointWrapper(Plain())]
        layers.append(Recomputed(Plain()))
        layers.append(Recomputed(Plain(), use_reentrant=False))
        layers.append(Owns())
        return nn.Sequential(*layers)
"""


def test_constructing_a_wrapper_class_is_a_site(tmp_path: Path) -> None:
    """The wrapper of the block that draws gets CKP301, the other none; ``Recomputed``'s
    ``use_reentrant=None`` default reaches torch, so its constructions that leave it out
    get CKP001 (fixed where they are); a class that checkpoints a module of its own is an
    ordinary site inside it, not a wrapper."""
    files = {
        "mylib/__init__.py": "",
        "mylib/wrappers.py": WRAPPERS,
        "pkg/__init__.py": "",
        "pkg/model.py": WRAPPED,
    }
    assert lint_tree(tmp_path, files) == [
        ("pkg/model.py", 27, 15, "CKP301"),
        ("pkg/model.py", 28, 19, "CKP001"),
    ]


@pytest.mark.parametrize("name", ["CheckpointFunction", "NoRngFunction"])
def test_the_function_sources_say_what_they_restore(tmp_path: Path, name: str) -> None:
    from ckptlint.analysis import ProjectAnalysis
    from ckptlint.project.index import Project
    from ckptlint.project.layout import Layout
    from ckptlint.regions.sources import SourceTable
    from ckptlint.resolution.values import ClassValue, Method

    path = tmp_path / "recompute.py"
    path.write_text(textwrap.dedent(RECOMPUTE))
    table = SourceTable.build()
    project = Project(Layout([str(path)]), eager_words=table.words)
    analysis = ProjectAnalysis(project, table)
    module = project.module_at(str(path))
    assert module is not None
    [node] = [n for n in module.tree.body if getattr(n, "name", "") == name]
    cls = ClassValue(node, analysis.evaluator.module_context(module))  # type: ignore[arg-type]
    source = analysis.finder.source_of(Method(cls, "apply"))
    assert source is not None
    assert (source.label, source.region, source.reentrant) == (f"{name}.apply", (0, None), None)
    assert source.restores_rng is (name == "CheckpointFunction")
