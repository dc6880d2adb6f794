"""A region's fingerprint: everything it can reach, read through plans after the forward and
read again before each recompute; the first difference is handed to ``_explain``.

What a region reaches: process-wide torch settings; the global module hooks; the modules its
forward ran (seen by ``_intercept``) plus modules bound into the callable; the functions it and
those modules' code call (their globals, closures and defaults); its arguments (keywords and
containers, bounded) and objects bound into partials and methods, with the attribute chains
its code reads from them.
"""

from __future__ import annotations

import functools
import types
import weakref
from typing import Any

import torch

from ckptguard import _compat
from ckptguard._fingerprint import (
    MISSING,
    argument_fp,
    input_fp,
    value_fp,
)
from ckptguard._plan import (
    _argument_names,
    code_reads,
    function_plan,
    is_library_code,
    module_plan,
    read_chain,
    rebuild_function_plan,
    unwrap_function,
)
from ckptguard._reader import RegionReader, cached_reader, store_reader

_MODULE_CALLS = frozenset({"__call__", "_wrapped_call_impl", "_call_impl"})


class Difference(Exception):
    """Internal: the first fingerprint that differs, with what explains it."""

    def __init__(self, kind: str, name: str, where: str, old: Any, new: Any):
        super().__init__(name)
        self.kind, self.name, self.where, self.old, self.new = kind, name, where, old, new


def _bind(fn: Any) -> tuple[Any, list, dict]:
    """(innermost callable, positional values bound before the call's, bound keywords)."""
    bound_args: list = []
    bound_kwargs: dict = {}
    while True:
        if isinstance(fn, functools.partial):
            bound_args[:0] = list(fn.args)
            bound_kwargs = {**fn.keywords, **bound_kwargs}
            fn = fn.func
        elif isinstance(fn, types.MethodType):
            owner = fn.__self__
            if isinstance(owner, torch.nn.Module) and fn.__func__.__name__ in _MODULE_CALLS:
                fn = owner
            else:
                bound_args.insert(0, owner)
                fn = fn.__func__
        elif isinstance(fn, torch.nn.Module):
            forward = fn.__dict__.get("forward") or type(fn).forward
            if not isinstance(forward, types.MethodType):
                bound_args.insert(0, fn)
            return fn, bound_args, bound_kwargs
        else:
            return fn, bound_args, bound_kwargs


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
        if isinstance(item, torch.nn.Module):
            modules.append(item)
        elif isinstance(item, functools.partial):
            pending.append(item.func)
            pending.extend(v for v in (*item.args, *item.keywords.values()) if _is_callable(v))
        elif isinstance(item, types.MethodType):
            pending.append(item.__self__ if isinstance(item.__self__, torch.nn.Module) else None)
            if not (
                isinstance(item.__self__, torch.nn.Module)
                and item.__func__.__name__ in _MODULE_CALLS
            ):
                pending.append(item.__func__)
        elif isinstance(item, types.FunctionType):
            functions.append(item)
            wrapped = getattr(item, "__wrapped__", None)
            if wrapped is not None:
                pending.append(wrapped)
            for cell in item.__closure__ or ():
                try:
                    value = cell.cell_contents
                except ValueError:
                    continue
                if _is_callable(value):
                    pending.append(value)
    return modules, functions


def _is_callable(value: Any) -> bool:
    return isinstance(
        value, (torch.nn.Module, functools.partial, types.MethodType, types.FunctionType)
    )


class RegionFingerprint:
    """The values a region's forward saw, and the reader that reads them again."""

    __slots__ = (
        "reader",
        "roots",
        "written",
        "values",
        "checks",
        "arguments",
        "argument_chains",
        "argument_values",
    )

    def __init__(self) -> None:
        self.arguments: list[tuple[str, Any, Any]] = []  # (label, weakref or None, value)
        self.argument_chains: list[tuple[str, Any, tuple]] = []


def _torch_state(resolved: _compat.Torch, reentrant: bool) -> tuple:
    """Getters of the process-wide settings the recompute does not restore."""
    if reentrant and resolved.default_device is not None:  # non-reentrant restores it
        return (*resolved.torch_state, ("torch.get_default_device()", resolved.default_device))
    return resolved.torch_state


def _masked(reader: RegionReader, values: tuple, written: dict[int, frozenset]) -> tuple:
    if not written:
        return values
    out = list(values)
    for index, plan in enumerate(reader.module_plans):
        done = written.get(index)
        if done:
            out[2 + index] = plan.masked(out[2 + index], done)
    return tuple(out)


def _build_reader(
    modules: list, roots: list, reentrant: bool, loose: set[int], fresh: bool
) -> RegionReader:
    plans = [module_plan(m, id(m) in loose, fresh) for m in modules]
    root_plans = [rebuild_function_plan(f) if fresh else function_plan(f) for f in roots]
    class_functions: dict[int, weakref.ref] = {}
    root_ids = {id(f) for f in roots}
    for plan in plans:
        for ref in plan.functions:
            func = ref()
            if func is not None and id(func) not in root_ids:
                class_functions.setdefault(id(func), ref)
    class_plans = []
    for ref in class_functions.values():
        func = ref()
        class_plans.append(rebuild_function_plan(func) if fresh else function_plan(func))
    torch_state = _torch_state(_compat.resolve(), reentrant)
    return RegionReader(
        modules, plans, [*root_plans, *class_plans], list(class_functions.values()), torch_state
    )


def capture(
    fn: Any,
    reach: tuple[list, list],
    modules: list,
    written: dict[int, frozenset],
    args: tuple,
    kwargs: dict,
    reentrant: bool,
    own_hooks: frozenset,
    loose: set[int],
) -> RegionFingerprint:
    """Read everything the region reached; plans and the reader are built or rebuilt here."""
    static_modules, static_functions = reach
    everything = list({id(m): m for m in (*static_modules, *modules)}.values())
    roots = [f for f in static_functions if not is_library_code(f.__code__)]
    key = (
        tuple([id(m) for m in everything]),
        tuple([(f.__code__, id(f.__globals__)) for f in roots]),
        reentrant,
        frozenset(loose) if loose else None,
    )
    reader = cached_reader(key, everything)
    for fresh in (False, True):
        if reader is None:
            reader = _build_reader(everything, roots, reentrant, loose, fresh)
            store_reader(key, everything, reader)
        functions = reader.functions(roots)
        if functions is not None:
            values, checks = reader.read_safely(everything, functions, own_hooks)
            if fresh or (checks == reader.checks and not reader.stale_functions(values)):
                break
        reader = None
    fingerprint = RegionFingerprint()
    fingerprint.reader = reader
    fingerprint.roots = roots
    if written:
        index_of = {id(m): i for i, m in enumerate(everything)}
        written = {index_of[k]: v for k, v in written.items() if k in index_of}
    fingerprint.written = written
    fingerprint.values = _masked(reader, values, fingerprint.written)
    fingerprint.checks = checks
    _capture_arguments(fingerprint, fn, args, kwargs)
    return fingerprint


def compare(
    fingerprint: RegionFingerprint,
    fn: Any,
    args: tuple,
    kwargs: dict,
    own_hooks: frozenset,
    name_module: Any,
) -> None:
    """Raise ``Difference`` for the first value that differs from the forward's."""
    reader = fingerprint.reader
    modules = [ref() for ref in reader.module_refs]
    functions = reader.functions(fingerprint.roots)
    if functions is not None and all(m is not None for m in modules):
        values, checks = reader.read_safely(modules, functions, own_hooks)
        values = _masked(reader, values, fingerprint.written)
        if values != fingerprint.values:
            _explain_values(fingerprint, values, modules, functions, name_module)
        if checks != fingerprint.checks:
            _explain_reshaped(fingerprint, checks, modules, name_module)
    _compare_arguments(fingerprint, fn, args, kwargs)


def _explain_values(
    fingerprint: RegionFingerprint, values: tuple, modules: list, functions: list, name_module: Any
) -> None:
    reader = fingerprint.reader
    for group, (old_group, new_group) in enumerate(zip(fingerprint.values, values, strict=True)):
        if old_group == new_group:
            continue
        index = _first_difference(old_group, new_group)
        old, new = _at(old_group, index), _at(new_group, index)
        if group == 0:
            raise Difference(
                "torch_state", reader.torch_labels[index], "process-wide torch setting", old, new
            )
        if group == 1:
            name = _compat.GLOBAL_HOOK_DICTS[index]
            where = "global module hooks, run by every module"
            raise Difference("hook", f"torch.nn.modules.module.{name}", where, old, new)
        module_index = group - 2
        if module_index < len(modules):
            kind, attribute = reader.module_plans[module_index].labels[index]
            _raise_module(kind, attribute, modules[module_index], old, new, name_module)
        start = 0
        for plan_index, plan in enumerate(reader.function_plans):
            count = len(plan.entries)
            if plan_index == module_index - len(modules):
                kind, name, where = plan.labels(functions[start : start + count])[index]
                raise Difference(kind, name, where, old, new)
            start += count


def _explain_reshaped(
    fingerprint: RegionFingerprint, checks: tuple, modules: list, name_module: Any
) -> None:
    """A module's shape changed (an attribute, parameter, buffer or child added or removed)
    while every value its plan reads stayed equal: read it through a fresh plan and compare
    what both plans read (a new instance attribute may now shadow a class attribute)."""
    reader = fingerprint.reader
    for index, (old, new) in enumerate(zip(fingerprint.checks, checks, strict=True)):
        if old == new:
            continue
        module, plan = modules[index], reader.module_plans[index]
        fresh = RegionReader([module], [module_plan(module, plan.loose, fresh=True)], [], [], ())
        current = fresh.read([module], [], frozenset())[0][2]
        written = fingerprint.written.get(index)
        if written:
            current = fresh.module_plans[0].masked(current, written)
        before = dict(zip(plan.labels, fingerprint.values[2 + index], strict=True))
        for label, value in zip(fresh.module_plans[0].labels, current, strict=True):
            if label in before and before[label] != value:
                _raise_module(*label, module, before[label], value, name_module)


def _argument_values(fn: Any, args: tuple, kwargs: dict) -> tuple[list, Any, list, dict]:
    """(label, value, compare by same object) for each argument, in a fixed order."""
    target, bound_args, bound_kwargs = _bind(fn)
    out = [(f"positional argument {i}", v, isinstance(v, torch.Tensor)) for i, v in enumerate(args)]
    out += [(f"keyword argument {k}", v, False) for k, v in kwargs.items()]
    where = "bound into the region's functools.partial or method"
    out += [
        (f"bound argument {i} ({where})", v, False)
        for i, v in enumerate(bound_args)
        if not isinstance(v, torch.nn.Module)
    ]
    out += [(f"bound keyword {k} ({where})", v, False) for k, v in bound_kwargs.items()]
    return out, target, bound_args, bound_kwargs


def _argument_fp(value: Any, same_object: bool) -> Any:
    return input_fp(value) if same_object else argument_fp(value)


def _capture_arguments(fingerprint: RegionFingerprint, fn: Any, args: tuple, kwargs: dict) -> None:
    values, target, bound_args, bound_kwargs = _argument_values(fn, args, kwargs)
    fingerprint.arguments = [
        (label, weakref.ref(value) if same else None, _argument_fp(value, same))
        for label, value, same in values
    ]
    function = target if isinstance(target, types.FunctionType) else None
    if isinstance(target, torch.nn.Module):
        forward = target.__dict__.get("forward") or type(target).forward
        function = unwrap_function(getattr(forward, "__func__", forward))
    chains = fingerprint.argument_chains
    if function is not None and not is_library_code(function.__code__):
        reads = code_reads(function.__code__)
        names = _argument_names(function.__code__)
        bound = dict(zip(names, [*bound_args, *args], strict=False))
        bound.update(bound_kwargs)
        bound.update(kwargs)
        for name, attrs in sorted(reads.arg_chains):
            value = bound.get(name, MISSING)
            if value is MISSING or isinstance(value, (torch.Tensor, torch.nn.Module)):
                continue  # tensors are arguments above; modules have their own plans
            chains.append((f"{name}.{'.'.join(attrs)}", value, attrs))
    fingerprint.argument_values = [value_fp(read_chain(v, attrs)) for _, v, attrs in chains]


def _compare_arguments(fingerprint: RegionFingerprint, fn: Any, args: tuple, kwargs: dict) -> None:
    values = _argument_values(fn, args, kwargs)[0]
    for (label, ref, old), (_, value, same) in zip(fingerprint.arguments, values, strict=False):
        if ref is not None and ref() is not value:
            # nested and reentrant recomputes get new input objects: only the same object is
            # comparable (torch checks the versions of the tensors it saved itself)
            continue
        new = _argument_fp(value, same)
        if new != old:
            raise Difference("argument", label, "argument of the region", old, new)
    chains = fingerprint.argument_chains
    old_chains = fingerprint.argument_values
    new_chains = [value_fp(read_chain(v, attrs)) for _, v, attrs in chains]
    if new_chains != old_chains:
        index = _first_difference(old_chains, new_chains)
        where = "attribute of an object passed to or bound into the region"
        raise Difference("attribute", chains[index][0], where, old_chains[index], new_chains[index])


def _raise_module(
    kind: str, attribute: str, module: Any, old: Any, new: Any, name_module: Any
) -> None:
    owner = type(module).__name__
    where = {
        "tensor": f"parameter or buffer of {owner}",
        "attribute": f"read by {owner}'s code (attribute, child module or class attribute)",
        "hook": f"hooks of {owner}",
    }.get(kind, f"{owner} module")
    name = f"{name_module(module)}.{attribute}"
    raise Difference(kind, name, where, old, new)


def _at(values: list, index: int) -> Any:
    return values[index] if index < len(values) else MISSING


def _first_difference(old: list, new: list) -> int:
    for index, (a, b) in enumerate(zip(old, new, strict=False)):
        if a is not b and a != b:
            return index
    return min(len(old), len(new))
