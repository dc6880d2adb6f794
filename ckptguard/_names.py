"""Names users recognise: a module's path in their model (``blocks.7.attn``), a region's name.

The model is found once per region, at its forward, as the outermost module whose ``__call__``
is on the Python stack; only a weak reference to it is kept. Paths are worked out only when a
message or report mode needs them.
"""

from __future__ import annotations

import functools
import sys
import types
import weakref
from typing import Any

import torch

from ckptguard import _compat
from ckptguard._readplan import (
    code_location,
    code_of,
    forward_of,
    function_name,
    is_library_code,
    unwrap_function,
)

_paths: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # module -> (root ref, path)
# id of a region's first module -> (weak reference to it, weak reference to its model)
_roots: dict[int, tuple[weakref.ref, weakref.ref]] = {}


def find_root() -> torch.nn.Module | None:
    """The outermost module being called on this thread's stack, if any."""
    first, second = _compat.resolve().module_call_codes
    frame: types.FrameType | None = sys._getframe(2)
    outer = None
    while frame is not None:
        code = frame.f_code
        if code is first or code is second:
            outer = frame
        frame = frame.f_back
    if outer is None:
        return None
    root = outer.f_locals.get("self")
    return root if isinstance(root, torch.nn.Module) else None


def root_ref(module: torch.nn.Module) -> weakref.ref | None:
    """A weak reference to the model a region's first module runs in: found once per module
    by walking the stack (the region's forward is still inside the model's call), then kept
    while both live."""
    ident = id(module)
    entry = _roots.get(ident)
    if entry is not None and entry[0]() is module and entry[1]() is not None:
        return entry[1]
    root = find_root()
    if root is None:  # not cached: the next call may run in a model
        return None
    ref = weakref.ref(root)
    _roots[ident] = (weakref.ref(module, lambda _: _roots.pop(ident, None)), ref)
    return ref


def module_path(root: torch.nn.Module | None, module: torch.nn.Module) -> str | None:
    """Dotted path of ``module`` inside ``root`` ("" for the root itself), None if not inside."""
    if root is None:
        return None
    if module is root:
        return ""
    cached = _paths.get(module)
    if cached is not None and cached[0]() is root:
        return cached[1]
    found = None
    root_ref = weakref.ref(root)
    for name, sub in root.named_modules(remove_duplicate=False):
        if sub not in _paths or _paths[sub][0]() is not root:
            _paths[sub] = (root_ref, name)
        if sub is module and found is None:
            found = name
    return found


def class_name(module: torch.nn.Module) -> str:
    """A module's class name; a TorchScript module's is that of the module it compiled (its
    own class is torch's wrapper, ``RecursiveScriptModule``)."""
    if isinstance(module, torch.jit.ScriptModule):
        return getattr(module, "original_name", None) or type(module).__name__
    return type(module).__name__


def _region_target(fn: Any) -> Any:
    """The module, or else the innermost function, that a region's callable runs."""
    target = fn
    while isinstance(target, functools.partial):
        target = target.func
    if isinstance(target, types.MethodType):
        owner = target.__self__
        if isinstance(owner, torch.nn.Module) and target.__func__.__name__ in (
            "__call__",
            "_wrapped_call_impl",
            "_call_impl",
        ):
            return owner
        target = target.__func__
    if isinstance(target, torch.nn.Module):
        return target
    return unwrap_function(target) or target


def _describe(target: Any, code: Any = None) -> str:
    """Qualified name and file:line of what a region runs (see ``_region_target``); ``code``
    is the code it ran at its forward (a later patch must not rename the region)."""
    if isinstance(target, torch.jit.ScriptModule):
        return f"{class_name(target)}.forward, TorchScript"
    if isinstance(target, torch.nn.Module):
        if code is None:
            code = code_of(forward_of(target))
        return f"{type(target).__qualname__}.forward, {code_location(code)}"
    if code is None:
        code = code_of(target)
    return f"{function_name(target)}, {code_location(code)}"


def function_label(fn: Any) -> str:
    """What a region runs, named for a warning about a region the guard failed to read:
    ``region_name`` without the model, else the callable's class (naming must not fail too)."""
    try:
        return _describe(_region_target(fn)).replace(", ", " (", 1) + ")"
    except Exception:
        return type(fn).__qualname__


def region_name(fn: Any, root: torch.nn.Module | None, modules: list, code: Any = None) -> str:
    """``blocks.7 (Block.forward, file:line)``; a segment running several blocks names them.
    ``code``: the code the region ran at its forward, as the user wrote it."""
    target = _region_target(fn)
    function = _describe(target, code)
    plain = function.replace(", ", " (", 1) + ")"
    if not modules:
        return plain
    # outside a model, a module's class names a region only when the function is library
    # code (checkpoint_sequential's closure); the user's own function names it better
    code = code_of(target)
    by_class = code is None or is_library_code(code)
    top: list[str] = []
    for module in modules:
        path = module_path(root, module)
        if path is None:
            if not top and by_class:
                top.append(class_name(module))
            continue
        if path == "":
            top = [class_name(module)]
            break
        if not any(path.startswith(t + ".") or path == t for t in top):
            top.append(path)
    if not top:
        return plain
    shown = top[0] if len(top) == 1 else f"{top[0]}..{top[-1]} ({len(top)} modules)"
    if shown == class_name(modules[0]) and function.startswith(shown + "."):
        return plain
    return f"{shown} ({function})"
