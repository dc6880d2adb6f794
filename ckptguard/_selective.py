"""Selective checkpointing at run time: what a region's policy decided, and its saved outputs.

``create_selective_checkpoint_contexts(policy)`` returns two dispatch modes: the forward's
calls the policy for every op and keeps the outputs it says to save, the recompute's hands
them back by op and call index. Measured on torch 2.13 (and read in 2.12's sources, run on
2.12 too):

* torch calls a policy with an ``OpOverload`` (``aten.mm.default``) and saves an output only
  for ``CheckpointPolicy.MUST_SAVE`` / ``PREFER_SAVE`` or ``True``. A policy comparing the op
  with a packet (``torch.ops.aten.mm``) or a Python function (``torch.mm``), returning
  anything else (``"save"``, ``1``, ``None``), or naming ops the region never runs (``nn.Linear``
  runs ``aten.addmm``, not ``aten.mm``) saves nothing: the region recomputes everything and
  nothing says so. Reported, with the ops, at the region's first recompute.
* torch 2.13 calls the policy only in the forward; up to 2.12 it calls it again in the
  recompute and takes a saved output wherever it then says save, so a policy that decides
  differently there (a counter that ignores ``ctx.is_recompute``) takes another call's output
  (wrong gradients) or fails with "... not found in storage" or "Trying to backward an extra
  time". Where the recompute mode asks the policy, its decisions are compared with the
  forward's, call by call, before torch acts on them.
* An output saved and then modified in place (``y = mm(x, w); y.mul_(2)``): without
  ``allow_cache_entry_mutation`` torch raises a bare "Tensor cached during selective activation
  checkpoint has been mutated", explained here with the op and call; with it, the recompute
  takes the modified tensor and runs the in-place op on it again. Strict mode measures
  whether that changes what backward uses, and says which; default mode says it may.

The guard hands torch the user's ``context_fn`` wrapped (``watched``): the forward mode keeps
its type and gets a recording policy, the recompute mode is entered through ``RecomputeWatch``.
"""

from __future__ import annotations

import dis
import functools
import inspect
import types
import weakref
from collections.abc import Iterator
from typing import Any

from torch.utils.checkpoint import CheckpointPolicy

from ckptguard import _compat, _explain
from ckptguard._barrier import stage
from ckptguard._fingerprint import instance_dict
from ckptguard._readplan import (
    BoundedCache,
    code_location,
    code_of,
    function_name,
    is_library_code,
)
from ckptguard.errors import CheckpointGuardError

_SAVE = (CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_SAVE)


def decides_save(result: Any) -> bool:
    """As torch reads a policy's answer: a bool, or a ``CheckpointPolicy`` of the save kind."""
    if isinstance(result, bool):
        return result
    return isinstance(result, CheckpointPolicy) and result in _SAVE


# ------------------------------------------------------------------ the context_fn argument


class ContextArgument:
    """Where the non-reentrant generator receives ``context_fn``: positionally up to 2.13
    (``checkpoint`` passes every option in order), as a keyword-only argument from 2.14."""

    __slots__ = ("index", "default")

    def __init__(self, generator: Any) -> None:
        parameters = list(inspect.signature(generator).parameters.values())
        found = next(p for p in parameters if p.name == "context_fn")
        positional = found.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
        self.index = parameters.index(found) - 1 if positional else None  # after ``fn``
        self.default = found.default

    def get(self, args: tuple, kwargs: dict) -> Any:
        if kwargs and "context_fn" in kwargs:
            return kwargs["context_fn"]
        index = self.index
        return args[index] if index is not None and len(args) > index else self.default

    def replace(self, args: tuple, kwargs: dict, value: Any) -> tuple[tuple, dict]:
        if "context_fn" in kwargs or self.index is None or len(args) <= self.index:
            return args, {**kwargs, "context_fn": value}
        return (*args[: self.index], value, *args[self.index + 1 :]), kwargs


# ------------------------------------------------------------------- what the policy decided


class Record:
    """One region's forward, as its policy decided it: calls and saves per op, answers torch
    reads as recompute although they are no ``CheckpointPolicy`` (``"save"``, ``1``, ``None``),
    and, where the recompute asks the policy again (torch <= 2.12), every decision in order."""

    __slots__ = ("policy", "key", "calls", "saved", "invalid", "decisions")

    def __init__(self, policy: Any, compare: bool) -> None:
        self.policy = policy
        self.key = _policy_key(policy)
        self.calls: dict[Any, int] = {}
        self.saved = 0
        self.invalid: dict[Any, tuple[str, int]] = {}  # op -> (the answer, how often)
        self.decisions: dict[Any, list[bool]] | None = {} if compare else None


class RecordingPolicy:
    """The user's policy, for the forward mode: the same answers, each one recorded (in the
    region's barrier: see NOTE [ The guard never stops training ] in ``_barrier``)."""

    __slots__ = ("policy", "record", "region")

    def __init__(self, policy: Any, record: Record, region: Any) -> None:
        self.policy, self.record, self.region = policy, record, region

    def __call__(self, ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
        result = self.policy(ctx, op, *args, **kwargs)
        _note(self.region, self.record, op, result)
        return result


@stage("record the selective-checkpoint policy of")
def _note(region: Any, record: Record, op: Any, result: Any) -> None:
    record.calls[op] = record.calls.get(op, 0) + 1
    save = decides_save(result)
    if save:
        if not record.saved:
            _ever_saved[record.key] = True
        record.saved += 1
    elif not isinstance(result, (CheckpointPolicy, bool)):
        shown, count = record.invalid.get(op, (_explain.abbreviate(result, 40), 0))
        record.invalid[op] = (shown, count + 1)
    if record.decisions is not None:
        record.decisions.setdefault(op, []).append(save)


class ComparingPolicy:
    """The user's policy, for a recompute mode that asks it again (torch <= 2.12): each
    answer compared with the forward's for the same op and call, before torch acts on it."""

    __slots__ = ("policy", "watch", "counts")

    def __init__(self, policy: Any, watch: RecomputeWatch) -> None:
        self.policy, self.watch = policy, watch
        self.counts: dict[Any, int] = {}

    def __call__(self, ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # torch asks it: pytest does not show it
        result = self.policy(ctx, op, *args, **kwargs)
        try:
            _compare(self.watch.region, self, op, result)
        except CheckpointGuardError as error:
            _explain.raised_at_hook(error)
            raise
        return result


@stage("compare the selective-checkpoint decisions of")
def _compare(region: Any, policy: ComparingPolicy, op: Any, result: Any) -> None:
    index = policy.counts.get(op, 0)
    policy.counts[op] = index + 1
    before = (policy.watch.record.decisions or {}).get(op, ())
    if index < len(before) and before[index] != decides_save(result):
        policy.watch.decision_changed(op, index, before[index], result)


# policies (by code) that saved an output in some region of this process
_ever_saved: dict = BoundedCache()
# (policy, region code) pairs whose saved-nothing verdict is given: once per pair and process
_judged: dict = BoundedCache()
# regions whose saved outputs were modified in place, for strict mode's verdict
_mutations: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _policy_key(policy: Any) -> Any:
    function = _function_of(policy)
    code = code_of(function)
    if code is None:
        return id(type(policy))
    if is_library_code(code):  # torch's own policy for an op list: one per list
        return code, tuple(id(c.cell_contents) for c in function.__closure__ or ())
    return code


def _function_of(policy: Any) -> Any:
    while isinstance(policy, functools.partial):
        policy = policy.func
    if isinstance(policy, types.MethodType):
        return policy.__func__
    if isinstance(policy, types.FunctionType):
        return policy
    return inspect.getattr_static(type(policy), "__call__", None)


# ------------------------------------------------------------------------ the wrapped modes


def watched(region: Any, context_fn: Any) -> Any:
    """``context_fn`` as the guard hands it to torch: a selective-checkpoint pair gets a
    recording policy and a watched recompute mode; any other pair passes unchanged."""

    def context() -> tuple[Any, Any]:
        forward, recompute = context_fn()
        pair = _watch_modes(region, forward, recompute)
        return (forward, recompute) if pair is None else pair

    return context


@stage("watch the selective-checkpoint policy of")
def _watch_modes(region: Any, forward: Any, recompute: Any) -> tuple[Any, Any]:
    modes = _compat.selective_modes()
    if (
        modes is None
        or not isinstance(forward, modes.caching)
        or not isinstance(recompute, modes.cached)
    ):
        return forward, recompute
    policy = forward.policy_fn
    if type(policy) is RecordingPolicy:  # the same modes handed out again
        policy = policy.policy
    asks_again = getattr(recompute, "policy_fn", None) is not None  # torch <= 2.12
    record = Record(policy, asks_again)
    forward.policy_fn = RecordingPolicy(policy, record, region)
    return forward, RecomputeWatch(region, forward, recompute, record, modes)


class RecomputeWatch:
    """The recompute mode, entered through this: at the first recompute, the forward's
    decisions are judged and its saved outputs checked for in-place changes; torch's own
    error about such a change is explained as it leaves."""

    __slots__ = ("region", "forward", "recompute", "record", "modes", "judged", "mutated")

    def __init__(self, region: Any, forward: Any, recompute: Any, record: Record, modes: Any):
        self.region, self.forward, self.recompute = region, forward, recompute
        self.record, self.modes = record, modes
        self.judged = False
        self.mutated: list[tuple] = []

    def __enter__(self) -> Any:
        _watch_recompute(self.region, self)
        return self.recompute.__enter__()

    def __exit__(self, *exc: Any) -> Any:
        __tracebackhide__ = True  # a hook torch calls: pytest does not show it
        suppressed = self.recompute.__exit__(*exc)
        error, region = exc[1], self.region
        if self.mutated and type(error) is RuntimeError and _explain.MUTATED_TORCH in str(error):
            explained = _explain_refused(region, self.mutated)
            if explained is not None:  # else torch's own error goes on
                raise explained from error
        return suppressed

    def judge_forward(self) -> None:
        region, record = self.region, self.record
        self.mutated = mutated = _mutated_outputs(self.forward.storage, self.modes)
        if mutated and self.recompute.allow_cache_entry_mutation:
            if region.strict_forward is not None and region.scoped:
                _mutations[region] = mutated  # strict mode measures what it changed
            else:
                _explain.selective_cache_unmeasured(region.name, mutated, region.location())
        if record.saved or not record.calls:
            return
        region_code = region.binding.function.__code__ if region.binding.function else None
        judged_key = (record.key, region_code)
        if judged_key in _judged:
            return
        _judged[judged_key] = True
        causes = saved_nothing_causes(record, record.key in _ever_saved)
        if causes:
            _explain.selective_saved_nothing(
                region.name, policy_label(record.policy), record.calls, causes, region.location()
            )

    def decision_changed(self, op: Any, index: int, saved_before: bool, now: Any) -> None:
        region = self.region
        error = _explain.selective_decision_changed(
            region.name, policy_label(self.record.policy), str(op), index, saved_before, now
        )
        _explain.report(error, region.options.on_mismatch, region.location())


@stage("check the selective-checkpoint policy of")
def _watch_recompute(region: Any, watch: RecomputeWatch) -> None:
    if not watch.judged:
        watch.judged = True
        watch.judge_forward()
    if watch.record.decisions is not None:
        original = watch.recompute.policy_fn
        if type(original) is ComparingPolicy:
            original = original.policy
        watch.recompute.policy_fn = ComparingPolicy(original, watch)


@stage("explain torch's error in")
def _explain_refused(region: Any, mutated: list[tuple]) -> CheckpointGuardError:
    return _explain.selective_cache_refused(region.name, mutated)


def take_mutations(region: Any) -> list[tuple] | None:
    """Strict mode: the saved outputs this region's forward modified in place, if any."""
    return _mutations.pop(region, None)


def _mutated_outputs(storage: Any, modes: Any) -> list[tuple]:
    """(op, call index, version when saved, version now) of each saved output modified in
    place since (storage: op -> call index -> saved outputs; a list per op up to 2.12)."""
    found = []
    wrapper = modes.version_wrapper
    for op, entries in list(storage.items()):
        pairs = entries.items() if isinstance(entries, dict) else enumerate(entries)
        for index, entry in pairs:
            for leaf in _compat.tree_leaves(entry):
                if type(leaf) is not wrapper or leaf.version is None:
                    continue
                now = leaf.val._version
                if now != leaf.version:
                    found.append((str(op), index, leaf.version, now))
    return found


# ------------------------------------------------------ what the policy's code names as ops

_OP_TYPES = _compat.OP_OVERLOAD_TYPES
_PACKET = _compat.OP_PACKET_TYPE
_NAMESPACES = _compat.OP_NAMESPACE_TYPES
_ROOTS = frozenset({"LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF", "LOAD_FAST", "LOAD_FAST_CHECK"})
_ATTRIBUTES = frozenset({"LOAD_ATTR", "LOAD_METHOD"})
MAX_CONTAINER = 256  # elements of a container of ops read


def _is_list_form(policy: Any) -> bool:
    """torch's own policy for ``create_selective_checkpoint_contexts([ops])``."""
    code = code_of(_function_of(policy))
    return code is not None and is_library_code(code)


def policy_label(policy: Any) -> str:
    code = code_of(_function_of(policy))
    if _is_list_form(policy):
        listed = [v for _, v in _named_ops(policy) if isinstance(v, _OP_TYPES)]
        return f"for the op list [{', '.join(map(str, listed))}]"
    return f"{function_name(policy)} ({code_location(code)})"


def saved_nothing_causes(record: Record, saved_elsewhere: bool) -> list[tuple[str, str, str]]:
    """Why a policy that saved nothing in a region did so, as (kind, what the code names,
    what became of it): certain causes (a packet or Python function its code names whose aten
    op the region ran; answers torch reads as recompute) always, and, for a policy that has
    saved nothing in any region so far, the ops its code names (whether they ran, or that
    torch never asks a policy about them: ``record.calls`` holds only the ops torch asked
    about, so an op it passes through would read as never run). Empty: its code names no op,
    or it saves elsewhere and nothing certain explains this region."""
    ran = record.calls
    causes: list[tuple[str, str, str]] = []
    named = _named_ops(record.policy)
    if _is_list_form(record.policy):  # torch's own policy: its variable names mean nothing
        named = [("", value) for _, value in named]
    for label, value in named:
        if isinstance(value, _OP_TYPES):
            continue
        if isinstance(value, _PACKET):
            kind, matching = "packet", [op for op in ran if _packet_of(op) is value]
        else:
            name = getattr(value, "__name__", "")
            kind, matching = "function", [op for op in ran if _packet_name(op) == name]
        if matching:
            causes.append((kind, _describe(label, value), _counted(matching, ran)))
    for op, (shown, count) in record.invalid.items():
        causes.append(("answer", shown, f"{op} x{count}"))
    if causes or saved_elsewhere:
        return causes
    for label, value in named:
        if isinstance(value, _OP_TYPES) and value in _compat.SAC_IGNORED_OPS:
            causes.append(("ignored", _describe(label, value), ""))  # whether it ran or not
        elif isinstance(value, (*_OP_TYPES, _PACKET)):
            state = f"ran x{ran[value]}" if value in ran else "never ran"
            causes.append(("overload", _describe(label, value), state))
    return causes


def _describe(label: str, value: Any) -> str:
    if isinstance(value, _PACKET):
        shown = f"torch.ops.{value} (an OpOverloadPacket)"
    elif isinstance(value, _OP_TYPES):
        shown = str(value)
    else:
        shown = f"{getattr(value, '__module__', '')}.{getattr(value, '__name__', value)}"
        shown += " (a Python function)"
    return shown if label in ("", shown, shown.split(" (")[0]) else f"{label} = {shown}"


def _counted(ops: list, ran: dict) -> str:
    return ", ".join(f"{op} x{ran[op]}" for op in ops)


def _packet_of(op: Any) -> Any:
    return getattr(op, "overloadpacket", None)


def _packet_name(op: Any) -> str:
    packet = _packet_of(op)
    return getattr(packet, "__name__", "") if packet is not None else ""


def _named_ops(policy: Any) -> list[tuple[str, Any]]:
    """(how the code names it, the object) for every op, op packet and torch function the
    policy's code reaches: through its globals, closure, defaults, ``functools.partial``
    arguments and its object's attributes, directly or inside a container."""
    found: dict[int, tuple[str, Any]] = {}
    bound = None
    while isinstance(policy, functools.partial):
        for index, value in enumerate(policy.args):
            _collect(found, f"functools.partial argument {index}", value)
        for name, value in policy.keywords.items():
            _collect(found, f"functools.partial argument {name}", value)
        policy = policy.func
    if isinstance(policy, types.MethodType):
        bound, policy = policy.__self__, policy.__func__
    elif not isinstance(policy, types.FunctionType):
        bound, policy = policy, inspect.getattr_static(type(policy), "__call__", None)
    if not isinstance(policy, types.FunctionType):
        return list(found.values())
    code = policy.__code__
    cells = dict(zip(code.co_freevars, policy.__closure__ or (), strict=True))
    receiver = code.co_varnames[0] if bound is not None and code.co_argcount else None
    for root, attrs in _chains(code):
        if root in cells:
            try:
                value = cells[root].cell_contents
            except ValueError:
                continue
        elif root == receiver:
            value = bound
        elif root in policy.__globals__:
            value = policy.__globals__[root]
        else:  # a local variable, a builtin, or a name of nested code's own closure
            continue
        _follow(found, root, value, attrs)
    for value in (*(policy.__defaults__ or ()), *(policy.__kwdefaults__ or {}).values()):
        _collect(found, "a default argument", value)
    return list(found.values())


def _chains(code: types.CodeType) -> Iterator[tuple[str, tuple[str, ...]]]:
    """(root name, attributes) of every load chain in the code and its nested code."""
    root: str | None = None
    attrs: list[str] = []
    for instruction in dis.get_instructions(code):
        if instruction.opname in _ATTRIBUTES and root is not None:
            attrs.append(instruction.argval)
            continue
        if root is not None:
            yield root, tuple(attrs)
        root, attrs = None, []
        if instruction.opname in _ROOTS:
            root = instruction.argval
    if root is not None:
        yield root, tuple(attrs)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _chains(const)


def _follow(found: dict, label: str, value: Any, attrs: tuple[str, ...]) -> None:
    """Along ``attrs`` from ``value``, recording the last op the chain reaches
    (``torch.ops.aten.mm.default.name`` names the overload, ``op.overloadpacket`` nothing):
    op namespaces are read with getattr (it only builds op objects), any other object only
    from its ``__dict__``, running no code of its own."""
    last: tuple[str, Any] | None = (label, value) if _is_op_like(value) else None
    for name in attrs:
        if isinstance(value, (types.ModuleType, *_NAMESPACES)):
            try:
                value = getattr(value, name)
            except Exception:  # an op name that does not exist
                break
        else:
            state = instance_dict(value)
            if state is None or name not in state:
                break
            value = state[name]
        label = f"{label}.{name}"
        if _is_op_like(value):
            last = (label, value)
        elif last is None and isinstance(value, (list, tuple, set, frozenset, dict)):
            _collect(found, label, value)
    if last is not None:
        _collect(found, *last)
    elif not attrs:
        _collect(found, label, value)


def _is_op_like(value: Any) -> bool:
    return isinstance(value, (*_OP_TYPES, _PACKET)) or _is_torch_function(value)


def _collect(found: dict, label: str, value: Any, depth: int = 0) -> bool:
    """Record ``value`` if it is an op, an op packet or a torch function, or the ops inside
    it if it is a container; whether anything was recorded."""
    if isinstance(value, (*_OP_TYPES, _PACKET)) or _is_torch_function(value):
        found.setdefault(id(value), (label, value))
        return True
    if depth < 2 and isinstance(value, (list, tuple, set, frozenset, dict)):
        items = list(value.items() if isinstance(value, dict) else value)[:MAX_CONTAINER]
        recorded = False
        for item in items:
            inner = label if label.startswith("an element of") else f"an element of {label}"
            for part in item if isinstance(value, dict) else (item,):
                recorded |= _collect(found, inner, part, depth + 1)
        return recorded
    return False


def _is_torch_function(value: Any) -> bool:
    """A Python-level torch function (``torch.mm``, ``F.linear``), not one of the ops torch
    hands a policy; classes, the checkpoint API and op namespaces are not."""
    if not callable(value) or isinstance(value, (type, *_NAMESPACES)):
        return False
    module = getattr(value, "__module__", None) or ""
    return (module == "torch" or module.startswith("torch.")) and not module.startswith(
        (CheckpointPolicy.__module__, _PACKET.__module__)
    )
