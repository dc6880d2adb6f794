"""Region readers: the plans of a region's modules and functions compiled into one function.

A region is read twice per step (after the forward, before the recompute), between kernels
that have pushed the guard's objects out of the CPU caches, so what a read costs is mostly the
memory it touches. A reader is generated, straight-line Python that returns ONE flat tuple:
torch settings (through torch's C getters), the global hooks, then per module its training
flag, forward, hooks, parameters, buffers, attribute chains and shape, then per function its
code, globals, closure and defaults. Two reads compare with a single ``==``; the labels of the
positions are looked at only when they differ.

Some positions are the plans' *shape*: a module's forward, code, sizes and children, each
function's code and the objects a function plan followed into callees. When they differ from
the reader's, the plans no longer describe the objects and the reader is rebuilt (See
NOTE [ Stale plans ]). A reader is compiled once per set of
modules and functions and cached under the region's first module (weakly): it dies with the
model.
"""

from __future__ import annotations

import operator
import os
import types
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
    FUNCTION,
    HOOKS,
    TORCH,
    BoundedCache,
    FunctionEntry,
    FunctionPlan,
    Label,
    ModulePlan,
    cache_state,
    cell_contents,
    cell_fp,
    code_reads,
    function_labels,
    inline_spec,
    plan_cache_sizes,
    read_chain,
)

_NAMESPACE = {
    "MISSING": MISSING,
    "cache_state": cache_state,
    "ENV_GET": os.environ.get,
    "ENV_COPY": os.environ.copy,
    "TENSOR_METHOD": _compat.TENSOR_METHOD,
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
        f"(TENSOR, id(_t), _t._version, _t.data_ptr(), _t.dtype, None, None, _t.requires_grad))"
    )


def _chain(root: str, chain: tuple, spec: tuple | None, name: str) -> tuple:
    """(expression, namespace entries) reading an attribute chain from the value ``root``
    evaluates to (a global, a module's attribute), through the plan's inline spec (see
    ``_readplan.inline_spec``) where there is one, else ``read_chain``. ``name`` prefixes the
    namespace entries."""
    if len(chain) == 1:
        return root, {}
    if spec is None:
        return f"read_chain({root}, {chain[1:]!r})", {}
    if spec[0] == "modules":  # through modules' dicts: torch.nn.functional.dropout
        entries = {f"{name}v": spec[1], "MODULE": types.ModuleType}
        steps = [f"type(_r := {root}) is MODULE"]
        steps += [
            f"type(_r := OGA(_r, '__dict__').get({a!r}, MISSING)) is MODULE" for a in chain[1:-1]
        ]
        steps.append(f"type(_v := OGA(_r, '__dict__').get({chain[-1]!r}, MISSING)) is {name}v")
        fallback = f"read_chain({root}, {chain[1:]!r})"
        return f"(_v if {' and '.join(steps)} else {fallback})", entries
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


_NO_SHAPE = object()  # a position that is no part of the plans' shape


class _Source:
    """A reader's source as it is written: each position of the read is added once, with its
    label and what else is known of it (part of the shape, an id, a raw value, a container
    the functions' own code mutates), so the lists describing the positions stay in step."""

    def __init__(self, safe: bool) -> None:
        self.safe = safe
        self.namespace = dict(_NAMESPACE)
        self.module_lines: list[str] = []  # statements binding the modules' locals
        self.function_lines: list[str] = []  # statements binding the functions' locals
        self.items: list[str] = []  # the read's expressions, one per position
        self.labels: list[Label] = []
        self.shape_positions: list[int] = []
        self.shape: list[Any] = []
        self.tensor_positions: dict[tuple[int, str], int] = {}
        self.raw: list[int] = []  # positions holding a value as it is, not its fingerprint
        self.identity: list[int] = []  # positions holding an object's id (an int, not a value)
        self.self_written: list[int] = []  # containers the functions' own code mutates
        self.weak_functions: list[weakref.ref] = []  # functions the reader dereferences
        self.writes_shared = False  # a function's own code writes a global or closure cell
        self.iterators: list[int] = []  # iterators the region's code advances
        # (function id, chain index) -> (position of an lru_cache's state, its maxsize)
        self.caches: dict[tuple[int, int], tuple[int, tuple]] = {}
        # position -> the lru_cache only through which it is read: (its state's position, size)
        self.behind_cache: dict[int, tuple[int, tuple]] = {}
        # (id of a library forward's globals, chain) -> (globals, chain, the function it led
        # to, the forward's name)
        self.library_calls: dict[tuple[int, tuple], tuple[dict, tuple, Any, str]] = {}
        self.library_objects: dict[int, Any] = {}  # the torch functions those chains led to
        self.method_names: dict[int, tuple[str, ...]] = {}  # position -> tensor methods it reads

    def add(
        self,
        expression: str,
        label: Label,
        shape: Any = _NO_SHAPE,
        identity: bool = False,
        raw: bool = False,
        self_written: bool = False,
    ) -> int:
        position = len(self.items)
        self.items.append(expression)
        self.labels.append(label)
        if shape is not _NO_SHAPE:
            self.shape_positions.append(position)
            self.shape.append(shape)
        if identity:
            self.identity.append(position)
        if raw:
            self.raw.append(position)
        if self_written:
            self.self_written.append(position)
        return position

    # what every region reads --------------------------------------------------------------

    def add_torch_state(self, torch_state: tuple) -> None:
        for index, (name, getter) in enumerate(torch_state):
            self.namespace[f"ts{index}"] = getter
            label = Label(TORCH, "torch_state", name, "process-wide torch setting")
            self.add(f"ts{index}()", label)

    def add_global_hooks(self) -> None:
        tables = [table for _, table in _compat.resolve().global_hook_dicts]
        for index, table in enumerate(tables):
            self.namespace[f"gh{index}"] = table
        self.namespace["global_hooks"] = _global_hooks
        any_hooks = " or ".join(f"gh{i}" for i in range(len(tables)))
        where = "global module hooks, run by every module"
        self.add(f"(global_hooks(own) if ({any_hooks}) else ())", Label(HOOKS, "hook", "", where))

    # the modules' part ----------------------------------------------------------------------

    def add_module(self, i: int, plan: ModulePlan, module: Any, top: bool) -> None:
        """Module ``i``: its training flag, forward, hooks, tensors, attribute chains and
        shape. ``top``: the region's own module, read for a non-reentrant recompute."""
        if plan.opaque:  # TorchScript: its training flag and tensors, through torch
            self.add(f"mods[{i}].training", Label(i, "training", "training", None))
            self.add(f"script_tensors(mods[{i}])", Label(i, "tensor", "", None))
            return
        self.module_lines += [
            f"    s{i} = mods[{i}].__dict__",
            f'    p{i} = s{i}["_parameters"]',
            f'    b{i} = s{i}["_buffers"]',
            f'    m{i} = s{i}["_modules"]',
        ]
        if not plan.inert:
            # the class the module has now: one reassigned (``__class__ = ...``) runs its forward
            self.module_lines.append(f'    f{i} = s{i}.get("forward") or type(mods[{i}]).forward')
        if not plan.inert:  # a container's shape below covers a forward added to it
            # a wrapper module (torch.compile's) keeps its flag in the module it wraps
            self.add(f's{i}.get("training", MISSING)', Label(i, "training", "training", None))
            # its code is read with the functions' part (torch's own forwards aside)
            forward = Label(i, "function", "forward", None)
            self.add(f"id(f{i})", forward, shape=plan.forward, identity=True)
            self.add(_hooks_of(f"s{i}", top), Label(i, "hook", "hooks", None))
        for table, names in ((f"p{i}", plan.params), (f"b{i}", plan.buffers)):
            loose = plan.loose and table.startswith("p")
            for name in names:
                expression = _tensor(f"{table}.get({name!r})", loose, self.safe)
                label = Label(i, "tensor", name, None)
                self.tensor_positions[(i, name)] = self.add(expression, label)
        for number, read in enumerate(plan.chains):
            chain, source, kind = read.chain, read.source, read.kind
            if source[0] == "class":
                self.namespace[f"cd{i}_{source[1]}"] = plan.class_dicts[source[1]]
                expression = f"cd{i}_{source[1]}.get({source[2]!r}, MISSING)"
            elif source[0] == "type":  # self.__class__, type(self)
                expression = f"type(mods[{i}])"
            else:
                table = {"dict": "s", "_parameters": "p", "_buffers": "b"}.get(source[0], "m")
                expression = f"{table}{i}.get({source[1]!r}, MISSING)"
            expression, inline = _chain(expression, chain, read.spec, f"M{i}_{number}")
            self.namespace.update(inline)
            at = self.add(
                _convert(expression, kind),
                Label(i, "attribute", ".".join(chain), None),
                identity=kind == "object",
            )
            if number in plan.iterators:
                self.iterators.append(at)
        for namespace, chain, target in plan.calls:  # read with the functions' part
            key = (id(namespace), chain)
            if key not in self.library_calls:
                caller = f"{plan.cls.__qualname__}.forward"
                self.library_calls[key] = (namespace, chain, target, caller)
        for table, size, name in zip(("s", "p", "b", "m"), plan.shape, _SIZED, strict=True):
            # small ints: nothing allocated
            self.add(f"len({table}{i})", Label(i, "shape", name, None), shape=size)
        if module._modules:  # a child replaced; one added changes the sizes
            self.add(
                f"tuple(map(id, m{i}.values()))",
                Label(i, "shape", "children", None),
                shape=tuple(map(id, module._modules.values())),
            )

    # the functions' part --------------------------------------------------------------------

    def add_functions(
        self, function_plans: list[FunctionPlan], class_functions: list, functions: list
    ) -> None:
        """Each function once, however many plans reach it: the region's own functions come
        in as ``roots``, the others are dereferenced by the reader (``live_functions`` keeps
        them)."""
        self._add_library_calls()
        entries: list[FunctionEntry] = []
        sources: list[int | weakref.ref] = []  # index into ``roots``, or a weak reference
        starts: list[int] = []  # where each entry's plan starts in ``entries``
        roots = len(function_plans) - len(class_functions)
        for index, plan in enumerate(function_plans):
            start = len(entries)
            for number, entry in enumerate(plan.entries):
                entries.append(entry)
                starts.append(start)
                if number:
                    assert entry.ref is not None  # only a plan's root has none
                    sources.append(entry.ref)
                else:
                    sources.append(index if index < roots else class_functions[index - roots])
        seen: set[int] = set()
        for position, (func, entry, source) in enumerate(
            zip(functions, entries, sources, strict=True)
        ):
            if id(func) not in seen:
                seen.add(id(func))
                cache = None
                if entry.behind is not None:  # reached only through an lru_cache wrapper
                    caller, chain = entry.behind
                    cache = (id(functions[starts[position] + caller]), chain)
                self._add_function(position, func, entry, source, cache)

    def _add_library_calls(self) -> None:
        """The torch functions torch's own module code calls (``F.linear`` in ``Linear``),
        once per region however many modules share it, with what the region shares."""
        for number, (namespace, chain, target, caller) in enumerate(self.library_calls.values()):
            self.namespace[f"LG{number}"] = namespace
            spec = inline_spec(namespace.get(chain[0], MISSING), chain, target)
            root = f"LG{number}.get({chain[0]!r}, MISSING)"
            expression, inline = _chain(root, chain, spec, f"L{number}_")
            self.namespace.update(inline)
            label = Label(
                FUNCTION, "function", ".".join(chain), f"torch function called by {caller}"
            )
            self.add(f"id({expression})", label, identity=True)
            self.library_objects[id(target)] = target

    def _add_function(
        self,
        position: int,
        func: Any,
        entry: FunctionEntry,
        source: int | weakref.ref,
        cache: tuple[int, int] | None,
    ) -> None:
        """A function's code, then its globals (with the state of an lru_cache among them),
        closure cells, chains read through them, its defaults, the environment variables and
        tensor methods its code reads, in the order of ``function_labels``. ``cache``: the
        (caller, chain) of the lru_cache only through which it runs; its values matter only
        where that cache lost what it held."""
        first = len(self.items)
        name = f"F{position}"
        if isinstance(source, int):
            self.function_lines.append(f"    {name} = roots[{source}]")
        else:
            self.namespace[f"W{position}"] = source
            self.weak_functions.append(source)
            self.function_lines.append(f"    {name} = W{position}()")
        self.function_lines.append(f"    G{position} = {name}.__globals__")
        labels = iter(function_labels(func, entry))
        reads = code_reads(func.__code__) if func is not None else None
        mutated = reads.mutated if reads is not None else frozenset()
        if reads is None or mutated or reads.rebinds:
            self.writes_shared = True
        # the code its plan was made from: swapped since, the plan no longer describes what
        # the function reads. See NOTE [ Stale plans ]
        self.add(f"{name}.__code__", next(labels), shape=entry.code)
        followed = dict(entry.followed)
        iterators = set(entry.iterators)
        for number, read in enumerate(entry.chains):
            root = f"G{position}.get({read.chain[0]!r}, MISSING)"
            expression, inline = _chain(root, read.chain, read.spec, f"I{position}_{number}")
            self.namespace.update(inline)
            own = len(read.chain) == 1 and read.chain[0] in mutated
            at = self.add(
                _convert(expression, read.kind),
                next(labels),
                shape=followed.get(number, _NO_SHAPE),
                identity=read.kind == "object",
                self_written=own and read.kind != "object",
            )
            if ("chain", number) in iterators:
                self.iterators.append(at)
            # a torch function: named in a message if it is patched later. ``func`` is None
            # where a function the plan follows was collected since the plan was made (a
            # closure of an earlier call of the same code): such a reader is never read
            # (``live_functions`` is None), ``capture`` plans the region afresh
            if read.called and func is not None:
                target = read_chain(func.__globals__.get(read.chain[0], MISSING), read.chain[1:])
                self.library_objects[id(target)] = target
            if read.cache is not None:
                at = self.add(f"cache_state({expression})", next(labels), raw=True)
                self.caches[(id(func), number)] = (at, read.cache)
        freevars = func.__code__.co_freevars if func is not None else ()
        for c, kind in enumerate(entry.cells):
            own = c < len(freevars) and freevars[c] in mutated
            if kind == "empty" or self.safe:  # safe: an empty cell reads as MISSING
                expression = f"cell_fp({name}, {c}, {kind == 'object'})"
            else:
                expression = _convert(f"{name}.__closure__[{c}].cell_contents", kind)
            at = self.add(
                expression,
                next(labels),
                identity=kind == "object",
                self_written=own and kind != "object",
            )
            if ("cell", c) in iterators:
                self.iterators.append(at)
        for through in entry.cell_chains:
            expression = f"read_chain(cell_contents({name}, {through.cell}), {through.attrs!r})"
            kind = through.kind
            self.add(_convert(expression, kind), next(labels), identity=kind == "object")
        if entry.defaults == "scalars":  # the tuple itself: immutable, compared by value
            self.add(f"{name}.__defaults__", next(labels), raw=True)
        elif entry.defaults is not None:
            self.add(f"value_fp({name}.__defaults__)", next(labels))
        if entry.kwdefaults:
            self.add(f"value_fp({name}.__kwdefaults__)", next(labels))
        for key in entry.environment:
            self.add(f"ENV_GET({key!r})" if key is not None else "ENV_COPY()", next(labels))
        if entry.methods:
            self.namespace[f"TM{position}"] = entry.methods
            at = self.add(f"tuple(map(TENSOR_METHOD, TM{position}))", next(labels), raw=True)
            self.method_names[at] = entry.methods
        assert next(labels, None) is None, "a label for each value"
        found = self.caches.get(cache) if cache is not None else None
        if found is not None:
            for at in range(first, len(self.items)):
                self.behind_cache[at] = found

    # the compiled functions -----------------------------------------------------------------

    def compile(self, heads: int, modules_end: int) -> _Compiled:
        """The modules' part, and the torch settings, global hooks and functions' part.
        See NOTE [ Shared state, read once per backward pass ]"""
        items = self.items
        head, own_items, shared = items[:heads], items[heads:modules_end], items[modules_end:]
        source = "\n".join(
            [
                "def read_modules(mods):",
                *self.module_lines,
                _returned(own_items),
                "def read_shared(roots, own):",
                *self.function_lines,
                f"    return {_tuple(head)}, {_tuple(shared)}",
            ]
        )
        return _compiled_for(source, self.namespace)


class _Compiled:
    """A reader's two compiled functions, shared by the readers whose source and namespace
    are the same: the layers of a model, read one after another, run one copy of the code,
    so its bytes are fetched into the CPU caches once per pass, not once per layer."""

    __slots__ = ("read_modules", "read_shared", "__weakref__")

    def __init__(self, source: str, namespace: dict) -> None:
        exec(compile(source + "\n", "<ckptguard region reader>", "exec"), namespace)
        self.read_modules = namespace["read_modules"]
        self.read_shared = namespace["read_shared"]


# (source, identities of the namespace's values) -> weak reference to the readers' _Compiled.
# The compiled functions hold their namespace, so while an entry's functions live its ids
# name the same objects; the entry goes with them.
# See NOTE [ Never keeps a user's object alive ]
_compiled: dict[tuple, weakref.ref] = {}


def _compiled_for(source: str, namespace: dict) -> _Compiled:
    key = (source, tuple([(name, id(value)) for name, value in namespace.items()]))
    ref = _compiled.get(key)
    found = ref() if ref is not None else None
    if found is not None:
        return found
    found = _Compiled(source, namespace)

    def forget(dead: weakref.ref, key: tuple = key) -> None:
        if _compiled.get(key) is dead:
            del _compiled[key]

    _compiled[key] = weakref.ref(found, forget)
    return found


class RegionReader:
    """One compiled reader for a fixed list of module plans and function plans.

    ``labels[i]`` says what position ``i`` of a read holds (a ``Label``). ``shape`` is what
    the positions in ``shape_positions`` held when the plans were made.
    """

    __slots__ = (
        "compiled",
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
        "iterators",
        "behind_cache",
        "library_objects",
        "library_calls",
        "method_names",
        "safe",
        "top_hooks",
        "torch_compiled",
        "hookless_at",
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
        self.hookless_at: int | None = None  # see ``_hooks.hooked_modules``
        # it runs code torch.compile made (see ``_compat.compiled_by_dynamo``)
        self.torch_compiled = any(map(_compat.compiled_by_dynamo, modules)) or any(
            entry.compiled for plan in function_plans for entry in plan.entries
        )

        source = _Source(safe)
        source.add_torch_state(torch_state)
        source.add_global_hooks()
        heads = len(source.items)
        for index, (plan, module) in enumerate(zip(module_plans, modules, strict=True)):
            source.add_module(index, plan, module, top_hooks and index == 0)
        modules_end = len(source.items)
        source.add_functions(function_plans, class_functions, functions)
        self.compiled = compiled = source.compile(heads, modules_end)
        self.read_modules, self.read_shared = compiled.read_modules, compiled.read_shared

        self.labels = tuple(source.labels)
        self.weak_functions = tuple(source.weak_functions)
        self.shape_positions = tuple(source.shape_positions)
        self.shape = tuple(source.shape)
        self.tensor_positions = source.tensor_positions
        self.raw_positions = frozenset(source.raw)
        self.identity_positions = frozenset(source.identity)
        self.self_written = tuple(source.self_written)
        self.iterators = tuple(source.iterators)
        self.behind_cache = source.behind_cache
        self.library_objects = source.library_objects
        self.library_calls = tuple(source.library_calls.values())
        self.method_names = source.method_names
        positions = source.shape_positions
        self._shape_of = operator.itemgetter(*positions) if positions else None
        self.writes_shared = source.writes_shared
        # what several regions share: torch settings, global hooks and the functions' part,
        # read once per backward pass; the modules' part apart.
        # See NOTE [ Shared state, read once per backward pass ]
        self.parts = (heads, modules_end)
        self.shared_signature = (
            tuple(name for name, _ in torch_state),
            tuple(map(id, function_plans)),
            tuple(map(id, class_functions)),
            tuple(source.library_calls),  # torch functions the modules' torch code calls
        )

    def read(self, modules: list, roots: list, own: frozenset) -> tuple:
        """The whole read: torch settings and global hooks, the modules' part, the functions'
        part, in that order (the positions of ``labels``)."""
        head, functions = self.read_shared(roots, own)
        return head + self.read_modules(modules) + functions

    def shape_of(self, values: tuple) -> tuple:
        if self._shape_of is None:
            return ()
        found = self._shape_of(values)
        return found if len(self.shape_positions) > 1 else (found,)

    def same_modules(self, modules: list) -> bool:
        return len(modules) == len(self.module_refs) and all(
            ref() is module for ref, module in zip(self.module_refs, modules, strict=True)
        )

    def live_modules(self) -> list:
        """The modules it reads that are still alive."""
        return [m for m in map(DEREFERENCE, self.module_refs) if m is not None]

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
        self.compiled = safe.compiled
        self.read_modules, self.read_shared = safe.read_modules, safe.read_shared
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
# its module does, so readers die with their model (a plain dict: looked up twice a region).
# See NOTE [ Never keeps a user's object alive ]
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
