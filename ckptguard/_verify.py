"""A region's fingerprint: everything it can reach, read through plans after the forward and
read again before each recompute; the first difference is returned as a record of positions
(``Found``), which ``_explain`` names (it alone re-reads to describe, and words).

What a region reaches: process-wide torch settings; the global module hooks; the modules its
forward ran (seen by ``_intercept``) plus modules bound into the callable; the functions it and
those modules' code call (their globals, closures and defaults); its arguments (keywords and
containers, bounded) and objects bound into partials and methods, with the attribute chains
its code reads from them.
"""

from __future__ import annotations

import functools
import operator
import threading
import types
import weakref
from collections.abc import Iterator
from collections.abc import Set as AbstractSet
from typing import Any, NamedTuple

import torch

from ckptguard import _compat
from ckptguard._fingerprint import (
    MISSING,
    SCALAR_TYPES,
    arguments_fp,
    input_fp,
    of_type,
    value_fp,
)
from ckptguard._hooks import FORWARD_TABLES
from ckptguard._reader import (
    DEREFERENCE,
    RegionReader,
    cached_reader,
    store_reader,
)
from ckptguard._readplan import (
    TORCH,
    BoundedCache,
    cache_kept,
    cell_contents,
    chains_through_code,
    code_reads,
    function_plan,
    is_iterator,
    is_library_code,
    module_plan,
    read_chain,
    rebuild_function_plan,
    static_attribute,
    unwrap_function,
)

# NOTE [ Read twice ]
# A region is read twice: right after its forward (``capture``) and at the start of each
# recompute, before any of its code runs (``compare``). The recompute runs the region's code
# again on what it reaches then, so any value that differs between the two reads is state the
# recompute sees differently from the forward; one that is equal cannot change what it
# computes. Both reads go through the same compiled reader, so they are comparable position
# by position, and a clean step costs two reads and one ``==``. Verifying at the start matters:
# a non-reentrant recompute stops early (``_StopRecomputationError``) once the last saved
# tensor is made, and code after that point never runs.

_MODULE_CALLS = frozenset({"__call__", "_wrapped_call_impl", "_call_impl"})


class Binding(NamedTuple):
    """A region's callable taken apart once: the arguments bound before the call's own, the
    innermost Python function (whose argument chains count), the module the region calls
    (None: a function region, which may call any module), the region's own functions (what
    the callable holds directly, library code aside), the modules it holds directly, and the
    code it runs under its decorators (what names it)."""

    bound_args: list
    keywords: tuple[dict, ...]  # the partials' own keyword dicts, outermost first (live)
    function: types.FunctionType | None
    bound_values: list  # bound arguments but modules, as fingerprinted
    module: torch.nn.Module | None
    roots: list
    reached: list
    code: Any
    structure: Any  # its _Structure, which remembers the region's reader
    segment: types.FunctionType | None  # checkpoint_sequential's closure, if that is the region
    torch_compiled: bool  # it holds code torch.compile made (see ``_compat.compiled_by_dynamo``)


def bind(fn: Any) -> Binding:
    """Unwrap partials and bound methods down to what the region calls. The module a region
    calls: ``checkpoint(block, ...)``, ``block.__call__``, partials of them, and
    ``partial(Block.forward, block, ...)`` (transformers' layers). What the callable is made
    of is worked out once per structure (see ``_Structure``); the values bound into partials
    are taken from each call's callable."""
    bound_args, keywords, key, objects, innermost = _take_apart(fn)
    structure = _structures.get(key) if key is not None else None
    parts = structure.parts() if structure is not None and structure.holds(objects) else None
    if (
        structure is None or parts is None
    ):  # new, or one of its objects collected (ids are reused) or rebound
        structure = _Structure(fn, innermost, bound_args, objects)
        if key is not None and structure.refs is not None:
            _structures[key] = structure
        parts = structure.parts()
        assert parts is not None, "what a new structure holds is alive: fn holds it"
    function, module, roots, reached = parts
    return Binding(
        bound_args,
        keywords,
        function,
        [v for v in bound_args if not of_type(v, torch.nn.Module)],
        module,
        roots,
        reached,
        structure.code,
        structure,
        innermost if _is_segment(innermost) else None,
        structure.torch_compiled,
    )


def bound_keywords(binding: Binding) -> dict:
    """The keywords the partials bind now: read from the partials' own dicts at every
    fingerprint, so a keyword changed in place (``p.keywords["scale"] = 3.0``) is seen; an
    outer partial's keyword overrides an inner one's, as a call does."""
    keywords = binding.keywords
    if len(keywords) == 1:
        return keywords[0]
    merged: dict = {}  # none: {}
    for own in reversed(keywords):
        merged.update(own)
    return merged


def _is_segment(fn: Any) -> bool:
    return (
        _compat.SEGMENT_CODE is not None
        and type(fn) is types.FunctionType
        and fn.__code__ is _compat.SEGMENT_CODE
    )


# values bound into a partial that cannot lead to code or modules: not part of its structure
_INERT = frozenset({*SCALAR_TYPES, torch.Tensor, torch.nn.Parameter, tuple, list, dict})


def _take_apart(fn: Any) -> tuple[list, tuple, tuple | None, list, Any]:
    """(bound args, the partials' keyword dicts, structure key, objects of the structure, innermost
    callable). The key lists the identities of the partials' functions and of the values bound
    into them that can reach code (modules, functions, partials, methods), of a method's
    function and owner, and of the innermost callable (a module with its forward). None: a
    bare function, often a new closure per call, worked out each time."""
    bound_args: list = []
    keywords: list = []
    key: list = []
    objects: list = []
    while True:
        kind = type(fn)
        if kind is functools.partial or issubclass(kind, functools.partial):
            key.append(kind)
            for index, value in enumerate(fn.args):
                if type(value) not in _INERT and of_type(value, _REACHING):
                    key += (index, id(value))
                    objects.append(value)
            for name, value in fn.keywords.items():
                if type(value) not in _INERT and of_type(value, _REACHING):
                    key += (name, id(value))
                    objects.append(value)
            bound_args[:0] = fn.args
            keywords.append(fn.keywords)  # even empty: one may be added in place
            fn = fn.func
        elif issubclass(kind, types.MethodType):
            owner, func = fn.__self__, fn.__func__
            key += (kind, id(func), id(owner))
            objects += (func, owner)
            if of_type(owner, torch.nn.Module) and func.__name__ in _MODULE_CALLS:
                fn = owner
            else:
                bound_args.insert(0, owner)
                fn = func
        else:
            break
    if of_type(fn, torch.nn.Module):
        forward = fn.__dict__.get("forward") or type(fn).forward
        if not isinstance(forward, types.MethodType):
            bound_args.insert(0, fn)
        key += (id(fn), id(forward))
        objects += (fn, forward)
    elif not key:
        return bound_args, (), None, objects, fn
    else:
        key.append(id(fn))
        objects.append(fn)
    return bound_args, tuple(keywords), tuple(key), objects, fn


class _Structure:
    """What a region's callable is made of: the function and module it runs, the functions
    and modules it holds (``static_reach``: its own functions are those not in library code),
    its code. A cached structure holds them by weak references and is valid while the objects
    its key names are alive and the same (``holds``) and the closure cells ``static_reach``
    followed still hold what they held (``parts``); one with an object that has no weak
    references is used once."""

    __slots__ = ("refs", "held", "code", "cells", "own", "readers", "reads", "torch_compiled")

    def __init__(self, fn: Any, innermost: Any, bound_args: list, objects: list) -> None:
        module = function = None
        if of_type(innermost, torch.nn.Module):
            module = innermost
            forward = innermost.__dict__.get("forward") or type(innermost).forward
            function = unwrap_function(
                forward.__func__ if of_type(forward, types.MethodType) else forward
            )
        elif of_type(innermost, types.FunctionType):
            function = innermost
            if bound_args and of_type(bound_args[0], torch.nn.Module):
                owner = innermost.__qualname__.rpartition(".")[0]
                for klass in type(bound_args[0]).__mro__:
                    if klass.__qualname__ == owner:  # a method of the module's class, on it
                        module = bound_args[0]
                        break
        if function is not None and is_library_code(function.__code__):
            function = None
        reached, functions = static_reach(fn)
        self.torch_compiled = any(
            map(_compat.compiled_by_dynamo, (fn, innermost, *reached, *functions))
        )
        unwrapped = unwrap_function(function) if function is not None else None
        self.code = unwrapped.__code__ if unwrapped is not None else None
        self.own = tuple(i for i, f in enumerate(functions) if not is_library_code(f.__code__))
        # (reentrant, FSDP2 modules) -> weak reference to the reader of a module region; the
        # reader's shape tells when it no longer fits (See NOTE [ Stale plans ])
        self.readers: dict[tuple, weakref.ref] = {}
        # (code, its CodeReads) of the function whose parameters' chains count: a code object
        # hashes its contents on every lookup, so the capture checks this one by identity
        self.reads: tuple | None = None
        self.cells = tuple(
            (position, index, id(contents))
            for position, func in enumerate(functions)
            for index, contents in enumerate(map(_contents, func.__closure__ or ()))
            if type(contents) not in _INERT and of_type(contents, _REACHING)
        )
        try:
            self.refs: tuple | None = tuple(map(weakref.ref, objects))
            self.held: tuple = (
                None if function is None else weakref.ref(function),
                None if module is None else weakref.ref(module),
                tuple(map(weakref.ref, functions)),
                tuple(map(weakref.ref, reached)),
            )
        except TypeError:  # an object without weak references: used for this call only
            self.refs, self.held = None, (function, module, functions, reached)

    def holds(self, objects: list) -> bool:
        refs = self.refs
        if refs is None or len(refs) != len(objects):
            return False
        for ref, obj in zip(refs, objects, strict=True):
            if ref() is not obj:
                return False
        return True

    def parts(self) -> tuple | None:
        """(function, module, own functions, reached modules), or None if one was collected
        or a followed cell rebound."""
        function, module, functions, reached = self.held
        if self.refs is not None:
            if function is not None and (function := function()) is None:
                return None
            if module is not None and (module := module()) is None:
                return None
            functions = list(map(DEREFERENCE, functions))
            reached = list(map(DEREFERENCE, reached))
            if None in functions or None in reached:  # by identity: functions and modules
                return None
            for position, index, ident in self.cells:
                if id(_contents(functions[position].__closure__[index])) != ident:
                    return None
        return function, module, [functions[i] for i in self.own], reached


def _contents(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


# structure key -> _Structure; bounded, and its entries hold weak references only.
# See NOTE [ Never keeps a user's object alive ]
_structures: dict[tuple, _Structure] = BoundedCache()


def forget_structure(fn: Any) -> None:
    """Drop the cached structure of ``fn``'s kind (its reader was stale: work it out again)."""
    key = _take_apart(fn)[2]
    if key is not None:
        _structures.pop(key, None)


def static_reach(fn: Any) -> tuple[list, list[types.FunctionType]]:
    """Modules and Python functions a region's callable holds directly (partials, methods,
    closures, decorators), before anything runs."""
    modules: list = []
    functions: list[types.FunctionType] = []
    pending = [fn]
    seen: set[int] = set()
    while pending:
        item = pending.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if type(item) is types.FunctionType:
            functions.append(item)
            wrapped = item.__dict__.get("__wrapped__")
            if wrapped is not None:
                pending.append(wrapped)
            for cell in item.__closure__ or ():
                try:
                    value = cell.cell_contents
                except ValueError:
                    continue
                if type(value) not in SCALAR_TYPES and of_type(value, _REACHING):
                    pending.append(value)
        elif of_type(item, torch.nn.Module):
            modules.append(item)
        elif of_type(item, functools.partial):
            pending.append(item.func)
            for value in (*item.args, *item.keywords.values()):
                if type(value) not in SCALAR_TYPES and of_type(value, _REACHING):
                    pending.append(value)
        elif of_type(item, types.MethodType):
            owner = item.__self__
            if of_type(owner, torch.nn.Module):
                pending.append(owner)
                if item.__func__.__name__ in _MODULE_CALLS:
                    continue
            pending.append(item.__func__)
    return modules, functions


_REACHING = (torch.nn.Module, functools.partial, types.MethodType, types.FunctionType)


class RegionFingerprint:
    """What a region's forward saw: one flat tuple of values read through the reader, the
    modules and functions it was read from (held for the region's life, which ends with its
    autograd graph), and its arguments."""

    __slots__ = (
        "reader",
        "modules",
        "functions",
        "roots",
        "written",
        "mask",
        "values",
        "arguments",
        "argument_chains",
        "argument_values",
        "code",
        "iterators",
        "inert_hooks",
    )

    def __init__(
        self,
        reader: RegionReader,
        modules: list,
        functions: list,
        roots: list,
        written: dict[int, frozenset],
        mask: tuple,
        values: tuple,
        arguments: tuple[list, list, Any],
        argument_chains: list[tuple[str, Any, tuple]],
        argument_values: list,
        code: Any,
        iterators: list,
        inert_hooks: frozenset,
    ) -> None:
        self.reader = reader
        self.modules = modules  # what the values were read from
        self.functions = functions  # the functions the reader dereferences, held
        self.roots = roots  # the region's own functions
        self.written = written  # module index -> buffers the forward itself wrote
        self.mask = mask  # their positions, left out of the comparison
        self.values = values
        # (positional tensors, every other argument, the modules a segment runs)
        self.arguments = arguments
        self.argument_chains = argument_chains  # (dotted name, object, attributes)
        self.argument_values = argument_values  # what those chains read
        self.code = code  # the code the region ran at its forward (what names it)
        self.iterators = iterators  # labels of the iterators it advances, or argument names
        # forward hooks that ran in the forward and changed nothing: their removal is none
        self.inert_hooks = inert_hooks


def _torch_state(resolved: _compat.Torch, reentrant: bool) -> tuple:
    """Getters of the process-wide settings the recompute does not restore."""
    if reentrant and resolved.default_device is not None:  # non-reentrant restores it
        return (*resolved.torch_state, ("torch.get_default_device()", resolved.default_device))
    return resolved.torch_state


def _masked(values: tuple, mask: tuple) -> tuple:
    """Values without the buffers the region itself writes (its outputs, not its inputs)."""
    out = list(values)
    for position in mask:
        out[position] = None
    return tuple(out)


def _build_reader(
    modules: list,
    roots: list,
    reentrant: bool,
    loose: AbstractSet[int],
    fresh: bool,
    top_hooks: bool,
) -> RegionReader:
    plans = [module_plan(m, id(m) in loose, fresh) for m in modules]
    root_plans = [rebuild_function_plan(f) if fresh else function_plan(f) for f in roots]
    # id -> (weak reference, the function): the modules' functions, held while planned
    class_functions: dict[int, tuple[weakref.ref, types.FunctionType]] = {}
    root_ids = {id(f) for f in roots}
    for plan in plans:
        for ref in plan.functions:
            func = ref()
            if func is not None and id(func) not in root_ids:
                class_functions.setdefault(id(func), (ref, func))
    held = [func for _, func in class_functions.values()]
    class_plans = [rebuild_function_plan(f) if fresh else function_plan(f) for f in held]
    torch_state = _torch_state(_compat.resolve(), reentrant)
    function_plans = [*root_plans, *class_plans]
    functions = []
    for function_plan_, func in zip(function_plans, [*roots, *held], strict=True):
        functions += function_plan_.functions(func)
    return RegionReader(
        modules,
        plans,
        function_plans,
        [ref for ref, _ in class_functions.values()],
        torch_state,
        functions,
        top_hooks,
    )


def module_tree(target: torch.nn.Module, loose: AbstractSet[int]) -> list:
    """A module region's modules: its subtree, plus modules its code reaches outside the tree
    through attributes (``self.shared = other_module`` set without registering it)."""
    out: list = []
    seen: set[int] = set()
    pending = [target]
    while pending:
        module = pending.pop()
        if id(module) in seen:
            continue
        seen.add(id(module))
        out.append(module)
        if module_plan(module, id(module) in loose).opaque:
            continue  # its plan holds the tensors of its own children
        pending.extend(reversed([c for c in module._modules.values() if c is not None]))
        pending.extend(m for m in _modules_read(module, loose) if id(m) not in seen)
    return out


def _modules_read(module: torch.nn.Module, loose: AbstractSet[int]) -> Iterator[torch.nn.Module]:
    """Modules the code of ``module`` reads through its attributes (``self.blocks``)."""
    plan = module_plan(module, id(module) in loose)
    for read in plan.chains:
        if read.kind == "object":
            chain = read.chain
            value = read_chain(static_attribute(module, chain[0]), chain[1:])
            if of_type(value, torch.nn.Module):
                yield value


def _with_modules_read(modules: list, loose: AbstractSet[int]) -> list:
    """A function region's modules (those its forward ran) and the modules their code reads
    without running them: a ``ModuleList`` it iterates, whose length is what it runs."""
    out = list({id(m): m for m in modules}.values())
    seen = {id(m) for m in out}
    for module in out:  # grows while it is walked: modules read by modules read
        for held in _modules_read(module, loose):
            if id(held) not in seen:
                seen.add(id(held))
                out.append(held)
    return out


def _reader_key(
    target: Any, modules: list, roots: list, reentrant: bool, loose: AbstractSet[int]
) -> tuple[tuple, Any]:
    """(cache key, anchor module) of a region's reader: a module region's reader is stored
    under its module, a function region's under the first module it ran. Functions count by
    their code object (held by the key, which lives as long as its anchor) and the id of
    their globals."""
    functions = []
    for function in roots:
        functions.append((function.__code__, id(function.__globals__)))
    frozen = frozenset(loose) if loose else None
    if target is not None:
        return ("tree", tuple(functions), reentrant, frozen), target
    ids = tuple(map(id, modules))
    return (ids, tuple(functions), reentrant, frozen), (modules[0] if modules else None)


def reader_for(
    target: Any, observed: list, binding: Binding, reentrant: bool, loose: AbstractSet[int]
) -> tuple[RegionReader, list]:
    """(reader, its modules): cached per module region (its tree) or per set of observed
    modules; ``capture`` checks it and rebuilds it if stale."""
    roots = binding.roots
    if target is not None:
        tree = tree_reader(target, binding, reentrant, loose)
        return tree, list(map(DEREFERENCE, tree.module_refs))
    modules = _with_modules_read([*binding.reached, *observed], loose)
    key, anchor = _reader_key(None, modules, roots, reentrant, loose)
    reader = cached_reader(key, anchor, modules)
    if reader is None:
        reader = _build_reader(modules, roots, reentrant, loose, False, False)
        _store(key, anchor, reader)
    return reader, modules


def tree_reader(
    target: torch.nn.Module, binding: Binding, reentrant: bool, loose: AbstractSet[int]
) -> RegionReader:
    """A module region's reader: the structure remembers it (it reads the same functions; a
    code swapped or a module changed shows in the read's shape, and capture rebuilds it)."""
    way = (reentrant, frozenset(loose) if loose else None)
    known = binding.structure.readers.get(way)
    reader = known() if known is not None else None
    if reader is None or reader.module_refs[0]() is not target:
        roots = binding.roots
        key, anchor = _reader_key(target, [], roots, reentrant, loose)
        reader = cached_reader(key, anchor, None)
        if reader is None:
            modules = module_tree(target, loose)
            reader = _build_reader(modules, roots, reentrant, loose, False, not reentrant)
            _store(key, anchor, reader)
        binding.structure.readers[way] = weakref.ref(reader)
    return reader


def _store(key: tuple, anchor: Any, reader: RegionReader) -> None:
    store_reader(key, anchor, reader)


def stateful_modules(
    target: torch.nn.Module, binding: Binding, reentrant: bool, loose: AbstractSet[int]
) -> tuple[list, RegionReader]:
    """The modules of a module region's tree that hold buffers or assign attributes (their
    state before the forward tells what the forward wrote), and the tree's reader they were
    found through: the region's capture reads through it, its modules dereferenced then
    (whether they still live decided then, as for a reader looked up then), its shape
    checked as for any cached reader. The first call builds the reader."""
    reader = tree_reader(target, binding, reentrant, loose)
    if not reader.stateful:
        return [], reader
    refs = reader.module_refs
    return [m for i in reader.stateful if (m := refs[i]()) is not None], reader


def capture(
    fn: Any,
    binding: Binding,
    observed: list,
    written: dict[int, frozenset],
    args: tuple,
    kwargs: dict,
    reentrant: bool,
    own_hooks: frozenset,
    loose: AbstractSet[int],
    inert_hooks: frozenset,
    tree: RegionReader | None = None,
) -> RegionFingerprint:
    """Read everything the region reached; a reader that no longer matches its modules (a
    child replaced, an attribute added, a followed global rebound) is rebuilt here. ``tree``:
    a module region's reader, from ``stateful_modules`` before its forward. See
    NOTE [ Read twice ] and NOTE [ Stale plans ]"""
    target = binding.module
    if tree is not None and target is not None:
        reader, modules = tree, list(map(DEREFERENCE, tree.module_refs))
    else:
        reader, modules = reader_for(target, observed, binding, reentrant, loose)
    roots = binding.roots
    values = functions = None
    for fresh in (False, True):
        if fresh:
            # what the callable holds may have changed too (a closure cell rebound)
            forget_structure(fn)
            binding = bind(fn)
            roots = binding.roots
            if target is not None:
                modules = module_tree(target, loose)
            top_hooks = target is not None and not reentrant
            reader = _build_reader(modules, roots, reentrant, loose, True, top_hooks)
            key, anchor = _reader_key(target, modules, roots, reentrant, loose)
            _store(key, anchor, reader)
            if target is not None:
                way = (reentrant, frozenset(loose) if loose else None)
                binding.structure.readers[way] = weakref.ref(reader)
        functions = reader.live_functions()
        if functions is None or any(map(_is_none, modules)):
            continue
        try:
            values = reader.read(modules, roots, own_hooks)
        except _READ_ERRORS:
            values = reader.read_safely(modules, roots, own_hooks)
        if fresh or reader.shape_of(values) == reader.shape:
            break
    if values is None or functions is None:  # collected while read: no fingerprint to take
        raise RuntimeError("the region's modules or functions were collected while read")
    mask: tuple = ()
    written_at: dict[int, frozenset] = {}
    if written:  # See NOTE [ Outputs are not inputs ]
        index_of = {id(m): i for i, m in enumerate(modules)}
        written_at = {index_of[k]: v for k, v in written.items() if k in index_of}
        positions = reader.tensor_positions
        mask = tuple(positions[(i, n)] for i, names in written_at.items() for n in names)
        values = _masked(values, mask)
    arguments, chains, chain_values, advanced = _capture_arguments(binding, args, kwargs)
    iterators = (
        [reader.labels[p] for p in reader.iterators] + advanced if reader.iterators else advanced
    )
    return RegionFingerprint(
        reader=reader,
        modules=modules,
        functions=functions,
        roots=roots,
        written=written_at,
        mask=mask,
        values=values,
        arguments=arguments,
        argument_chains=chains,
        argument_values=chain_values,
        code=binding.code,
        iterators=iterators,
        inert_hooks=inert_hooks,
    )


def refresh_own_writes(fingerprint: RegionFingerprint, own_hooks: frozenset) -> None:
    """After a recompute: the containers the region's own code mutates hold what it left
    there, the state its next recompute (the same graph backpropagated again) starts from.
    See NOTE [ Outputs are not inputs ]"""
    reader = fingerprint.reader
    values = reader.read(fingerprint.modules, fingerprint.roots, own_hooks)
    refreshed = list(fingerprint.values)
    for position in reader.self_written:
        refreshed[position] = values[position]
    fingerprint.values = tuple(refreshed)


class Found(NamedTuple):
    """The first difference between the forward's fingerprint and the one read before a
    recompute, by where it is (``_explain`` says what it is):

    - ``READ``: position ``index`` of the region's read (see ``RegionReader.labels``);
    - ``RESHAPED``: modules (a tuple of their indexes) whose shape alone changed (an attribute,
      parameter, buffer or child added or removed); whether what their code reads changed is
      known once a fresh plan reads them again, so this may be no change at all;
    - ``TENSOR_ARGUMENT``, ``ARGUMENT``, ``ARGUMENT_CHAIN``: the ``index``-th positional tensor,
      other argument (keywords and bound values), or attribute chain read from an argument;
    - ``SEGMENT``: the modules of a ``checkpoint_sequential`` segment (``index`` unused).
    """

    part: str
    index: Any
    old: Any
    new: Any


READ = "read"
RESHAPED = "reshaped"
TENSOR_ARGUMENT = "tensor argument"
ARGUMENT = "argument"
ARGUMENT_CHAIN = "argument chain"
SEGMENT = "segment"


class Comparison(NamedTuple):
    """What a recompute's read found: the torch settings that changed, as (setting, forward's
    value, now), to be judged by what the recompute runs, and the first other difference."""

    settings: list[tuple[str, Any, Any]]
    found: Found | None


def compare(
    fingerprint: RegionFingerprint,
    binding: Binding,
    args: tuple,
    kwargs: dict,
    own_hooks: frozenset,
) -> Comparison:
    """Compare what the region reaches now with what its forward saw. When nothing changed
    (the usual case) this is one read, one ``==`` and the arguments' fingerprints. See
    NOTE [ Read twice ]"""
    reader = fingerprint.reader
    try:
        values = _read_in_pass(reader, fingerprint.modules, fingerprint.roots, own_hooks)
    except _READ_ERRORS:
        values = reader.read_safely(fingerprint.modules, fingerprint.roots, own_hooks)
    if fingerprint.mask:
        values = _masked(values, fingerprint.mask)
    try:
        same = values == fingerprint.values
    except Exception:  # an element's own __eq__ raised: it differs
        same = False
    settings: list[tuple[str, Any, Any]] = []
    found = None
    if not same:
        settings, found = _first_difference_read(fingerprint, values)
    if found is None:
        found = _first_difference_in_arguments(fingerprint, binding, args, kwargs)
    return Comparison(settings, found)


_READ_ERRORS = (RuntimeError, AttributeError, ValueError, IndexError, TypeError)


class _Pass(threading.local):
    """What a backward pass on this thread read of the state its regions share: (graph task,
    {(shared signature, the region's own functions, the guard's hooks): (torch settings and
    global hooks, the functions' part)})."""

    task = -1
    shared: dict = {}


_pass = _Pass()


# NOTE [ Shared state, read once per backward pass ]
# What several regions share (torch settings, global hooks, and the functions their code runs
# with their globals, closures and defaults: the layers of a model run the same ones) is read
# once per backward pass, at its first recompute, and reused by the pass's later recomputes of
# regions with the same functions; each region's modules (attributes, children, hooks, the
# training flag, tensors, the objects their attribute chains reach) are read before every
# recompute. A backward pass is torch's graph task (``_compat``'s ``graph_task_id``, -1 outside
# one: then everything is read). This assumes that code running inside a backward pass (hooks,
# other regions' recomputes) does not change that shared state, with one exception the guard
# can see: a region whose own code rebinds a global or a closure variable or mutates one in
# place (``writes_shared``, from its bytecode) makes its pass read the shared part again.


def _read_in_pass(reader: RegionReader, modules: list, roots: list, own: frozenset) -> tuple:
    """A recompute's read: the shared part from the pass, the modules' part now. See
    NOTE [ Shared state, read once per backward pass ]"""
    task = _compat.resolve().graph_task_id()
    if task < 0:
        return reader.read(modules, roots, own)
    state = _pass
    if state.task != task:
        state.task, state.shared = task, {}
    if reader.writes_shared:  # its recompute, about to run, may change what others read
        state.shared = {}
        shared = reader.read_shared(roots, own)
    else:
        key = (reader.shared_signature, *map(id, roots), own)
        shared = state.shared.get(key)
        if shared is None:
            shared = state.shared[key] = reader.read_shared(roots, own)
    head, functions = shared
    return head + reader.read_modules(modules) + functions


_is_none = functools.partial(operator.is_, None)


def _equal(old: Any, new: Any) -> bool:
    """``==``, where an object's own ``__eq__`` that raises (only possible where the two
    differ) counts as a difference."""
    try:
        return bool(old == new)
    except Exception:
        return False


# Modules whose contents are what their users read (iterated, indexed, run in order): a
# module or parameter added, removed or replaced changes what the region computes.
CONTAINERS = (
    torch.nn.ModuleList,
    torch.nn.ModuleDict,
    torch.nn.Sequential,
    torch.nn.ParameterList,
    torch.nn.ParameterDict,
)
CONTENTS = frozenset({"_modules", "children", "_parameters"})


def _first_difference_read(
    fingerprint: RegionFingerprint, values: tuple
) -> tuple[list[tuple[str, Any, Any]], Found | None]:
    """(torch settings that differ, the first other position that differs); modules whose
    shape alone changed are found together, after every other position."""
    reader, modules = fingerprint.reader, fingerprint.modules
    reshaped: list[int] = []
    settings: list[tuple[str, Any, Any]] = []
    for position, (old, new) in enumerate(zip(fingerprint.values, values, strict=True)):
        if old is new or _equal(old, new):
            continue
        label = reader.labels[position]
        if label.owner == TORCH:
            settings.append((label.name, old, new))
            continue
        if label.kind == "cache" or _cache_kept(fingerprint, values, position):
            continue  # the recompute gets the forward's result from the cache
        if label.kind == "hook" and not hooks_differ(old, new, fingerprint.inert_hooks):
            continue  # only hooks that changed nothing at the forward were removed
        if label.kind == "shape" and type(label.owner) is int:
            contents = label.name in CONTENTS and of_type(modules[label.owner], CONTAINERS)
            if not contents:
                if label.owner not in reshaped:
                    reshaped.append(label.owner)
                continue
        return settings, Found(READ, position, old, new)
    if reshaped:
        return settings, Found(RESHAPED, tuple(reshaped), None, None)
    return settings, None


def hooks_differ(old: Any, new: Any, inert: frozenset) -> bool:
    """Whether the hook keys a position holds (per table, () where every table is empty)
    differ in a way the recompute sees: a hook added, a forward hook or pre-hook removed that
    changed what the forward computed (or was not watched), any backward hook change. The
    forward tables come first (``MODULE_HOOK_DICTS``, ``GLOBAL_HOOK_DICTS``)."""
    tables = max(len(old), len(new))
    before, after = old or ((),) * tables, new or ((),) * tables
    for index, (then, now) in enumerate(zip(before, after, strict=True)):
        if then == now:
            continue
        if index >= len(FORWARD_TABLES):
            return True
        removed, added = set(then) - set(now), set(now) - set(then)
        if added or not removed <= inert:
            return True
    return False


def _cache_kept(fingerprint: RegionFingerprint, values: tuple, position: int) -> bool:
    """Whether ``position`` is read only through an lru_cache that still holds every entry it
    held at the forward: the recompute's call hits it and gets the forward's result."""
    behind = fingerprint.reader.behind_cache.get(position)
    if behind is None:
        return False
    at, size = behind
    return cache_kept(fingerprint.values[at], values[at], size)


def _arguments(binding: Binding, args: tuple, kwargs: dict) -> tuple[list, list]:
    """(positional tensors, every other argument) of a call, in a fixed order: call arguments,
    then objects bound into partials and methods (modules aside: they have their own plans),
    then the keywords the partials bind now."""
    tensors: list = []
    others: list = []
    for value in args:
        if type(value) is torch.Tensor or of_type(value, torch.Tensor):
            tensors.append(value)
        else:
            others.append(value)
    if kwargs:
        others += kwargs.values()
    others += binding.bound_values
    keywords = binding.keywords
    others += (keywords[0] if len(keywords) == 1 else bound_keywords(binding)).values()
    return tensors, others


def _capture_arguments(
    binding: Binding, args: tuple, kwargs: dict
) -> tuple[tuple[list, list, Any], list[tuple[str, Any, tuple]], list, list[str]]:
    """(the arguments' fingerprints: positional tensors held weakly, every other argument,
    the modules a ``checkpoint_sequential`` segment runs; the attribute chains the region's
    function reads from its arguments, as (dotted name, object, attributes); the values those
    chains read; the arguments holding an iterator the function advances)."""
    tensors, others = _arguments(binding, args, kwargs)
    held = [(weakref.ref(tensor), input_fp(tensor)) for tensor in tensors]
    arguments = (held, arguments_fp(others), None if binding.segment is None else _segment(binding))
    chains: list[tuple[str, Any, tuple]] = []
    function = binding.function
    reads = None
    if function is not None:
        code, known = function.__code__, binding.structure.reads
        if known is not None and known[0] is code:
            reads = known[1]
        else:  # new, or a code swapped since (``f.__code__ = ...``)
            reads = code_reads(code)
            binding.structure.reads = (code, reads)
    parameter_chains = reads.parameter_chains if reads is not None else ()
    advanced = (
        _advanced_arguments(binding, reads, args, kwargs)
        if reads is not None and reads.advanced
        else []
    )
    if not parameter_chains:
        return arguments, chains, [], advanced
    positional = [*binding.bound_args, *args]
    keywords = bound_keywords(binding)
    for name, position, attrs in parameter_chains:
        if name in kwargs:
            value = kwargs[name]
        elif name in keywords:
            value = keywords[name]
        elif position is not None and position < len(positional):
            value = positional[position]
        else:
            continue
        if of_type(value, (torch.Tensor, torch.nn.Module)):
            continue  # tensors are arguments above; modules have their own plans
        for chain in chains_through_code(value, (name, *attrs)):
            chains.append((".".join(chain), value, chain[1:]))
    values = [value_fp(read_chain(v, attrs)) for _, v, attrs in chains]
    return arguments, chains, values, advanced


def _advanced_arguments(binding: Binding, reads: Any, args: tuple, kwargs: dict) -> list[str]:
    """Arguments holding an iterator the region's function advances (``next(it)``)."""
    if reads is None or not reads.advanced or binding.function is None:
        return []
    code = binding.function.__code__
    positional = [*binding.bound_args, *args]
    keywords = {**bound_keywords(binding), **kwargs}
    found = []
    for index, name in enumerate(code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]):
        if ("arg", name, ()) not in reads.advanced:
            continue
        value = keywords.get(name, positional[index] if index < len(positional) else MISSING)
        if is_iterator(value):
            found.append(f"argument {name}")
    return found


def segment_cells(binding: Binding) -> tuple[Any, Any, Any]:
    """(the list, start, end) a ``checkpoint_sequential`` segment's closure holds."""
    segment: Any = binding.segment
    functions, start, end = (cell_contents(segment, i) for i in _compat.SEGMENT_CELLS)
    return functions, start, end


def _segment(binding: Binding) -> Any:
    """The modules a ``checkpoint_sequential`` segment runs, by identity (its closure holds
    the list and the segment's bounds: an item of a plain list replaced after the forward is
    what the recompute runs), None for any other region."""
    if binding.segment is None:
        return None
    functions, start, end = segment_cells(binding)
    try:
        return tuple(map(id, functions[start : end + 1]))
    except TypeError:  # not a sequence any more
        return MISSING


def _first_difference_in_arguments(
    fingerprint: RegionFingerprint, binding: Binding, args: tuple, kwargs: dict
) -> Found | None:
    tensors, others = _arguments(binding, args, kwargs)
    old_tensors, old_others, old_segment = fingerprint.arguments
    if old_segment is not None:
        segment = _segment(binding)
        if segment != old_segment:
            return Found(SEGMENT, None, old_segment, segment)
    for index, ((ref, old), tensor) in enumerate(zip(old_tensors, tensors, strict=False)):
        # nested and reentrant recomputes get new input objects: only the same object is
        # comparable (torch checks the versions of the tensors it saved itself)
        if ref() is tensor:
            new = input_fp(tensor)
            if new != old:
                return Found(TENSOR_ARGUMENT, index, old, new)
    new_others = arguments_fp(others)
    if new_others != old_others:
        index = _first_difference(old_others, new_others)
        return Found(ARGUMENT, index, _at(old_others, index), _at(new_others, index))
    chains = fingerprint.argument_chains
    if chains:
        old_chains = fingerprint.argument_values
        new_chains = [value_fp(read_chain(v, attrs)) for _, v, attrs in chains]
        if new_chains != old_chains:
            index = _first_difference(old_chains, new_chains)
            return Found(ARGUMENT_CHAIN, index, old_chains[index], new_chains[index])
    return None


def _at(values: list, index: int) -> Any:
    return values[index] if index < len(values) else MISSING


def _first_difference(old: list, new: list) -> int:
    for index, (a, b) in enumerate(zip(old, new, strict=False)):
        if a is not b and a != b:
            return index
    return min(len(old), len(new))
