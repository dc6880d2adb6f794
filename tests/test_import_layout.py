"""Module names as the import system gives them, one real folder on disk per shape:
namespace packages (PEP 420) under a project root, inside a regular package and under a
``src/`` folder, one namespace package split across source folders, loose scripts, and the
bounds of the walk (folders that are no package names, deep chains, symlink loops). Each
name is asserted exactly, and a shape whose region is reached through a relative import is
linted end to end.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

from ckptlint.project.layout import MAX_NAMESPACE_DEPTH, Layout
from tests.conftest import hang_guard, lint_tree

# A project wrapper (DiffSynth's shape): the region is the module it is handed.
WRAPPER = """
    import torch


    def gradient_checkpoint_forward(model, use_gradient_checkpointing, *args):
        if use_gradient_checkpointing:
            return torch.utils.checkpoint.checkpoint(model, *args, use_reentrant=False)
        return model(*args)
"""

# A module of the namespace package that hands a single GELU to the wrapper (CKP101).
TINY_THROUGH_THE_WRAPPER = """
    import torch.nn as nn

    from ..utils import gradient_checkpoint_forward


    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.act = nn.GELU()

        def forward(self, x):
            return gradient_checkpoint_forward(self.act, self.training, x)
"""


def write(root: Path, files: dict[str, str]) -> dict[str, str]:
    """Write ``files`` (relative path: text) and return their absolute paths by name."""
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return {relative: str(root / relative) for relative in files}


def names(root: Path, files: dict[str, str]) -> dict[str, str]:
    """The module name of each file written, with all of them registered."""
    paths = write(root, files)
    layout = Layout(paths.values())
    return {relative: layout.module_name(path) for relative, path in paths.items()}


def test_namespace_package_under_a_project_root(tmp_path: Path) -> None:
    found = names(
        tmp_path,
        {
            "pyproject.toml": "",
            "pkg/utils.py": "",
            "pkg/models/dit.py": "",
            "pkg/models/deep/block.py": "",
            "top.py": "",
        },
    )
    assert found == {
        "pyproject.toml": "pyproject.toml",
        "pkg/utils.py": "pkg.utils",
        "pkg/models/dit.py": "pkg.models.dit",
        "pkg/models/deep/block.py": "pkg.models.deep.block",
        "top.py": "top",
    }


def test_namespace_folder_inside_a_regular_package_without_a_project_root(tmp_path: Path) -> None:
    found = names(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/core/__init__.py": "",
            "pkg/models/dit.py": "",
            "pkg/models/sub/block.py": "",
        },
    )
    assert found == {
        "pkg/__init__.py": "pkg",
        "pkg/core/__init__.py": "pkg.core",
        "pkg/models/dit.py": "pkg.models.dit",
        "pkg/models/sub/block.py": "pkg.models.sub.block",
    }


def test_src_layout_with_a_namespace_package(tmp_path: Path) -> None:
    found = names(
        tmp_path,
        {
            "setup.cfg": "",
            "src/ns/sub/mod.py": "",
            "src/regular/__init__.py": "",
            "src/regular/inner/leaf.py": "",
        },
    )
    assert found["src/ns/sub/mod.py"] == "ns.sub.mod"
    assert found["src/regular/__init__.py"] == "regular"
    assert found["src/regular/inner/leaf.py"] == "regular.inner.leaf"


def test_a_git_work_tree_is_a_project_root(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    assert names(tmp_path, {"ns/models/dit.py": ""}) == {"ns/models/dit.py": "ns.models.dit"}


def test_one_namespace_package_split_across_source_folders(tmp_path: Path) -> None:
    paths = write(
        tmp_path,
        {
            "alpha/pyproject.toml": "",
            "alpha/src/ns/alpha/wrap.py": "",
            "beta/pyproject.toml": "",
            "beta/src/ns/beta/__init__.py": "",
            "beta/src/ns/beta/model.py": "",
        },
    )
    layout = Layout([paths["alpha/src/ns/alpha/wrap.py"], paths["beta/src/ns/beta/model.py"]])
    assert layout.module_name(paths["alpha/src/ns/alpha/wrap.py"]) == "ns.alpha.wrap"
    assert layout.module_name(paths["beta/src/ns/beta/model.py"]) == "ns.beta.model"
    assert layout.find("ns.alpha.wrap") == paths["alpha/src/ns/alpha/wrap.py"]
    assert layout.find("ns.beta") == paths["beta/src/ns/beta/__init__.py"]
    assert layout.is_project_package("ns")
    assert layout.find("ns") is None  # a namespace package has no file of its own


def test_loose_scripts_import_their_neighbours(tmp_path: Path) -> None:
    """``python scripts/train.py`` puts ``scripts/`` on ``sys.path``: ``import helpers``
    finds the file beside it (an unregistered file is the module it was imported as)."""
    paths = write(
        tmp_path, {"pyproject.toml": "", "scripts/train.py": "", "scripts/helpers.py": ""}
    )
    layout = Layout([paths["scripts/train.py"]])
    assert layout.module_name(paths["scripts/train.py"]) == "scripts.train"
    assert layout.find("helpers") == paths["scripts/helpers.py"]
    assert layout.module_name(paths["scripts/helpers.py"]) == "helpers"
    assert layout.find("scripts.helpers") == paths["scripts/helpers.py"]


def test_a_folder_name_that_is_no_identifier_ends_the_walk(tmp_path: Path) -> None:
    found = names(
        tmp_path,
        {"pyproject.toml": "", "my-tools/run.py": "", "ok/class/x.py": "", "ok/y/z.py": ""},
    )
    assert found["my-tools/run.py"] == "run"
    assert found["ok/class/x.py"] == "x"  # ``class`` is a keyword: no package name
    assert found["ok/y/z.py"] == "ok.y.z"


def test_namespace_chains_deeper_than_the_bound_keep_the_name_their_folder_gives(
    tmp_path: Path,
) -> None:
    deepest = "/".join(f"n{i}" for i in range(MAX_NAMESPACE_DEPTH + 1))
    within = "/".join(f"n{i}" for i in range(MAX_NAMESPACE_DEPTH))
    found = names(
        tmp_path,
        {"pyproject.toml": "", f"{deepest}/far.py": "", f"{within}/near.py": ""},
    )
    assert found[f"{deepest}/far.py"] == "far"
    assert found[f"{within}/near.py"] == ".".join([*within.split("/"), "near"])


def test_a_symlink_loop_under_a_namespace_package_ends(tmp_path: Path) -> None:
    """A folder linking back to its parent: the walk up reads the path, not the links, and
    discovery lists each real folder once."""
    write(
        tmp_path,
        {
            "pyproject.toml": "",
            "pkg/utils.py": WRAPPER,
            "pkg/models/dit.py": TINY_THROUGH_THE_WRAPPER,
        },
    )
    os.symlink(tmp_path / "pkg", tmp_path / "pkg" / "models" / "loop")
    with hang_guard(60, "linting a tree with a symlink loop"):
        found = lint_tree(tmp_path, {})
    assert found == [("pkg/models/dit.py", 13, 16, "CKP101")]


def test_relative_import_of_a_wrapper_in_a_namespace_package(tmp_path: Path) -> None:
    files = {
        "pyproject.toml": "",
        "pkg/utils.py": WRAPPER,
        "pkg/models/dit.py": TINY_THROUGH_THE_WRAPPER,
    }
    assert lint_tree(tmp_path, files) == [("pkg/models/dit.py", 13, 16, "CKP101")]


def test_relative_import_of_a_wrapper_in_a_namespace_folder_of_a_regular_package(
    tmp_path: Path,
) -> None:
    files = {
        "pkg/__init__.py": "",
        "pkg/utils.py": WRAPPER,
        "pkg/models/dit.py": TINY_THROUGH_THE_WRAPPER,
    }
    assert lint_tree(tmp_path, files) == [("pkg/models/dit.py", 13, 16, "CKP101")]


def test_absolute_import_across_a_namespace_package_split_over_source_folders(
    tmp_path: Path,
) -> None:
    files = {
        "alpha/pyproject.toml": "",
        "alpha/src/ns/alpha/utils.py": WRAPPER,
        "beta/pyproject.toml": "",
        "beta/src/ns/beta/dit.py": TINY_THROUGH_THE_WRAPPER.replace(
            "from ..utils import", "from ns.alpha.utils import"
        ),
    }
    assert lint_tree(tmp_path, files) == [("beta/src/ns/beta/dit.py", 13, 16, "CKP101")]
