"""Messages and errors: one function builds each kind of error the guard raises or warns, and
the description of what a comparison found (``mismatch``: the fingerprint's labels, objects
known by identity, a module read again through a fresh plan). A verdict that cannot be
described is raised all the same (``undescribed``, ``worded``)."""

from __future__ import annotations

import contextlib
import functools
import linecache
import os
import sys
import sysconfig
import types
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple, cast

import torch

from ckptguard._compat import GLOBAL_HOOK_DICTS, MODULE_HOOK_DICTS, torch_dir
from ckptguard._fingerprint import (
    MISSING,
    OBJECT,
    TENSOR,
    Described,
    LooseTensorFP,
    ObjectFP,
    TensorFP,
    of_type,
    readable,
    value_fp,
)
from ckptguard._reader import RegionReader
from ckptguard._readplan import (
    FUNCTION,
    HOOKS,
    code_reads,
    module_plan,
    read_chain,
    static_attribute,
    unwrap_function,
)
from ckptguard._verify import (
    ARGUMENT,
    ARGUMENT_CHAIN,
    READ,
    RESHAPED,
    SEGMENT,
    TENSOR_ARGUMENT,
    Binding,
    Found,
    RegionFingerprint,
    bound_keywords,
    segment_cells,
)
from ckptguard.errors import (
    MISMATCH_KINDS,
    CheckpointGuardError,
    CheckpointGuardWarning,
    CheckpointMismatchError,
    CheckpointMismatchWarning,
    LostGradientsError,
    ReentrantDDPError,
    abbreviate,
    without_addresses,
)

Location = tuple[str, int]  # (file, line)

_FIXES = {
    "function": (
        "patch or replace code (forward, methods, __code__, monkeypatches) before the forward "
        "pass or after backward, never between them"
    ),
    "global": (
        "do not rebind or mutate this global between forward and backward; pass the value to "
        "the region as an argument, or read it once outside the region"
    ),
    "closure": (
        "the region closes over a variable that was rebound after the forward (often a loop "
        "variable: late binding); bind the value now with functools.partial(fn, name=value) or "
        "a default argument"
    ),
    "defaults": (
        "a default argument of a function the region runs was changed after the forward; "
        "pass the value explicitly, or change defaults only between steps"
    ),
    "contents": (
        "a container the region reads (a closure variable, a global or a partial argument) "
        "was changed in place after the forward; change it only between steps, or pass the "
        "value to the region as an argument"
    ),
    "attribute": (
        "change module attributes, children and config objects only after backward (e.g. after "
        "optimizer.step()), or pass the value to the region as an input"
    ),
    "hook": (
        "register and remove module hooks before the forward pass or after backward; a hook "
        "added in between runs in the recompute only"
    ),
    "training": (
        "switch train()/eval() only between steps, not between forward and backward; run "
        "evaluation passes under torch.no_grad()"
    ),
    "tensor": (
        "update parameters, buffers and inputs (optimizer.step(), load_state_dict, in-place "
        "writes, assignment) only after backward"
    ),
    "argument": (
        "a value passed to or bound into the region (a keyword or argument of its "
        "functools.partial, an object its method is bound to) was changed after the forward; "
        "bind a new partial for a new value, or change it only between steps"
    ),
    "placement": "move or cast the model (.to(), .double(), .half()) only between steps",
    "torch_state": (
        "torch's checkpoint restores RNG and autocast for the recompute, not process-wide "
        "settings; change them only between steps, or use a context manager that ends before "
        "the forward and starts again around backward"
    ),
}


def _describe_value(value: Any) -> str:
    """A fingerprinted value as a message shows it: never by its address."""
    if isinstance(value, Described):
        return str(value)
    value = readable(value)
    if isinstance(value, TensorFP):
        where = f" {tuple(value.shape)}" if value.shape is not None else ""
        device = f" on {value.device}" if value.device is not None else ""
        return f"tensor{where} {value.dtype}{device} (version {value.version})"
    if isinstance(value, LooseTensorFP):
        return f"tensor {tuple(value.shape)} {value.dtype} on {value.device}"
    if isinstance(value, ObjectFP):  # read by identity: the guard holds no reference to it
        if value.type is None:
            return "an object the guard knows by identity only (it keeps no reference to it)"
        return f"a {value.type.__qualname__} object"
    if isinstance(value, types.CodeType):
        return f"code of {getattr(value, 'co_qualname', value.co_name)}"
    if _is_partial(value):
        arguments = [_describe_value(v) for v in value[2]]
        arguments += [f"{k}={_describe_value(v)}" for k, v in value[3]]
        return abbreviate(Text(f"functools.partial(..., {', '.join(arguments)})"), 160)
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], type):
        shown = ", ".join(_describe_value(v) for v in value[1]) if value[0] is not dict else ""
        if value[0] is dict:
            shown = ", ".join(f"{k!r}: {_describe_value(v)}" for k, v in value[1])
        return f"{value[0].__name__} of {len(value[1])}: {abbreviate(shown, 160)}"
    return abbreviate(value)


def describe_object(value: Any, name_module: Callable[[Any], str] | None) -> Described:
    """An object a message names by what it is: a module by its path in the model, its class
    and what its ``extra_repr`` says (``blocks.0.fc (Linear(in_features=4, ...))``), a
    function by its name, qualified name and ``file:line``, a tensor by shape, dtype, device
    and version, a built-in by its module; other objects by their type, plain values by
    value. Types are read from the object itself (``of_type``), not from what a proxy's
    ``__class__`` answers."""
    if of_type(value, torch.nn.Module):
        cls = type(value).__name__
        name = name_module(value) if name_module is not None else cls
        extra = _extra_repr(value)
        shown = f"{cls}({extra})" if extra else cls
        return Described(shown if name == cls else f"{name} ({shown})", True)
    function = _python_function(value)
    if function is not None:
        code = function.__code__
        where = f"{code.co_filename}:{code.co_firstlineno}"
        label = (
            where
            if function.__name__ == function.__qualname__
            else f"{function.__qualname__}, {where}"
        )
        return Described(f"{function.__name__} ({label})")
    if of_type(value, (types.BuiltinFunctionType, types.BuiltinMethodType)):
        owner = getattr(value, "__module__", None) or type(value.__self__).__name__
        return Described(f"built-in {owner}.{value.__name__}")
    if of_type(value, torch.Tensor):
        return Described(
            f"tensor {tuple(value.shape)} {value.dtype} on {value.device} "
            f"(version {value._version})"
        )
    if type(value) in _PLAIN:
        return Described(abbreviate(value))
    return Described(f"a {type(value).__qualname__} object")


_PLAIN = (int, float, bool, complex, str, bytes, type(None), list, tuple, dict, set, frozenset)
_CLOSURE_VALUES_SHOWN = 4  # per function, at most


def describe_pair(
    old: Any, new: Any, name_module: Callable[[Any], str] | None
) -> tuple[Described, Described]:
    """Two objects a read found in one place, described; two functions with the same free
    variables also by the closure values that differ (``helper (make.<locals>.helper,
    train.py:5) with scale=2.0`` against ``... with scale=3.0``)."""
    old_text, new_text = describe_object(old, name_module), describe_object(new, name_module)
    before, after = _python_function(old), _python_function(new)
    if before is None or after is None:
        return old_text, new_text
    differing = _closure_differences(before, after)[:_CLOSURE_VALUES_SHOWN]
    if not differing:
        return old_text, new_text
    then = ", ".join(f"{name}={a}" for name, a, _ in differing)
    now = ", ".join(f"{name}={b}" for name, _, b in differing)
    return Described(f"{old_text} with {then}"), Described(f"{new_text} with {now}")


def _closure_differences(old: types.FunctionType, new: types.FunctionType) -> list:
    """(name, then, now) of each closure variable whose value differs, for two functions of
    the same free variables."""
    names = old.__code__.co_freevars
    if names != new.__code__.co_freevars or not names:
        return []
    found = []
    for name, a, b in zip(names, old.__closure__ or (), new.__closure__ or (), strict=True):
        then, now = _cell_value(a), _cell_value(b)
        if then is now or (type(then) in _PLAIN and type(then) is type(now) and _same(then, now)):
            continue
        found.append((name, _short(then), _short(now)))
    return found


def _cell_value(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return MISSING


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # an element's own __eq__ raised: they differ
        return False


def _short(value: Any) -> str:
    """A closure value inside a message's line."""
    if value is MISSING:
        return "<unset>"
    if type(value) in _PLAIN:
        return abbreviate(value, 40)
    if of_type(value, torch.Tensor):
        return f"tensor {tuple(value.shape)} {value.dtype}"
    function = _python_function(value)
    if function is not None:
        return function.__qualname__
    return f"a {type(value).__qualname__} object"


def _python_function(value: Any) -> types.FunctionType | None:
    """The Python function a function, method or decorated function runs, else None."""
    function = value.__func__ if of_type(value, types.MethodType) else value
    return unwrap_function(function)


def _extra_repr(module: torch.nn.Module) -> str:
    try:
        return abbreviate(Text(module.extra_repr()), 80)
    except Exception:  # a module's own method: a message must not fail on it
        return ""


def _tensor_change(old: Any, new: Any) -> tuple[str, str]:
    """Refine a tensor mismatch into (kind, what happened)."""
    if isinstance(old, TensorFP) and isinstance(new, TensorFP):
        return _placement_change(old, new) or _storage_change(old, new)
    if isinstance(old, LooseTensorFP) and isinstance(new, LooseTensorFP):
        reshaped = f"was reshaped from {tuple(old.shape)} to {tuple(new.shape)}"
        return _placement_change(old, new) or ("tensor", reshaped)
    return "tensor", "was set, removed or replaced"


def _placement_change(
    old: TensorFP | LooseTensorFP, new: TensorFP | LooseTensorFP
) -> tuple[str, str] | None:
    same_place = old.device is None or old.device == new.device  # None: not recorded
    if old.dtype == new.dtype and same_place:
        return None
    if same_place:
        return "placement", f"was cast from {old.dtype} to {new.dtype}"
    return "placement", (
        f"was moved or cast from {old.dtype} on {old.device} to {new.dtype} on {new.device}"
    )


def _storage_change(old: TensorFP, new: TensorFP) -> tuple[str, str]:
    if old.ident != new.ident and old.ident != 0:
        return "tensor", "was replaced by a different tensor object"
    if old.shape is not None and old.shape != new.shape:
        return "tensor", f"was resized from {tuple(old.shape)} to {tuple(new.shape or ())}"
    if old.version != new.version:
        return "tensor", (
            f"was modified in place (version counter {old.version} -> {new.version}, e.g. an "
            "optimizer step or a .copy_/.add_)"
        )
    if old.requires_grad != new.requires_grad:
        return "tensor", (
            f"had requires_grad switched from {old.requires_grad} to {new.requires_grad} "
            "(requires_grad_())"
        )
    return "tensor", "had its storage swapped (.data = ... or set_())"


def _refine(kind: str, old: Any, new: Any) -> tuple[str, str]:
    old_r, new_r = readable(old), readable(new)
    if isinstance(old_r, (TensorFP, LooseTensorFP)) or isinstance(new_r, (TensorFP, LooseTensorFP)):
        return _tensor_change(old_r, new_r)
    if isinstance(old_r, (ObjectFP, Described)) and isinstance(new_r, (ObjectFP, Described)):
        if isinstance(old_r, Described) or isinstance(new_r, Described):
            modules = [v.module for v in (old_r, new_r) if isinstance(v, Described)]
            if all(modules):
                return kind, "was replaced by another module"
            return kind, "now refers to another object"
        known = [t for t in (old_r.type, new_r.type) if t is not None]
        if known and all("Module" in {k.__name__ for k in t.__mro__} for t in known):
            return kind, "was replaced by another module"
        return kind, "now refers to another object"
    return kind, "changed"


def _descend(name: str, old: Any, new: Any) -> tuple[str, Any, Any]:
    """Into a container fingerprint to the first element that differs: ``factors[0]``, a
    partial's ``act.keywords['approximate']``."""
    if _is_partial(old) and _is_partial(new) and old[1] == new[1]:  # the same function
        if old[2] != new[2]:
            name, old, new = f"{name}.args", (tuple, old[2]), (tuple, new[2])
        else:
            name, old, new = f"{name}.keywords", (dict, old[3]), (dict, new[3])
    while (
        type(old) is tuple
        and type(new) is tuple
        and len(old) == 2
        and len(new) == 2
        and old[0] is new[0]
        and old[0] in (list, tuple, dict)
        and len(old[1]) == len(new[1])
    ):
        pairs = list(zip(old[1], new[1], strict=True))
        index = next((i for i, (a, b) in enumerate(pairs) if a != b), None)
        if index is None:
            break
        a, b = pairs[index]
        if old[0] is dict:
            if a[0] != b[0]:
                break
            name, old, new = f"{name}[{a[0]!r}]", a[1], b[1]
        else:
            name, old, new = f"{name}[{index}]", a, b
    return name, old, new


def _is_partial(value: Any) -> bool:
    """A ``functools.partial``'s fingerprint: (partial, id of its function, args, keywords)."""
    return type(value) is tuple and len(value) == 4 and value[0] is functools.partial


# what plain PyTorch does with each kind of change, where it does not stay silent
_TORCH_DOES = {
    "training": (
        "plain PyTorch raises an opaque CheckpointError in backward under "
        "use_reentrant=False when the switch changes what the region saves (dropout, "
        "BatchNorm: a different number of saved tensors), and otherwise computes the other "
        "mode's gradients without a word"
    ),
    "placement": (
        "plain PyTorch fails inside the recompute with an opaque error at the first op that "
        "meets the moved or cast tensor (a dtype or device mismatch such as 'mat1 and mat2 "
        "must have the same dtype'), or raises CheckpointError about the saved tensors' "
        "metadata"
    ),
}
_TORCH_SILENT = "plain PyTorch does not notice"


def _fix_for(kind: str, name: str, where: str | None, old: Any) -> str:
    if kind == "closure" and name.endswith(("__defaults__", "__kwdefaults__")):
        return _FIXES["defaults"]
    if kind in ("closure", "global") and type(old) is tuple and old and old[0] in _CONTAINERS:
        return _FIXES["contents"]
    return _FIXES.get(kind, _FIXES["tensor"])


_CONTAINERS = (list, tuple, dict, set, frozenset)


class Difference(NamedTuple):
    """What changed, as a message names it: its kind, name, where it lives, and the forward's
    and the current value."""

    kind: str
    name: str
    where: str | None
    old: Any
    new: Any


class Text(str):
    """A description shown as it is in a message (no quotes)."""

    def __repr__(self) -> str:
        return str(self)


def hooks_text(keys: tuple) -> Text:
    if not keys:
        return Text("no hooks")
    plural = "s" if len(keys) > 1 else ""
    return Text(f"{len(keys)} hook{plural} (handle ids {', '.join(map(str, keys))})")


def _first_changed_table(tables: tuple[str, ...], old: Any, new: Any) -> tuple[str, Text, Text]:
    """Hook dicts are read as the keys of each table, () when all are empty: the first
    table that differs, and its hooks before and now."""
    before, after = old or ((),) * len(tables), new or ((),) * len(tables)
    index = next(i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b)
    return tables[index], hooks_text(before[index]), hooks_text(after[index])


def global_hooks_difference(
    kind: str, tables: tuple[str, ...], where: str | None, old: Any, new: Any
) -> Difference:
    table, old, new = _first_changed_table(tables, old, new)
    return Difference(kind, f"torch.nn.modules.module.{table}", where, old, new)


def module_difference(
    kind: str,
    attribute: str | None,
    module: str,
    owner: str,
    hook_tables: tuple[str, ...],
    old: Any,
    new: Any,
    holder: Any = None,
) -> Difference:
    """A value one of the region's modules holds (``module`` its name, ``owner`` its class,
    ``holder`` the module itself: a tensor it holds now is shown with its shape and device,
    which its fingerprint leaves out)."""
    if kind == "tensor" and attribute and holder is not None:
        new = _with_placement(new, _tensor_held(holder, attribute))
    where = {
        "tensor": f"parameter or buffer of {owner}",
        "attribute": f"read by {owner}'s code",
        "hook": f"hooks of {owner}",
    }.get(kind, f"{owner} module")
    if kind == "hook":
        attribute, old, new = _first_changed_table(hook_tables, old, new)
    name = f"{module}.{attribute}" if attribute else module
    return Difference(kind, name, where, old, new)


def _tensor_held(module: Any, name: str) -> Any:
    for table in ("_parameters", "_buffers"):
        tensor = module.__dict__.get(table, {}).get(name)
        if tensor is not None:
            return tensor
    return None


def _with_placement(value: Any, tensor: Any) -> Any:
    """A parameter's or buffer's fingerprint with the device and shape of ``tensor``, the
    tensor it fingerprinted (the fingerprint leaves them out: a move or resize changes its
    data pointer or version counter anyway)."""
    fingerprint = readable(value)
    if not isinstance(fingerprint, TensorFP) or fingerprint.device is not None:
        return value
    if tensor is None or id(tensor) != fingerprint.ident:
        return value
    return (TENSOR, *fingerprint[:4], tensor.device, tuple(tensor.shape))


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def contents_difference(name: str, module: str, owner: str, old: Any, new: Any) -> Difference:
    """A container module's contents changed (``name``: the sizes' ``_modules`` or
    ``_parameters``, or ``children``, their ids: as many, one or more replaced)."""
    held = "parameter" if name == "_parameters" else "module"
    if name == "children":
        old, new = Text(_count(len(old), held)), Text("as many, one or more replaced")
    else:
        old, new = Text(_count(old, held)), Text(_count(new, held))
    return Difference("attribute", module, f"the {held}s held by this {owner}", old, new)


def mismatch_error(
    region: str, kind: str, name: str, where: str | None, old: Any, new: Any
) -> CheckpointMismatchError:
    """A fingerprinted state that differs at recompute from what the forward saw."""
    name, shown_old, shown_new = _descend(name, old, new)
    refined, change = _refine(kind, shown_old, shown_new)
    # a tensor argument is a tensor; any other argument keeps its own kind
    fix = _fix_for(refined if kind == "argument" else kind, name, where, old)
    old_text, new_text = _describe_value(shown_old), _describe_value(shown_new)
    message = (
        f"ckptguard [{refined}]: checkpointed region {region} would be recomputed differently "
        f"from its forward pass.\n"
        f"  what changed: {name} ({where}) {change}\n"
        f"  forward saw:  {old_text}\n"
        f"  now:          {new_text}\n"
        f"  effect: {_EFFECT}; {_TORCH_DOES.get(refined, _TORCH_SILENT)}.\n"
        f"  how to fix: {fix}."
    )
    details = {"name": name, "where": where, "old": old_text, "new": new_text}
    return CheckpointMismatchError(message, kind=refined, region=region, details=details)


_EFFECT = (
    "backward reruns the region with the new state, so its gradients belong to a different "
    "computation than the forward's output"
)


def undescribed(region: str, kind: str, entry: str, error: Exception) -> CheckpointMismatchError:
    """A difference the guard found but failed to describe (reading the objects to name them
    raised): the verdict stands, named by what differs in the fingerprint."""
    reason = f"{type(error).__name__}: {without_addresses(str(error))}"
    message = (
        f"ckptguard [{kind}]: checkpointed region {region} would be recomputed differently "
        f"from its forward pass.\n"
        f"  what changed: {entry} changed (could not describe it: {reason})\n"
        f"  effect: {_EFFECT}; {_TORCH_DOES.get(kind, _TORCH_SILENT)}.\n"
        f"  how to fix: {_FIXES.get(kind, _FIXES['tensor'])}."
    )
    details = {"name": entry, "where": None, "old": None, "new": None, "undescribed": reason}
    return CheckpointMismatchError(message, kind=kind, region=region, details=details)


def worded(
    build: Callable[..., CheckpointGuardError],
    region: str,
    kind: str,
    entry: str,
    *args: Any,
) -> CheckpointGuardError:
    """``build(region, *args)``: the error for a verdict already reached; where wording it
    fails, the verdict stands all the same (``undescribed``). See NOTE [ The guard never stops
    training ] in ``_barrier``."""
    try:
        return build(region, *args)
    except Exception as error:
        return undescribed(region, kind, entry, error)


# ------------------------------------------------------------ what a comparison found


def mismatch(
    region: str,
    found: Found,
    fingerprint: RegionFingerprint,
    binding: Binding,
    args: tuple,
    kwargs: dict,
    name_module: Callable[[Any], str],
) -> CheckpointMismatchError | None:
    """The error for the first difference a recompute's comparison found (``_verify.Found``),
    named by what it is: positions by their labels, objects read by identity by what they
    are, a module whose shape changed read again through a fresh plan. None where that fresh
    read finds every value its code reads unchanged (an attribute nothing reads was added).
    Where describing it fails, the verdict stands: the error names the fingerprint entry."""
    kind, entry = _kind_of(found, fingerprint), _entry(found, fingerprint)
    try:
        difference = _difference(found, fingerprint, binding, args, kwargs, name_module)
    except Exception as error:
        return undescribed(region, kind, entry, error)
    if difference is None:
        return None
    return cast(CheckpointMismatchError, worded(mismatch_error, region, kind, entry, *difference))


def _difference(
    found: Found,
    fingerprint: RegionFingerprint,
    binding: Binding,
    args: tuple,
    kwargs: dict,
    name_module: Callable[[Any], str],
) -> Difference | None:
    part, index, old, new = found
    if part == READ:
        return _read_difference(fingerprint, index, old, new, name_module)
    if part == RESHAPED:
        for module in index:
            difference = _reshaped_difference(fingerprint, module, name_module)
            if difference is not None:
                return difference
        return None
    if part == SEGMENT:
        return _segment_difference(binding, old, new)
    if part == ARGUMENT_CHAIN:
        where = "attribute of an object passed to or bound into the region"
        return Difference("attribute", fingerprint.argument_chains[index][0], where, old, new)
    tensors, others = _argument_labels(binding, args, kwargs)
    labels = tensors if part == TENSOR_ARGUMENT else others
    name, where = labels[index] if index < len(labels) else ("a keyword", "bound into a partial")
    return Difference("argument", name, where, old, new)


def _kind_of(found: Found, fingerprint: RegionFingerprint) -> str:
    """The kind a difference is reported as when it cannot be described."""
    if found.part == READ:
        labels = fingerprint.reader.labels
        kind = labels[found.index].kind if 0 <= found.index < len(labels) else "attribute"
        return kind if kind in MISMATCH_KINDS else "attribute"
    return {TENSOR_ARGUMENT: "tensor", ARGUMENT: "argument"}.get(found.part, "attribute")


def _entry(found: Found, fingerprint: RegionFingerprint) -> str:
    """What differs, named from the fingerprint alone (its labels and the modules' classes),
    for a difference that cannot be described otherwise."""
    try:
        if found.part == READ:
            label = fingerprint.reader.labels[found.index]
            if type(label.owner) is int:
                owner = type(fingerprint.modules[label.owner]).__name__
                return f"{owner}.{label.name}" if label.name else owner
            return f"{label.name} ({label.where})" if label.where else label.name
        if found.part == RESHAPED:
            owners = ", ".join(type(fingerprint.modules[i]).__name__ for i in found.index)
            return f"the attributes, parameters, buffers or children of {owners}"
        return f"{found.part} #{found.index}"
    except Exception:  # the fingerprint's own records: cannot fail, but must not hide the verdict
        return f"{found.part} of the region's fingerprint"


def _read_difference(
    fingerprint: RegionFingerprint,
    position: int,
    old: Any,
    new: Any,
    name_module: Callable[[Any], str],
) -> Difference:
    reader = fingerprint.reader
    label = reader.labels[position]
    objects = _KnownObjects(fingerprint, name_module)
    if label.kind == "methods":
        return _method_difference(reader.method_names[position], label.where, old, new, objects)
    old, new = objects.shown_pair(position, old, new)
    if label.kind == "hook":  # the hooks that count (see ``_verify.hooks_differ``)
        old, new = _counted(old, fingerprint.inert_hooks), _counted(new, fingerprint.inert_hooks)
    if label.owner == HOOKS:
        return global_hooks_difference(label.kind, GLOBAL_HOOK_DICTS, label.where, old, new)
    if label.owner == FUNCTION:
        return Difference(label.kind, label.name, label.where, old, new)
    assert type(label.owner) is int, "a module's index"
    module = fingerprint.modules[label.owner]
    planned = reader.module_plans[label.owner].cls
    if label.name == "forward" and type(module) is not planned:  # module.__class__ = Other
        where = f"class of the module ({planned.__qualname__} at the forward)"
        path = f"{name_module(module)}.__class__"
        return Difference(
            "function",
            path,
            where,
            Described(planned.__qualname__),
            Described(type(module).__qualname__),
        )
    if label.kind == "shape":  # a container's contents
        owner = type(module).__name__
        return contents_difference(label.name, name_module(module), owner, old, new)
    return _module_difference(label.kind, label.name, module, old, new, name_module)


def _counted(keys: tuple, inert: frozenset) -> tuple:
    """Hook keys per table without the hooks that changed nothing at the forward."""
    if not inert:
        return keys
    return tuple(tuple(k for k in table if k not in inert) for table in keys)


def _module_difference(
    kind: str, attribute: str | None, module: Any, old: Any, new: Any, name_module: Any
) -> Difference:
    if kind == "attribute" and attribute and type(new) is tuple and new[0] is OBJECT:
        # read by identity: say what the attribute holds now
        chain = tuple(attribute.split("."))
        current = read_chain(static_attribute(module, chain[0]), chain[1:])
        if id(current) == new[1]:
            new = describe_object(current, name_module)
        else:
            new = (OBJECT, new[1], type(current))
    owner, name = type(module).__name__, name_module(module)
    return module_difference(kind, attribute, name, owner, MODULE_HOOK_DICTS, old, new, module)


def _reshaped_difference(
    fingerprint: RegionFingerprint, index: int, name_module: Any
) -> Difference | None:
    """A module's shape changed (an attribute, parameter, buffer or child added or removed)
    while every value its plan reads stayed equal: compare what the old and a fresh plan read
    (a new instance attribute may now shadow a class one)."""
    reader, module = fingerprint.reader, fingerprint.modules[index]
    plan = reader.module_plans[index]
    top_hooks = reader.top_hooks and index == 0
    fresh_plan = module_plan(module, plan.loose, fresh=True)
    fresh = RegionReader([module], [fresh_plan], [], [], (), [], top_hooks)
    before = _module_values(reader, fingerprint.values, index)
    current = _module_values(fresh, fresh.read([module], [], frozenset()), 0)
    written = fingerprint.written.get(index, ())
    for (kind, name), value in current.items():
        if kind == "tensor" and name in written:
            continue  # the region's own output. See NOTE [ Outputs are not inputs ]
        if (kind, name) in before and not _same(before[kind, name], value):
            return _module_difference(kind, name, module, before[kind, name], value, name_module)
    return None


def _module_values(reader: RegionReader, values: tuple, index: int) -> dict[tuple, Any]:
    """{(kind, name): value} of one module's positions, its shape aside."""
    return {
        (label.kind, label.name): _as_fingerprint(reader, position, value)
        for position, (label, value) in enumerate(zip(reader.labels, values, strict=True))
        if label.owner == index and label.kind != "shape"
    }


def _as_fingerprint(reader: RegionReader, position: int, value: Any) -> Any:
    """A read value as a fingerprint: an id read for identity becomes an object fingerprint
    of unknown type (an int attribute read by value stays an int)."""
    if position in reader.identity_positions:
        return (OBJECT, value, None)
    if position in reader.raw_positions:
        return value_fp(value)
    return value


def _method_difference(
    names: tuple[str, ...], where: str | None, old: tuple, new: tuple, objects: _KnownObjects
) -> Difference:
    """A method of ``torch.Tensor`` the region's code calls, patched since its forward (None:
    not in ``torch.Tensor``'s own dict, so its C implementation)."""
    for name, before, now in zip(names, old, new, strict=True):
        if before is not now:
            shown = [
                Described(f"torch's own {name}") if value is None else objects.describe(value)
                for value in (before, now)
            ]
            return Difference("function", f"torch.Tensor.{name}", where, *shown)
    return Difference("function", "torch.Tensor", where, old, new)


class _KnownObjects:
    """Objects a mismatch message can name by what they are (``blocks.2 (Block)``,
    ``patched_forward (train.py:60)``) where the reader kept only their ids: those the
    fingerprint holds (its modules and functions, alive since the forward, so their ids
    are theirs) and those the region's functions and modules hold now."""

    def __init__(self, fingerprint: RegionFingerprint, name_module: Any) -> None:
        self.fingerprint = fingerprint
        self.name_module = name_module
        self._by_id: dict[int, Any] | None = None

    def _objects(self) -> dict[int, Any]:
        if self._by_id is None:
            fingerprint = self.fingerprint
            found: dict[int, Any] = {}
            functions = [f for f in (*fingerprint.roots, *fingerprint.functions) if f is not None]
            for module in fingerprint.modules:
                found[id(module)] = module
                forward = module.__dict__.get("forward") or type(module).forward
                found.setdefault(id(forward), forward)
            for function in functions:
                found.setdefault(id(function), function)
                for cell in function.__closure__ or ():
                    contents = _cell_value(cell)
                    if contents is not MISSING:
                        found.setdefault(id(contents), contents)
                namespace = function.__globals__
                for chain in code_reads(function.__code__).global_chains:
                    value = read_chain(namespace.get(chain[0], MISSING), chain[1:])
                    found.setdefault(id(value), value)
            reader = fingerprint.reader
            for namespace, chain, _, _ in reader.library_calls:  # what torch's code calls now
                value = read_chain(namespace.get(chain[0], MISSING), chain[1:])
                found.setdefault(id(value), value)
            for ident, value in reader.library_objects.items():  # ... and called at the forward
                found.setdefault(ident, value)
            self._by_id = found
        return self._by_id

    def describe(self, value: Any) -> Described:
        """An object by what it is (see ``describe_object``)."""
        return describe_object(value, self.name_module)

    def shown_pair(self, position: int, old: Any, new: Any) -> tuple[Any, Any]:
        """The forward's and the current value of one position, objects read by identity
        described by what they are where known (see ``describe_pair``)."""
        reader = self.fingerprint.reader
        if position not in reader.identity_positions:
            return _as_fingerprint(reader, position, old), _as_fingerprint(reader, position, new)
        known = self._objects()
        before, now = known.get(old, MISSING), known.get(new, MISSING)
        if before is not MISSING and now is not MISSING:
            return describe_pair(before, now, self.name_module)
        return (
            _as_fingerprint(reader, position, old)
            if before is MISSING
            else describe_object(before, self.name_module),
            _as_fingerprint(reader, position, new)
            if now is MISSING
            else describe_object(now, self.name_module),
        )


def _argument_labels(binding: Binding, args: tuple, kwargs: dict) -> tuple[list, list]:
    """(name, where) of each argument ``_verify`` fingerprints, in its order: the positional
    tensors, then every other argument."""
    passed, bound = "argument of the region", "bound into the region's functools.partial or method"
    tensors = [
        (f"positional argument {i}", passed) for i, v in enumerate(args) if of_type(v, torch.Tensor)
    ]
    others = [
        (f"positional argument {i}", passed)
        for i, v in enumerate(args)
        if not of_type(v, torch.Tensor)
    ]
    others += [(f"keyword argument {k}", passed) for k in kwargs]
    others += [
        (f"bound argument {i}", bound)
        for i, v in enumerate(binding.bound_args)
        if not of_type(v, torch.nn.Module)
    ]
    others += [(f"bound keyword {k}", bound) for k in bound_keywords(binding)]
    return tensors, others


def _segment_difference(binding: Binding, old: tuple, new: Any) -> Difference:
    """An item of the plain list a ``checkpoint_sequential`` segment runs, replaced since the
    forward (``nn.Sequential`` is copied into a list of its own at the call)."""
    functions, start, end = segment_cells(binding)
    try:
        now = list(functions[start : end + 1])
    except TypeError:  # not a sequence any more
        now = []
    shown = [
        Described(f"{type(item).__name__}{'' if id(item) in old else ' (another object)'}")
        for item in now
    ]
    name = f"functions[{start}:{end + 1}]"
    where = "the plain list checkpoint_sequential runs this segment from"
    return Difference("attribute", name, where, Described(f"{len(old)} modules"), shown)


def advanced_iterators_of(fingerprint: RegionFingerprint, name_module: Any) -> list[str]:
    """What the region's forward advanced that its recompute will advance again (a global,
    closure cell, module attribute or argument holding an iterator or a generator)."""
    names = []
    for found in fingerprint.iterators:
        if type(found) is str:
            names.append(found)
        elif type(found.owner) is int:
            names.append(f"{name_module(fingerprint.modules[found.owner])}.{found.name}")
        else:
            names.append(f"{found.name} ({found.where})")
    return names


def torch_state_error(
    region: str, name: str, old: Any, new: Any, evidence: str, certain: bool
) -> CheckpointMismatchError:
    """A process-wide torch setting that changed between forward and recompute, judged by
    what the recompute ran: ``certain`` when an op's result depends on the setting (a tensor
    made from the default dtype), else the recompute ran ops the setting may change."""
    if certain:
        effect = (
            f"the recompute ran {evidence}, so it computed differently from the forward and "
            f"the gradients belong to a different computation; plain PyTorch does not notice "
            f"(or fails later with an opaque dtype or device error)"
        )
        headline = "was recomputed differently from its forward pass"
    else:
        effect = (
            f"the recompute ran {evidence}, whose results this setting may change (depending "
            f"on the backend and the kernels chosen): the gradients may differ from the "
            f"forward's computation; the guard cannot tell whether they do (strict=True "
            f"compares the values backward uses)"
        )
        headline = "may have been recomputed differently from its forward pass"
    message = (
        f"ckptguard [torch_state]: checkpointed region {region} {headline}.\n"
        f"  what changed: {name} (process-wide torch setting) changed\n"
        f"  forward saw:  {abbreviate(old)}\n"
        f"  now:          {abbreviate(new)}\n"
        f"  effect: {effect}.\n"
        f"  how to fix: {_FIXES['torch_state']}."
    )
    details = {
        "name": name,
        "where": "process-wide torch setting",
        "old": abbreviate(old),
        "new": abbreviate(new),
        "certain": certain,
        "evidence": evidence,
    }
    return CheckpointMismatchError(message, kind="torch_state", region=region, details=details)


def state_read_error(
    region: str, name: str, evidence: str, certain: bool
) -> CheckpointMismatchError:
    """Module state the region's own forward updated (an observer's statistics, a fake
    quantization's scale, spectral_norm's vectors, a counter) and its recompute computes from:
    the recompute starts from the forward's update, not from what the forward read."""
    if certain:
        headline = "was recomputed differently from its forward pass"
        effect = (
            f"the recompute ran {evidence}, and backward uses what it computed, so the "
            f"gradients belong to a different computation than the forward's output; plain "
            f"PyTorch does not notice"
        )
    else:
        headline = "may have been recomputed differently from its forward pass"
        effect = (
            f"the recompute ran {evidence}, and backward uses what it computed; the guard "
            f"could not run it again as the forward ran it to know whether its result differs "
            f"(strict=True compares the values backward uses)"
        )
    fix = (
        "keep modules that update state they compute from (observers, fake quantization, "
        "spectral_norm) outside checkpointed regions, or skip the update during the recompute "
        "(freeze the observers, e.g. torch.ao.quantization.disable_observer, or a flag checked "
        "in forward)"
    )
    message = (
        f"ckptguard [tensor]: checkpointed region {region} {headline}.\n"
        f"  what changed: {name} (state the region's own forward updated) was updated by the "
        f"forward, and the recompute computes from the update\n"
        f"  forward saw:  its value before the forward\n"
        f"  now:          the value the forward left\n"
        f"  effect: {effect}.\n"
        f"  how to fix: {fix}."
    )
    details = {
        "name": name,
        "where": "state the region's own forward updated",
        "old": "its value before the forward",
        "new": "the value the forward left",
        "certain": certain,
        "evidence": evidence,
    }
    return CheckpointMismatchError(message, kind="tensor", region=region, details=details)


def setting_changed(name: str, old: Any, new: Any) -> dict[str, Any]:
    """A torch setting that changed between the passes although no result the recompute
    computed under it reached backward: kept to explain torch's own error, should torch find
    the recompute saved other tensors (an attention backend saves its own)."""
    where = "process-wide torch setting; the guard found no result it changed that backward uses"
    return {"name": name, "where": where, "old": abbreviate(old), "new": abbreviate(new)}


def rng_device_error(region: str, devices: list[str], preserve: bool) -> CheckpointMismatchError:
    reason = (
        "preserve_rng_state=False, so torch restores no RNG state"
        if not preserve
        else "torch stashes the RNG state only for CPU and for the devices of tensor positional "
        "arguments"
    )
    # without preserve_rng_state torch restores no device's state, whatever the arguments
    restore = (
        "pass a tensor on each of these devices as a positional argument of checkpoint"
        if preserve
        else "keep preserve_rng_state=True (the default)"
    )
    message = (
        f"ckptguard [rng_device]: checkpointed region {region} drew random numbers on "
        f"{', '.join(devices)} during its forward, but {reason}; the recompute will draw "
        f"different numbers there and its gradients will not match the forward.\n"
        f"  how to fix: {restore}, or draw the random numbers outside the region and pass "
        f"them in."
    )
    details = {"devices": devices, "preserve_rng_state": preserve}
    return CheckpointMismatchError(message, kind="rng_device", region=region, details=details)


def values_error(
    region: str, what: str, difference: dict[str, Any], first_op: dict[str, Any] | None
) -> CheckpointMismatchError:
    """Strict mode: a tensor backward uses differs beyond rounding between forward and recompute."""
    op_text = ""
    if first_op is not None:
        op_text = (
            f"  first differing op: #{first_op['index']} {first_op['op']} {first_op['frame']}\n"
            f"    forward:   {first_op['forward']}\n"
            f"    recompute: {first_op['recompute']}\n"
        )
    message = (
        f"ckptguard [values]: checkpointed region {region} computed different values during its "
        f"recompute.\n"
        f"  what differs: {what}\n"
        f"  by how much: {difference['summary']}\n"
        f"{op_text}"
        f"  effect: backward uses these recomputed tensors, so the gradients are affected "
        f"(beyond floating-point rounding).\n"
        f"  how to fix: make the region a pure function of its inputs and parameters: no state "
        f"that changes between forward and backward (object attributes, explicit "
        f"torch.Generator, nondeterministic kernels, ops like F.rrelu in training mode)."
    )
    details = {"what": what, **difference}
    if first_op is not None:
        details.update({"op": first_op["op"], "index": first_op["index"]})
        details.update({k: first_op[k] for k in ("frame", "forward", "recompute")})
    return CheckpointMismatchError(message, kind="values", region=region, details=details)


def checkpoint_error_explained(
    region: str,
    torch_message: str,
    found: list[tuple[str, dict[str, Any]]],
    first_op: dict[str, Any] | None,
) -> CheckpointMismatchError:
    """torch's own CheckpointError, explained from the region's fingerprints."""
    first_line = torch_message.strip().splitlines()[0] if torch_message.strip() else ""
    if found:
        cause = "\n".join(
            f"  ckptguard saw: [{kind}] {details.get('name', details.get('what', ''))} "
            f"({details.get('old', '')} -> {details.get('new', '')})"
            for kind, details in found
        )
        kind = found[0][0]
    else:
        kind = "saved_tensors"
        cause = (
            "  ckptguard saw no change in what it fingerprints (modules, globals, closures, "
            "arguments, torch settings): the region read state it cannot name (an object passed "
            "in and grown in between, such as a KV cache, or parameters re-partitioned by a "
            "framework)."
            + ("" if first_op else " enable(strict=True) names the first op that diverged.")
        )
    op_text = ""
    if first_op is not None:
        op_text = (
            f"\n  first differing op: #{first_op['index']} {first_op['op']} {first_op['frame']}\n"
            f"    forward:   {first_op['forward']}\n"
            f"    recompute: {first_op['recompute']}"
        )
    rest = torch_message.strip()[len(first_line) :].strip("\n")
    torch_text = f"\n  torch's full report:\n{rest}" if rest else ""
    message = (
        f"ckptguard [{kind}]: torch's checkpoint found that the recompute of region {region} "
        f"saved different tensors than its forward.\n"
        f"  torch: {first_line}\n"
        f"{cause}{op_text}\n"
        f"  effect: the recompute is a different computation; torch refuses to use it."
        f"{torch_text}"
    )
    details: dict[str, Any] = {"torch": torch_message, "changes": [d for _, d in found]}
    if first_op is not None:
        details.update({"op": first_op["op"], "index": first_op["index"]})
    return CheckpointMismatchError(message, kind=kind, region=region, details=details)


def side_effect(
    region: str, names: list[str], statistics_only: bool, fallback: Location | None
) -> None:
    """The recompute updated module state the forward had already updated: a warning in
    every mode (strict mode compares what backward uses, and raises only there)."""
    if statistics_only:
        effect = (
            "gradients are not affected (a normalisation layer in training computes its output "
            "from the batch's own statistics), but each checkpointed step updates the running "
            "statistics twice: they move as if momentum were about twice as large "
            "(num_batches_tracked counts two per step), which the model uses in eval()"
        )
        fix = (
            "keep the normalisation layer outside the checkpointed region, halve its momentum "
            "to compensate, or use a norm without running statistics (GroupNorm, LayerNorm); "
            "this is reported once per module"
        )
    else:
        effect = (
            "the recompute started from the state the forward had already updated: if the "
            "region computes its output from it (power-iteration vectors of spectral_norm, an "
            "EMA codebook, a counter feeding a schedule) its gradients are wrong; if it only "
            "records it (a call counter) the step counts twice. Strict mode compares the "
            "tensors backward uses and raises where they differ"
        )
        fix = (
            "keep such modules outside checkpointed regions, or skip the update during the "
            "recompute (e.g. a flag checked in forward); this is reported once per module"
        )
    message = (
        f"ckptguard [side_effect]: the recompute of checkpointed region {region} updated state "
        f"a second time: {', '.join(_counted_names(names))}.\n"
        f"  effect: {effect}.\n"
        f"  how to fix: {fix}."
    )
    warn(message, CheckpointGuardWarning, fallback)


def _counted_names(names: list[str]) -> list[str]:
    """Each name once, in order; one that several modules share (modules of one class outside
    a model are named by their class) says how many: ``Net.counter (in 5 modules)``."""
    counts: dict[str, int] = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    return [
        name if count == 1 else f"{name} (in {count} modules)" for name, count in counts.items()
    ]


def advanced_iterators(region: str, names: list[str], fallback: Location | None) -> None:
    """At the forward: the region advanced an iterator or generator (``next(self.gains)``),
    which its recompute will advance again."""
    message = (
        f"ckptguard [iterator]: checkpointed region {region} advanced {', '.join(names)} "
        f"during its forward (next() or a for loop over an iterator or generator); the "
        f"recompute will draw the next value from it.\n"
        f"  effect: backward recomputes the region from other values than the forward's output "
        f"was computed from, so its gradients belong to a different computation; plain "
        f"PyTorch does not notice.\n"
        f"  how to fix: draw the value before the checkpointed call and pass it to the region "
        f"as an argument, or keep a sequence the region indexes."
    )
    warn(message, CheckpointGuardWarning, fallback)


def internal_error(region: str, stage: str, error: Exception) -> None:
    """The guard failed on a region (its own bug, or state it cannot read): a warning, since
    the user's training must go on; the region runs unguarded from here. Issued whatever
    failed, warnings included: as a last resort the message is written to stderr."""
    message = (
        f"ckptguard [internal]: could not {stage} checkpointed region {region}: "
        f"{type(error).__name__}: {without_addresses(str(error))}.\n"
        f"  effect: this region runs without the guard from here (torch's checkpoint is not "
        f"affected); other regions stay guarded.\n"
        f"  how to fix: this is a ckptguard bug; please report it with this message (run with "
        f"-W error::ckptguard.CheckpointGuardWarning for the traceback)."
    )
    try:
        warn(message, CheckpointGuardWarning, None)
    except CheckpointGuardWarning:
        raise
    except Exception:  # See NOTE [ The guard never stops training ]
        with contextlib.suppress(Exception):
            print(f"CheckpointGuardWarning: {message}", file=sys.stderr)


def lost_gradients(
    region: str,
    parameters: list[str],
    nested: list[str],
    args: tuple,
    model_fix: str | None,
    raise_: bool,
    fallback: Location | None,
) -> None:
    """A reentrant region whose parameters or nested tensor inputs will get no gradient, with
    its cause (inputs that do not require grad: the layers before it are frozen) and both
    fixes. ``model_fix``: the model's own method to make inputs require grad, where it has one
    (transformers and PEFT models: ``enable_input_require_grads``)."""
    inputs = [
        f"positional argument {i}: tensor {tuple(a.shape)} {a.dtype}"
        for i, a in enumerate(args)
        if isinstance(a, torch.Tensor)
    ]
    parts = []
    if parameters:
        shown = ", ".join(parameters[:8])
        more = f" and {len(parameters) - 8} more" if len(parameters) > 8 else ""
        parts.append(
            f"no input requires grad, so these parameters will get no gradient (None or "
            f"zero): {shown}{more}"
        )
    if nested:
        parts.append(
            "the tensors that require grad are nested inside container arguments, which the "
            f"reentrant variant does not track; they will get no gradient: {', '.join(nested)}"
        )
    frozen = ", ".join(inputs) if inputs else "no positional argument is a tensor"
    fix_input = (
        f"call model.{model_fix}() (this model has it: it makes the input embeddings' "
        f"output require grad)"
        if model_fix
        else "call model.enable_input_require_grads() on a transformers or PEFT model, or "
        "x.requires_grad_() on the region's input"
    )
    message = (
        f"ckptguard [lost_gradients]: checkpoint(use_reentrant=True) region {region}: "
        f"{'; '.join(parts)}.\n"
        f"  cause: the reentrant variant gives a region's parameters gradients only when one "
        f"of its positional tensor inputs requires grad, and none does ({frozen}): what runs "
        f"before the region is frozen, as the embeddings in front of LoRA adapters are, or a "
        f"layer set requires_grad_(False). torch only warns 'None of the inputs have "
        f"requires_grad=True. Gradients will be None'.\n"
        f"  how to fix: use use_reentrant=False{_transformers(' ({})')}, or make the input "
        f"require grad: {fix_input}; and pass tensors as positional arguments."
    )
    if raise_:
        details = {"parameters": parameters, "nested": nested, "inputs": inputs}
        raise LostGradientsError(message, kind="lost_gradients", region=region, details=details)
    warn(message, CheckpointGuardWarning, fallback)


def _transformers(form: str) -> str:
    """How the transformers this process runs turns activation checkpointing on with
    ``use_reentrant=False``, put in ``form``: ``activation_checkpointing_enable`` where it
    has it (5.25 on), with the older name where that is there too; empty where transformers
    is not in use (not imported)."""
    modeling = sys.modules.get("transformers.modeling_utils")
    model = getattr(modeling, "PreTrainedModel", None)
    names = [
        f'model.{method}({keywords}={{"use_reentrant": False}})'
        for method, keywords in (
            ("activation_checkpointing_enable", "activation_checkpointing_kwargs"),
            ("gradient_checkpointing_enable", "gradient_checkpointing_kwargs"),
        )
        if callable(getattr(model, method, None))
    ]
    if not names:
        return ""
    older = f", or by its older name {names[1]}" if len(names) > 1 else ""
    return form.format(f"transformers: {names[0]}{older}")


def _ddp_fix() -> str:
    return (
        "pass use_reentrant=False to these checkpoint calls (one backward pass, gradients "
        f"identical to the unchecked model{_transformers('; {}')}"
        "), or build DDP with static_graph=True if every step runs the same graph"
    )


def _shown(names: list[str], limit: int = 6) -> str:
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def ddp_reused_parameters(
    region: str, others: list[tuple[str, list[str]]], outside: list[str], find_unused: bool
) -> ReentrantDDPError:
    """Parameters of a reentrant region whose gradient another backward pass of the same DDP
    step produces too (another reentrant region, or the model's graph where the module ran
    outside the region): named at the region's forward, before DDP reduces anything."""
    parameters = list(dict.fromkeys([*outside, *(n for _, names in others for n in names)]))
    where = [
        f"{_shown(names)} (also in region {other})"
        if other != region
        else f"{_shown(names)} (the same region, checkpointed again)"
        for other, names in others
    ]
    if outside:
        where.append(f"{_shown(outside)} (the module also ran outside the region before it)")
    if others and not find_unused:
        effect = (
            "DDP reduces a parameter's gradient when the first of these passes produces it and, "
            "once every bucket is ready, finishes the step inside that pass, so the second pass "
            "adds its gradient to each rank's own copy after the average: every rank steps with "
            "a different gradient, none of them the average, and plain PyTorch raises nothing "
            "(DDP raises 'Expected to mark a variable ready only once' only where the second "
            "pass comes before the buckets are complete)"
        )
    else:
        effect = (
            "DDP marks the parameter ready in each pass: it raises 'Expected to mark a variable "
            "ready only once' in backward, or, where one pass has made every bucket ready and "
            "DDP finished the step inside it (as when the module's only use outside comes "
            "before the region), adds the other pass's gradient after the average without a "
            "word, and every rank steps with a different gradient"
        )
    message = (
        f"ckptguard [ddp_reentrant]: checkpointed region {region} (use_reentrant=True) runs "
        f"parameters whose gradients another backward pass of this DistributedDataParallel "
        f"step produces too: {'; '.join(where)}.\n"
        f"  why: a reentrant region computes its parameters' gradients in a backward pass of "
        f"its own, and DDP expects one gradient per parameter and step. {effect[0].upper()}"
        f"{effect[1:]}.\n"
        f"  how to fix: {_ddp_fix()}."
    )
    details = {
        "parameters": parameters,
        "regions": [o for o, _ in others],
        "outside": outside,
        "find_unused_parameters": find_unused,
    }
    return ReentrantDDPError(message, kind="ddp_reentrant", region=region, details=details)


def ddp_marked_twice(
    region: str, parameter: str | None, others: list[str], find_unused: bool, torch_message: str
) -> ReentrantDDPError:
    """DDP's "Expected to mark a variable ready only once", raised in a reentrant region's
    backward pass, explained: which parameter, which region(s), why, and the fix."""
    named = f"parameter {parameter}" if parameter else "a parameter"
    also = f"; it also runs in reentrant region {', '.join(others)} of this step" if others else ""
    if find_unused:
        why = (
            "DDP was built with find_unused_parameters=True, and a reentrant region runs its "
            "forward under no_grad: when the forward ended, DDP did not find the region's "
            "parameters in the autograd graph and marked them ready as unused; the region's own "
            "backward pass then produced their gradients and marked them ready a second time"
        )
        fix = (
            f"{_ddp_fix()}, or drop find_unused_parameters if every parameter is used in every step"
        )
    else:
        why = (
            "a reentrant region computes its parameters' gradients in a backward pass of its "
            "own, and this parameter's gradient was already produced in another backward pass "
            "of this step: another reentrant region that runs it, or the model's own backward "
            "where the module also runs outside the region"
        )
        fix = _ddp_fix()
    message = (
        f"ckptguard [ddp_reentrant]: DistributedDataParallel marked {named} ready twice in the "
        f"backward pass of checkpointed region {region} (use_reentrant=True){also}.\n"
        f"  torch: RuntimeError: Expected to mark a variable ready only once (DDP's whole "
        f"message is this error's __cause__)\n"
        f"  why: {why}.\n"
        f"  how to fix: {fix}."
    )
    details = {
        "parameters": [parameter] if parameter else [],
        "regions": [region, *others],
        "find_unused_parameters": find_unused,
        "torch": torch_message,
    }
    return ReentrantDDPError(message, kind="ddp_reentrant", region=region, details=details)


_POLICY_CAUSES = {
    "packet": (
        "its code compares the op with {what}; torch calls a policy with an OpOverload "
        "(this region ran {detail}), which never equals its packet",
        "compare with the overload (e.g. torch.ops.aten.mm.default), or compare "
        "op.overloadpacket with the packet",
    ),
    "function": (
        "its code compares the op with {what}; torch calls a policy with the aten op "
        "(this region ran {detail}), never with a Python function",
        "compare with the aten overload (e.g. torch.ops.aten.mm.default)",
    ),
    "answer": (
        "it answered {what} for {detail}; torch saves an output only for "
        "CheckpointPolicy.MUST_SAVE or PREFER_SAVE (or True) and reads anything else as "
        "recompute",
        "return CheckpointPolicy.MUST_SAVE (or PREFER_SAVE) for the outputs to keep",
    ),
    "ignored": (
        "its code names {what}, which torch never asks a policy about: selective "
        "checkpointing runs detach and the size, stride and device queries without asking "
        "(torch.utils.checkpoint.SAC_IGNORED_OPS), so their outputs are never saved",
        "name ops whose outputs backward uses (those torch asked about are listed above)",
    ),
    "overload": (
        "its code names {what}, which {detail} in this region",
        "name the overloads this region runs (torch asked about them above: nn.Linear runs "
        "aten.addmm, not aten.mm), and check the answers the policy gives them",
    ),
}


def selective_saved_nothing(
    region: str,
    policy: str,
    calls: dict[Any, int],
    causes: list[tuple[str, str, str]],
    fallback: Location | None,
) -> None:
    """A selective-checkpoint policy that kept no output in a region whose policy code names
    ops (a warning: the gradients are right, the memory/speed trade is not made)."""
    asked = sorted(calls.items(), key=lambda item: -item[1])
    shown = ", ".join(f"{op} x{count}" for op, count in asked[:6])
    more = f" and {len(asked) - 6} more" if len(asked) > 6 else ""
    why = "\n".join(
        f"  why: {_POLICY_CAUSES[kind][0].format(what=what, detail=detail)}"
        for kind, what, detail in causes
    )
    fixes = "; ".join(dict.fromkeys(_POLICY_CAUSES[kind][1] for kind, _, _ in causes))
    message = (
        f"ckptguard [selective_policy]: the selective-checkpoint policy {policy} of "
        f"checkpointed region {region} saved no op's output: torch asked it about "
        f"{sum(calls.values())} ops ({shown}{more}) and it chose recompute for every one, so "
        f"backward recomputes the whole region, as plain checkpointing does.\n"
        f"{why}\n"
        f"  effect: the gradients are right, but the region keeps none of the outputs its "
        f"policy was written to keep (no memory is traded for less recompute).\n"
        f"  how to fix: {fixes}; ckptlint reports such policies before the run (CKP501, "
        f"CKP502)."
    )
    warn(message, CheckpointGuardWarning, fallback)


def selective_decision_changed(
    region: str, policy: str, op: str, index: int, saved_before: bool, now: Any
) -> CheckpointMismatchError:
    """torch <= 2.12 asks the policy again in the recompute: it answered otherwise there."""
    before = "saved" if saved_before else "recomputed"
    after = "save" if not saved_before else "recompute"
    message = (
        f"ckptguard [selective_policy]: the selective-checkpoint policy {policy} of "
        f"checkpointed region {region} decided differently in the recompute: call #{index} "
        f"of {op} was {before} in the forward, and the policy now answers {abbreviate(now, 40)} "
        f"({after}).\n"
        f"  effect: this torch asks the policy again during the recompute and takes a saved "
        f"output wherever it says save: with other answers it takes the output of another call "
        f"of the op (wrong gradients where their shapes agree) or fails with '... not found "
        f"in storage' or 'Trying to backward an extra time'.\n"
        f"  how to fix: decide from the op and its arguments alone, or count the forward and "
        f"the recompute apart (ctx.is_recompute); torch 2.13 and later ask the policy in the "
        f"forward only."
    )
    details = {"op": op, "index": index, "forward": before, "recompute": abbreviate(now, 40)}
    return CheckpointMismatchError(message, kind="selective_policy", region=region, details=details)


def _mutated_text(mutated: list[tuple]) -> str:
    return ", ".join(
        f"{op} call #{index} (version {then} -> {now})" for op, index, then, now in mutated[:4]
    ) + (f" and {len(mutated) - 4} more" if len(mutated) > 4 else "")


MUTATED_TORCH = "Tensor cached during selective activation checkpoint has been mutated"
_CACHE_MUTATED = (
    "an output that selective checkpointing saved in the forward was modified in place "
    "afterwards: {outputs}"
)
_CACHE_FIX = (
    "use the out-of-place op (y = y * 2 rather than y.mul_(2)) on saved outputs, or have the "
    "policy recompute that op instead of saving it"
)


def selective_cache_refused(region: str, mutated: list[tuple]) -> CheckpointMismatchError:
    """torch's bare "Tensor cached ... has been mutated", with the op and call it means."""
    message = (
        f"ckptguard [selective_cache]: checkpointed region {region}: "
        f"{_CACHE_MUTATED.format(outputs=_mutated_text(mutated))}.\n"
        f"  torch: RuntimeError: {MUTATED_TORCH}\n"
        f"  effect: torch refuses the recompute, since it would start from the modified "
        f"value.\n"
        f"  how to fix: {_CACHE_FIX}."
    )
    details = {"outputs": [f"{op} #{index}" for op, index, _, _ in mutated]}
    return CheckpointMismatchError(message, kind="selective_cache", region=region, details=details)


def selective_cache_unmeasured(
    region: str, mutated: list[tuple], fallback: Location | None
) -> None:
    """allow_cache_entry_mutation=True and a saved output modified in place, default mode."""
    message = (
        f"ckptguard [selective_cache]: checkpointed region {region} "
        f"(allow_cache_entry_mutation=True): "
        f"{_CACHE_MUTATED.format(outputs=_mutated_text(mutated))}.\n"
        f"  effect: the recompute takes the modified tensor and runs the region's in-place op "
        f"on it again, so the gradients may be wrong (not where the op gives the same result "
        f"applied twice, as relu_ does); enable(strict=True) measures whether the tensors "
        f"backward uses change.\n"
        f"  how to fix: {_CACHE_FIX}."
    )
    warn(message, CheckpointGuardWarning, fallback)


def selective_cache_measured(
    region: str,
    mutated: list[tuple],
    what: str | None,
    difference: dict[str, Any] | None,
    first_op: dict[str, Any] | None,
    fallback: Location | None,
) -> CheckpointMismatchError | None:
    """Strict mode's verdict on a saved output modified in place (allow_cache_entry_mutation
    =True): an error where the tensors backward uses differ, else a warning that they match."""
    outputs = _CACHE_MUTATED.format(outputs=_mutated_text(mutated))
    if difference is None:
        message = (
            f"ckptguard [selective_cache]: checkpointed region {region} "
            f"(allow_cache_entry_mutation=True): {outputs}.\n"
            f"  measured: the recompute took the modified tensor and ran the in-place op on it "
            f"again, and every tensor backward uses matches the forward's (strict mode): the "
            f"gradients are not affected (the op gives the same result applied twice).\n"
            f"  how to fix: nothing is wrong now; a change to the in-place op can make it wrong "
            f"without a word: {_CACHE_FIX}."
        )
        warn(message, CheckpointGuardWarning, fallback)
        return None
    op_text = ""
    if first_op is not None:
        op_text = (
            f"  first differing op: #{first_op['index']} {first_op['op']} {first_op['frame']}\n"
        )
    message = (
        f"ckptguard [selective_cache]: checkpointed region {region} "
        f"(allow_cache_entry_mutation=True): {outputs}.\n"
        f"  measured: the recompute took the modified tensor and ran the in-place op on it "
        f"again: {what} differs from the forward's ({difference['summary']}).\n"
        f"{op_text}"
        f"  effect: backward uses these recomputed tensors, so the gradients are affected; "
        f"plain PyTorch does not notice.\n"
        f"  how to fix: {_CACHE_FIX}."
    )
    details = {
        "outputs": [f"{op} #{index}" for op, index, _, _ in mutated],
        "what": what,
        **difference,
    }
    return CheckpointMismatchError(message, kind="selective_cache", region=region, details=details)


def report(error: CheckpointGuardError, on_mismatch: str, fallback: Location | None) -> None:
    if on_mismatch == "warn":
        warn(str(error), CheckpointMismatchWarning, fallback)
    else:
        raise error


_OWN_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_STDLIB_DIR = os.path.realpath(sysconfig.get_paths()["stdlib"]) + os.sep
_PACKAGE_DIRS = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)


def _is_user_file(filename: str) -> bool:
    """Not ckptguard's, torch's or the standard library's (installed packages count as the
    user's: transformers' layer is where its region is called)."""
    if filename.startswith("<"):
        return filename in ("<stdin>", "<string>") or filename.startswith("<ipython")
    if filename.startswith((_OWN_DIR, torch_dir())):
        return False
    return not filename.startswith(_STDLIB_DIR) or any(d in filename for d in _PACKAGE_DIRS)


def raised_at_hook(error: BaseException) -> None:
    """Where the hook torch called (or a policy torch asks) catches one of the guard's errors
    to raise it again: the guard's frames below the hook are dropped, so the traceback ends
    with torch's call of the hook, one frame that sets ``__tracebackhide__`` (pytest and
    IPython's debugger leave it out). An error that came through other code (a nested
    region's, raised inside the user's function) keeps its frames."""
    hook = error.__traceback__  # the frame that caught it comes first
    if hook is None:
        return
    below = hook.tb_next
    while below is not None:
        if not below.tb_frame.f_code.co_filename.startswith(_OWN_DIR):
            return
        below = below.tb_next
    hook.tb_next = None


def user_location() -> tuple[Any, Location] | None:
    """(module globals, (file, line)) of the innermost frame outside ckptguard, torch and the
    standard library: the user's backward call during a recompute, the region's checkpoint
    call during a forward."""
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None:
        if _is_user_file(frame.f_code.co_filename):
            return frame.f_globals, (frame.f_code.co_filename, frame.f_lineno)
        frame = frame.f_back
    return None


def warn(message: str, category: type[Warning], fallback: Location | None) -> None:
    """A warning at the user's code (so ``-W`` filters by module and the printed location
    help), or at ``fallback`` (the region's code) when no user frame is on this thread's
    stack (a backward run by an accelerator's worker thread).

    Issued whatever ``__main__`` is: the user's module globals are never handed to
    ``warnings.warn_explicit``, which asks their ``__loader__`` for the source and fails where
    there is none (``python -c``, ``python - < train.py``: the builtin importer raises
    ``ImportError: '__main__' is not a built-in module``). ``linecache`` is given them instead,
    and it gives up quietly. If placing the warning fails all the same, it is issued unplaced.
    A warnings filter that makes it an error raises it, as the user asked.
    See NOTE [ The guard never stops training ]"""
    try:
        _warn_placed(message, category, fallback)
    except category:
        raise
    except Exception as error:
        warnings.warn(
            f"{message}\n  (ckptguard could not place this warning at your code: "
            f"{type(error).__name__}: {error})",
            category,
            stacklevel=2,
        )


def _warn_placed(message: str, category: type[Warning], fallback: Location | None) -> None:
    found = user_location()
    if found is not None:
        module_globals, (filename, lineno) = found
        registry = module_globals.setdefault("__warningregistry__", {})
        module = module_globals.get("__name__", "__main__")
        linecache.lazycache(filename, module_globals)  # the source line, where a loader has it
        warnings.warn_explicit(message, category, filename, lineno, module, registry)
    elif fallback is not None:
        warnings.warn_explicit(message, category, fallback[0], fallback[1])
    else:
        warnings.warn(message, category, stacklevel=3)
