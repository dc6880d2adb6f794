"""Plans: what a region can read, worked out once per code object, function and module.

Bytecode tells global loads (``LOAD_GLOBAL``) from attribute loads (``LOAD_ATTR``), so a plan
knows that ``self.output`` is an attribute and ``output`` a global, and which attribute chains a
function reads from its arguments (``self.config.scale``), its closure and its globals
(``cfg.SCALE``). Plans follow what the code calls: global functions in any module (not torch's
or the standard library's), methods on ``self`` and ``super()``, functions held in closures.

A plan holds no strong reference to a module or a user function
(See NOTE [ Never keeps a user's object alive ]); a module's plan is rebuilt when the module's
shape changes (an attribute, parameter, buffer or child added or removed, ``forward``
replaced; See NOTE [ Stale plans ]).
"""

from __future__ import annotations

import builtins
import collections.abc
import dis
import functools
import inspect
import os
import sys
import sysconfig
import threading
import types
import weakref
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from ckptguard._compat import NORMS_WITH_STATISTICS, compiled_by_dynamo, torch_dir
from ckptguard._fingerprint import (
    MISSING,
    SCALAR_TYPES,
    SKIPPED,
    instance_dict,
    of_type,
    value_fp,
)

MAX_CHAIN = 8  # attributes followed after a root name (self.config.a.b.scale: 4)
MAX_FUNCTIONS = 64  # functions one plan follows, transitively
_FAST_LOADS = frozenset({"LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_BORROW"})
_PAIR_LOADS = frozenset({"LOAD_FAST_LOAD_FAST", "LOAD_FAST_BORROW_LOAD_FAST_BORROW"})
_ATTR_LOADS = frozenset({"LOAD_ATTR", "LOAD_METHOD"})
_SUPER_SKIPPED = frozenset({"PRECALL", "CALL", "PUSH_NULL", "LOAD_DEREF", "LOAD_FAST", "CACHE"})
_BUILTINS = frozenset(dir(builtins))
_DYNAMIC_ACCESS = frozenset({"getattr", "vars", "setattr", "hasattr"})
_OWN_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
# the standard library's own folder; in a virtual environment "platstdlib" is the venv, whose
# site-packages hold user-level libraries (transformers, timm) that must be followed
_STDLIB_DIR = os.path.realpath(sysconfig.get_paths()["stdlib"]) + os.sep
_PACKAGE_DIRS = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)
_LIBRARY_ROOTS = frozenset(getattr(sys, "stdlib_module_names", ())) | {"torch", "ckptguard"}
_MODULE_INTERNALS = frozenset(torch.nn.Module().__dict__)
_UNCALLABLE = torch.nn.Module.forward  # what a container's forward is: it raises


# NOTE [ Never keeps a user's object alive ]
# The guard's caches outlive regions, so they hold no strong reference to a user's module,
# function or class: plans and readers hold weak references (or ids checked against one, or
# the object passed in at read time); tables keyed by an object's id keep a weak reference to
# it whose callback drops the entry (``_class_reads``, ``_reader._readers``), so an entry dies
# with its model and a reused id never finds another object's entry; caches keyed by code
# objects (which cannot be weakly referenced) are bounded (``BoundedCache``). A region's
# fingerprint does hold the modules and functions it read, as torch's autograd graph holds
# the region itself: they live as long as that graph.

# NOTE [ Stale plans ]
# A plan describes objects as they were when it was made: which attributes a module's code
# reads and where they live, which globals a function's code reads and which callees it
# leads to. What makes a plan wrong is read with the values, as the read's *shape*: a module's
# forward, its code and sizes and children, each function's code (the code its entry was made
# from: a caller's cached plan keeps its callees' entries), the objects followed into callees.
# ``_verify.capture`` compares the shape after the forward and, where it differs, rebuilds
# the plans and the reader from the objects as they are; a difference at a recompute is a
# change between forward and backward, named by ``compare``.

PLAN_CACHE_ENTRIES = 4096  # per cache keyed by code object or file name


class BoundedCache(dict):
    """A dict that forgets its oldest entry past ``PLAN_CACHE_ENTRIES``: code objects cannot
    be weakly referenced, and generated code (torch.fx's ``<eval_with_key>``, ``exec``) makes
    new ones for every model, so caches keyed by them must not grow with the run."""

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)
        while len(self) > PLAN_CACHE_ENTRIES:
            del self[next(iter(self))]


_library_files: dict[str, bool] = BoundedCache()


def is_library_code(code: types.CodeType) -> bool:
    """torch's, the standard library's or ckptguard's own code: not followed for globals."""
    filename = code.co_filename
    known = _library_files.get(filename)
    if known is None:
        real = os.path.realpath(filename)
        in_stdlib = real.startswith(_STDLIB_DIR) and not any(d in real for d in _PACKAGE_DIRS)
        known = _library_files[filename] = in_stdlib or filename.startswith((torch_dir(), _OWN_DIR))
    return known


def unwrap_function(func: Any) -> types.FunctionType | None:
    """The Python function under any ``functools.wraps`` decorators, or None if there is none.
    Follows ``__wrapped__`` where the wrapper's own dict holds it (as ``functools.wraps`` puts
    it), never through ``getattr``: a user's ``__getattr__`` is not run (and may raise
    anything)."""
    seen = 0
    while True:
        state = func.__dict__ if type(func) is types.FunctionType else instance_dict(func)
        wrapped = state.get("__wrapped__", MISSING) if state else MISSING
        if wrapped is MISSING:
            return func if of_type(func, types.FunctionType) else None
        seen += 1
        if seen > _MAX_WRAPPERS:  # a __wrapped__ cycle
            return None
        func = wrapped


_MAX_WRAPPERS = 100  # decorators followed down to a function; more is a cycle


def function_name(func: Any) -> str:
    """A function's qualified name; any other callable's type name (its attributes are not
    read: a ``__getattr__`` may raise anything)."""
    if of_type(func, (types.FunctionType, types.BuiltinFunctionType, types.MethodType)):
        return func.__qualname__
    return type(func).__qualname__


def code_of(value: Any) -> types.CodeType | None:
    """The code a function, a method or a decorated function runs, else None (without
    ``getattr``: a user's ``__getattr__`` may raise anything)."""
    if of_type(value, types.MethodType):
        value = value.__func__
    function = unwrap_function(value)
    return function.__code__ if function is not None else None


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
    self_stored: frozenset  # those assigned on the first argument (a method's ``self``)
    dynamic_args: frozenset  # arguments whose attributes are read by computed names
    parameter_chains: tuple  # sorted (named parameter, its position or None, (attr, ...))
    mutated: frozenset  # global and free names whose contents the code changes in place
    rebinds: frozenset  # global and free names the code assigns or deletes
    attributes: frozenset  # every attribute name the code loads (tensor methods among them)
    keyed: frozenset  # (global chain, constant key) read as ``chain["KEY"]`` or ``chain("KEY")``
    advanced: frozenset  # (root kind, name, attrs) passed to next() or iterated


def _argument_names(code: types.CodeType) -> tuple[str, ...]:
    count = code.co_argcount + code.co_kwonlyargcount
    count += bool(code.co_flags & inspect.CO_VARARGS) + bool(code.co_flags & inspect.CO_VARKEYWORDS)
    return code.co_varnames[:count]


# methods that change a container in place: ``calls.append(1)`` mutates ``calls``
_MUTATORS = frozenset(
    {
        "append",
        "extend",
        "insert",
        "pop",
        "popitem",
        "remove",
        "clear",
        "update",
        "setdefault",
        "add",
        "discard",
        "sort",
        "reverse",
        "__setitem__",
        "__delitem__",
        "__iadd__",
    }
)
_SUBSCRIPT_WRITES = frozenset({"STORE_SUBSCR", "DELETE_SUBSCR", "STORE_SLICE"})
_REBINDS = frozenset({"STORE_GLOBAL", "DELETE_GLOBAL", "STORE_DEREF", "DELETE_DEREF"})
_SIMPLE_LOADS = _FAST_LOADS | {"LOAD_CONST", "LOAD_DEREF", "LOAD_GLOBAL", "LOAD_NAME"}


def _subscript_container(instructions: list, index: int) -> Any:
    """The instruction loading the container (or the root of the attribute chain reaching
    it: ``CFG.table[k] = v``) that the subscript write at ``index`` writes into, where its key
    is one load, in a plain (``c[k] = v``, ``del c[k]``) or augmented (``c[k] += v``) write;
    None for any other form."""
    at = index - 1
    if instructions[at].opname == "SWAP":  # c k COPY COPY BINARY_SUBSCR v BINARY_OP SWAP SWAP
        while at > 0 and instructions[at].opname != "BINARY_SUBSCR":
            at -= 1
        if at < 3 or instructions[at - 1].opname != "COPY" or instructions[at - 2].opname != "COPY":
            return None
        at -= 3
    if at < 1 or instructions[at].opname not in _SIMPLE_LOADS:
        return None
    at -= 1
    while at > 0 and instructions[at].opname in _ATTR_LOADS:
        at -= 1
    found = instructions[at]
    return found if found.opname in _SIMPLE_LOADS or found.opname in _PAIR_LOADS else None


def _stores_on(instructions: list, index: int) -> str | None:
    """The local whose attribute the ``STORE_ATTR`` at ``index`` writes, where the object is
    one load: ``self.x = v`` (the load right before it) and ``self.x += v`` (loaded, copied,
    its attribute read: ``LOAD_FAST self, COPY 1, LOAD_ATTR x, ..., SWAP 2, STORE_ATTR x``)."""
    before = instructions[index - 1] if index else None
    if before is None:
        return None
    if before.opname in _OBJECT_LOADS:
        return before.argval
    if before.opname == "SWAP":
        at = index - 2
        while at > 1 and instructions[at].opname != "COPY":
            at -= 1
        loaded = instructions[at - 1]
        if at > 0 and instructions[at].opname == "COPY" and loaded.opname in _OBJECT_LOADS:
            return loaded.argval
    return None


_OBJECT_LOADS = _FAST_LOADS | {"LOAD_DEREF"}  # ``self`` in a closure is a cell


def _scan(
    code: types.CodeType,
    arguments: frozenset,
    free: frozenset,
    found: dict[str, set],
    first: str | None,
) -> None:
    """``first``: the outermost code's first argument (a method's ``self``, also where a
    nested function or comprehension uses it)."""
    instructions = list(dis.get_instructions(code))
    root: tuple | None = None
    attrs: list[str] = []
    pending_super = False
    line_roots: dict[int | None, set[str]] = {}  # global and free names loaded per line
    after_next = False  # the chain flushed next is next()'s argument

    def flush(trigger: dis.Instruction | None) -> None:
        nonlocal after_next
        if root is None:
            return
        kind, name = root
        if kind == "global" and name == "next" and not attrs:
            after_next = True
            return
        if attrs[1:2] and attrs[0] == "__class__" and attrs[1].startswith("__"):
            del attrs[1:]  # type(self).__name__: the class itself, not its dunders
        if after_next or (trigger is not None and trigger.opname == "GET_ITER"):
            found["advanced"].add((kind, name, tuple(attrs)))
        after_next = False
        if kind != "arg" and attrs and attrs[-1] in _MUTATORS:
            found["mutated"].add(name)
        if kind == "global" and trigger is not None and trigger.opname == "LOAD_CONST":
            if isinstance(trigger.argval, str):  # os.environ["KEY"], os.getenv("KEY")
                found["keyed"].add(((name, *attrs), trigger.argval))
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

    line: int | None = None
    skip_to = -1  # the loads of ``type(x)``, read as ``x.__class__``
    for index, ins in enumerate(instructions):
        if index <= skip_to:
            continue
        op = ins.opname
        positions = getattr(ins, "positions", None)  # Python 3.11+
        if positions is not None:
            line = positions.lineno
        elif ins.starts_line is not None:  # 3.10: set on the first instruction of a line
            line = ins.starts_line
        if op in _SUBSCRIPT_WRITES:  # calls[0] += 1
            container = None if op == "STORE_SLICE" else _subscript_container(instructions, index)
            if container is None:  # a form not recognised: every container loaded on its line
                found["mutated"].update(line_roots.get(line, ()))
            elif (written := classify(container)) is not None and written[0] != "arg":
                found["mutated"].add(written[1])
        elif op in _REBINDS and (op.endswith("GLOBAL") or ins.argval in free):
            found["rebinds"].add(ins.argval)
        if pending_super:
            if op in _ATTR_LOADS:
                found["super"].add(ins.argval)
                pending_super = False
                continue
            if op in _SUPER_SKIPPED:
                continue
            pending_super = False
        if op in _ATTR_LOADS:
            found["attributes"].add(ins.argval)
            if root is not None:
                if len(attrs) < MAX_CHAIN:
                    attrs.append(ins.argval)
                continue
        flush(ins)
        root, attrs = None, []
        if op == "LOAD_SUPER_ATTR":
            found["super"].add(ins.argval)
            continue
        if op in ("STORE_ATTR", "DELETE_ATTR"):
            found["stored"].add(ins.argval)
            if _stores_on(instructions, index) == first:
                found["self_stored"].add(ins.argval)
            continue
        root = classify(ins)
        if root is not None and root[0] != "arg":
            line_roots.setdefault(line, set()).add(root[1])
        if root is None or root[0] != "global":
            continue
        if root[1] == "type":  # type(x).attr reads x.__class__.attr
            called = _type_call(instructions, index)
            target = classify(instructions[index + 1]) if called is not None else None
            if called is not None and target is not None:
                root, attrs, skip_to = target, ["__class__"], called
        elif root[1] == "super":
            pending_super, root = True, None
        elif root[1] in _DYNAMIC_ACCESS:
            target = classify(instructions[index + 1]) if index + 1 < len(instructions) else None
            following = instructions[index + 2] if index + 2 < len(instructions) else None
            if target is not None and target[0] != "global":
                loads_constant = following is not None and following.opname == "LOAD_CONST"
                constant = following.argval if following is not None and loads_constant else None
                if root[1] == "getattr" and isinstance(constant, str):
                    extra = (target[1], (constant,))
                    found["arg" if target[0] == "arg" else "free"].add(extra)
                elif target[0] == "arg" and root[1] != "hasattr":
                    found["dynamic"].add(target[1])
            root = None
    flush(None)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _scan(const, arguments, free, found, first)


def _type_call(instructions: list, index: int) -> int | None:
    """Where ``LOAD_GLOBAL type`` at ``index`` is ``type(x)`` with ``x`` one load: the index
    of its CALL."""
    at = index + 2
    while at < len(instructions) and instructions[at].opname == "PRECALL":  # 3.11
        at += 1
    if at < len(instructions) and instructions[at].opname == "CALL" and instructions[at].arg == 1:
        return at
    return None


_code_reads: dict[types.CodeType, CodeReads] = BoundedCache()


def code_reads(code: types.CodeType) -> CodeReads:
    """Cached per code object (code objects are immutable, so the cache never goes stale)."""
    reads = _code_reads.get(code)
    if reads is None:
        kinds = (
            "global",
            "arg",
            "free",
            "super",
            "stored",
            "self_stored",
            "dynamic",
            "mutated",
            "rebinds",
            "attributes",
            "keyed",
            "advanced",
        )
        found: dict[str, set] = {k: set() for k in kinds}
        first = code.co_varnames[0] if code.co_argcount else None
        _scan(code, frozenset(_argument_names(code)), frozenset(code.co_freevars), found, first)
        reads = _code_reads[code] = CodeReads(
            frozenset(found["global"]),
            frozenset(found["arg"]),
            frozenset(found["free"]),
            frozenset(found["super"]),
            frozenset(found["stored"]),
            frozenset(found["self_stored"]),
            frozenset(found["dynamic"]),
            _parameter_chains(code, found["arg"]),
            frozenset(found["mutated"]),
            frozenset(found["rebinds"]),
            frozenset(found["attributes"]),
            frozenset(found["keyed"]),
            frozenset(found["advanced"]),
        )
    return reads


def _parameter_chains(code: types.CodeType, chains: set) -> tuple:
    """Chains read from named parameters, with where a call passes each (its position, or
    None for a keyword-only one); ``*args`` and ``**kwargs`` are containers, not objects."""
    positional = code.co_varnames[: code.co_argcount]
    named = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
    return tuple(
        (name, positional.index(name) if name in positional else None, attrs)
        for name, attrs in sorted(chains)
        if name in named
    )


# -------------------------------------------------------------------- static attribute reads


def static_attribute(obj: Any, name: str) -> Any:
    """``getattr`` without running code: the instance's own state (its ``__dict__``, a
    ``threading.local``'s dict for this thread), module registries, then class dicts (for a
    class: its own and its bases', ``Config.SCALE``), where a ``__slots__`` slot is read
    through its descriptor (C code); ``__class__`` is the object's own type.

    Properties and other descriptors are not evaluated (``SKIPPED``): reading them may run
    arbitrary code with side effects. Any exception a probe meets means "cannot read"."""
    if name == "__class__":
        return type(obj)
    state = _own_state(obj)  # past a custom __getattribute__ (transformers' configs have one)
    if state is not None and name in state:
        return state[name]
    if state and of_type(obj, torch.nn.Module):
        for registry in ("_parameters", "_buffers", "_modules"):
            table = state.get(registry)
            if table is not None and name in table:
                return table[name]
    is_class = of_type(obj, type)
    for klass in obj.__mro__ if is_class else type(obj).__mro__:
        if name in klass.__dict__:
            value = klass.__dict__[name]
            if not is_class and type(value) is types.MemberDescriptorType:
                return _slot(value, obj)
            return value if _read_as_stored(value) else SKIPPED
    return MISSING


def _own_state(obj: Any) -> dict | None:
    """The dict an object's attributes live in, read without running its code: its
    ``__dict__``, or for a ``threading.local`` the dict of the calling thread."""
    if of_type(obj, threading.local):
        try:
            state = threading.local.__getattribute__(obj, "__dict__")
        except Exception:
            return None
        return state if type(state) is dict else None
    return instance_dict(obj)


def _slot(descriptor: Any, obj: Any) -> Any:
    """A ``__slots__`` attribute (``@dataclass(slots=True)``), MISSING while unset."""
    try:
        return descriptor.__get__(obj, type(obj))
    except Exception:
        return MISSING


def _read_as_stored(value: Any) -> bool:
    """Whether a class attribute is what reading it gives: not a descriptor that runs code
    (functions and static/class methods are taken as they are, to be followed)."""
    if isinstance(value, (types.FunctionType, staticmethod, classmethod)):
        return True
    return not hasattr(type(value), "__get__")


def read_chain(value: Any, attrs: tuple) -> Any:
    for name in attrs:
        if value is MISSING or value is SKIPPED:
            return value
        if of_type(value, torch.Tensor):  # its metadata is in its fingerprint
            return value
        value = static_attribute(value, name)
    return value


def chains_through_code(root: Any, chain: tuple) -> list[tuple]:
    """``chain`` (a root name, then attributes) as the code it passes reads it, that code never
    run (it may have side effects):

    - where it passes a property of the object it has reached, the attribute chains the
      getter reads from its ``self`` replace it: ``config._attn_implementation`` is read as
      ``config._attn_implementation_internal``;
    - where it ends at a method of the object it has reached (``self.hook.post_forward(...)``),
      the chain itself (which method) and what the method, and the methods it calls on its
      ``self``, read from that object (``self.hook.factor``).
    """
    value = root
    index = 1
    while index < len(chain):
        if value is MISSING or value is SKIPPED or of_type(value, (torch.Tensor, type)):
            break
        name = chain[index]
        found = static_attribute(value, name)
        if found is MISSING:  # a wrapper may hand the name to an object it holds
            path = forwarded_path(value, name)
            if path is not None:
                chain = (*chain[:index], *path, *chain[index:])
                value = read_chain(value, path)
                index += len(path)
                continue
        if found is not SKIPPED:
            if index == len(chain) - 1 and _is_method_of(value, name, found):
                return [chain, *_method_reads(value, found, chain[:index])]
            value = found
            index += 1
            continue
        getter = _property_getter(type(value), name)
        if getter is None:
            break
        reads = code_reads(getter.__code__)
        self_name = _argument_names(getter.__code__)[:1]
        expanded = {
            (*chain[:index], *attrs)[: MAX_CHAIN + 1]
            for argument, attrs in reads.arg_chains
            if (argument,) == self_name and attrs[0] != name
        }
        return sorted(expanded)
    return [chain]


_MAX_FORWARDING = 4  # wrappers of wrappers followed (PeftModel -> LoraModel -> the model)


def forwarded_path(obj: Any, name: str, depth: int = 0) -> tuple[str, ...] | None:
    """Where a forwarding ``__getattr__`` finds ``name`` (PEFT's and accelerate's wrappers
    hand names they lack to the module they wrap): the attributes of ``obj`` leading to the
    object whose own ``name`` it returns, to be read from there without running the wrapper.
    Found by calling it once, when a plan is made (the region's own code runs it at each
    read), and looking for what it returned among the objects its code reads from its
    ``self`` and, for a module, among its children and theirs. None: no user ``__getattr__``,
    it raised, or what it returned is found nowhere."""
    getter = _user_getattr(type(obj))
    if getter is None or depth >= _MAX_FORWARDING:
        return None
    try:
        returned = getattr(obj, name)
    except Exception:  # the wrapper's own code: anything it raises means "cannot read"
        return None
    for path in _forwarding_candidates(obj, getter):
        target = read_chain(obj, path)
        if target is MISSING or target is SKIPPED or of_type(target, torch.Tensor):
            continue
        found = static_attribute(target, name)
        if found is not MISSING and _read_as(found, returned, target):
            return path
        if found is MISSING:
            deeper = forwarded_path(target, name, depth + 1)
            holder = read_chain(target, deeper) if deeper is not None else MISSING
            if deeper is not None and _read_as(static_attribute(holder, name), returned, holder):
                return (*path, *deeper)
    return None


def _read_as(found: Any, returned: Any, holder: Any) -> bool:
    """Whether ``getattr`` returned what ``static_attribute`` found on ``holder``: the same
    object, or a method it found, bound to ``holder``."""
    if found is returned:
        return True
    return (
        type(returned) is types.MethodType
        and returned.__func__ is found
        and returned.__self__ is holder
    )


def attribute_of(obj: Any, name: str) -> Any:
    """``static_attribute``, or where ``obj`` lacks ``name`` and a forwarding ``__getattr__``
    hands it on (``forwarded_path``), the object it is handed to has it."""
    found = static_attribute(obj, name)
    if found is MISSING:
        path = forwarded_path(obj, name)
        if path is not None:
            return read_chain(obj, (*path, name))
    return found


def _user_getattr(cls: type) -> types.FunctionType | None:
    """A class's own ``__getattr__`` in user code (``nn.Module``'s is torch's: not one)."""
    for klass in cls.__mro__:
        if "__getattr__" in klass.__dict__:
            getter = unwrap_function(klass.__dict__["__getattr__"])
            if getter is None or is_library_code(getter.__code__):
                return None
            return getter
    return None


def _forwarding_candidates(obj: Any, getter: types.FunctionType) -> list[tuple[str, ...]]:
    """Paths from ``obj`` to what its ``__getattr__`` may hand names to: the attribute chains
    its code reads from its ``self``, then, for a module, its children and their children."""
    self_name = _argument_names(getter.__code__)[:1]
    paths = sorted(
        attrs
        for argument, attrs in code_reads(getter.__code__).arg_chains
        if (argument,) == self_name
    )
    state = _own_state(obj)
    children = state.get("_modules") if state and of_type(obj, torch.nn.Module) else None
    for child_name, child in (children or {}).items():
        paths.append((child_name,))
        grandchildren = (
            getattr(child, "_modules", None) if of_type(child, torch.nn.Module) else None
        )
        paths.extend((child_name, n) for n in grandchildren or ())
    return list(dict.fromkeys(paths))


# module methods whose reads the module's own plan covers (a module in the region's tree)
_MODULE_ENTRY_POINTS = frozenset({"forward", "__call__", "_call_impl", "_wrapped_call_impl"})


def _is_method_of(owner: Any, name: str, found: Any) -> bool:
    """Whether ``owner.name`` is a user-code method found on its class (called, it gets
    ``owner`` as ``self``), not a function stored on the instance."""
    if type(found) is not types.FunctionType or is_library_code(found.__code__):
        return False
    if of_type(owner, torch.nn.Module) and name in _MODULE_ENTRY_POINTS:
        return False
    state = _own_state(owner)  # none (__slots__): found on the class
    return state is None or name not in state


def _method_reads(owner: Any, method: types.FunctionType, path: tuple) -> list[tuple]:
    """Chains from ``path`` (which reaches ``owner``) to what ``method`` reads from its self,
    the attributes it assigns aside (its outputs)."""
    reads = class_reads(type(owner), method)
    return sorted(
        {
            (*path, *attrs)[: MAX_CHAIN + 1]
            for attrs in reads.self_chains
            if attrs[0] not in reads.stored
        }
    )


def _property_getter(cls: type, name: str) -> types.FunctionType | None:
    for klass in cls.__mro__:
        if name in klass.__dict__:
            found = klass.__dict__[name]
            if not isinstance(found, property):
                return None
            getter = unwrap_function(found.fget)
            if getter is None or is_library_code(getter.__code__):
                return None
            return getter
    return None


def _is_library_module(value: types.ModuleType) -> bool:
    return value.__name__.partition(".")[0] in _LIBRARY_ROOTS


def _follow_target(value: Any) -> types.FunctionType | None:
    """The user function a value leads to (functions, methods, partials), if any."""
    if of_type(value, (staticmethod, classmethod)):
        value = value.__func__
    if of_type(value, types.MethodType):
        value = value.__func__
    if of_type(value, functools.partial):
        value = value.func
    func = unwrap_function(value) if callable(value) else None
    if func is None or is_library_code(func.__code__):
        return None
    return func


# ------------------------------------------------------------------------- function plans


def inline_spec(root: Any, chain: tuple, value: Any) -> tuple | None:
    """How a reader may read a global's attribute (``cfg.SCALE``, ``Config.SCALE``,
    ``logger.warning_once``) without calling ``read_chain``, which costs far more than the
    lookup itself in a step's cold caches. ``("own", T, V)``: in the root's own ``__dict__``;
    ``("class", T, has_dict, dicts before, class dict, V, as stored)``: on a class of its
    type. The reader checks the root's type ``T``, that nothing earlier shadows the attribute
    and the value's type ``V``, and calls ``read_chain`` whenever one of them fails, so the
    result is always ``static_attribute``'s. None: no shortcut (longer chains, modules)."""
    if len(chain) > 2 and of_type(root, types.ModuleType):
        return _through_modules(root, chain, value)
    if len(chain) != 2 or of_type(root, (torch.nn.Module, threading.local)):
        return None
    name = chain[1]
    if name == "__class__":
        return None
    try:
        state = object.__getattribute__(root, "__dict__")
    except Exception:
        state = None
    if of_type(root, type):
        if name in state and _read_as_stored(value):
            return ("own", type(root), type(value))
        return None
    if type(state) is dict and name in state:
        return ("own", type(root), type(value))
    if state is not None and type(state) is not dict:
        return None
    mro = type(root).__mro__
    for index, klass in enumerate(mro):
        if name in klass.__dict__:
            stored = klass.__dict__[name]
            if type(stored) is types.MemberDescriptorType:  # a slot: read by static_attribute
                return None
            before = tuple(k.__dict__ for k in mro[:index])
            found = (klass.__dict__, type(stored), value is stored)
            return ("class", type(root), state is not None, before, *found)
    return None


def _through_modules(root: types.ModuleType, chain: tuple, value: Any) -> tuple | None:
    """``("modules", V)`` where every step of ``chain`` before its last attribute is a module
    (``nn.functional.dropout``): read through the modules' dicts, the value's type checked."""
    found: Any = root
    for name in chain[1:]:
        if not of_type(found, types.ModuleType):
            return None
        found = object.__getattribute__(found, "__dict__").get(name, MISSING)
    return ("modules", type(value)) if found is value else None


def _defaults_kind(defaults: tuple | None) -> str | None:
    """ "scalars": a tuple of scalars only (immutable, so the tuple itself is its fingerprint)."""
    if defaults is None:
        return None
    return "scalars" if all(type(v) in SCALAR_TYPES for v in defaults) else "any"


class GlobalChain(NamedTuple):
    """A global, or an attribute chain from one, that a function reads."""

    chain: tuple[str, ...]  # the global's name, then attributes
    kind: str  # how its value is fingerprinted (``sample_kind``)
    spec: tuple | None  # how the reader inlines it (``inline_spec``), None: ``read_chain``
    # its value is a ``functools.lru_cache`` wrapper (its ``maxsize``, None: unbounded): the
    # functions reached only through it run only when the cache misses
    cache: tuple[int | None] | None = None
    called: bool = False  # a torch function it calls (reached through a torch module)


class CellChain(NamedTuple):
    """An attribute chain a function reads from an object in its closure."""

    cell: int  # index into ``__closure__``
    attrs: tuple[str, ...]
    kind: str


class FunctionEntry(NamedTuple):
    """One function of a plan: what its code reads, as the plan was made."""

    ref: weakref.ref | None  # None for the root, which the caller passes in
    chains: tuple[GlobalChain, ...]
    cells: tuple[str, ...]  # kind of each closure cell's value ("empty": an unset cell)
    cell_chains: tuple[CellChain, ...]
    defaults: str | None  # kind of its ``__defaults__`` (``_defaults_kind``)
    kwdefaults: bool  # whether it has ``__kwdefaults__``
    followed: tuple[tuple[int, int], ...]  # callees followed: (chain index, id of the object)
    # the code object the entry was made from: a plan cached for a caller keeps its callees'
    # entries, so a callee's ``__code__`` swapped since shows here. See NOTE [ Stale plans ]
    code: types.CodeType
    environment: tuple[str | None, ...] = ()  # keys of os.environ it reads (None: any key)
    methods: tuple[str, ...] = ()  # torch.Tensor methods its code may call (x.view, x.softmax)
    # values it advances (next() or a for loop) that are iterators: ("chain", index into
    # chains) or ("cell", index into cells); the recompute draws their next value
    iterators: tuple[tuple[str, int], ...] = ()
    # (entry index, chain index) of the lru_cache only through which the entry is reached
    behind: tuple[int, int] | None = None
    compiled: bool = False  # it calls code torch.compile made (``compiled_by_dynamo``)


class FunctionPlan:
    """The globals, closures and defaults of a function and of every user function it calls.

    ``entries`` lists each function as a ``FunctionEntry``. A decorator's wrapper
    (``__wrapped__``) is followed into the function it wraps; its own closure is decorator
    plumbing and is not read. A rebound followed name makes the plan stale, and it is rebuilt
    at the next forward.
    """

    __slots__ = ("entries", "__weakref__")

    def __init__(self, root: types.FunctionType):
        entries: list[FunctionEntry] = []
        # (function, is the root, the entry and chain index of the call that led to it, and
        # whether that call goes through an lru_cache)
        pending: list[tuple[types.FunctionType, bool, tuple[int, int] | None, bool]] = [
            (root, True, None, False)
        ]
        seen: dict[int, int] = {}  # id of a function -> its entry
        edges: list[tuple[int, int, tuple[int, int] | None]] = []  # caller, callee, its cache
        while pending and len(entries) < MAX_FUNCTIONS:
            func, is_root, via, cached = pending.pop()
            if id(func) in seen:
                if via is not None:
                    edges.append((via[0], seen[id(func)], via if cached else None))
                continue
            index = seen[id(func)] = len(entries)
            if via is not None:
                edges.append((via[0], index, via if cached else None))
            code = func.__code__
            reads = code_reads(code) if not is_library_code(code) else None
            namespace = func.__globals__
            chains: list[GlobalChain] = []
            followed = []
            compiled = False
            for chain in sorted(reads.global_chains) if reads is not None else ():
                name = chain[0]
                if name not in namespace and name in _BUILTINS:
                    continue
                value = namespace.get(name, MISSING)
                if of_type(value, types.ModuleType):
                    if len(chain) == 1:
                        continue
                    if _is_library_module(value):
                        # a torch function it calls: patched between the passes, the
                        # recompute would call the patch
                        target = read_chain(value, chain[1:])
                        if _is_torch_function(value, target):
                            spec = inline_spec(value, chain, target)
                            chains.append(GlobalChain(chain, "object", spec, called=True))
                        continue
                for read in chains_through_code(value, chain):
                    target = read_chain(value, read[1:])
                    kind = sample_kind(target)
                    cache = _lru_cache_size(target)
                    chains.append(GlobalChain(read, kind, inline_spec(value, read, target), cache))
                    compiled = compiled or compiled_by_dynamo(target)
                    callee = _follow_target(target)
                    if callee is not None:
                        if kind == "object":
                            followed.append((len(chains) - 1, id(target)))
                        call = (index, len(chains) - 1)
                        pending.append((callee, False, call, cache is not None))
            cells = []
            cell_chains = []
            wrapped = getattr(func, "__wrapped__", None)
            if wrapped is not None:
                target = unwrap_function(wrapped)
                if target is not None and not is_library_code(target.__code__):
                    pending.append((target, False, (index, -1), False))
            else:
                for cell in func.__closure__ or ():
                    try:
                        contents = cell.cell_contents
                    except ValueError:
                        cells.append("empty")
                        continue
                    cells.append(sample_kind(contents))
                    compiled = compiled or compiled_by_dynamo(contents)
                    callee = _follow_target(contents)
                    if callee is not None:
                        pending.append((callee, False, (index, -1), False))
                for cell_index, attrs, target in _cell_chains(func, reads):
                    cell_chains.append(CellChain(cell_index, attrs, sample_kind(target)))
                    callee = _follow_target(target)
                    if callee is not None:
                        pending.append((callee, False, (index, -1), False))
            entries.append(
                FunctionEntry(
                    ref=None if is_root else weakref.ref(func),
                    chains=tuple(chains),
                    cells=tuple(cells),
                    cell_chains=tuple(cell_chains),
                    defaults=_defaults_kind(func.__defaults__),
                    kwdefaults=func.__kwdefaults__ is not None,
                    followed=tuple(followed),
                    code=code,
                    environment=_environment_reads(namespace, reads),
                    methods=_tensor_methods(reads),
                    iterators=_advanced_iterators(func, reads, chains, namespace),
                    compiled=compiled,
                )
            )
        self.entries = tuple(_behind_caches(entries, edges))

    def functions(self, root: types.FunctionType) -> list:
        """The function of each entry now (None where a followed one was collected)."""
        return [root if entry.ref is None else entry.ref() for entry in self.entries]


def _is_torch_function(module: types.ModuleType, target: Any) -> bool:
    """A function of torch's (``torch.sin``, ``F.gelu``), reached through a torch module."""
    return module.__name__.partition(".")[0] == "torch" and of_type(
        target, (types.FunctionType, types.BuiltinFunctionType)
    )


_LRU_WRAPPER: type = type(functools.lru_cache(maxsize=None)(lambda: None))


def _lru_cache_size(value: Any) -> tuple[int | None] | None:
    """(maxsize,) of an ``functools.lru_cache`` wrapper (``functools.cache``: None)."""
    if type(value) is not _LRU_WRAPPER:
        return None
    wrapper: Any = value
    return (wrapper.cache_parameters()["maxsize"],)


def cache_state(wrapper: Any) -> Any:
    """What tells whether an lru_cache still holds what it held: its misses and its size (a
    ``cache_clear()`` resets both, a full cache evicts on a miss)."""
    if type(wrapper) is not _LRU_WRAPPER:
        return MISSING
    info = wrapper.cache_info()  # type: ignore[attr-defined]
    return (info.misses, info.currsize)


def cache_kept(old: Any, new: Any, size: tuple[int | None]) -> bool:
    """Whether a cache whose state went from ``old`` to ``new`` still holds every entry it
    held: nothing cleared, and no miss that could have evicted one."""
    if type(old) is not tuple or type(new) is not tuple:
        return False
    (misses, held), (misses_now, held_now) = old, new
    if misses_now < misses or held_now < held:
        return False
    maxsize = size[0]
    return maxsize is None or held + (misses_now - misses) <= maxsize


def _behind_caches(entries: list[FunctionEntry], edges: list) -> list[FunctionEntry]:
    """Entries reached from the root only through calls of one lru_cache wrapper: they run
    at the recompute only if that cache no longer holds the forward's result."""
    plain = {0}
    changed = True
    while changed:
        changed = False
        for caller, callee, cache in edges:
            if cache is None and caller in plain and callee not in plain:
                plain.add(callee)
                changed = True
    caches: dict[int, set] = {}
    changed = True
    while changed:
        changed = False
        for caller, callee, cache in edges:
            if callee in plain:
                continue
            found = {cache} if cache is not None else caches.get(caller, set())
            known = caches.setdefault(callee, set())
            if not found <= known:
                known |= found
                changed = True
    return [
        entry._replace(behind=next(iter(caches[i])))
        if i not in plain and len(caches.get(i, ())) == 1
        else entry
        for i, entry in enumerate(entries)
    ]


def _environment_reads(namespace: dict, reads: CodeReads | None) -> tuple[str | None, ...]:
    """Keys of ``os.environ`` the code reads (``os.environ["K"]``, ``os.environ.get("K")``,
    ``os.getenv("K")``, from any alias); None where it reads a key it computes."""
    if reads is None:
        return ()
    keys: set[str | None] = set()
    for chain in reads.global_chains:
        if _reads_environment(namespace, chain):
            found = [key for read, key in reads.keyed if read == chain]
            keys.update(found if found else [None])
    return tuple(sorted(keys, key=lambda k: (k is None, k or "")))


def _reads_environment(namespace: dict, chain: tuple) -> bool:
    root = namespace.get(chain[0], MISSING)
    target = read_chain(root, chain[1:])
    if target is os.environ or target is os.getenv:
        return True
    return chain[-1] == "get" and read_chain(root, chain[1:-1]) is os.environ


_tensor_method_names: frozenset | None = None


def _tensor_methods(reads: CodeReads | None) -> tuple[str, ...]:
    """Methods of ``torch.Tensor`` among the attributes the code loads: one patched on
    ``torch.Tensor`` between the passes is what the recompute calls."""
    global _tensor_method_names
    if reads is None:
        return ()
    if _tensor_method_names is None:
        _tensor_method_names = frozenset(
            name
            for name in dir(torch.Tensor)
            if not name.startswith("__")
            and callable(inspect.getattr_static(torch.Tensor, name, None))
        )
    return tuple(sorted(reads.attributes & _tensor_method_names))


_ITERATOR_TYPES = (collections.abc.Iterator,)


def is_iterator(value: Any) -> bool:
    return of_type(value, _ITERATOR_TYPES)


def _advanced_iterators(
    func: types.FunctionType, reads: CodeReads | None, chains: list, namespace: dict
) -> tuple[tuple[str, int], ...]:
    """Globals and closure cells holding an iterator the code advances."""
    if reads is None or not reads.advanced:
        return ()
    found: list[tuple[str, int]] = []
    for index, read in enumerate(chains):
        if ("global", read.chain[0], read.chain[1:]) in reads.advanced:
            if is_iterator(read_chain(namespace.get(read.chain[0], MISSING), read.chain[1:])):
                found.append(("chain", index))
    for index, name in enumerate(func.__code__.co_freevars):
        if ("free", name, ()) in reads.advanced and is_iterator(cell_contents(func, index)):
            found.append(("cell", index))
    return tuple(found)


def _cell_chains(func: types.FunctionType, reads: CodeReads | None) -> list[tuple]:
    """(cell index, attributes, value now) of each attribute chain the function reads from
    an object in its closure (``self.scale`` in a function nested in a method)."""
    if reads is None or not reads.free_chains:
        return []
    names = func.__code__.co_freevars
    found = []
    for name, attrs in sorted(reads.free_chains):
        if not attrs or name not in names or attrs[0] in reads.stored:
            continue  # an attribute the function assigns is its output, not its input
        index = names.index(name)
        try:
            contents = (func.__closure__ or ())[index].cell_contents
        except ValueError:
            continue
        if type(contents) in SCALAR_TYPES or of_type(contents, types.ModuleType):
            continue  # scalars are read whole; modules' globals are their functions' business
        for chain in chains_through_code(contents, (name, *attrs)):
            found.append((index, chain[1:], read_chain(contents, chain[1:])))
    return found


def cell_contents(func: types.FunctionType, index: int) -> Any:
    try:
        return (func.__closure__ or ())[index].cell_contents
    except ValueError:  # an empty cell
        return MISSING


class Label(NamedTuple):
    """What one position of a region's read holds: its owner (``TORCH``, ``HOOKS``, a
    module's index in the region or ``FUNCTION``), the kind of value (what a difference is
    called: "tensor", "global", "closure", ...), its name and where it lives (None: said by
    the module it belongs to)."""

    owner: int | str
    kind: str
    name: str  # "" where the owner says it all (the global hooks, a TorchScript module's tensors)
    where: str | None


TORCH = "torch"  # label owners besides module indexes
HOOKS = "hooks"
FUNCTION = "function"


def function_labels(func: Any, entry: FunctionEntry) -> list[Label]:
    """A label for each value an entry reads; ``where`` names the function by its qualified
    name and file:line."""
    name = function_name(func) if func is not None else "<collected function>"
    code = func.__code__ if func is not None else None
    location = code_location(code)
    # a function exec'd in globals without __name__ has no module: name where its code is
    module = getattr(func, "__module__", None) or (
        f"{code.co_filename} (run without a module name)" if code is not None else "?"
    )
    of = f"{name} ({location})"
    out = [Label(FUNCTION, "function", f"{name}.__code__", f"code of {of}")]
    for read in entry.chains:
        dotted = ".".join(read.chain)
        if read.called:
            out.append(Label(FUNCTION, "function", dotted, f"torch function called by {of}"))
        else:
            out.append(Label(FUNCTION, "global", dotted, f"global of {module}, read by {of}"))
        if read.cache is not None:
            out.append(Label(FUNCTION, "cache", f"{dotted}.cache_info()", f"read by {of}"))
    cells = entry.cells
    names = func.__code__.co_freevars if func is not None else ("?",) * len(cells)
    out += [Label(FUNCTION, "closure", var, f"closure cell of {of}") for var in names[: len(cells)]]
    out += [
        Label(
            FUNCTION,
            "closure",
            ".".join((names[c.cell], *c.attrs)),
            f"read through a closure cell of {of}",
        )
        for c in entry.cell_chains
    ]
    if entry.defaults:
        out.append(Label(FUNCTION, "closure", f"{name}.__defaults__", f"default arguments of {of}"))
    if entry.kwdefaults:
        out.append(
            Label(FUNCTION, "closure", f"{name}.__kwdefaults__", f"keyword defaults of {of}")
        )
    out += [
        Label(FUNCTION, "global", f"os.environ[{key!r}]", f"environment variable read by {of}")
        if key is not None
        else Label(FUNCTION, "global", "os.environ", f"environment read by {of}")
        for key in entry.environment
    ]
    if entry.methods:
        out.append(Label(FUNCTION, "methods", "torch.Tensor", f"tensor methods called by {of}"))
    return out


_function_plans: dict[tuple[types.CodeType, int], FunctionPlan] = BoundedCache()


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


def cell_fp(func: types.FunctionType, index: int, by_identity: bool) -> Any:
    """A closure cell's contents as the reader reads them (its id where the plan reads the
    object by identity), MISSING while the cell is empty."""
    try:
        contents = (func.__closure__ or ())[index].cell_contents
    except ValueError:
        return MISSING
    return id(contents) if by_identity else value_fp(contents)


# ---------------------------------------------------------------------------- module plans


def forward_of(module: torch.nn.Module) -> Any:
    return module.__dict__.get("forward") or type(module).forward


@dataclass(frozen=True)
class ClassReads:
    """What a module class's forward and the methods it calls on ``self`` read from ``self``,
    assign on ``self``, and which functions they reach (for their globals)."""

    self_chains: frozenset  # attribute tuples read from self
    stored: frozenset
    self_stored: frozenset  # attributes its code assigns on ``self`` (counters, caches)
    dynamic: bool  # attributes read by computed names: fingerprint every plain attribute
    functions: tuple  # weak references to the user functions reached (their globals count)
    code: Any  # the forward's code when this was worked out
    advanced: frozenset  # attribute tuples of self its code advances (next(), a for loop)
    # (globals, chain) of the torch functions torch's own code of the class calls (``F.linear``
    # in ``Linear.forward``): patched between the passes, the recompute calls the patch
    calls: tuple


# id of a class -> (weak reference to it, {id of a forward: its reads}); an entry goes with
# its class, and values hold no strong reference to a class or a forward
_class_reads: dict[int, tuple[weakref.ref, dict]] = {}


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
    ident = id(cls)
    entry = _class_reads.get(ident)
    if entry is None or entry[0]() is not cls:
        ref = weakref.ref(cls, lambda _: _class_reads.pop(ident, None))
        entry = _class_reads[ident] = (ref, {})
    per_class = entry[1]
    code = getattr(forward, "__code__", None)
    cached = per_class.get(id(forward))
    if cached is not None and cached.code is code:
        return cached
    ignored = _ignored_attributes(cls)
    chains: set = set()
    stored: set = set()
    self_stored: set = set()
    advanced: set = set()
    calls: dict[tuple[int, tuple], tuple] = {}
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
        reads = code_reads(func.__code__)
        if not is_library_code(func.__code__):
            functions.append(func)
        else:  # its torch calls; a user function's are in its own plan
            for chain in reads.global_chains:
                calls.setdefault((id(func.__globals__), chain), (func.__globals__, chain))
        names = _argument_names(func.__code__)
        if not names:
            continue
        self_name = names[0]
        stored |= reads.stored
        self_stored |= reads.self_stored
        advanced.update(
            a for kind, n, a in reads.advanced if kind == "arg" and n == self_name and a
        )
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
        frozenset(c for c in chains if c[0] not in _MODULE_INTERNALS and c[0] not in ignored),
        frozenset(stored),
        frozenset(self_stored),
        dynamic,
        tuple(weakref.ref(f) for f in functions),
        code,
        frozenset(advanced),
        tuple(_torch_calls(calls.values())),
    )
    return result


# NOTE [ Momentum feeds only the running statistics ]
# A normalisation layer with running statistics (BatchNorm, InstanceNorm with
# track_running_stats) reads ``momentum`` only to update those statistics, which are the
# region's output (See NOTE [ Outputs are not inputs ]): in training its output comes from the
# batch's own statistics, in eval from the running ones, which momentum does not touch. So a
# momentum changed between forward and recompute changes the recompute's second update of the
# statistics (a side effect, warned as such), never what backward uses: it is not read.
_STATISTICS_ONLY = frozenset({"momentum"})


def _ignored_attributes(cls: type) -> frozenset:
    """See NOTE [ Momentum feeds only the running statistics ]"""
    return _STATISTICS_ONLY if issubclass(cls, NORMS_WITH_STATISTICS) else frozenset()


def _torch_calls(found: Any) -> list[tuple[dict, tuple, Any]]:
    """(globals, chain, the function) of the chains through torch modules that lead to a
    function (``F.linear``), sorted."""
    calls = []
    for namespace, chain in sorted(found, key=lambda item: (id(item[0]), item[1])):
        root = namespace.get(chain[0], MISSING)
        if len(chain) > 1 and of_type(root, types.ModuleType):
            target = read_chain(root, chain[1:])
            if _is_torch_function(root, target):
                calls.append((namespace, chain, target))
    return calls


def _is_plain_attribute(value: Any) -> bool:
    if type(value) in SCALAR_TYPES or of_type(value, torch.Tensor):
        return True
    return type(value) in (tuple, list, dict) and len(value) <= 16


class ModuleChain(NamedTuple):
    """An attribute chain a module's code reads from ``self``."""

    chain: tuple[str, ...]
    source: tuple  # where its first attribute lives (``ModulePlan._source_of``)
    kind: str  # how its value is fingerprinted (``sample_kind``)
    spec: tuple | None = None  # how the reader inlines its second attribute (``inline_spec``)


class ModulePlan:
    """Per module: its parameters and buffers, and where each attribute its code reads lives.

    A module's fingerprint is: the training flag, the forward and its code, the keys of each
    hook dict, every parameter and buffer, and every attribute chain its code reads
    (attributes, children, config objects, class attributes). ``_reader`` compiles plans into
    straight-line readers. The plan references its module's class, never the module.
    """

    __slots__ = (
        "cls",
        "shape",
        "forward",
        "params",
        "buffers",
        "chains",
        "class_dicts",
        "loose",
        "functions",
        "stores_scalars",
        "opaque",
        "iterators",
        "calls",
        "inert",
        "__weakref__",
    )
    shape: tuple[int, ...]
    forward: int
    params: tuple[str, ...]
    buffers: tuple[str, ...]
    chains: tuple[ModuleChain, ...]
    class_dicts: list[Any]  # the class dicts attributes are read from (mappingproxy)
    functions: tuple[weakref.ref, ...]
    stores_scalars: bool
    iterators: tuple[int, ...]  # chains holding an iterator its code advances
    calls: tuple  # (globals, chain, function): torch functions its torch forward calls
    # a container that cannot be called (ModuleDict, ParameterDict, ModuleList: torch's
    # unimplemented forward): no hook of its runs and no code reads its training flag
    inert: bool

    def __init__(self, module: torch.nn.Module, loose: bool):
        self.cls = type(module)
        self.loose = loose
        self.opaque = of_type(module, torch.jit.ScriptModule)
        if self.opaque:  # TorchScript: no Python code to read, no hooks; its tensors count
            self.shape, self.forward = (), 0
            self.params = self.buffers = self.chains = self.functions = ()
            self.iterators = self.calls = ()
            self.class_dicts, self.stores_scalars, self.inert = [], False, False
            return
        state = module.__dict__
        forward = forward_of(module)
        reads = class_reads(type(module), forward)
        self.shape = module_shape(module)
        self.forward = id(forward)  # an id: a forward closing over its module must not pin it
        self.functions = reads.functions
        self.calls = reads.calls
        self.inert = forward is _UNCALLABLE
        self.stores_scalars = bool(reads.self_stored)
        # a container's placeholder forward never runs: nothing it would read is read
        chains = set() if self.inert else set(reads.self_chains)
        if reads.dynamic and not self.inert:
            chains.update(
                (key,)
                for key, value in state.items()
                if key not in _MODULE_INTERNALS and _is_plain_attribute(value)
            )
        self.params = tuple(state["_parameters"])
        self.buffers = tuple(state["_buffers"])
        registered = {*self.params, *self.buffers}
        self.class_dicts = []
        resolved = {}
        iterators: list[tuple] = []
        for chain in sorted(
            c for c in chains if c[0] not in reads.stored and c[0] not in registered
        ):
            if static_attribute(module, chain[0]) is MISSING:  # handed on by a __getattr__?
                chain = (*(forwarded_path(module, chain[0]) or ()), *chain)
            source = self._source_of(module, chain[0])
            if source is None:
                continue  # a property: not evaluated, its getter's own reads are chains
            root = static_attribute(module, chain[0])
            for read in chains_through_code(root, chain):
                sample = read_chain(root, read[1:])
                if sample is not SKIPPED:  # SKIPPED: a property whose getter is not readable
                    spec = inline_spec(root, read, sample)  # self.config.scale: config's dict
                    resolved[read] = ModuleChain(read, source, sample_kind(sample), spec)
                    if read in reads.advanced and is_iterator(sample):
                        iterators.append(read)
        self.chains = tuple(resolved.values())
        self.iterators = tuple(i for i, c in enumerate(self.chains) if c.chain in iterators)

    def _source_of(self, module: torch.nn.Module, name: str) -> tuple | None:
        """Where ``getattr`` finds ``name`` now: ("dict"|"_parameters"|"_buffers"|"_modules",
        name) or ("class", index into class_dicts, name); None for a property."""
        state = module.__dict__
        if name in state:
            return ("dict", name)
        if name == "__class__":
            return ("type",)
        for registry in ("_parameters", "_buffers", "_modules"):
            if name in state[registry]:
                return (registry, name)
        for klass in type(module).__mro__:
            if name in klass.__dict__:
                if static_attribute(module, name) is SKIPPED:
                    return None
                self.class_dicts.append(klass.__dict__)
                return ("class", len(self.class_dicts) - 1, name)
        return ("dict", name)  # not there yet: read it from the instance if it appears


def sample_kind(value: Any) -> str:
    """How a read value is fingerprinted, from its type when the plan is made: scalars by
    value (checked at read time), containers and tensors through ``value_fp``, other objects
    (modules, functions, classes, configs) by identity."""
    if type(value) in SCALAR_TYPES:
        return "scalar"
    if value is MISSING or value is SKIPPED:
        return "any"
    if of_type(value, (torch.Tensor, list, tuple, dict, set, frozenset, functools.partial)):
        return "any"
    return "object"


def module_shape(module: torch.nn.Module) -> tuple[int, int, int, int]:
    state = module.__dict__
    return (
        len(state),
        len(state["_parameters"]),
        len(state["_buffers"]),
        len(state["_modules"]),
    )


_module_plans: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def module_plan(module: torch.nn.Module, loose: bool, fresh: bool = False) -> ModulePlan:
    """The module's plan, cached per module and keyed weakly; ``fresh`` rebuilds it (the
    module's shape or forward changed)."""
    plan = None if fresh else _module_plans.get(module)
    if plan is None or plan.loose != loose:
        plan = _module_plans[module] = ModulePlan(module, loose)
    return plan


def plan_cache_sizes() -> dict[str, int]:
    """Sizes of the plan caches: bounded by the distinct code objects and the live modules."""
    return {
        "code_reads": len(_code_reads),
        "function_plans": len(_function_plans),
        "class_reads": sum(len(table) for _, table in _class_reads.values()),
        "module_plans": len(_module_plans),
    }
