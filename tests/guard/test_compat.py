"""The compatibility layer: every private torch symbol is resolved at enable(); a missing one
is a clear error naming it, and nothing is left half-patched (issue 9, item 7)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.utils.checkpoint as torch_checkpoint
from packaging.requirements import Requirement

import ckptguard
from ckptguard import _compat
from tests.conftest import SUBPROCESS_TIMEOUT

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def unresolved(monkeypatch):
    """Forget the resolved symbols so that enable() looks them up again."""
    monkeypatch.setattr(_compat, "_resolved", None)
    yield
    _compat._resolved = None


def test_old_torch_is_refused(unresolved, monkeypatch) -> None:
    monkeypatch.setattr(torch, "__version__", "2.7.1+cu126")
    with pytest.raises(ckptguard.CheckpointGuardCompatibilityError, match=r"torch>=2\.8\b"):
        ckptguard.enable()
    assert not ckptguard.is_enabled()


def test_old_torch_is_refused_before_the_layers_are_imported() -> None:
    """A torch below the floor lacks what the layers import (2.4: ``CheckpointPolicy``):
    ``enable()`` names the floor before importing them, not a bare ImportError."""
    script = (
        "import sys, torch; torch.__version__ = '2.4.0+cu121'\n"
        "sys.modules['ckptguard._intercept'] = None  # importing it now raises ImportError\n"
        "import ckptguard\n"
        "try:\n"
        "    ckptguard.enable()\n"
        "except ckptguard.CheckpointGuardCompatibilityError as error:\n"
        "    print(error)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
        check=True,
    )
    assert "on torch 2.4.0+cu121: it needs torch>=2.8," in done.stdout, done.stderr


def test_the_guard_extra_claims_the_floor_enable_checks() -> None:
    """pyproject.toml's ``torch>=`` for the guard is the release ``enable()`` refuses below."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (torch_requirement,) = [
        Requirement(line)
        for line in project["optional-dependencies"]["guard"]
        if Requirement(line).name == "torch"
    ]
    assert str(torch_requirement.specifier) == ">=" + ".".join(map(str, _compat.MINIMUM_TORCH))


@pytest.mark.parametrize(
    ("owner", "name", "named"),
    [
        (torch_checkpoint, "_StopRecomputationError", "torch.utils.checkpoint._StopRecomputation"),
        (torch_checkpoint, "_checkpoint_without_reentrant_generator", "_generator"),
        (torch._C._autograd, "_top_saved_tensors_default_hooks", "_top_saved_tensors_default"),
        (torch.nn.modules.module, "_global_forward_hooks", "module._global_forward_hooks"),
    ],
)
def test_missing_hook_point_is_named(unresolved, monkeypatch, owner, name, named) -> None:
    monkeypatch.delattr(owner, name)
    if name == "_checkpoint_without_reentrant_generator":
        monkeypatch.delattr(owner, "_checkpoint_without_reentrant_generator_impl", raising=False)
    generator = vars(torch_checkpoint).get("_checkpoint_without_reentrant_generator")
    with pytest.raises(ckptguard.CheckpointGuardCompatibilityError) as info:
        ckptguard.enable()
    assert named in str(info.value) and torch.__version__ in str(info.value)
    assert not ckptguard.is_enabled()
    assert "apply" not in vars(torch_checkpoint.CheckpointFunction)  # nothing half-patched
    assert vars(torch_checkpoint).get("_checkpoint_without_reentrant_generator") is generator


def test_every_private_symbol_comes_from_the_compatibility_module() -> None:
    """No other guard module reaches into torch's private namespaces itself."""
    import pathlib
    import re

    package = pathlib.Path(ckptguard.__file__).parent
    private = re.compile(r"torch(\.\w+)*\._\w+|from torch[\w.]* import _|torch\._C\b")
    offenders = []
    for path in package.glob("*.py"):
        if path.name in ("_compat.py", "pricing.py") or path.parent.name == "planner":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0]
            if private.search(code):
                offenders.append(f"{path.name}:{number}: {line.strip()}")
    assert offenders == []
