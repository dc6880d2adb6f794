"""Discovery runs to a fixed point: chains of project wrappers of any length, chains of
local aliases, import cycles (star imports included) are analysed, never cut short.

Each case is a real multi-file package written to disk and linted as a folder; the
expectations are exact (file, line, column, code).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from tests.conftest import lint_tree, messages_of

DROPOUT_BLOCK = """
    import torch.nn as nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(8, 8)
            self.drop = nn.Dropout(0.1)

        def forward(self, x):
            return self.drop(self.linear(x))
"""


def wrapper_chain(length: int) -> dict[str, str]:
    """``w0`` checkpoints without restoring RNG; ``w<i>`` hands its region to ``w<i-1>``, each
    in its own module; ``model.py`` calls every one of them with a block that draws."""
    files = {
        "pkg/__init__.py": "",
        "pkg/blocks.py": DROPOUT_BLOCK,
        "pkg/w0.py": (
            "from torch.utils.checkpoint import checkpoint\n\n\n"
            "def w0(fn, *args):\n"
            "    return checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=False)\n"
        ),
    }
    for index in range(1, length):
        files[f"pkg/w{index}.py"] = (
            f"from pkg.w{index - 1} import w{index - 1}\n\n\n"
            f"def w{index}(fn, *args):\n"
            f"    return w{index - 1}(fn, *args)\n"
        )
    imports = "".join(f"from pkg.w{index} import w{index}\n" for index in range(length))
    calls = "".join(f"    x = w{index}(block, x)\n" for index in range(length))
    files["pkg/model.py"] = (
        f"from pkg.blocks import Block\n{imports}\n\ndef run(block: Block, x):\n{calls}"
        "    return x\n"
    )
    return files


def test_a_chain_of_wrappers_is_followed_whatever_its_length(tmp_path: Path) -> None:
    """Twelve wrappers, each handing the region to the next (the analysis once stopped
    after six): every call is a site, and its region's dropout is found through all of
    them."""
    length = 12
    found = lint_tree(tmp_path, wrapper_chain(length))
    first_call = length + 5  # the line of ``x = w0(block, x)`` in model.py
    assert found == [("pkg/model.py", first_call + i, 9, "CKP301") for i in range(length)]


def test_a_recursive_wrapper_ends(tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": "",
        "pkg/blocks.py": DROPOUT_BLOCK,
        "pkg/run.py": """
            from torch.utils.checkpoint import checkpoint

            def run(fn, x, depth=0):
                if depth:
                    return run(fn, x, depth - 1)
                return checkpoint(fn, x, use_reentrant=False, preserve_rng_state=False)
        """,
        "pkg/model.py": """
            from pkg.blocks import Block
            from pkg.run import run

            def forward(block: Block, x):
                return run(block, x, depth=3)
        """,
    }
    assert lint_tree(tmp_path, files) == [("pkg/model.py", 6, 12, "CKP301")]


def test_a_chain_of_wrappers_in_one_module_is_followed_to_its_end(tmp_path: Path) -> None:
    """The module is scoped again until no new wrapper appears (once eight rounds at most:
    each round scopes the body of one more wrapper)."""
    wrappers = "".join(
        f"\n\ndef w{i}(fn, *args):\n    return w{i - 1}(fn, *args)\n" for i in range(1, 12)
    )
    files = {
        "pkg/__init__.py": "",
        "pkg/blocks.py": DROPOUT_BLOCK,
        "pkg/model.py": (
            "from torch.utils.checkpoint import checkpoint\n"
            "from pkg.blocks import Block\n\n\n"
            "def w0(fn, *args):\n"
            "    return checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=False)\n"
            f"{wrappers}\n\n"
            "def run(block: Block, x):\n"
            "    return w11(block, x)\n"
        ),
    }
    assert lint_tree(tmp_path, files) == [("pkg/model.py", 54, 12, "CKP301")]


def star_cycle(size: int) -> dict[str, str]:
    """``m<i>`` imports ``*`` from ``m<i+1>``, the last from ``m0``; the checkpoint import
    and the block live at the far end of the cycle from the module that uses them."""
    files = {"pkg/__init__.py": ""}
    for index in range(size):
        lines = [f"from pkg.m{(index + 1) % size} import *"]
        if index == size - 1:
            lines += [
                "from torch.utils.checkpoint import checkpoint",
                textwrap.dedent(DROPOUT_BLOCK),
            ]
        files[f"pkg/m{index}.py"] = "\n".join(lines) + "\n"
    files["pkg/m0.py"] += (
        "\n\ndef forward(x):\n"
        "    block = Block()\n"
        "    return checkpoint(block, x, use_reentrant=False, preserve_rng_state=helper())\n"
        "\n\ndef other(x):\n"
        "    return undefined_anywhere(x)\n"
    )
    return files


def test_a_star_import_cycle_over_many_files_is_analysed(tmp_path: Path) -> None:
    """A name bound nowhere in the cycle (``helper``) once sent the lookup round the cycle
    until the interpreter's recursion limit, and the file had no finding but CKP901."""
    files = star_cycle(15)
    files["pkg/m0.py"] = files["pkg/m0.py"].replace(
        "checkpoint(block, x, use_reentrant=False, preserve_rng_state=helper())",
        "checkpoint(helper, x)",
    )
    assert lint_tree(tmp_path, files) == [("pkg/m0.py", 6, 12, "CKP001")]


def test_names_through_a_star_import_cycle_resolve(tmp_path: Path) -> None:
    files = star_cycle(15)
    files["pkg/m0.py"] = files["pkg/m0.py"].replace("helper()", "False")
    assert lint_tree(tmp_path, files) == [("pkg/m0.py", 6, 12, "CKP301")]


def test_modules_importing_each_other_are_analysed(tmp_path: Path) -> None:
    """``model`` imports the wrapper from ``wrap``, which imports the block from ``model``."""
    files = {
        "pkg/__init__.py": "",
        "pkg/wrap.py": """
            from torch.utils.checkpoint import checkpoint
            from pkg import model

            def run(x):
                block = model.Block()
                return checkpoint(block, x, use_reentrant=False, preserve_rng_state=False)
        """,
        "pkg/model.py": """
            import torch.nn as nn
            from pkg.wrap import run

            class Block(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.drop = nn.Dropout(0.1)

                def forward(self, x):
                    return run(self.drop(x))
        """,
    }
    assert lint_tree(tmp_path, files) == [("pkg/wrap.py", 7, 12, "CKP301")]


LOOP = """
    from torch.utils.checkpoint import checkpoint

    def forward(self, x, scales, **kwargs):
        for index, layer in enumerate(self.layers):
            scale = scales[index]
            kwargs["window"] = index % 2

            def run(h):
                return layer(h, **kwargs) * scale

            x = checkpoint(run, x, use_reentrant=False)
        return x
"""


def test_late_binding_names_every_variable_the_region_reads(tmp_path: Path) -> None:
    [message] = messages_of(tmp_path, {"model.py": LOOP}, select=("CKP202",))
    assert message == (
        "`checkpoint()` region `run()` reads `layer` (line 10; the loop at line 5 rebinds it),"
        " `kwargs` (line 10; the loop at line 5 changes it in place at line 7) and `scale`"
        " (line 10; the loop at line 5 rebinds it) through its closure: the recompute in"
        " backward runs after the loop moved on and sees the last values, so gradients are"
        " silently wrong; bind them when making the region (`layer=layer`,"
        " `kwargs=dict(kwargs)`, `scale=scale` default arguments, functools.partial) or pass"
        " them as checkpoint inputs"
    )


def test_late_binding_of_one_variable_keeps_its_message(tmp_path: Path) -> None:
    source = LOOP.replace("layer(h, **kwargs) * scale", "layer(h)")
    [message] = messages_of(tmp_path, {"model.py": source}, select=("CKP202",))
    assert message.startswith(
        "`checkpoint()` region `run()` reads `layer` (line 10) through its closure, and the"
        " loop at line 5 rebinds it:"
    )
