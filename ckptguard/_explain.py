"""Messages and errors: one function builds each kind of error the guard raises or warns."""

from __future__ import annotations

import os
import sys
import sysconfig
import types
import warnings
from typing import Any

from ckptguard._fingerprint import Described, LooseTensorFP, ObjectFP, TensorFP, readable
from ckptguard.errors import (
    CheckpointGuardCompatibilityError,
    CheckpointGuardError,
    CheckpointGuardWarning,
    CheckpointMismatchError,
    CheckpointMismatchWarning,
    LostGradientsError,
    abbreviate,
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
    "placement": "move or cast the model (.to(), .double(), .half()) only between steps",
    "torch_state": (
        "torch's checkpoint restores RNG and autocast for the recompute, not process-wide "
        "settings; change them only between steps, or use a context manager that ends before "
        "the forward and starts again around backward"
    ),
}


def _describe_value(value: Any) -> str:
    if isinstance(value, Described):
        return str(value)
    value = readable(value)
    if isinstance(value, TensorFP):
        where = f" {tuple(value.shape)}" if value.shape is not None else ""
        device = f" on {value.device}" if value.device is not None else ""
        return f"tensor{where} {value.dtype}{device} (version {value.version})"
    if isinstance(value, LooseTensorFP):
        return f"tensor {tuple(value.shape)} {value.dtype} on {value.device}"
    if isinstance(value, ObjectFP):  # its type is unknown where it was read by identity
        kind = f"{value.type.__qualname__} object" if value.type is not None else "an object"
        return f"{kind} at {value.ident:#x}"
    if isinstance(value, types.CodeType):
        return f"code of {getattr(value, 'co_qualname', value.co_name)}"
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], type):
        shown = ", ".join(_describe_value(v) for v in value[1]) if value[0] is not dict else ""
        if value[0] is dict:
            shown = ", ".join(f"{k!r}: {_describe_value(v)}" for k, v in value[1])
        return f"{value[0].__name__} of {len(value[1])}: {abbreviate(shown, 160)}"
    return abbreviate(value)


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
    if old.dtype == new.dtype and old.device == new.device:
        return None
    if old.device is None or old.device == new.device:
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
    """Into a container fingerprint to the first element that differs: ``factors[0]``."""
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


class Difference(Exception):
    """Internal: the first fingerprint that differs, with what explains it (raised by
    ``_verify`` at a recompute's start, made into ``mismatch_error`` by the region)."""

    def __init__(self, kind: str, name: str, where: str | None, old: Any, new: Any):
        super().__init__(name)
        self.kind, self.name, self.where, self.old, self.new = kind, name, where, old, new


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
) -> Difference:
    """A value one of the region's modules holds (``module`` its name, ``owner`` its class)."""
    where = {
        "tensor": f"parameter or buffer of {owner}",
        "attribute": f"read by {owner}'s code",
        "hook": f"hooks of {owner}",
    }.get(kind, f"{owner} module")
    if kind == "hook":
        attribute, old, new = _first_changed_table(hook_tables, old, new)
    name = f"{module}.{attribute}" if attribute else module
    return Difference(kind, name, where, old, new)


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


def argument_difference(label: str, old: Any, new: Any) -> Difference:
    return Difference("argument", label, "argument of the region", old, new)


def argument_attribute_difference(chain: str, old: Any, new: Any) -> Difference:
    where = "attribute of an object passed to or bound into the region"
    return Difference("attribute", chain, where, old, new)


def mismatch_error(
    region: str, kind: str, name: str, where: str | None, old: Any, new: Any
) -> CheckpointMismatchError:
    """A fingerprinted state that differs at recompute from what the forward saw."""
    if kind == "argument":
        kind = "tensor"
    fix = _fix_for(kind, name, where, old)
    name, old, new = _descend(name, old, new)
    kind, change = _refine(kind, old, new)
    old_text, new_text = _describe_value(old), _describe_value(new)
    message = (
        f"ckptguard [{kind}]: checkpointed region {region} would be recomputed differently "
        f"from its forward pass.\n"
        f"  what changed: {name} ({where}) {change}\n"
        f"  forward saw:  {old_text}\n"
        f"  now:          {new_text}\n"
        f"  effect: backward reruns the region with the new state, so its gradients belong to a "
        f"different computation than the forward's output; {_TORCH_DOES.get(kind, _TORCH_SILENT)}"
        f".\n"
        f"  how to fix: {fix}."
    )
    details = {"name": name, "where": where, "old": old_text, "new": new_text}
    return CheckpointMismatchError(message, kind=kind, region=region, details=details)


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


def rng_device_error(region: str, devices: list[str], preserve: bool) -> CheckpointMismatchError:
    reason = (
        "preserve_rng_state=False, so torch restores no RNG state"
        if not preserve
        else "torch stashes the RNG state only for CPU and for the devices of tensor positional "
        "arguments"
    )
    message = (
        f"ckptguard [rng_device]: checkpointed region {region} drew random numbers on "
        f"{', '.join(devices)} during its forward, but {reason}; the recompute will draw "
        f"different numbers there and its gradients will not match the forward.\n"
        f"  how to fix: pass a tensor on each of these devices as a positional argument of "
        f"checkpoint, keep preserve_rng_state=True, or draw the random numbers outside the "
        f"region and pass them in."
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
        f"a second time: {', '.join(names)}.\n"
        f"  effect: {effect}.\n"
        f"  how to fix: {fix}."
    )
    warn(message, CheckpointGuardWarning, fallback)


def internal_error(region: str, stage: str, error: Exception) -> None:
    """The guard failed on a region (its own bug, or state it cannot read): a warning, since
    the user's training must go on; the region runs unguarded from here."""
    message = (
        f"ckptguard [internal]: could not {stage} checkpointed region {region}: "
        f"{type(error).__name__}: {error}.\n"
        f"  effect: this region runs without the guard from here (torch's checkpoint is not "
        f"affected); other regions stay guarded.\n"
        f"  how to fix: this is a ckptguard bug; please report it with this message (run with "
        f"-W error::ckptguard.CheckpointGuardWarning for the traceback)."
    )
    warn(message, CheckpointGuardWarning, None)


def lost_gradients(
    region: str, parameters: list[str], nested: list[str], raise_: bool, fallback: Location | None
) -> None:
    """A reentrant region whose parameters or nested tensor inputs will get no gradient."""
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
    message = (
        f"ckptguard [lost_gradients]: checkpoint(use_reentrant=True) region {region}: "
        f"{'; '.join(parts)}.\n"
        f"  how to fix: use use_reentrant=False, or pass an input that requires grad (e.g. "
        f"call model.enable_input_require_grads() with frozen embeddings), and pass tensors as "
        f"positional arguments."
    )
    if raise_:
        details = {"parameters": parameters, "nested": nested}
        raise LostGradientsError(message, kind="lost_gradients", region=region, details=details)
    warn(message, CheckpointGuardWarning, fallback)


def compatibility_error(version: str, missing: str) -> CheckpointGuardCompatibilityError:
    return CheckpointGuardCompatibilityError(
        f"ckptguard cannot guard checkpoints on torch {version}: it needs {missing}, which this "
        f"version lacks. Regions would run unguarded, so enable() refuses. ckptguard supports "
        f"torch>=2.4; please report this torch version."
    )


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
    from ckptguard._compat import torch_dir  # _compat imports this module

    if filename.startswith((_OWN_DIR, torch_dir())):
        return False
    return not filename.startswith(_STDLIB_DIR) or any(d in filename for d in _PACKAGE_DIRS)


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
    stack (a backward run by an accelerator's worker thread)."""
    found = user_location()
    if found is not None:
        module_globals, (filename, lineno) = found
        registry = module_globals.setdefault("__warningregistry__", {})
        module = module_globals.get("__name__", "__main__")
        warnings.warn_explicit(
            message, category, filename, lineno, module, registry, module_globals
        )
    elif fallback is not None:
        warnings.warn_explicit(message, category, fallback[0], fallback[1])
    else:
        warnings.warn(message, category, stacklevel=2)
