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
    FunctionPlan,
    ModulePlan,
    _argument_names,
    code_reads,
    function_plan,
    is_library_code,
    module_plan,
    read_chain,
    rebuild_function_plan,
    unwrap_function,
)

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
    """The values a region's forward saw, and how to read them again."""

    __slots__ = (
        "torch_state",
        "global_hooks",
        "functions",
        "modules",
        "arguments",
        "argument_chains",
        "values",
        "fsdp_managed",
    )

    def __init__(self) -> None:
        self.functions: list[tuple[FunctionPlan, Any]] = []  # (plan, function or weakref)
        self.modules: list[tuple[ModulePlan, weakref.ref, frozenset]] = []
        self.arguments: list[tuple[str, Any, Any]] = []  # (label, weakref or None, value)
        self.argument_chains: list[tuple[str, Any, tuple]] = []
        self.values: list = []


def _torch_state(resolved: _compat.Torch, reentrant: bool) -> tuple:
    values = tuple([getter() for _, getter in resolved.torch_state])
    if reentrant and resolved.default_device is not None:  # non-reentrant restores it
        values += (resolved.default_device(),)
    return values


def _global_hooks(resolved: _compat.Torch, own: frozenset) -> tuple:
    return tuple(
        [
            tuple([k for k in hooks if k not in own]) if hooks else ()
            for _, hooks in resolved.global_hook_dicts
        ]
    )


def capture(
    fn: Any,
    modules: list,
    written: dict[int, frozenset],
    args: tuple,
    kwargs: dict,
    reentrant: bool,
    own_hooks: frozenset,
    loose: set[int],
) -> RegionFingerprint:
    """Read everything the region reached; plans are built or rebuilt here when needed."""
    resolved = _compat.resolve()
    fingerprint = RegionFingerprint()
    fingerprint.torch_state = _torch_state(resolved, reentrant)
    fingerprint.global_hooks = _global_hooks(resolved, own_hooks)
    values = fingerprint.values
    functions: dict[int, Any] = {}
    static_modules, static_functions = static_reach(fn)
    for func in static_functions:
        functions[id(func)] = func
    seen_modules: set[int] = set()
    for module in (*static_modules, *modules):
        if id(module) in seen_modules:
            continue
        seen_modules.add(id(module))
        plan = module_plan(module, id(module) in loose)
        for ref in plan.reads.functions:
            func = ref()
            if func is not None:
                functions.setdefault(id(func), ref)
        done = written.get(id(module), frozenset())
        fingerprint.modules.append((plan, weakref.ref(module), done))
        values.append(plan.read(module, done))
    for key, holder in functions.items():
        func = holder() if isinstance(holder, weakref.ref) else holder
        if func is None or is_library_code(func.__code__):
            continue
        plan = function_plan(func)
        read = plan.read(func)
        if plan.stale(read):
            plan = rebuild_function_plan(func)
            read = plan.read(func)
        fingerprint.functions.append((plan, holder))
        values.append(read)
        del key
    _capture_arguments(fingerprint, fn, args, kwargs)
    return fingerprint


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
    fingerprint.values.append([value_fp(read_chain(v, attrs)) for _, v, attrs in chains])


def _compare_arguments(
    fingerprint: RegionFingerprint, fn: Any, args: tuple, kwargs: dict, old_chains: list
) -> None:
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
    new_chains = [value_fp(read_chain(v, attrs)) for _, v, attrs in chains]
    if new_chains != old_chains:
        index = _first_difference(old_chains, new_chains)
        where = "attribute of an object passed to or bound into the region"
        raise Difference("attribute", chains[index][0], where, old_chains[index], new_chains[index])


def compare(
    fingerprint: RegionFingerprint,
    fn: Any,
    args: tuple,
    kwargs: dict,
    reentrant: bool,
    own_hooks: frozenset,
    name_module: Any,
) -> None:
    """Raise ``Difference`` for the first value that differs from the forward's."""
    resolved = _compat.resolve()
    state = _torch_state(resolved, reentrant)
    if state != fingerprint.torch_state:
        labels = [label for label, _ in resolved.torch_state] + ["torch.get_default_device()"]
        for label, old, new in zip(labels, fingerprint.torch_state, state, strict=False):
            if old != new:
                raise Difference("torch_state", label, "process-wide torch setting", old, new)
    hooks = _global_hooks(resolved, own_hooks)
    if hooks != fingerprint.global_hooks:
        pairs = zip(resolved.global_hook_dicts, fingerprint.global_hooks, hooks, strict=True)
        for (name, _), old, new in pairs:
            if old != new:
                where = "global module hooks, run by every module"
                raise Difference("hook", f"torch.nn.modules.module.{name}", where, old, new)
    position = 0
    values = fingerprint.values
    for plan, ref, written in fingerprint.modules:
        module = ref()
        old = values[position]
        position += 1
        if module is None:
            continue
        new = plan.read(module, written)
        if new != old:
            _explain_module(plan, module, written, old, new, name_module)
    for plan, holder in fingerprint.functions:
        func = holder() if isinstance(holder, weakref.ref) else holder
        old = values[position]
        position += 1
        if func is None:
            continue
        new = plan.read(func)
        if new != old:
            index = _first_difference(old, new)
            kind, name, where = plan.labels(func)[index]
            raise Difference(kind, name, where, _at(old, index), _at(new, index))
    _compare_arguments(fingerprint, fn, args, kwargs, values[position])


def _explain_module(
    plan: ModulePlan, module: Any, written: frozenset, old: list, new: list, name_module: Any
) -> None:
    index = _first_difference(old, new)
    kind, attribute = plan.labels(written)[index]
    owner = type(module).__name__
    where = {
        "tensor": f"parameter or buffer of {owner}",
        "attribute": f"read by {owner}'s code (attribute, child module or class attribute)",
        "hook": f"hooks of {owner}",
    }.get(kind, f"{owner} module")
    name = f"{name_module(module)}.{attribute}"
    raise Difference(kind, name, where, _at(old, index), _at(new, index))


def _at(values: list, index: int) -> Any:
    return values[index] if index < len(values) else MISSING


def _first_difference(old: list, new: list) -> int:
    for index, (a, b) in enumerate(zip(old, new, strict=False)):
        if a is not b and a != b:
            return index
    return min(len(old), len(new))
