"""Which forward hooks changed what a region's forward computed.

A hook registered before the forward and removed before the backward does not run in the
recompute. That changes what the recompute computes only where the hook changed what the
forward computed: it returned a value (a pre-hook's new arguments, a forward hook's new
output), or it wrote into an input or output in place (their version counters show it). A
hook that only records (``acts.append(out.detach())``, as distillation, probing and
activation-logging code does) changes nothing, and its removal is no difference.

So for the forward only, each forward hook and pre-hook that can run in it (the region
module's tree, the global ones) is replaced in its dict by a ``_Probe`` that runs it and notes
what it did; the dicts get their hooks back when the forward ends, and the hooks that were
watched through every run and changed nothing are *inert*: ``_verify`` does not count their
removal. A function region's modules are seen only as they run, after torch has read their
pre-hooks for that call: their forward hooks are watched, their pre-hooks are not (and so
count as they always did). A hook added between the passes runs in the recompute only and is
always a difference.
"""

from __future__ import annotations

from typing import Any

import torch

from ckptguard import _compat
from ckptguard._compat import tree_leaves

FORWARD_TABLES = ("_forward_pre_hooks", "_forward_hooks")


def has_forward_hooks(module: torch.nn.Module) -> bool:
    state = module.__dict__
    return bool(state["_forward_hooks"] or state["_forward_pre_hooks"])


def hooked_modules(reader: Any) -> list:
    """The modules a reader reads that have forward hooks or pre-hooks. Scanned again only
    when a hook handle was made since a scan found none (``RemovableHandle.next_id``; a hook
    written into a dict without one is not watched, so its removal counts, as it always did)."""
    made = _compat.hook_handles_made()
    if reader.hookless_at == made:
        return []
    found = [m for m in reader.live_modules() if has_forward_hooks(m)]
    reader.hookless_at = None if found else made
    return found


def has_global_forward_hooks(own: frozenset) -> bool:
    """Whether a global forward hook or pre-hook other than the guard's own is registered."""
    pre, forward = _compat.GLOBAL_FORWARD_HOOKS
    if not (pre or forward):
        return False
    return any(key not in own for table in (pre, forward) for key in table)


class HookWatch:
    """The forward hooks of a region's forward, each watched by a ``_Probe`` while it runs;
    leaving the context puts the hooks back."""

    __slots__ = ("wrapped", "watched", "effective", "closed")

    def __init__(self) -> None:
        self.closed = False
        self.wrapped: list[tuple[dict, Any, Any, _Probe]] = []  # (table, key, hook, probe)
        self.watched: set = set()  # keys of the hooks watched through the whole forward
        self.effective: set = set()  # keys of the hooks that changed what the forward computed

    def watch_module(self, module: torch.nn.Module, pre_hooks: bool = True) -> None:
        state = module.__dict__
        if pre_hooks:
            self._wrap(state["_forward_pre_hooks"], True, frozenset())
        self._wrap(state["_forward_hooks"], False, frozenset())

    def watch_globals(self, own: frozenset) -> None:
        pre, forward = _compat.GLOBAL_FORWARD_HOOKS
        self._wrap(pre, True, own)
        self._wrap(forward, False, own)

    def _wrap(self, table: dict, pre: bool, own: frozenset) -> None:
        for key, hook in list(table.items()):
            if key not in own:
                probe = _Probe(hook, key, pre, self)
                table[key] = probe
                self.wrapped.append((table, key, hook, probe))

    def __enter__(self) -> HookWatch:
        return self

    def __exit__(self, *exc: Any) -> None:
        """Each hook back in its dict, where the probe is still there (a hook removed during
        the forward stays removed)."""
        wrapped, self.wrapped = self.wrapped, []
        self.closed = True
        self.watched.update(key for _, key, _, _ in wrapped)
        for table, key, hook, probe in reversed(wrapped):
            if table.get(key) is probe:
                # another thread's forward, over when this one began, may have left its probe
                while type(hook) is _Probe and hook.watch.closed:
                    hook = hook.hook
                table[key] = hook

    def inert(self) -> frozenset:
        """The keys of the hooks watched through the forward that changed nothing."""
        return frozenset(self.watched - self.effective)


class _Probe:
    """A hook as the forward runs it: what it returns and what it writes in place noted."""

    __slots__ = ("hook", "key", "pre", "watch")

    def __init__(self, hook: Any, key: Any, pre: bool, watch: HookWatch) -> None:
        self.hook, self.key, self.pre, self.watch = hook, key, pre, watch

    def __call__(self, module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        # a pre-hook gets (args[, kwargs]), a forward hook (args[, kwargs], output)
        given = (args[0] if len(args) == 1 else args) if self.pre else args[-1]
        versions = _versions(args)
        result = self.hook(module, *args, **kwargs)
        replaced = result is not None and not _same_objects(result, given)
        if replaced or _versions(args) != versions:
            self.watch.effective.add(self.key)
        return result


def _versions(values: Any) -> list[int]:
    return [t._version for t in tree_leaves(values) if isinstance(t, torch.Tensor)]


def _same_objects(result: Any, given: Any) -> bool:
    """Whether a hook handed back what it was given: the object itself, or a tuple of the
    same objects (a pre-hook's single value stands for a 1-tuple)."""
    if result is given:
        return True
    if type(result) is not tuple:
        return type(given) is tuple and len(given) == 1 and given[0] is result
    return (
        type(given) is tuple
        and len(result) == len(given)
        and all(a is b for a, b in zip(result, given, strict=True))
    )
