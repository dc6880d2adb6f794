"""Regions people write themselves, found as wrappers are (not configured).

A ``torch.autograd.Function`` subclass whose ``forward`` runs a function it is given and
keeps it on ``ctx``, and whose ``backward`` runs it again (``ctx.run_function(...)``): the
design of torch's own reentrant checkpoint, of fairscale's and of fairseq's. ``C.apply`` is
a region source: the region is the argument ``forward`` keeps; the RNG state is restored
only if ``forward`` saves one and ``backward`` sets it back; it takes no ``use_reentrant``.

(Decorators that put a method under checkpoint and module classes whose ``forward``
checkpoints the module they hold are found by the site layer: their checkpoint calls are
ordinary source calls.)
"""

from __future__ import annotations

import ast

from ckptlint.regions.sources import RegionSource
from ckptlint.resolution.bodies import own_nodes
from ckptlint.resolution.values import ClassValue

# Calls that save the RNG state (in forward) and set it back (in backward), by last name:
# torch's, fairscale's and fairseq's helpers, Megatron's and DeepSpeed's trackers.
_SAVES_RNG = frozenset(
    {"get_rng_state", "get_device_states", "get_states", "_get_cuda_rng_state", "get_state"}
)
_RESTORES_RNG = frozenset(
    {"set_rng_state", "set_device_states", "set_states", "_set_cuda_rng_state", "fork_rng"}
)
# A parameter of forward that switches the saving off (torch's CheckpointFunction).
_RNG_SWITCHES = ("preserve_rng_state", "preserve")


def recompute_function(cls: ClassValue, qualified: str) -> RegionSource | None:
    """The region source ``cls.apply`` is, when ``cls`` recomputes a function it is given
    (see the module docstring); None otherwise."""
    forward = _method(cls.node, "forward")
    backward = _method(cls.node, "backward")
    if forward is None or backward is None:
        return None
    parameters = [*forward.args.posonlyargs, *forward.args.args]
    if len(parameters) < 2:
        return None
    context, inputs = parameters[0].arg, [p.arg for p in parameters[1:]]
    kept = _kept_on(context, forward)
    rerun = _called_on(_first_name(backward), backward)
    run = {name for name, attribute in kept.items() if attribute in rerun and name in inputs}
    region = next((name for name in inputs if name in run and _calls(name, forward)), None)
    if region is None:
        return None
    saves = _calls_named(forward, _SAVES_RNG)
    restores = _calls_named(backward, _RESTORES_RNG)
    switch = next((name for name in inputs if name in _RNG_SWITCHES), None)
    if saves and restores:
        rng = "the RNG state its forward saves and its backward sets back"
        if switch is not None:
            rng += f" (unless `{switch}` is false)"
    else:
        rng = "none: its backward does not set the RNG state back"
    return RegionSource(
        "project",
        (f"{qualified}.apply",),
        "function",
        (inputs.index(region), None),
        rng=rng,
        rng_position=inputs.index(switch) if switch is not None and saves else None,
        restores_rng=bool(saves and restores),
        display=f"{cls.node.name}.apply",
    )


def _method(node: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    found = [s for s in node.body if isinstance(s, ast.FunctionDef) and s.name == name]
    return found[-1] if found else None


def _first_name(function: ast.FunctionDef) -> str:
    parameters = [*function.args.posonlyargs, *function.args.args]
    return parameters[0].arg if parameters else ""


def _kept_on(context: str, forward: ast.FunctionDef) -> dict[str, str]:
    """``ctx.<attribute> = <parameter>`` in forward: parameter -> attribute."""
    kept = {}
    for node in own_nodes(forward.body):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name):
            for target in node.targets:
                if (
                    isinstance(target, ast.Attribute)
                    and isinstance(target.value, ast.Name)
                    and target.value.id == context
                ):
                    kept[node.value.id] = target.attr
    return kept


def _called_on(context: str, function: ast.FunctionDef) -> set[str]:
    """The attributes of ``context`` that ``function`` calls (``ctx.run_function(...)``)."""
    return {
        node.func.attr
        for node in own_nodes(function.body)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == context
    }


def _calls(name: str, function: ast.FunctionDef) -> bool:
    return any(
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name
        for node in own_nodes(function.body)
    )


def _calls_named(function: ast.FunctionDef, names: frozenset[str]) -> bool:
    for node in own_nodes(function.body):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in names:
                return True
    return False
