"""Plans: what a region can read, worked out once per code object, function and module.

Bytecode tells global loads (``LOAD_GLOBAL``) from attribute loads (``LOAD_ATTR``), so a plan
knows that ``self.output`` is an attribute and ``output`` a global, and which attribute chains a
function reads from its arguments (``self.config.scale``), its closure and its globals
(``cfg.SCALE``). Plans follow what the code calls: global functions in any module (not torch's
or the standard library's), methods on ``self`` and ``super()``, functions held in closures.

A plan holds no strong reference to a module or a user function (weak references, or the
object passed in at read time), so caching it never keeps a model alive; a module's plan is
rebuilt when the module's shape changes (an attribute, parameter, buffer or child added or
removed, ``forward`` replaced).
"""

from __future__ import annotations

import builtins
import dis
import functools
import inspect
import os
import sys
import sysconfig
import types
import weakref
from dataclasses import dataclass
from typing import Any

import torch

from ckptguard._compat import MODULE_HOOK_DICTS, torch_dir
from ckptguard._fingerprint import (
    MISSING,
    SCALAR_TYPES,
    SKIPPED,
    loose_tensor_fp,
    tensor_fp,
    value_fp,
)

MAX_CHAIN = 3  # attributes followed after a root name: self.config.scale.x stops at 3
MAX_FUNCTIONS = 64  # functions one plan follows, transitively
_FAST_LOADS = frozenset({"LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_BORROW"})
_PAIR_LOADS = frozenset({"LOAD_FAST_LOAD_FAST", "LOAD_FAST_BORROW_LOAD_FAST_BORROW"})
_ATTR_LOADS = frozenset({"LOAD_ATTR", "LOAD_METHOD"})
_SUPER_SKIPPED = frozenset({"PRECALL", "CALL", "PUSH_NULL", "LOAD_DEREF", "LOAD_FAST", "CACHE"})
_BUILTINS = frozenset(dir(builtins))
_DYNAMIC_ACCESS = frozenset({"getattr", "vars", "setattr", "hasattr"})
_OWN_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_STDLIB_DIRS = tuple(
    {
        os.path.realpath(sysconfig.get_paths()[key]) + os.sep
        for key in ("stdlib", "platstdlib")
        if sysconfig.get_paths().get(key)
    }
)
_LIBRARY_ROOTS = frozenset(getattr(sys, "stdlib_module_names", ())) | {"torch", "ckptguard"}
_MODULE_INTERNALS = frozenset(torch.nn.Module().__dict__)


def is_library_code(code: types.CodeType) -> bool:
    """torch's, the standard library's or ckptguard's own code: not followed for globals."""
    filename = code.co_filename
    return filename.startswith((torch_dir(), _OWN_DIR)) or os.path.realpath(filename).startswith(
        _STDLIB_DIRS
    )


def unwrap_function(func: Any) -> types.FunctionType | None:
    """The Python function under any ``functools.wraps`` decorators, or None if there is none."""
    try:
        func = inspect.unwrap(func)
    except ValueError:  # a __wrapped__ cycle
        pass
    return func if isinstance(func, types.FunctionType) else None


def function_name(func: Any) -> str:
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)


def code_location(code: Any) -> str:
    if not isinstance(code, types.CodeType):
        return "<no Python code>"
    return f"{code.co_filename}:{code.co_firstlineno}"


# ------------------------------------------------------------------------------ bytecode


@dataclass(frozen=True)
class CodeReads:
    """What one code object (with its nested lambdas and comprehensions) loads, by kind."""

    global_chains: frozenset  # (name, attr, ...) read through LOAD_GLOBAL
    arg_chains: frozenset  # (argument name, (attr, ...)) with at least one attribute
    free_chains: frozenset  # (free variable name, (attr, ...)), attributes possibly empty
    super_names: frozenset  # names read through super()
    stored: frozenset  # attribute names assigned or deleted (outputs, not inputs)
    dynamic_args: frozenset  # arguments whose attributes are read by computed names


def _argument_names(code: types.CodeType) -> tuple[str, ...]:
    count = code.co_argcount + code.co_kwonlyargcount
    count += bool(code.co_flags & inspect.CO_VARARGS) + bool(code.co_flags & inspect.CO_VARKEYWORDS)
    return code.co_varnames[:count]


def _scan(
    code: types.CodeType, arguments: frozenset, free: frozenset, found: dict[str, set]
) -> None:
    instructions = list(dis.get_instructions(code))
    root: tuple | None = None
    attrs: list[str] = []
    pending_super = False

    def flush() -> None:
        if root is None:
            return
        kind, name = root
        if kind == "global":
            found["global"].add((name, *attrs))
        elif kind == "arg":
            if "__dict__" in attrs:
                found["dynamic"].add(name)
            elif attrs:
                found["arg"].add((name, tuple(attrs)))
        else:
            found["free"].add((name, tuple(attrs)))

    def classify(ins: dis.Instruction) -> tuple | None:
        op = ins.opname
        name = ins.argval
        if op in _PAIR_LOADS:
            name = name[1] if isinstance(name, tuple) else None
            op = "LOAD_FAST"
        if op in ("LOAD_GLOBAL", "LOAD_NAME"):
            return ("global", name)
        if op in _FAST_LOADS or op == "LOAD_DEREF":
            if name in arguments:
                return ("arg", name)
            if op == "LOAD_DEREF" and name in free:
                return ("free", name)
        return None

    for index, ins in enumerate(instructions):
        op = ins.opname
        if pending_super:
            if op in _ATTR_LOADS:
                found["super"].add(ins.argval)
                pending_super = False
                continue
            if op in _SUPER_SKIPPED:
                continue
            pending_super = False
        if op in _ATTR_LOADS and root is not None:
            if len(attrs) < MAX_CHAIN:
                attrs.append(ins.argval)
            continue
        flush()
        root, attrs = None, []
        if op == "LOAD_SUPER_ATTR":
            found["super"].add(ins.argval)
            continue
        if op in ("STORE_ATTR", "DELETE_ATTR"):
            found["stored"].add(ins.argval)
            continue
        root = classify(ins)
        if root is None or root[0] != "global":
            continue
        if root[1] == "super":
            pending_super, root = True, None
        elif root[1] in _DYNAMIC_ACCESS:
            target = classify(instructions[index + 1]) if index + 1 < len(instructions) else None
            following = instructions[index + 2] if index + 2 < len(instructions) else None
            if target is not None and target[0] != "global":
                is_constant = following is not None and following.opname == "LOAD_CONST"
                if root[1] == "getattr" and is_constant and isinstance(following.argval, str):
                    extra = (target[1], (following.argval,))
                    found["arg" if target[0] == "arg" else "free"].add(extra)
                elif target[0] == "arg" and root[1] != "hasattr":
                    found["dynamic"].add(target[1])
            root = None
    flush()
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _scan(const, arguments, free, found)


_code_reads: dict[types.CodeType, CodeReads] = {}


def code_reads(code: types.CodeType) -> CodeReads:
    """Cached per code object (code objects are immutable, so the cache never goes stale)."""
    reads = _code_reads.get(code)
    if reads is None:
        found: dict[str, set] = {k: set() for k in ("global", "arg", "free", "super", "stored")}
        found["dynamic"] = set()
        _scan(code, frozenset(_argument_names(code)), frozenset(code.co_freevars), found)
        reads = _code_reads[code] = CodeReads(
            frozenset(found["global"]),
            frozenset(found["arg"]),
            frozenset(found["free"]),
            frozenset(found["super"]),
            frozenset(found["stored"]),
            frozenset(found["dynamic"]),
        )
    return reads


# -------------------------------------------------------------------- static attribute reads


def static_attribute(obj: Any, name: str) -> Any:
    """``getattr`` without running code: instance dict, module registries, then class dicts.

    Properties and other descriptors are not evaluated (``SKIPPED``): reading them may run
    arbitrary code with side effects."""
    state = getattr(obj, "__dict__", None)
    if type(state) is dict and name in state:
        return state[name]
    if isinstance(obj, torch.nn.Module):
        for registry in ("_parameters", "_buffers", "_modules"):
            table = state.get(registry) if state else None
            if table is not None and name in table:
                return table[name]
    for klass in type(obj).__mro__:
        if name in klass.__dict__:
            value = klass.__dict__[name]
            if isinstance(value, (types.FunctionType, staticmethod, classmethod)):
                return value
            if hasattr(type(value), "__get__"):
                return SKIPPED
            return value
    if isinstance(obj, types.ModuleType):
        return MISSING
    return MISSING


def read_chain(value: Any, attrs: tuple) -> Any:
    for name in attrs:
        if value is MISSING or value is SKIPPED:
            return value
        if isinstance(value, torch.Tensor):  # tensor metadata is in the tensor's fingerprint
            return value
        value = static_attribute(value, name)
    return value


def _is_library_module(value: types.ModuleType) -> bool:
    return value.__name__.partition(".")[0] in _LIBRARY_ROOTS


def _follow_target(value: Any) -> types.FunctionType | None:
    """The user function a value leads to (functions, methods, partials), if any."""
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    if isinstance(value, types.MethodType):
        value = value.__func__
    if isinstance(value, functools.partial):
        value = value.func
    func = unwrap_function(value) if callable(value) else None
    if func is None or is_library_code(func.__code__):
        return None
    return func


# ------------------------------------------------------------------------- function plans


class FunctionPlan:
    """The globals, closures and defaults of a function and of every user function it calls.

    ``read(func)`` returns a flat list of fingerprints; ``labels(func)`` explains each position.
    Followed callees are kept as weak references; ``stale`` tells when a followed name now
    holds another function, so the plan is rebuilt at the next forward.
    """

    __slots__ = ("entries", "expected", "__weakref__")

    def __init__(self, root: types.FunctionType):
        entries = []  # (weakref to function or None for the root, global chains, free names)
        expected = []  # (position in the read list, fingerprint of a followed function)
        pending: list[tuple[types.FunctionType, bool]] = [(root, True)]
        seen: set[int] = set()
        position = 0
        while pending and len(entries) < MAX_FUNCTIONS:
            func, is_root = pending.pop()
            if id(func) in seen:
                continue
            seen.add(id(func))
            code = func.__code__
            reads = code_reads(code) if not is_library_code(code) else None
            namespace = func.__globals__
            chains = []
            position += 1  # the code object comes first
            if reads is not None:
                for chain in sorted(reads.global_chains):
                    name = chain[0]
                    if name not in namespace and name in _BUILTINS:
                        continue
                    value = namespace.get(name, MISSING)
                    if isinstance(value, types.ModuleType):
                        if len(chain) == 1 or _is_library_module(value):
                            continue
                    elif len(chain) > 1 and isinstance(value, type):
                        chain = chain[:2]  # a class attribute; deeper is the class's business
                    chains.append(chain)
                    target = read_chain(value, chain[1:])
                    callee = _follow_target(target)
                    if callee is not None:
                        expected.append((position + len(chains) - 1, value_fp(target)))
                        pending.append((callee, False))
            position += len(chains)
            free = code.co_freevars if func.__closure__ else ()
            for cell in func.__closure__ or ():
                try:
                    callee = _follow_target(cell.cell_contents)
                except ValueError:  # an empty cell
                    continue
                if callee is not None:
                    pending.append((callee, False))
            position += len(free) + 2  # cells, then __defaults__ and __kwdefaults__
            ref = None if is_root else weakref.ref(func)
            entries.append((ref, tuple(chains), free))
        self.entries = tuple(entries)
        self.expected = tuple(expected)

    def read(self, root: types.FunctionType) -> list:
        out: list = []
        add = out.append
        for ref, chains, free in self.entries:
            func = root if ref is None else ref()
            if func is None:
                out.extend([MISSING] * (len(chains) + len(free) + 3))
                continue
            namespace = func.__globals__
            add(func.__code__)
            for chain in chains:
                value = namespace.get(chain[0], MISSING)
                if len(chain) > 1:
                    value = read_chain(value, chain[1:])
                add(value_fp(value))
            for cell in func.__closure__ or ():
                try:
                    add(value_fp(cell.cell_contents))
                except ValueError:
                    add(MISSING)
            add(value_fp(func.__defaults__))
            add(value_fp(func.__kwdefaults__))
        return out

    def stale(self, values: list) -> bool:
        return any(values[index] != fp for index, fp in self.expected)

    def labels(self, root: types.FunctionType) -> list[tuple[str, str, str]]:
        """(kind, name, where) for each position of ``read``."""
        out = []
        for ref, chains, free in self.entries:
            func = root if ref is None else ref()
            name = function_name(func) if func is not None else "<collected function>"
            module = getattr(func, "__module__", "?")
            out.append(
                ("function", f"{name}.__code__", code_location(getattr(func, "__code__", None)))
            )
            for chain in chains:
                out.append(("global", ".".join(chain), f"global of {module}, read by {name}"))
            out.extend(("closure", var, f"closure of {name}") for var in free)
            out.append(("closure", f"{name}.__defaults__", "default arguments"))
            out.append(("closure", f"{name}.__kwdefaults__", "default arguments"))
        return out


_function_plans: dict[tuple[types.CodeType, int], FunctionPlan] = {}


def function_plan(func: types.FunctionType) -> FunctionPlan:
    """Cached per (code object, globals namespace)."""
    key = (func.__code__, id(func.__globals__))
    plan = _function_plans.get(key)
    if plan is None:
        plan = _function_plans[key] = FunctionPlan(func)
    return plan


def rebuild_function_plan(func: types.FunctionType) -> FunctionPlan:
    plan = _function_plans[(func.__code__, id(func.__globals__))] = FunctionPlan(func)
    return plan


# ---------------------------------------------------------------------------- module plans


def forward_of(module: torch.nn.Module) -> Any:
    return module.__dict__.get("forward") or type(module).forward


@dataclass(frozen=True)
class ClassReads:
    """What a module class's forward and the methods it calls on ``self`` read from ``self``,
    assign on ``self``, and which functions they reach (for their globals)."""

    self_chains: frozenset  # attribute tuples read from self
    stored: frozenset
    dynamic: bool  # attributes read by computed names: fingerprint every plain attribute
    functions: tuple  # weak references to the user functions reached (their globals count)
    code: Any  # the forward's code when this was worked out


# keyed weakly by class, then by id of the forward; values hold no strong reference to either
_class_reads: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _method_on(cls: type, name: str, after: type | None = None) -> list[types.FunctionType]:
    mro = cls.__mro__
    if after is not None and after in mro:
        mro = mro[mro.index(after) + 1 :]
    for klass in mro:
        if name in klass.__dict__:
            target = klass.__dict__[name]
            if isinstance(target, (staticmethod, classmethod)):
                target = target.__func__
            elif isinstance(target, property):  # not evaluated, but what it reads is
                target = target.fget
            func = unwrap_function(target)
            return [func] if func is not None else []
    return []


def class_reads(cls: type, forward: Any) -> ClassReads:
    per_class = _class_reads.get(cls)
    if per_class is None:
        per_class = _class_reads[cls] = {}
    code = getattr(forward, "__code__", None)
    cached = per_class.get(id(forward))
    if cached is not None and cached.code is code:
        return cached
    chains: set = set()
    stored: set = set()
    dynamic = False
    functions: list = []
    start = [f for f in (unwrap_function(forward), _follow_target(forward)) if f is not None]
    pending = list(dict.fromkeys(start))
    seen: set[int] = set()
    while pending and len(seen) < MAX_FUNCTIONS:
        func = pending.pop()
        if id(func) in seen:
            continue
        seen.add(id(func))
        if not is_library_code(func.__code__):
            functions.append(func)
        reads = code_reads(func.__code__)
        names = _argument_names(func.__code__)
        if not names:
            continue
        self_name = names[0]
        stored |= reads.stored
        dynamic = dynamic or self_name in reads.dynamic_args
        for name, attrs in reads.arg_chains:
            if name != self_name:
                continue
            chains.add(attrs)
            pending.extend(_method_on(cls, attrs[0]))
        owner = func.__qualname__.rpartition(".")[0]
        defining = next((k for k in cls.__mro__ if k.__qualname__ == owner), None)
        for name in reads.super_names:
            pending.extend(_method_on(cls, name, after=defining))
    result = per_class[id(forward)] = ClassReads(
        frozenset(c for c in chains if c[0] not in _MODULE_INTERNALS),
        frozenset(stored),
        dynamic,
        tuple(weakref.ref(f) for f in functions),
        code,
    )
    return result


def _is_plain_attribute(value: Any) -> bool:
    if type(value) in SCALAR_TYPES or isinstance(value, torch.Tensor):
        return True
    return type(value) in (tuple, list, dict) and len(value) <= 16


class ModulePlan:
    """Per module: where each attribute its code reads lives, and the module's shape.

    ``read(module, written)`` returns the flat fingerprint of the module's own state:
    training flag, forward, hooks, parameters, buffers (minus those the region itself writes),
    and every attribute chain its code reads; children are modules of their own plans.
    """

    __slots__ = (
        "shape",
        "forward",
        "code",
        "reads",
        "params",
        "buffers",
        "chains",
        "loose",
        "__weakref__",
    )

    def __init__(self, module: torch.nn.Module, loose: bool):
        state = module.__dict__
        forward = forward_of(module)
        self.shape = module_shape(module)
        self.forward = id(forward)  # an id: a forward closing over its module must not pin it
        self.code = getattr(forward, "__code__", None)
        self.reads = class_reads(type(module), forward)
        self.params = tuple(state["_parameters"])
        self.buffers = tuple(state["_buffers"])
        self.loose = loose
        chains = set(self.reads.self_chains)
        if self.reads.dynamic:
            chains.update(
                (key,)
                for key, value in state.items()
                if key not in _MODULE_INTERNALS and _is_plain_attribute(value)
            )
        stored = self.reads.stored
        registered = set(self.params) | set(self.buffers)
        self.chains = tuple(
            sorted(c for c in chains if c[0] not in stored and c[0] not in registered)
        )

    def valid_for(self, module: torch.nn.Module) -> bool:
        forward = forward_of(module)
        return (
            self.shape == module_shape(module)
            and self.forward == id(forward)
            and self.code is getattr(forward, "__code__", None)
        )

    def read(self, module: torch.nn.Module, written: frozenset) -> list:
        state = module.__dict__
        forward = state.get("forward") or type(module).forward
        out = [state["training"], id(forward), getattr(forward, "__code__", None)]
        for name in MODULE_HOOK_DICTS:
            hooks = state[name]
            out.append(tuple(hooks) if hooks else ())
        params = state["_parameters"]
        fingerprint = loose_tensor_fp if self.loose else tensor_fp
        out.extend([fingerprint(params.get(name)) for name in self.params])
        buffers = state["_buffers"]
        if written:
            out.extend([tensor_fp(buffers.get(n)) for n in self.buffers if n not in written])
        else:
            out.extend([tensor_fp(buffers.get(n)) for n in self.buffers])
        for chain in self.chains:
            value = static_attribute(module, chain[0])
            if len(chain) > 1:
                value = read_chain(value, chain[1:])
            out.append(value_fp(value))
        return out

    def labels(self, written: frozenset) -> list[tuple[str, str]]:
        """(kind, attribute path below the module) for each position of ``read``."""
        out = [("training", "training"), ("function", "forward"), ("function", "forward.__code__")]
        out.extend(("hook", name) for name in MODULE_HOOK_DICTS)
        out.extend(("tensor", name) for name in self.params)
        out.extend(("tensor", name) for name in self.buffers if name not in written)
        out.extend(("attribute", ".".join(chain)) for chain in self.chains)
        return out


def module_shape(module: torch.nn.Module) -> tuple[int, int, int, int]:
    state = module.__dict__
    return (
        len(state),
        len(state["_parameters"]),
        len(state["_buffers"]),
        len(state["_modules"]),
    )


_module_plans: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def module_plan(module: torch.nn.Module, loose: bool) -> ModulePlan:
    """Cached per module, keyed weakly; the plan holds no reference to its module."""
    plan = _module_plans.get(module)
    if plan is None or plan.loose != loose or not plan.valid_for(module):
        plan = _module_plans[module] = ModulePlan(module, loose)
    return plan


def cache_sizes() -> dict[str, int]:
    """Sizes of the plan caches: bounded by the distinct code objects and the live modules."""
    return {
        "code_reads": len(_code_reads),
        "function_plans": len(_function_plans),
        "class_reads": sum(len(v) for v in _class_reads.values()),
        "module_plans": len(_module_plans),
    }
