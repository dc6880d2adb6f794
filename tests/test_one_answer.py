"""One answer, whoever asks: a differential test of every entry point on generated packages.

Each example is a multi-file package (project wrappers in chains of any length, a layer
class reading globals, globals written in other modules through the module object or a name
imported from it, star imports in a cycle, a package that shadows a module) and a sequence
of random edits. After each edit, every file's findings must be the same from: the whole
tree without the cache, the whole tree with it (warm), the file named alone, a random
chunking of the files (as pre-commit passes them), standard input, and the flake8 plugin.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptlint.flake8_plugin import CheckpointChecker
from tests.conftest import run_cli

Findings = dict[str, list[tuple[int, int, str]]]


@dataclass(frozen=True)
class Package:
    """What the generated package looks like; ``files`` writes it out."""

    chain: int = 1  # project wrappers calling one another before torch's checkpoint
    chain_split: bool = False  # the chain's last wrapper in a module of its own
    reentrant: str = "missing"  # "missing", "false", "true"
    preserve_rng: bool = True
    writer: str = "none"  # "none", "attribute" (config.SCALE = ...), "imported" (TABLE[k] = ...)
    read: str = "attribute"  # how the layer reads config: "attribute", "imported", "star"
    late_binding: bool = False
    star_cycle: bool = False
    shadow: bool = False  # pkg/layers/__init__.py next to pkg/layers.py
    # Edits that keep every module's exports: a body no other module reads, lines moved
    # (what early cutoff must see through, and must not see through where it matters).
    noise: int = 0

    def files(self) -> dict[str, str]:
        files = {
            "pkg/__init__.py": "from .config import *\n" if self.read == "star" else "",
            "pkg/config.py": 'SCALE = 1.0\nTABLE = {"v": 1}\n'
            + ("from .model import *\n" if self.star_cycle else ""),
            "pkg/model.py": self._model(),
        }
        keyword = {"missing": "", "false": ", use_reentrant=False", "true": ", use_reentrant=True"}
        rng = "" if self.preserve_rng else ", preserve_rng_state=False"
        first = (
            "from torch.utils.checkpoint import checkpoint\n\n\n"
            "def wrap0(function, *args):\n"
            f"    return checkpoint(function, *args{keyword[self.reentrant]}{rng})\n"
        )
        rest = "".join(
            f"\n\ndef wrap{i}(function, *args):\n    return wrap{i - 1}(function, *args)\n"
            for i in range(1, self.chain)
        )
        unrelated = f"\n\ndef unrelated():\n    return {self.noise}\n" + "\n" * self.noise
        if self.chain_split and self.chain > 1:
            files["pkg/base.py"] = first + unrelated
            files["pkg/wrappers.py"] = "from pkg.base import wrap0\n" + unrelated + rest
        else:
            files["pkg/wrappers.py"] = first + unrelated + rest
        layer = self._layer()
        if self.shadow:
            files["pkg/layers/__init__.py"] = layer
            files["pkg/layers.py"] = layer.replace("* ", "+ ").replace("self.drop(", "(")
        else:
            files["pkg/layers.py"] = layer
        if self.writer == "attribute":
            files["pkg/train.py"] = "import pkg.config as config\n\n\ndef step():\n"
            files["pkg/train.py"] += "    config.SCALE = 2.0\n"
        elif self.writer == "imported":
            files["pkg/train.py"] = "from pkg.config import TABLE\n\n\ndef step():\n"
            files["pkg/train.py"] += '    TABLE["v"] += 1\n'
        return files

    def _layer(self) -> str:
        imports = {
            "attribute": "from pkg import config\n",
            "imported": "from pkg.config import SCALE, TABLE\n",
            "star": "from pkg import *\n",
        }[self.read]
        value = "config.SCALE" if self.read == "attribute" else "SCALE"
        table = "config.TABLE" if self.read == "attribute" else "TABLE"
        return (
            "import torch.nn as nn\n"
            + imports
            + "\n" * (2 + self.noise)
            + "class Block(nn.Module):\n"
            "    def __init__(self):\n"
            "        super().__init__()\n"
            "        self.lin = nn.Linear(4, 4)\n"
            "        self.drop = nn.Dropout(0.1)\n\n"
            "    def forward(self, x):\n"
            f'        return self.drop(self.lin(x)) * {value} * {table}["v"]\n'
        )

    def _model(self) -> str:
        call = "lambda h: block(h)" if self.late_binding else "block"
        return (
            "import torch.nn as nn\n"
            "from pkg.layers import Block\n"
            f"from pkg.wrappers import wrap{self.chain - 1}\n\n\n"
            "class Model(nn.Module):\n"
            "    def __init__(self):\n"
            "        super().__init__()\n"
            "        self.blocks = nn.ModuleList([Block() for _ in range(2)])\n\n"
            "    def forward(self, x):\n"
            "        for block in self.blocks:\n"
            f"            x = wrap{self.chain - 1}({call}, x)\n"
            "        return x\n"
        )


packages = st.builds(
    Package,
    chain=st.integers(1, 8),
    chain_split=st.booleans(),
    reentrant=st.sampled_from(["missing", "false", "true"]),
    preserve_rng=st.booleans(),
    writer=st.sampled_from(["none", "attribute", "imported"]),
    read=st.sampled_from(["attribute", "imported", "star"]),
    late_binding=st.booleans(),
    star_cycle=st.booleans(),
    shadow=st.booleans(),
    noise=st.integers(0, 2),
)
edits = st.sampled_from(
    [
        ("chain", st.integers(1, 8)),
        ("chain_split", st.booleans()),
        ("reentrant", st.sampled_from(["missing", "false", "true"])),
        ("preserve_rng", st.booleans()),
        ("writer", st.sampled_from(["none", "attribute", "imported"])),
        ("read", st.sampled_from(["attribute", "imported", "star"])),
        ("late_binding", st.booleans()),
        ("star_cycle", st.booleans()),
        ("shadow", st.booleans()),
        ("noise", st.integers(0, 3)),
    ]
).flatmap(lambda edit: edit[1].map(lambda value: (edit[0], value)))


def write_package(root: Path, package: Package) -> list[str]:
    """Write the package's files (deleting those it no longer has); its file names."""
    files = package.files()
    for path in list(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if relative not in files:
            path.unlink()
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
    for folder in sorted(root.rglob("*"), reverse=True):  # an emptied package folder goes
        if folder.is_dir() and folder.name != ".ckptlint_cache" and not any(folder.iterdir()):
            folder.rmdir()
    return sorted(files)


def cli(root: Path, *arguments: str, stdin: bytes = b"") -> Findings:
    result = run_cli("--format", "json", "--exit-zero", *arguments, cwd=root, stdin=stdin)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    found: Findings = {}
    for item in json.loads(result.stdout):
        found.setdefault(item["path"], []).append((item["line"], item["column"], item["code"]))
    return {path: sorted(items) for path, items in found.items()}


def flake8_findings(root: Path, names: list[str]) -> Findings:
    """The plugin as flake8 runs it: a process that sees the files one by one."""
    CheckpointChecker._engines = {}
    CheckpointChecker._roots = {}
    found: Findings = {}
    saved = os.getcwd()
    os.chdir(root)
    try:
        for name in names:
            text = (root / name).read_text()
            checker = CheckpointChecker(ast.parse(text), text.splitlines(True), name)
            items = [
                (line, column + 1, message.split()[0]) for line, column, message, _ in checker.run()
            ]
            if items:
                found[name] = sorted(items)
    finally:
        os.chdir(saved)
    return found


def check_state(root: Path, names: list[str], data: st.DataObject) -> None:
    reference = cli(root, "--no-cache", ".")
    assert cli(root, ".") == reference, "warm whole tree"
    alone = data.draw(st.sampled_from(names), label="named alone")
    assert cli(root, alone) == {k: v for k, v in reference.items() if k == alone}, alone
    order = data.draw(st.permutations(names), label="chunk order")
    cut = data.draw(st.integers(1, len(names)), label="chunk size")
    for start in range(0, len(order), cut):
        chunk = sorted(order[start : start + cut])
        expected = {k: v for k, v in reference.items() if k in chunk}
        assert cli(root, *chunk) == expected, chunk
    piped = data.draw(st.sampled_from(names), label="standard input")
    text = (root / piped).read_bytes()
    expected = {k: v for k, v in reference.items() if k == piped}
    assert cli(root, "--stdin-filename", piped, "-", stdin=text) == expected, piped
    assert flake8_findings(root, names) == reference, "flake8"


def run_sequence(package: Package, steps: list[tuple[str, object]], data: st.DataObject) -> None:
    root = Path(tempfile.mkdtemp(prefix="one-answer-"))
    try:
        (root / ".git").mkdir()  # a work tree: the project root
        names = write_package(root, package)
        check_state(root, names, data)
        for field, value in steps:
            package = replace(package, **{field: value})
            names = write_package(root, package)
            check_state(root, names, data)
    finally:
        shutil.rmtree(root, ignore_errors=True)


SEQUENCES = settings(
    max_examples=30,
    deadline=None,
    derandomize=True,  # the same examples every run; the campaign draws new ones
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@SEQUENCES
@given(package=packages, steps=st.lists(edits, min_size=1, max_size=2), data=st.data())
def test_every_entry_point_gives_one_answer(
    package: Package, steps: list[tuple[str, object]], data: st.DataObject
) -> None:
    run_sequence(package, steps, data)


@pytest.mark.slow
@settings(SEQUENCES, max_examples=5000, derandomize=False)
@given(package=packages, steps=st.lists(edits, min_size=1, max_size=6), data=st.data())
def test_campaign_every_entry_point_gives_one_answer(
    package: Package, steps: list[tuple[str, object]], data: st.DataObject
) -> None:
    run_sequence(package, steps, data)


def test_the_package_reaches_every_rule_it_is_built_for() -> None:
    """The generator is not vacuous: its shapes give the findings they are meant to."""
    root = Path(tempfile.mkdtemp(prefix="one-answer-"))
    try:
        (root / ".git").mkdir()
        package = Package(chain=6, chain_split=True, writer="imported", late_binding=True)
        write_package(root, package)
        found = cli(root, "--no-cache", ".")
        assert {code for items in found.values() for _, _, code in items} >= {
            "CKP001",
            "CKP201",
            "CKP202",
        }, found
        write_package(root, replace(package, writer="attribute", read="attribute"))
        assert "CKP201" in {c for items in cli(root, ".").values() for _, _, c in items}
    finally:
        shutil.rmtree(root, ignore_errors=True)
