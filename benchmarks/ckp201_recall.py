"""CKP201's recall and precision on writes made in another module than the region's.

A held-out set of issue 37 (written before the change finder was touched for it): small
multi-file packages in which a region in ``pkg/model.py`` reads module-level state of
``pkg/cfg.py`` or ``pkg/registry.py``, and another module (``pkg/train.py``, or
``pkg/loop/step.py`` for relative imports from a subpackage) writes it. Each case has two
twins: INVALID writes it in the training loop, between a forward and its backward (CKP201
must be reported at the region); VALID writes it only while the program is set up (at
import, in a constructor, in an ``init_*`` function) or writes something the region does
not read (CKP201 must stay silent).

    python benchmarks/ckp201_recall.py [--show]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from ckptlint.config import Settings  # noqa: E402
from ckptlint.discovery import discover  # noqa: E402
from ckptlint.engine import Engine  # noqa: E402

CFG = """
SCALE = 1.0
TABLE = {"scale": 1.0}
SIZES = [1.0]


class Config:
    scale = 1.0
"""

REGISTRY = """
REGISTRY = {"act": abs}
"""

# Setters some cases call, added to the module they write (a setter nobody calls would be
# a change by itself: public API a user may call at any time).
CONFIG_SETTER = """

def set_scale(value):
    global SCALE
    SCALE = value
"""
CLASS_SETTER = """

class Schedule:
    scale = 1.0

    @classmethod
    def set_scale(cls, value):
        cls.scale = value
"""
REGISTER = """

def register(name, function):
    REGISTRY[name] = function
"""
REGISTER_AS = """

def register_as(name):
    def decorate(function):
        REGISTRY[name] = function
        return function

    return decorate
"""
HELPERS = {
    "module's own setter called from the loop": ("pkg/cfg.py", CONFIG_SETTER),
    "classmethod setter called from the loop": ("pkg/cfg.py", CLASS_SETTER),
    "register function called from the loop": ("pkg/registry.py", REGISTER),
    "register decorator applied in the loop": ("pkg/registry.py", REGISTER_AS),
}

MODEL = """
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

{imports}


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(8, 32)
        self.down = nn.Linear(32, 8)

    def forward(self, x):
        return self.down(self.up(x).relu()) * {read} + x


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()

    def forward(self, x):
        return checkpoint(self.block, x, use_reentrant=False)
"""
SITE_LINE = 23  # the checkpoint call in MODEL (after the leading newline is dropped)

RUN_TIME = """
{imports}


def train(model, batches, optimizer):
    for step, x in enumerate(batches):
        loss = model(x).sum()
        {write}
        loss.backward()
        optimizer.step()
"""

SET_UP = {
    "import": """
{imports}

{write}
""",
    "init": """
{imports}


class Trainer:
    def __init__(self, model):
        self.model = model
        {write}
""",
    "named": """
{imports}


def init_config(step=0):
    {write}
""",
}

# name: (model imports, what the region reads, writer imports, the write, valid twin form)
CASES: dict[str, tuple[str, str, str, str, str]] = {
    "module alias, attribute rebound": (
        "import pkg.cfg as cfg",
        "cfg.SCALE",
        "import pkg.cfg as cfg",
        "cfg.SCALE = 1.0 / (step + 1)",
        "import",
    ),
    "from package import module, attribute rebound": (
        "from pkg import cfg",
        "cfg.SCALE",
        "from pkg import cfg",
        "cfg.SCALE = 1.0 / (step + 1)",
        "init",
    ),
    "dotted module path, attribute rebound": (
        "import pkg.cfg",
        "pkg.cfg.SCALE",
        "import pkg.cfg",
        "pkg.cfg.SCALE = 1.0 / (step + 1)",
        "named",
    ),
    "augmented assignment through the module": (
        "from pkg import cfg",
        "cfg.SCALE",
        "import pkg.cfg as cfg",
        "cfg.SCALE *= 0.5",
        "import",
    ),
    "imported class, class attribute rebound": (
        "from pkg.cfg import Config",
        "Config.scale",
        "from pkg.cfg import Config",
        "Config.scale = 1.0 / (step + 1)",
        "init",
    ),
    "class through its module, class attribute rebound": (
        "from pkg.cfg import Config",
        "Config.scale",
        "import pkg.cfg as cfg",
        "cfg.Config.scale = 1.0 / (step + 1)",
        "named",
    ),
    "classmethod setter called from the loop": (
        "from pkg.cfg import Schedule",
        "Schedule.scale",
        "from pkg.cfg import Schedule",
        "Schedule.set_scale(1.0 / (step + 1))",
        "init",
    ),
    "module's own setter called from the loop": (
        "from pkg import cfg",
        "cfg.SCALE",
        "from pkg.cfg import set_scale",
        "set_scale(1.0 / (step + 1))",
        "import",
    ),
    "setattr on the module": (
        "from pkg import cfg",
        "cfg.SCALE",
        "from pkg import cfg",
        'setattr(cfg, "SCALE", 1.0 / (step + 1))',
        "named",
    ),
    "setattr on an imported class": (
        "from pkg.cfg import Config",
        "Config.scale",
        "from pkg.cfg import Config",
        'setattr(Config, "scale", 1.0 / (step + 1))',
        "init",
    ),
    "item of a module's table": (
        "from pkg import cfg",
        'cfg.TABLE["scale"]',
        "import pkg.cfg as cfg",
        'cfg.TABLE["scale"] = 1.0 / (step + 1)',
        "import",
    ),
    "update of a module's table": (
        "import pkg.cfg as cfg",
        'cfg.TABLE["scale"]',
        "from pkg import cfg",
        "cfg.TABLE.update(scale=1.0 / (step + 1))",
        "named",
    ),
    "item of an imported table": (
        "from pkg.cfg import TABLE",
        'TABLE["scale"]',
        "from pkg.cfg import TABLE",
        'TABLE["scale"] = 1.0 / (step + 1)',
        "init",
    ),
    "item of an imported list": (
        "from pkg.cfg import SIZES",
        "SIZES[0]",
        "from pkg.cfg import SIZES",
        "SIZES[0] = 1.0 / (step + 1)",
        "import",
    ),
    "registry item written": (
        "from pkg.registry import REGISTRY",
        'REGISTRY["act"](x)',
        "from pkg.registry import REGISTRY",
        'REGISTRY["act"] = lambda h: h * step',
        "named",
    ),
    "registry updated": (
        "from pkg.registry import REGISTRY",
        'REGISTRY["act"](x)',
        "from pkg.registry import REGISTRY",
        "REGISTRY.update(act=lambda h: h * step)",
        "init",
    ),
    "registry setdefault of a new entry": (
        "from pkg.registry import REGISTRY",
        'REGISTRY["act"](x)',
        "from pkg.registry import REGISTRY",
        'REGISTRY.setdefault("act", lambda h: h * step)',
        "import",
    ),
    "registry entry popped": (
        "from pkg.registry import REGISTRY",
        'REGISTRY.get("act", abs)(x)',
        "from pkg.registry import REGISTRY",
        'REGISTRY.pop("act", None)',
        "named",
    ),
    "register function called from the loop": (
        "from pkg.registry import REGISTRY",
        'REGISTRY["act"](x)',
        "from pkg.registry import register",
        'register("act", lambda h: h * step)',
        "init",
    ),
    "register decorator applied in the loop": (
        "from pkg.registry import REGISTRY",
        'REGISTRY["act"](x)',
        "from pkg.registry import register_as",
        'register_as("act")(lambda h: h * step)',
        "import",
    ),
    "registry through its module": (
        "from pkg import registry",
        'registry.REGISTRY["act"](x)',
        "import pkg.registry as registry",
        'registry.REGISTRY["act"] = lambda h: h * step',
        "named",
    ),
    "relative import of the module": (
        "from . import cfg",
        "cfg.SCALE",
        "from . import cfg",
        "cfg.SCALE = 1.0 / (step + 1)",
        "init",
    ),
    "relative import from a subpackage": (
        "from . import cfg",
        "cfg.SCALE",
        "from .. import cfg",
        "cfg.SCALE = 1.0 / (step + 1)",
        "import",
    ),
    "attribute deleted": (
        "from pkg import cfg",
        'getattr(cfg, "SCALE", 1.0)',
        "from pkg import cfg",
        "del cfg.SCALE",
        "named",
    ),
    "setattr on a class through its module": (
        "from pkg.cfg import Config",
        "Config.scale",
        "import pkg.cfg as cfg",
        'setattr(cfg.Config, "scale", 1.0 / (step + 1))',
        "import",
    ),
    "module's __dict__ item": (
        "from pkg import cfg",
        "cfg.SCALE",
        "from pkg import cfg",
        'vars(cfg)["SCALE"] = 1.0 / (step + 1)',
        "init",
    ),
    "module imported inside the function": (
        "from pkg import cfg",
        "cfg.SCALE",
        "",
        "import pkg.cfg as cfg; cfg.SCALE = 1.0 / (step + 1)",
        "named",
    ),
    "class imported under another name": (
        "from pkg.cfg import Config",
        "Config.scale",
        "from pkg.cfg import Config as Settings",
        "Settings.scale = 1.0 / (step + 1)",
        "import",
    ),
    "class attribute augmented": (
        "from pkg.cfg import Config",
        "Config.scale",
        "from pkg.cfg import Config",
        "Config.scale += 0.1",
        "init",
    ),
    "class re-exported by the package": (
        "from pkg.cfg import Config",
        "Config.scale",
        "from pkg import Config",
        "Config.scale = 1.0 / (step + 1)",
        "named",
    ),
    "table read through the package's re-export": (
        "from pkg import TABLE",
        'TABLE["scale"]',
        "import pkg.cfg",
        'pkg.cfg.TABLE["scale"] = 1.0 / (step + 1)',
        "import",
    ),
    "registry through an alias": (
        "from pkg.registry import REGISTRY",
        'REGISTRY["act"](x)',
        "from pkg.registry import REGISTRY",
        'table = REGISTRY; table["act"] = lambda h: h * step',
        "init",
    ),
    "registry __setitem__": (
        "from pkg.registry import REGISTRY",
        'REGISTRY["act"](x)',
        "from pkg.registry import REGISTRY",
        'REGISTRY.__setitem__("act", lambda h: h * step)',
        "named",
    ),
    "tuple assignment through the module": (
        "from pkg import cfg",
        "cfg.SCALE",
        "from pkg import cfg",
        "cfg.SCALE, first = 1.0 / (step + 1), step == 0",
        "import",
    ),
    "write in a closure run by the loop": (
        "from pkg import cfg",
        "cfg.SCALE",
        "from pkg import cfg",
        "(lambda: setattr(cfg, 'SCALE', 1.0 / (step + 1)))()",
        "init",
    ),
    "registry of a dotted module path": (
        "from pkg.registry import REGISTRY",
        'REGISTRY["act"](x)',
        "import pkg.registry",
        "pkg.registry.REGISTRY.update(act=lambda h: h * step)",
        "named",
    ),
}
# The cases whose writer lives in pkg/loop/step.py (a subpackage) rather than pkg/train.py.
IN_SUBPACKAGE = {"relative import from a subpackage"}


def files_of(name: str, valid: bool) -> dict[str, str]:
    model_imports, read, writer_imports, write, form = CASES[name]
    writer = (SET_UP[form] if valid else RUN_TIME).format(imports=writer_imports, write=write)
    writer_path = "pkg/loop/step.py" if name in IN_SUBPACKAGE else "pkg/train.py"
    files = {
        "pyproject.toml": "",
        "pkg/__init__.py": "from .cfg import TABLE, Config\n",
        "pkg/cfg.py": CFG,
        "pkg/registry.py": REGISTRY,
        "pkg/model.py": MODEL.format(imports=model_imports, read=read),
        writer_path: writer,
    }
    if writer_path.startswith("pkg/loop/"):
        files["pkg/loop/__init__.py"] = ""
    if name in HELPERS:
        path, helper = HELPERS[name]
        files[path] = files[path] + helper
    return files


def findings(root: Path, files: dict[str, str]) -> list[tuple[str, int, str]]:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))
    settings = Settings(root=root)
    paths = [f.path for f in discover([str(root)], settings)]
    found = []
    for result in Engine(settings, paths, jobs=1).lint(paths):
        relative = Path(result.path).resolve().relative_to(root.resolve()).as_posix()
        found.extend((relative, f.line, f.code) for f in result.findings if f.code == "CKP201")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--show", action="store_true", help="print each case's outcome")
    arguments = parser.parse_args()
    expected = [("pkg/model.py", SITE_LINE, "CKP201")]
    caught = false_alarms = 0
    for name in CASES:
        with tempfile.TemporaryDirectory() as invalid, tempfile.TemporaryDirectory() as valid:
            bad = findings(Path(invalid), files_of(name, valid=False))
            good = findings(Path(valid), files_of(name, valid=True))
        caught += bad == expected
        false_alarms += bool(good)
        if arguments.show:
            outcome = "caught" if bad == expected else "MISSED"
            print(f"{outcome:7} {'FP' if good else '  '} {name}")
    cases = len(CASES)
    reported = caught + false_alarms
    print(
        f"recall {caught}/{cases} = {caught / cases:.2f}; precision"
        f" {caught}/{reported} = {caught / max(reported, 1):.2f}"
        f" ({false_alarms} of {cases} valid twins reported)"
    )


if __name__ == "__main__":
    main()
