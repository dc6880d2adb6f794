"""Region readers: the plans of a region's modules and functions compiled into one function.

A region is read twice per step (after the forward, before the recompute), between kernels
that have pushed the guard's objects out of the CPU caches, so what a read costs is mostly the
memory it touches. A reader is generated, straight-line Python that returns ONE flat tuple:
torch settings (through torch's C getters), the global hooks, then per module its training
flag, forward, hooks, parameters, buffers, attribute chains and shape, then per function its
code, globals, closure and defaults. Two reads compare with a single ``==``; the labels of the
positions are looked at only when they differ.

Some positions are the plans' *shape*: a module's forward, code, sizes and children, and the
objects a function plan followed into callees. When they differ from the reader's, the plans
no longer describe the objects and the reader is rebuilt. A reader is compiled once per set of
modules and functions and cached under the region's first module (weakly): it dies with the
model.
"""

from __future__ import annotations

import operator
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
    script_tensors,
    tensor_fp,
    value_fp,
)
from ckptguard._readplan import (
    BoundedCache,
    FunctionPlan,
    ModulePlan,
    cell_contents,
    cell_fp,
    code_reads,
    function_labels,
    plan_cache_sizes,
    read_chain,
)

_NAMESPACE = {
    "MISSING": MISSING,
    "SKIPPED": SKIPPED,
    "PLAIN": SCALAR_TYPES | {type(MISSING)},
    "OGA": object.__getattribute__,
    "value_fp": value_fp,
    "tensor_fp": tensor_fp,
    "script_tensors": script_tensors,
    "loose_tensor_fp": loose_tensor_fp,
    "read_chain": read_chain,
    "cell_fp": cell_fp,
    "cell_contents": cell_contents,
    "TENSOR": TENSOR,
}

_SIZED = ("__dict__", "_parameters", "_buffers", "_modules")  # a module's sizes, in order
DEREFERENCE = weakref.ref.__call__  # map(DEREFERENCE, refs): the referents, without a frame
TORCH = "torch"  # label owners besides module indexes
HOOKS = "hooks"
FUNCTION = "function"


def _convert(expression: str, kind: str) -> str:
    """Objects by identity; anything else through ``value_fp``, without the call where the
    value is a scalar or a marker (``MISSING``, ``SKIPPED``), which ``value_fp`` returns as is."""
    if kind == "object":
        return f"id({expression})"
    return f"(_v if type(_v := {expression}) in PLAIN else value_fp(_v))"


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


def _global_chain(namespace: str, chain: tuple, spec: tuple | None, name: str) -> tuple:
    """(expression, namespace entries) reading a global or an attribute chain from one,
    through the plan's inline spec (see ``_readplan._inline_spec``) where there is one, else
    ``read_chain``. ``name`` prefixes the namespace entries."""
    root = f"{namespace}.get({chain[0]!r}, MISSING)"
    if len(chain) == 1:
        return root, {}
    if spec is None:
        return f"read_chain({root}, {chain[1:]!r})", {}
    attribute = chain[1]
    fallback = f"read_chain(_r, {chain[1:]!r})"
    if spec[0] == "own":
        _, root_type, value_type = spec
        entries = {f"{name}t": root_type, f"{name}v": value_type}
        lookup = f"OGA(_r, '__dict__').get({attribute!r}, MISSING)"
        guard = f"type(_r := {root}) is {name}t and type(_v := {lookup}) is {name}v"
        return f"(_v if {guard} else {fallback})", entries
    _, root_type, has_dict, before, class_dict, value_type, as_stored = spec
    entries = {f"{name}t": root_type, f"{name}k": class_dict, f"{name}v": value_type}
    guards = [f"type(_r := {root}) is {name}t"]
    if has_dict:
        guards.append(f"{attribute!r} not in OGA(_r, '__dict__')")
    for index, earlier in enumerate(before):
        entries[f"{name}b{index}"] = earlier
        guards.append(f"{attribute!r} not in {name}b{index}")
    guards.append(f"type(_v := {name}k.get({attribute!r}, MISSING)) is {name}v")
    result = "_v" if as_stored else "SKIPPED"
    return f"({result} if {' and '.join(guards)} else {fallback})", entries


def _tuple(items: list[str]) -> str:
    return "(\n        " + ",\n        ".join(items) + ",\n    )" if items else "()"


def _returned(items: list[str]) -> str:
    return f"    return {_tuple(items)}"


def _module_chain(expression: str, chain: tuple) -> str:
    return expression if len(chain) == 1 else f"read_chain({expression}, {chain[1:]!r})"


def _hooks_of(state: str, top: bool) -> str:
    """The keys of a module's four hook dicts, () when all are empty. ``top``: the region
    module's own forward hooks are left out (a non-reentrant recompute stops inside its
    forward and never uses its output, so such a hook never matters)."""
    watched = [h for h in MODULE_HOOK_DICTS if not (top and h == "_forward_hooks")]
    shown = ", ".join(
        "()" if h not in watched else f"tuple({state}[{h!r}])" for h in MODULE_HOOK_DICTS
    )
    any_hooks = " or ".join(f"{state}[{h!r}]" for h in watched)
    return f"(({shown}) if ({any_hooks}) else ())"


def _global_hooks(own: frozenset) -> tuple:
    """Keys of the four global hook dicts but the guard's own, () when there are none."""
    keys = tuple(
        tuple([k for k in table if k not in own])
        for _, table in _compat.resolve().global_hook_dicts
    )
    return keys if any(keys) else ()


class RegionReader:
    """One compiled reader for a fixed list of module plans and function plans.

    ``labels[i]`` says what position ``i`` of a read holds: ``(owner, kind, name, where)``,
    the owner being ``TORCH``, ``HOOKS``, a module's index or ``FUNCTION``. ``shape`` is what
    the positions in ``shape_positions`` held when the plans were made.
    """

    __slots__ = (
        "read",
        "read_modules",
        "read_shared",
        "shared_signature",
        "writes_shared",
        "parts",
        "module_plans",
        "module_refs",
        "function_plans",
        "class_functions",
        "weak_functions",
        "labels",
        "shape_positions",
        "shape",
        "tensor_positions",
        "raw_positions",
        "identity_positions",
        "stateful",
        "self_written",
        "safe",
        "top_hooks",
        "_getters",
        "_shape_of",
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
        top_hooks: bool = False,
        safe: bool = False,
    ):
        self.module_plans = tuple(module_plans)
        self.module_refs = tuple(weakref.ref(m) for m in modules)
        self.function_plans = tuple(function_plans)
        self.class_functions = tuple(class_functions)  # weak refs to the modules' functions
        self.stateful = tuple(
            i for i, plan in enumerate(module_plans) if plan.buffers or plan.stores_scalars
        )
        self.safe = safe
        self.top_hooks = top_hooks
        self._getters = torch_state
        namespace = dict(_NAMESPACE)
        lines = ["def read(mods, roots, own):"]
        items: list[str] = []
        labels: list[tuple] = []
        shape_positions: list[int] = []
        shape: list[Any] = []
        tensor_positions: dict[tuple[int, str], int] = {}
        raw: list[int] = []  # positions holding a value as it is, not its fingerprint
        identity: list[int] = []  # positions holding an object's id (an int, not a value)
        self_written: list[int] = []  # containers the functions' own code mutates

        for index, (label, getter) in enumerate(torch_state):
            namespace[f"ts{index}"] = getter
            items.append(f"ts{index}()")
            labels.append((TORCH, "torch_state", label, "process-wide torch setting"))
        tables = [table for _, table in _compat.resolve().global_hook_dicts]
        for index, table in enumerate(tables):
            namespace[f"gh{index}"] = table
        namespace["global_hooks"] = _global_hooks
        any_hooks = " or ".join(f"gh{i}" for i in range(len(tables)))
        items.append(f"(global_hooks(own) if ({any_hooks}) else ())")
        labels.append((HOOKS, "hook", None, "global module hooks, run by every module"))

        for i, (plan, module) in enumerate(zip(module_plans, modules, strict=True)):
            if plan.opaque:  # TorchScript: its training flag and tensors, through torch
                items += [f"mods[{i}].training", f"script_tensors(mods[{i}])"]
                labels += [(i, "training", "training", None), (i, "tensor", "", None)]
                continue
            namespace[f"C{i}"] = plan.cls
            lines.append(f"    s{i} = mods[{i}].__dict__")
            lines.append(f'    p{i} = s{i}["_parameters"]')
            lines.append(f'    b{i} = s{i}["_buffers"]')
            lines.append(f'    m{i} = s{i}["_modules"]')
            lines.append(f'    f{i} = s{i}.get("forward") or C{i}.forward')
            code = f"f{i}.__code__" if plan.code is not None else f'getattr(f{i}, "__code__", None)'
            shape_positions.append(len(items) + 1)
            shape.append(plan.forward)
            if plan.code is not None:
                shape_positions.append(len(items) + 2)
                shape.append(plan.code)
            hooks = _hooks_of(f"s{i}", top_hooks and i == 0)
            identity.append(len(items) + 1)
            # a wrapper module (torch.compile's) keeps its flag in the module it wraps
            items += [f's{i}.get("training", MISSING)', f"id(f{i})", code, hooks]
            labels += [
                (i, "training", "training", None),
                (i, "function", "forward", None),
                (i, "function", "forward.__code__", None),
                (i, "hook", "hooks", None),
            ]
            for table, names in ((f"p{i}", plan.params), (f"b{i}", plan.buffers)):
                loose = plan.loose and table.startswith("p")
                for name in names:
                    tensor_positions[(i, name)] = len(items)
                    items.append(_tensor(f"{table}.get({name!r})", loose, safe))
                    labels.append((i, "tensor", name, None))
            for chain, source, kind in plan.chains:
                if source[0] == "class":
                    namespace[f"cd{i}_{source[1]}"] = plan.class_dicts[source[1]]
                    expression = f"cd{i}_{source[1]}.get({source[2]!r}, MISSING)"
                else:
                    table = {"dict": "s", "_parameters": "p", "_buffers": "b"}.get(source[0], "m")
                    expression = f"{table}{i}.get({source[1]!r}, MISSING)"
                if kind == "object":
                    identity.append(len(items))
                items.append(_convert(_module_chain(expression, chain), kind))
                labels.append((i, "attribute", ".".join(chain), None))
            tables = ("s", "p", "b", "m")
            for table, size, name in zip(tables, plan.shape, _SIZED, strict=True):
                shape_positions.append(len(items))
                shape.append(size)
                items.append(f"len({table}{i})")  # small ints: nothing allocated
                labels.append((i, "shape", name, None))
            if module._modules:  # a child replaced; one added changes the sizes
                shape_positions.append(len(items))
                shape.append(tuple(map(id, module._modules.values())))
                items.append(f"tuple(map(id, m{i}.values()))")
                labels.append((i, "shape", "children", None))

        module_lines, lines = lines[1:], [lines[0]]
        heads = len(torch_state) + 1
        modules_end = len(items)
        # each function once, however many plans reach it: the region's own functions come
        # in as ``roots``, the others are dereferenced here (``live_functions`` keeps them)
        entries, sources = [], []
        roots = len(function_plans) - len(class_functions)
        for index, plan in enumerate(function_plans):
            for number, entry in enumerate(plan.entries):
                entries.append(entry)
                if number:
                    sources.append(entry[0])
                else:
                    sources.append(index if index < roots else class_functions[index - roots])
        weak: list = []
        seen: set[int] = set()
        writes = False  # whether a function's own code writes a global or a closure cell
        for position, (func, entry) in enumerate(zip(functions, entries, strict=True)):
            if id(func) in seen:
                continue
            seen.add(id(func))
            _, chains, cells, cell_chains, defaults, followed, planned = entry
            name = f"F{position}"
            source = sources[position]
            if type(source) is int:
                lines.append(f"    {name} = roots[{source}]")
            else:
                namespace[f"W{position}"] = source
                weak.append(source)
                lines.append(f"    {name} = W{position}()")
            lines.append(f"    G{position} = {name}.__globals__")
            first = len(items) + 1
            # the code its plan was made from: swapped since, the plan no longer describes
            # what the function reads (a caller's cached plan keeps its callees' entries)
            shape_positions.append(first - 1)
            shape.append(planned)
            for chain_index, ident in followed:
                shape_positions.append(first + chain_index)
                shape.append(ident)
            values = [f"{name}.__code__"]
            reads = code_reads(func.__code__) if func is not None else None
            mutated = reads.mutated if reads is not None else frozenset()
            writes = writes or reads is None or bool(mutated or reads.rebinds)
            freevars = func.__code__.co_freevars if func is not None else ()
            # (expression, kind of value, whether the expression already fingerprints it,
            # whether the function's own code mutates the value in place)
            read: list[tuple[str, str, bool, bool]] = []
            for number, (chain, kind, spec) in enumerate(chains):
                expression, inline = _global_chain(
                    f"G{position}", chain, spec, f"I{position}_{number}"
                )
                namespace.update(inline)
                read.append((expression, kind, False, len(chain) == 1 and chain[0] in mutated))
            for c, kind in enumerate(cells):
                own = c < len(freevars) and freevars[c] in mutated
                if kind == "empty" or safe:  # safe: an empty cell reads as MISSING
                    read.append((f"cell_fp({name}, {c}, {kind == 'object'})", kind, True, own))
                else:
                    read.append((f"{name}.__closure__[{c}].cell_contents", kind, False, own))
            for c, attrs, kind in cell_chains:
                expression = f"read_chain(cell_contents({name}, {c}), {attrs!r})"
                read.append((expression, kind, False, False))
            for expression, kind, converted, own in read:
                if kind == "object":
                    identity.append(len(items) + len(values))
                if own and kind != "object":
                    self_written.append(len(items) + len(values))
                values.append(expression if converted else _convert(expression, kind))
            if defaults[0] == "scalars":  # the tuple itself: immutable, compared by value
                raw.append(len(items) + len(values))
                values.append(f"{name}.__defaults__")
            elif defaults[0] is not None:
                values.append(f"value_fp({name}.__defaults__)")
            if defaults[1]:
                values.append(f"value_fp({name}.__kwdefaults__)")
            items += values
            labels += [(FUNCTION, *label) for label in function_labels(func, entry)]

        self.labels = tuple(labels)
        self.weak_functions = tuple(weak)
        self.shape_positions = tuple(shape_positions)
        self.shape = tuple(shape)
        self.tensor_positions = tensor_positions
        self.raw_positions = frozenset(raw)
        self.identity_positions = frozenset(identity)
        self.self_written = tuple(self_written)
        self._shape_of = operator.itemgetter(*shape_positions) if shape_positions else None
        self.writes_shared = writes
        # what several regions share: torch settings, global hooks and the functions' part,
        # read once per backward pass (see ``_verify.compare``); the modules' part apart
        self.parts = (heads, modules_end)
        self.shared_signature = (
            tuple(label for label, _ in torch_state),
            tuple(map(id, function_plans)),
            tuple(map(id, class_functions)),
        )
        head, own_items, shared = items[:heads], items[heads:modules_end], items[modules_end:]
        source = "\n".join(
            [
                *lines[:1],
                *module_lines,
                *lines[1:],
                _returned(items),
                "def read_modules(mods):",
                *module_lines,
                _returned(own_items),
                "def read_shared(roots, own):",
                *lines[1:],
                f"    return {_tuple(head)}, {_tuple(shared)}",
            ]
        )
        exec(compile(source + "\n", "<ckptguard region reader>", "exec"), namespace)
        self.read = namespace["read"]
        self.read_modules = namespace["read_modules"]
        self.read_shared = namespace["read_shared"]

    def shape_of(self, values: tuple) -> tuple:
        if self._shape_of is None:
            return ()
        found = self._shape_of(values)
        return found if len(self.shape_positions) > 1 else (found,)

    def same_modules(self, modules: list) -> bool:
        return len(modules) == len(self.module_refs) and all(
            ref() is module for ref, module in zip(self.module_refs, modules, strict=True)
        )

    def live_functions(self) -> list | None:
        """The functions the reader dereferences itself, to hold while a fingerprint needs
        them; None if one was collected (the plans must be rebuilt)."""
        functions = list(map(DEREFERENCE, self.weak_functions))
        return None if None in functions else functions  # functions compare by identity

    def read_safely(self, modules: list, roots: list, own: frozenset) -> tuple:
        """``read``, recompiled with a call per tensor if an inlined tensor read raised
        (a parameter became a wrapper subclass without storage)."""
        try:
            return self.read(modules, roots, own)
        except (RuntimeError, AttributeError, ValueError, IndexError, TypeError):
            if self.safe:
                raise
        # recompiled with the same plans: same positions, so fingerprints stay comparable
        safe = RegionReader(
            modules,
            list(self.module_plans),
            list(self.function_plans),
            list(self.class_functions),
            self._getters,
            self.functions(roots),
            self.top_hooks,
            safe=True,
        )
        self.read, self.read_modules, self.read_shared = (
            safe.read,
            safe.read_modules,
            safe.read_shared,
        )
        self.safe = True
        return self.read(modules, roots, own)

    def functions(self, roots: list) -> list:
        """Every plan entry's function, as the plans were made for (to compile a reader)."""
        holders = [*roots, *(ref() for ref in self.class_functions)]
        return [
            func
            for plan, holder in zip(self.function_plans, holders, strict=True)
            for func in plan.functions(holder)
        ]


# id of a region's first module -> (weak reference to it, {key: reader}); an entry goes when
# its module does, so readers die with their model (a plain dict: looked up twice a region)
_readers: dict[int, tuple[weakref.ref, dict]] = {}


def cached_reader(key: tuple, anchor: Any, modules: list | None) -> RegionReader | None:
    """The reader stored under ``anchor`` (the region's module, or its first module) for
    ``key``; with ``modules``, only if it reads exactly those."""
    if anchor is None:
        return _unanchored.get(key)
    entry = _readers.get(id(anchor))
    if entry is None or entry[0]() is not anchor:
        return None
    reader = entry[1].get(key)
    if reader is None:
        return None
    if modules is None:
        return reader if reader.module_refs[0]() is anchor else None
    return reader if reader.same_modules(modules) else None


def store_reader(key: tuple, anchor: Any, reader: RegionReader) -> None:
    if anchor is None:
        _unanchored[key] = reader
        return
    ident = id(anchor)
    entry = _readers.get(ident)
    if entry is None or entry[0]() is not anchor:
        entry = _readers[ident] = (weakref.ref(anchor, lambda _: _readers.pop(ident, None)), {})
    entry[1][key] = reader


# regions that run no module (a plain function): keyed by their function plans, few
_unanchored: dict[tuple, RegionReader] = BoundedCache()


def cache_sizes() -> dict[str, int]:
    """Sizes of the guard's caches (plans and compiled readers): bounded by the distinct code
    objects and the live modules."""
    readers = sum(len(table) for _, table in _readers.values()) + len(_unanchored)
    return {**plan_cache_sizes(), "region_readers": readers}
