"""A parameter's value is what the callers pass; its default counts only for calls that
omit it (or when some call cannot be seen).

The shape of transformers 4.35-4.4x: ``gradient_checkpointing_enable`` binds
``_gradient_checkpointing_func`` to ``functools.partial(checkpoint, **kwargs)`` through a
private setter whose default, ``checkpoint``, only the disabling call leaves in place, and
that call switches ``gradient_checkpointing`` off: the layers read the function only
under that flag.
"""

from __future__ import annotations

from pathlib import Path

from tests.conftest import lint_tree

BASE = """
    import functools
    import inspect

    import torch.nn as nn
    from torch.utils.checkpoint import checkpoint


    class PreTrained(nn.Module):
        def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
            if gradient_checkpointing_kwargs is None:
                gradient_checkpointing_kwargs = {"use_reentrant": True}
            function = functools.partial(checkpoint, **gradient_checkpointing_kwargs)
            if "value" not in inspect.signature(self._set_gradient_checkpointing).parameters:
                self._set_gradient_checkpointing(enable=True, gradient_checkpointing_func=function)
            else:
                self.apply(functools.partial(self._set_gradient_checkpointing, value=True))

        def gradient_checkpointing_disable(self):
            self._set_gradient_checkpointing(enable=False)

        def _set_gradient_checkpointing(self, enable=True, gradient_checkpointing_func=checkpoint):
            if hasattr(self, "gradient_checkpointing"):
                self._gradient_checkpointing_func = gradient_checkpointing_func
                self.gradient_checkpointing = enable
"""

ENCODER = """
    import torch.nn as nn

    from lib.base import PreTrained


    class Encoder(PreTrained):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Sequential(nn.Linear(8, 8), nn.GELU()) for _ in "ab"])
            self.gradient_checkpointing = False

        def forward(self, x):
            for layer in self.layers:
                if self.gradient_checkpointing and self.training:
                    x = self._gradient_checkpointing_func(layer.__call__, x)
                else:
                    x = layer(x)
            return x
"""


def package(base: str = BASE, encoder: str = ENCODER) -> dict[str, str]:
    return {
        "lib/__init__.py": "",
        "lib/base.py": base,
        "pkg/__init__.py": "",
        "pkg/model.py": encoder,
    }


def test_the_default_only_a_disabling_call_leaves_is_not_read(tmp_path: Path) -> None:
    """No CKP001 on ``self._gradient_checkpointing_func(...)`` (transformers 4.44.2: 106
    such findings, all false); the partial's ``**kwargs`` decide ``use_reentrant``."""
    assert lint_tree(tmp_path, package()) == []


def test_read_without_the_flag_the_default_counts(tmp_path: Path) -> None:
    encoder = ENCODER.replace("if self.gradient_checkpointing and self.training:", "if True:")
    assert lint_tree(tmp_path, package(encoder=encoder)) == [("pkg/model.py", 16, 21, "CKP001")]


def test_a_flag_set_true_without_the_function_leaves_the_default(tmp_path: Path) -> None:
    """After ``disable()`` then ``turn_on()`` the flag is true and the function is still the
    default ``checkpoint``."""
    base = BASE + ("\n        def turn_on(self):\n            self.gradient_checkpointing = True\n")
    assert lint_tree(tmp_path, package(base=base)) == [("pkg/model.py", 16, 21, "CKP001")]


def test_an_enabling_call_that_omits_the_function_stores_the_default(tmp_path: Path) -> None:
    base = BASE.replace(
        "self._set_gradient_checkpointing(enable=False)",
        "self._set_gradient_checkpointing(enable=False)\n\n"
        "        def enable_plain(self):\n"
        "            self._set_gradient_checkpointing()",
    )
    assert lint_tree(tmp_path, package(base=base)) == [("pkg/model.py", 16, 21, "CKP001")]


def test_a_public_setter_may_be_called_from_anywhere(tmp_path: Path) -> None:
    base = BASE.replace("_set_gradient_checkpointing", "set_gradient_checkpointing")
    assert lint_tree(tmp_path, package(base=base)) == [("pkg/model.py", 16, 21, "CKP001")]


def test_a_setter_that_escapes_may_be_called_with_anything(tmp_path: Path) -> None:
    base = BASE.replace(
        "self._set_gradient_checkpointing(enable=False)",
        "self._set_gradient_checkpointing(enable=False)\n"
        "            self.callbacks = [self._set_gradient_checkpointing]",
    )
    assert lint_tree(tmp_path, package(base=base)) == [("pkg/model.py", 16, 21, "CKP001")]


SETUP = """
    import functools

    import torch.nn as nn
    from torch.utils.checkpoint import checkpoint


    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.mlp = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8))
            self._setup(function=functools.partial(checkpoint, use_reentrant=False))

        def _setup(self, function=checkpoint):
            self._run = function

        def forward(self, x):
            return self._run(self.mlp, x)
"""


def test_a_default_every_caller_overrides_does_not_count(tmp_path: Path) -> None:
    assert lint_tree(tmp_path, {"model.py": SETUP}) == []


def test_a_call_that_omits_the_argument_brings_the_default_back(tmp_path: Path) -> None:
    source = SETUP.replace(
        "        def forward(self, x):",
        "        def reset(self):\n            self._setup()\n\n        def forward(self, x):",
    )
    assert lint_tree(tmp_path, {"model.py": source}) == [("model.py", 21, 16, "CKP001")]


def test_a_call_the_function_cannot_take_passes_nothing(tmp_path: Path) -> None:
    """``_setup(fn=...)``: no such parameter, a TypeError; it binds nothing, so the default
    is not brought back by it either."""
    source = SETUP.replace(
        "        def forward(self, x):",
        "        def broken(self):\n            self._setup(fn=None)\n\n"
        "        def forward(self, x):",
    )
    assert lint_tree(tmp_path, {"model.py": source}) == []
