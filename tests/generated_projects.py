"""Random small packages built to stress the analysis: code no real project would write, in
shapes real projects do write (mutual recursion through parameters and attributes, wrappers
whose names collide with attributes and locals, star imports in cycles, partials of
partials, decorators, ``**kwargs`` edited before it is handed on, loops rebinding what a
closure reads).

``project(choose)`` builds one package from a chooser: ``choose(options)`` picks one of
``options`` and ``choose(range)`` an integer of it. Tests drive it with hypothesis
(``hypothesis_chooser``), the benchmark with a seeded ``random.Random`` (``random_chooser``).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

from hypothesis import strategies as st

Chooser = Callable[[Any], Any]

# Names used for functions, attributes, parameters and locals alike, so that they collide.
NAMES = ("first", "second", "forward", "inner", "member", "evaluate", "wrap", "run", "block")
ATTRIBUTES = ("inner", "forward", "kind", "member", "fn", "layers", "run")
KEYWORDS = (
    "",
    ", use_reentrant=False",
    ", use_reentrant=True",
    ", **kwargs",
    ", use_reentrant=flag",
    ", preserve_rng_state=False",
)
KWARGS_EDITS = (
    'kwargs.setdefault("use_reentrant", False)',
    'kwargs["use_reentrant"] = False',
    "kwargs.update(use_reentrant=True)",
    'kwargs.pop("use_reentrant", None)',
    "kwargs = {**kwargs, 'use_reentrant': False}",
    "kwargs = dict(kwargs, use_reentrant=False)",
)


def hypothesis_chooser(data: st.DataObject) -> Chooser:
    def choose(options: Any) -> Any:
        if isinstance(options, range):
            return data.draw(st.integers(options.start, options.stop - 1))
        return data.draw(st.sampled_from(list(options)))

    return choose


def random_chooser(seed: int) -> Chooser:
    generator = random.Random(seed)

    def choose(options: Any) -> Any:
        if isinstance(options, range):
            return generator.randrange(options.start, options.stop)
        return generator.choice(list(options))

    return choose


def project(choose: Chooser) -> dict[str, str]:
    """The files of one package ``pkg`` (paths relative to the project root)."""
    count = choose(range(1, 5))
    modules = [f"m{i}" for i in range(count)]
    files = {"pkg/__init__.py": _init(choose, modules)}
    for index, name in enumerate(modules):
        files[f"pkg/{name}.py"] = _module(choose, modules, index)
    return files


def _init(choose: Chooser, modules: Sequence[str]) -> str:
    lines = []
    for name in modules:
        form = choose(("", "star", "name", "module"))
        if form == "star":
            lines.append(f"from .{name} import *")
        elif form == "name":
            lines.append(f"from .{name} import {choose(NAMES)}")
        elif form == "module":
            lines.append(f"from . import {name}")
    return "\n".join(lines) + "\n"


def _module(choose: Chooser, modules: Sequence[str], index: int) -> str:
    lines = ["import torch.nn as nn"]
    form = choose(("name", "name", "alias", "module", "star-only"))
    if form == "name":
        lines.append("from torch.utils.checkpoint import checkpoint")
    elif form == "alias":
        lines.append(f"from torch.utils.checkpoint import checkpoint as {choose(NAMES)}")
        lines.append(f"checkpoint = {choose(NAMES)}")
    elif form == "module":
        lines.append("import torch.utils.checkpoint as cp")
        lines.append("checkpoint = cp.checkpoint")
    lines.append("from functools import partial, wraps")
    for other in modules:
        form = choose(("", "", "star", "name", "module", "package"))
        if form == "star":
            lines.append(f"from pkg.{other} import *")
        elif form == "name":
            lines.append(f"from pkg.{other} import {choose(NAMES)}")
        elif form == "module":
            lines.append(f"import pkg.{other} as {other}")
        elif form == "package":
            lines.append("from pkg import *")
    lines.append("")
    for _ in range(choose(range(1, 6))):
        kind = choose(("function", "function", "class", "global", "decorator"))
        lines.extend(_DEFINITIONS[kind](choose, modules))
        lines.append("")
    return "\n".join(lines) + "\n"


def _callee(choose: Chooser, modules: Sequence[str]) -> str:
    name = choose(NAMES)
    form = choose(("", "", "module", "checkpoint"))
    if form == "module":
        return f"{choose(modules)}.{name}"
    if form == "checkpoint":
        return "checkpoint"
    return name


def _statement(choose: Chooser, modules: Sequence[str], names: list[str], depth: int) -> list[str]:
    """One statement of a function body; ``names`` are the names bound so far (parameters
    first), extended with what the statement binds."""
    f = _callee(choose, modules)
    a, b = choose(names), choose(names)
    attribute, test = choose(ATTRIBUTES), choose(ATTRIBUTES)
    argument = choose((a, f"{a}.{attribute}", f"{b}.evaluate({a})", f"{b}.{attribute}({a})"))
    form = choose(tuple(range(14)))
    if form == 0:
        return [f"if {a}.{test}:", f"    return {f}({argument}, {b})"]
    if form == 1:
        local = choose(NAMES)
        names.append(local)
        return [f"{local} = {b}.{attribute}({a}, {choose(NAMES)!r})"]
    if form == 2:
        region = choose((a, f, f"{a}.{attribute}", f"lambda *h: {f}(*h)", f"partial({f}, {a})"))
        return [f"if {b}.{test}:", f"    return checkpoint({region}, {b}{choose(KEYWORDS)})"]
    if form == 3:
        return [choose(KWARGS_EDITS)] if "kwargs" in names else [f"{a} = {f}({argument})"]
    if form == 4:
        local = choose(NAMES)
        names.append(local)
        return [f"{local} = partial({f}, {argument})", f"if {b}:", f"    return {local}({b})"]
    if form == 5:
        local = choose(NAMES)
        names.append(local)
        return [
            f"for {a} in {b}.{attribute}:",
            f"    {local} = lambda *h: {f}({a}, *h)",
            f"    {b} = checkpoint({local}, {b}{choose(KEYWORDS)})",
        ]
    if form == 6:
        return [f"{a} = {f}({argument})"]
    if form == 7:
        return [f"{a}.{attribute} = {f}"]
    if form == 8 and depth < 2:
        inner = choose(NAMES)
        body = _statement(choose, modules, [*names, "args", "kwargs"], depth + 1)
        names.append(inner)
        return [
            f"def {inner}(*args, **kwargs):",
            *(f"    {line}" for line in body),
            f"    return {f}({a}, *args, **kwargs)",
        ]
    if form == 9:
        return [f"{a} = {b} if {a}.{test} else {f}({argument})"]
    if form == 12 and depth < 2:  # a nested function that calls itself (unwrapping a module)
        inner = choose(NAMES)
        return [
            f"def {inner}(module):",
            f"    if module.{test}:",
            f"        module = {inner}(module.{attribute})",
            f"    return {choose(('module', f'{f}(module, {b})'))}",
            f"{a} = {inner}({a})",
        ]
    if form == 10 and "kwargs" in names:
        return [f"if {a}.{test}:", f"    return {f}({a}, *args, **kwargs)"]
    if form == 11:
        shared = choose(NAMES)
        if shared in names:
            return [f"{b}.{attribute} = {shared}"]
        names.append(shared)
        return [f"global {shared}", f"{shared} = {f}"]
    return [f"{b} = {a}"]


def _function(choose: Chooser, modules: Sequence[str], method: bool = False) -> list[str]:
    name = choose(NAMES)
    parameters = choose(
        (
            ["region", "analysis"],
            ["region", "analysis", "*args", "**kwargs"],
            ["x", "flag=None", "**kwargs"],
        )
    )
    if method:
        parameters = ["self", *parameters]
    names = [p.lstrip("*").partition("=")[0] for p in parameters]
    lines = []
    decorator = choose(("", "", "", "name", "wraps", "partial"))
    if decorator == "name":
        lines.append(f"@{_callee(choose, modules)}")
    elif decorator == "wraps":
        lines.append(f"@wraps({choose(NAMES)})")
    elif decorator == "partial":
        lines.append(f"@partial(checkpoint, use_reentrant={choose(('False', 'True'))})")
    lines.append(f"def {name}({', '.join(parameters)}):")
    for _ in range(choose(range(1, 5))):
        lines.extend(f"    {line}" for line in _statement(choose, modules, names, 0))
    a, b = choose(names), choose(names)
    lines.append(f"    return {_callee(choose, modules)}({choose((a, f'{b}.evaluate({a})'))}, {b})")
    return lines


def _class(choose: Chooser, modules: Sequence[str]) -> list[str]:
    name = choose(("Block", "Layer", "Wrapper", "first"))
    base = choose(("nn.Module", "object", "Block", "Layer", f"{choose(modules)}.Block"))
    lines = [f"class {name}({base}):"]
    lines.append(f"    {choose(ATTRIBUTES)} = {_callee(choose, modules)}")
    lines.append("    def __init__(self, inner=None, *args, **kwargs):")
    lines.append("        super().__init__()")
    lines.append(f"        self.{choose(ATTRIBUTES)} = inner")
    lines.append(f"        self.{choose(ATTRIBUTES)} = partial({_callee(choose, modules)}, self)")
    lines.append("    def forward(self, x, *args, **kwargs):")
    call = choose(
        (
            f"checkpoint(self.{choose(ATTRIBUTES)}, x{choose(KEYWORDS)})",
            f"self.{choose(ATTRIBUTES)}(x)",
            f"{_callee(choose, modules)}(self.{choose(ATTRIBUTES)}, x, **kwargs)",
            f"{name}(self)(x)",
        )
    )
    lines.append(f"        return {call}")
    lines.extend(f"    {line}" for line in _function(choose, modules, method=True))
    return lines


def _global(choose: Chooser, modules: Sequence[str]) -> list[str]:
    name = choose(NAMES)
    value = choose(
        (
            _callee(choose, modules),
            f"partial({_callee(choose, modules)}, {choose(NAMES)})",
            f"partial(partial(checkpoint, use_reentrant=False), {choose(NAMES)})",
            f"{choose(('Block', 'Layer'))}({choose(('Block', 'Layer'))}(None))",
            f"[{choose(NAMES)}, {choose(NAMES)}]",
            f"{{'k': {choose(NAMES)}}}",
        )
    )
    return [f"{name} = {value}"]


def _decorator(choose: Chooser, modules: Sequence[str]) -> list[str]:
    name = choose(NAMES)
    keyword = choose(("", ", use_reentrant=False", ", **kwargs"))
    return [
        f"def {name}(function):",
        "    @wraps(function)",
        "    def wrapper(*args, **kwargs):",
        f"        return checkpoint(function, *args{keyword})",
        "    return wrapper",
    ]


_DEFINITIONS: dict[str, Callable[[Chooser, Sequence[str]], list[str]]] = {
    "function": _function,
    "class": _class,
    "global": _global,
    "decorator": _decorator,
}
