"""Region readers: the plans of a region's modules and functions compiled into one function.

A region reads a dozen modules and a few functions twice per step (after the forward, before
the recompute), so this is the guard's hot path. A reader is generated, straight-line Python:
dict lookups and attribute reads in one tuple display per module or function, no loop or call
per value except for tensors and containers. It is compiled once per set of modules and
functions and cached under the region's first module (weakly), so it dies with the model.

``read(modules, functions, own_hooks)`` returns ``(values, checks)``: ``values`` is a tuple of
tuples (torch settings, global hooks, one per module, one per function) compared as a whole;
``checks`` holds each module's shape, which tells when a plan no longer describes its module.
"""

from __future__ import annotations

import weakref
from typing import Any

from ckptguard import _compat
from ckptguard._compat import MODULE_HOOK_DICTS
from ckptguard._fingerprint import (
    MISSING,
    SCALAR_TYPES,
    SKIPPED,
    TENSOR,
    loose_tensor_fp,
    tensor_fp,
    value_fp,
)
from ckptguard._plan import FunctionPlan, ModulePlan, cell_fp, function_labels, read_chain

_NAMESPACE = {
    "MISSING": MISSING,
    "SKIPPED": SKIPPED,
    "SCALARS": SCALAR_TYPES,
    "value_fp": value_fp,
    "tensor_fp": tensor_fp,
    "loose_tensor_fp": loose_tensor_fp,
    "read_chain": read_chain,
    "cell_fp": cell_fp,
    "TENSOR": TENSOR,
}


def _convert(expression: str, kind: str) -> str:
    if kind == "scalar":
        return f"(_v if type(_v := {expression}) in SCALARS else value_fp(_v))"
    if kind == "object":
        return f"id({expression})"
    return f"value_fp({expression})"


def _tensor(expression: str, loose: bool, safe: bool) -> str:
    """Parameters and buffers: inline for the common case, a call where a tensor may be a
    wrapper subclass without storage (the reader is recompiled ``safe`` if one raises)."""
    if loose:
        return f"loose_tensor_fp({expression})"
    if safe:
        return f"tensor_fp({expression})"
    return (
        f"(None if (_t := {expression}) is None else "
        f"(TENSOR, id(_t), _t._version, _t.data_ptr(), _t.dtype))"
    )


def _chain(expression: str, chain: tuple) -> str:
    return expression if len(chain) == 1 else f"read_chain({expression}, {chain[1:]!r})"


class RegionReader:
    """One compiled reader for a fixed list of module plans and function plans."""

    __slots__ = (
        "read",
        "module_plans",
        "module_refs",
        "function_plans",
        "class_functions",
        "function_labels",
        "expected",
        "checks",
        "torch_labels",
        "safe",
        "stateful",
        "_getters",
        "__weakref__",
    )

    def __init__(
        self,
        modules: list,
        module_plans: list[ModulePlan],
        function_plans: list[FunctionPlan],
        class_functions: list,
        torch_state: tuple,
        functions: list,
        safe: bool = False,
    ):
        self.module_plans = tuple(module_plans)
        self.module_refs = tuple(weakref.ref(m) for m in modules)
        self.function_plans = tuple(function_plans)
        self.class_functions = tuple(class_functions)  # weak refs to the modules' functions
        self.checks = tuple(
            (*plan.check(), tuple(map(id, m._modules.values())))
            for plan, m in zip(module_plans, modules, strict=True)
        )
        self.stateful = tuple(
            i for i, plan in enumerate(module_plans) if plan.buffers or plan.stores_scalars
        )
        self.torch_labels = tuple(label for label, _ in torch_state)
        self.safe = safe
        namespace = dict(_NAMESPACE)
        lines = ["def read(mods, funcs, own):"]
        groups = []
        self._getters = tuple(getter for _, getter in torch_state)
        for index, getter in enumerate(self._getters):
            namespace[f"ts{index}"] = getter
        groups.append(", ".join(f"ts{i}()" for i in range(len(torch_state))))
        hooks = []
        for index, (_, table) in enumerate(_compat.resolve().global_hook_dicts):
            namespace[f"gh{index}"] = table
            hooks.append(f"(tuple([k for k in gh{index} if k not in own]) if gh{index} else ())")
        groups.append(", ".join(hooks))
        for i, plan in enumerate(module_plans):
            namespace[f"C{i}"] = plan.cls
            lines.append(f"    s{i} = mods[{i}].__dict__")
            lines.append(f'    p{i} = s{i}["_parameters"]')
            lines.append(f'    b{i} = s{i}["_buffers"]')
            lines.append(f'    f{i} = s{i}.get("forward") or C{i}.forward')
            code = f"f{i}.__code__" if plan.code is not None else f'getattr(f{i}, "__code__", None)'
            any_hooks = " or ".join(f"s{i}[{h!r}]" for h in MODULE_HOOK_DICTS)
            all_hooks = ", ".join(f"tuple(s{i}[{h!r}])" for h in MODULE_HOOK_DICTS)
            items = [
                f's{i}["training"]',
                f"id(f{i})",
                code,
                f"(({all_hooks}) if ({any_hooks}) else ())",
            ]
            for table, names in ((f"p{i}", plan.params), (f"b{i}", plan.buffers)):
                loose = plan.loose and table.startswith("p")
                items += [_tensor(f"{table}.get({n!r})", loose, safe) for n in names]
            for chain, source, kind in plan.chains:
                if source[0] == "class":
                    namespace[f"cd{i}_{source[1]}"] = plan.class_dicts[source[1]]
                    expression = f"cd{i}_{source[1]}.get({source[2]!r}, MISSING)"
                else:
                    table = {"dict": f"s{i}", "_parameters": f"p{i}", "_buffers": f"b{i}"}.get(
                        source[0], f's{i}["_modules"]'
                    )
                    expression = f"{table}.get({source[1]!r}, MISSING)"
                items.append(_convert(_chain(expression, chain), kind))
            groups.append(", ".join(items))
        # each function once, however many plans reach it
        entries = [entry for plan in function_plans for entry in plan.entries]
        items, labels, expected, seen = [], [], [], set()
        for position, (func, entry) in enumerate(zip(functions, entries, strict=True)):
            if id(func) in seen:
                continue
            seen.add(id(func))
            _, chains, cells, defaults, followed = entry
            name = f"F{position}"
            lines.append(f"    {name} = funcs[{position}]")
            lines.append(f"    G{position} = {name}.__globals__")
            first = len(items) + 1
            expected += [(first + index, ident) for index, ident in followed]
            items.append(f"{name}.__code__")
            for chain, kind in chains:
                expression = f"G{position}.get({chain[0]!r}, MISSING)"
                items.append(_convert(_chain(expression, chain), kind))
            for c, kind in enumerate(cells):
                if kind == "empty" or safe:
                    items.append(f"cell_fp({name}, {c})")
                else:
                    items.append(_convert(f"{name}.__closure__[{c}].cell_contents", kind))
            if defaults[0]:
                items.append(f"value_fp({name}.__defaults__)")
            if defaults[1]:
                items.append(f"value_fp({name}.__kwdefaults__)")
            labels += function_labels(func, entry)
        groups.append(", ".join(items))
        self.function_labels = tuple(labels)
        self.expected = tuple(expected)
        body = ",\n        ".join(f"({group},)" if group else "()" for group in groups)
        checks = ", ".join(
            f'((len(s{i}), len(p{i}), len(b{i}), len(s{i}["_modules"])), id(f{i}), '
            + (f"f{i}.__code__, " if plan.code is not None else "None, ")
            + f'tuple(map(id, s{i}["_modules"].values())))'
            for i, plan in enumerate(module_plans)
        )
        checks = f"({checks},)" if checks else "()"
        lines.append(f"    return (\n        {body},\n    ), {checks}")
        source = "\n".join(lines) + "\n"
        exec(compile(source, "<ckptguard region reader>", "exec"), namespace)
        self.read = namespace["read"]

    def same_modules(self, modules: list) -> bool:
        return len(modules) == len(self.module_refs) and all(
            ref() is module for ref, module in zip(self.module_refs, modules, strict=True)
        )

    def functions(self, roots: list) -> list | None:
        """Each entry's function for this call: the region's own functions (new objects per
        call, e.g. closures) first, then those its modules' code reaches; None if a followed
        function was collected (the plans must be rebuilt)."""
        holders = list(roots)
        for ref in self.class_functions:
            holders.append(ref())
        out: list = []
        for plan, func in zip(self.function_plans, holders, strict=True):
            if func is None:
                return None
            for entry in plan.functions(func):
                if entry is None:
                    return None
                out.append(entry)
        return out

    def stale_functions(self, values: tuple) -> bool:
        """Whether a name a plan followed into a function now holds another object."""
        group = values[-1]
        for index, ident in self.expected:
            if group[index] != ident:
                return True
        return False

    def read_safely(self, modules: list, functions: list, own: frozenset) -> tuple[tuple, tuple]:
        """``read``, recompiled with a call per tensor if an inlined tensor read raised
        (a parameter became a wrapper subclass without storage)."""
        try:
            return self.read(modules, functions, own)
        except (RuntimeError, AttributeError, ValueError, IndexError, TypeError):
            if self.safe:
                raise
        self.read = RegionReader(
            modules,
            list(self.module_plans),
            list(self.function_plans),
            list(self.class_functions),
            tuple(zip(self.torch_labels, self._getters, strict=True)),
            functions,
            safe=True,
        ).read
        self.safe = True
        return self.read(modules, functions, own)


# first module of a region -> {key: reader}; weak, so readers die with their model
_readers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def cached_reader(key: tuple, anchor: Any, modules: list | None) -> RegionReader | None:
    """The reader stored under ``anchor`` (the region's module, or its first module) for
    ``key``; with ``modules``, only if it reads exactly those."""
    if anchor is None:
        return _unanchored.get(key)
    table = _readers.get(anchor)
    reader = table.get(key) if table is not None else None
    if reader is None:
        return None
    if modules is None:
        return reader if reader.module_refs[0]() is anchor else None
    return reader if reader.same_modules(modules) else None


def store_reader(key: tuple, anchor: Any, reader: RegionReader) -> None:
    if anchor is None:
        _unanchored[key] = reader
        return
    table = _readers.get(anchor)
    if table is None:
        table = _readers[anchor] = {}
    table[key] = reader


# regions that run no module (a plain function): keyed by their function plans, few
_unanchored: dict[tuple, RegionReader] = {}


def reader_count() -> int:
    return sum(len(table) for table in _readers.values()) + len(_unanchored)
