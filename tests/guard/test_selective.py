"""Issue 20: selective-checkpoint policies at run time (``context_fn=`` with
``create_selective_checkpoint_contexts``).

* A policy that saved nothing in a region whose code names ops to save: plain torch recomputes
  every op (shown by counting the ops the recompute runs) with right gradients and no word; the
  guard warns once, naming the ops torch asked about and why nothing was kept.
* A policy whose decisions change between the forward and the recompute: the tests measure
  whether this torch asks the policy in the recompute at all (2.13 does not, 2.12 does) and
  expect what follows: named before torch uses another call's output where it asks, right
  gradients and silence where it does not.
* A saved output modified in place: torch's bare error explained; with
  ``allow_cache_entry_mutation=True`` strict mode measures whether the gradients change.
Gradients stay bit-identical under the guard wherever nothing is wrong.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import warnings

import pytest
import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

import ckptguard

aten = torch.ops.aten
MM = aten.mm.default


def _weight() -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(6, 6, requires_grad=True)


WEIGHT = _weight()


def region(x: torch.Tensor) -> torch.Tensor:
    """Three matmuls of one shape: a saved output of one call fits any other."""
    return torch.mm(torch.mm(torch.mm(x, WEIGHT).sin(), WEIGHT).cos(), WEIGHT).tanh()


def _input() -> torch.Tensor:
    return torch.randn(4, 6, generator=torch.Generator().manual_seed(1), requires_grad=True)


class _RecomputedOps(TorchDispatchMode):
    """Entered just outside the recompute mode: sees the ops the recompute runs, not those
    whose saved output it takes (the recompute mode returns those without running them)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func] += 1
        return func(*args, **(kwargs or {}))


class _Counted:
    """A recompute context: the counting mode, then torch's recompute mode inside it."""

    def __init__(self, recompute, counter: _RecomputedOps) -> None:
        self.recompute, self.counter = recompute, counter

    def __enter__(self):
        self.counter.__enter__()
        return self.recompute.__enter__()

    def __exit__(self, *exc):
        self.recompute.__exit__(*exc)
        return self.counter.__exit__(*exc)


def recomputed_matmuls(policy) -> int:
    """Plain torch: how many matmuls the recompute of ``region`` runs under ``policy``."""
    counter = _RecomputedOps()

    def context():
        forward, recompute = create_selective_checkpoint_contexts(policy)
        return forward, _Counted(recompute, counter)

    checkpoint(region, _input(), use_reentrant=False, context_fn=context).sum().backward()
    WEIGHT.grad = None
    return counter.ops[MM]


def gradients(context_fn, fn=region, guard: dict | None = None) -> tuple[list, list[str]]:
    """(gradients of the weight and the input, the guard's warnings); under the guard with
    ``guard``'s options, plainly without it."""
    x = _input()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with ckptguard.guard(**guard) if guard is not None else contextlib.nullcontext():
            checkpoint(fn, x, use_reentrant=False, context_fn=context_fn).sum().backward()
    grads = [WEIGHT.grad.clone(), x.grad.clone()]
    WEIGHT.grad = None
    messages = [str(w.message) for w in caught if str(w.message).startswith("ckptguard")]
    return grads, messages


def unchecked() -> list:
    x = _input()
    region(x).sum().backward()
    grads = [WEIGHT.grad.clone(), x.grad.clone()]
    WEIGHT.grad = None
    return grads


def _equal(first: list, second: list) -> bool:
    return all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


# ------------------------------------------------------------------ policies saving nothing


def packet_policy(ctx, op, *args, **kwargs):
    if op == torch.ops.aten.mm:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


TO_SAVE = {torch.ops.aten.mm, torch.ops.aten.bmm}


def set_of_packets_policy(ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE if op in TO_SAVE else CheckpointPolicy.PREFER_RECOMPUTE


def function_policy(ctx, op, *args, **kwargs):
    return op is torch.mm


def answer_policy(ctx, op, *args, **kwargs):
    return "save" if op == aten.mm.default else CheckpointPolicy.PREFER_RECOMPUTE


def size_policy(ctx, op, *args, **kwargs):
    """Saves a size query (as PyTorch's test_subclass_dispatching_sizes does): torch runs
    those without asking the policy, whether the region runs them or not."""
    if op is torch.ops.aten.sym_size.default:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


SAVES_NOTHING = {
    "packet": (
        packet_policy,
        "its code compares the op with torch.ops.aten.mm (an OpOverloadPacket); torch calls a "
        "policy with an OpOverload (this region ran aten.mm.default x3), which never equals "
        "its packet",
    ),
    "set_of_packets": (
        set_of_packets_policy,
        "its code compares the op with an element of TO_SAVE = torch.ops.aten.mm (an "
        "OpOverloadPacket)",
    ),
    "python_function": (
        function_policy,
        "its code compares the op with torch.mm (a Python function); torch calls a policy "
        "with the aten op (this region ran aten.mm.default x3)",
    ),
    "answer": (
        answer_policy,
        "it answered 'save' for aten.mm.default x3; torch saves an output only for "
        "CheckpointPolicy.MUST_SAVE or PREFER_SAVE (or True)",
    ),
    "op_list_of_another_op": (
        [aten.addmm.default],
        "its code names aten.addmm.default, which never ran in this region",
    ),
    "op_torch_never_asks_about": (
        size_policy,
        "its code names torch.ops.aten.sym_size.default = aten.sym_size.default, which torch "
        "never asks a policy about: selective checkpointing runs detach and the size, stride "
        "and device queries without asking",
    ),
}


@pytest.mark.parametrize("name", list(SAVES_NOTHING))
def test_policy_that_saves_nothing_is_named_with_its_ops(name: str) -> None:
    policy, why = SAVES_NOTHING[name]
    assert recomputed_matmuls(policy) == 3, "plain torch recomputes every matmul"
    context = functools.partial(create_selective_checkpoint_contexts, policy)
    plain, messages = gradients(context)
    assert messages == [] and _equal(plain, unchecked())  # right gradients, no word
    guarded, messages = gradients(context, guard={})
    assert _equal(plain, guarded)
    assert len(messages) == 1, messages
    message = messages[0]
    label = "for the op list [aten.addmm.default]" if name == "op_list_of_another_op" else ""
    assert message.startswith(
        f"ckptguard [selective_policy]: the selective-checkpoint policy "
        f"{label or getattr(policy, '__name__', '')}"
    ), message
    assert "of checkpointed region region (" in message
    assert (
        "saved no op's output: torch asked it about 6 ops (aten.mm.default x3, "
        "aten.sin.default x1, aten.cos.default x1, aten.tanh.default x1) and it chose "
        "recompute for every one"
    ) in message
    assert f"  why: {why}" in message, message
    # once per policy and region: the next steps say nothing more
    with ckptguard.guard():
        _, messages = gradients(context)
    assert messages == []


def good_policy(ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE if op == MM else CheckpointPolicy.PREFER_RECOMPUTE


def packet_compared_right(ctx, op, *args, **kwargs):
    if getattr(op, "overloadpacket", None) == torch.ops.aten.mm:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def recompute_everything(ctx, op, *args, **kwargs):
    return CheckpointPolicy.PREFER_RECOMPUTE


@pytest.mark.parametrize(
    "policy",
    [good_policy, packet_compared_right, [MM], recompute_everything, lambda c, op, *a, **k: True],
    ids=["overload", "overloadpacket", "op_list", "names_no_op", "bool"],
)
def test_policies_that_save_are_silent_and_bit_identical(policy) -> None:
    context = functools.partial(create_selective_checkpoint_contexts, policy)
    plain, _ = gradients(context)
    guarded, messages = gradients(context, guard={})
    assert messages == [] and _equal(plain, guarded)
    strict, messages = gradients(context, guard={"strict": True})
    assert messages == [] and _equal(plain, strict)


def test_a_region_without_the_named_op_is_silent_when_the_policy_saves_elsewhere() -> None:
    """One policy for every block: a block running no matmul saves nothing, as intended."""
    torch.manual_seed(0)
    blocks = nn.ModuleList([nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 6)])
    policy = functools.partial(
        create_selective_checkpoint_contexts, lambda c, op, *a, **k: op == aten.addmm.default
    )

    def run() -> tuple[list, list]:
        x = _input()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for block in blocks:
                x = checkpoint(block, x, use_reentrant=False, context_fn=policy)
            x.sum().backward()
        grads = [p.grad.clone() for p in blocks.parameters()]
        blocks.zero_grad(set_to_none=True)
        return grads, [str(w.message) for w in caught if "ckptguard" in str(w.message)]

    plain, _ = run()
    with ckptguard.guard():
        guarded, messages = run()
    assert messages == [] and _equal(plain, guarded)


# ------------------------------------------------------- decisions of forward and recompute


def counting_policy(parity: int):
    """Saves every other matmul by counting calls, and never reads ctx.is_recompute."""
    counts = collections.Counter()

    def policy(ctx, op, *args, **kwargs):
        if op == MM:
            counts["mm"] += 1
            if counts["mm"] % 2 == parity:
                return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def asks_policy_in_recompute() -> bool:
    """Measured: does this torch call the policy while it recomputes?"""
    seen = []

    def policy(ctx, op, *args, **kwargs):
        seen.append(ctx.is_recompute)
        return CheckpointPolicy.PREFER_RECOMPUTE

    context = functools.partial(create_selective_checkpoint_contexts, policy)
    checkpoint(region, _input(), use_reentrant=False, context_fn=context).sum().backward()
    WEIGHT.grad = None
    return True in seen


@pytest.mark.parametrize("parity", [0, 1], ids=["second", "first_and_third"])
def test_policy_counting_calls_in_both_passes(parity: int) -> None:
    context = lambda: create_selective_checkpoint_contexts(counting_policy(parity))  # noqa: E731
    if not asks_policy_in_recompute():
        # torch 2.13 and later: the policy decides in the forward only, nothing can differ
        plain, _ = gradients(context)
        assert _equal(plain, unchecked())
        guarded, messages = gradients(context, guard={})
        assert messages == [] and _equal(plain, guarded)
        return
    # torch <= 2.12: the recompute's answers move on with the count
    try:
        plain, _ = gradients(context)
    except RuntimeError as error:
        assert "backward an extra time" in str(error) or "not found in storage" in str(error)
    else:
        assert not _equal(plain, unchecked()), "another call's saved output was used"
    with pytest.raises(ckptguard.CheckpointMismatchError) as info:
        gradients(context, guard={})
    error = info.value
    assert error.kind == "selective_policy" and error.details["op"] == "aten.mm.default"
    assert "decided differently in the recompute" in str(error)
    assert "count the forward and the recompute apart (ctx.is_recompute)" in str(error)


def test_policy_reading_is_recompute_is_silent_and_bit_identical() -> None:
    def make():
        counts = collections.Counter()

        def policy(ctx, op, *args, **kwargs):
            if op == MM:
                key = "recompute" if ctx.is_recompute else "forward"
                counts[key] += 1
                if counts[key] % 2 == 0:
                    return CheckpointPolicy.MUST_SAVE
            return CheckpointPolicy.PREFER_RECOMPUTE

        return create_selective_checkpoint_contexts(policy)

    plain, _ = gradients(make)
    assert _equal(plain, unchecked())
    guarded, messages = gradients(make, guard={})
    assert messages == [] and _equal(plain, guarded)


# ------------------------------------------------------- saved outputs modified in place


def doubled(x: torch.Tensor) -> torch.Tensor:
    y = torch.mm(x, WEIGHT)
    y.mul_(2.0)  # the saved output of the matmul, changed
    return y.sin()


def rectified(x: torch.Tensor) -> torch.Tensor:
    y = torch.mm(x, WEIGHT)
    y.relu_()  # changed too, but relu_ gives the same result applied twice
    return y.sin()


def _unchecked_of(fn) -> list:
    x = _input()
    fn(x).sum().backward()
    grads = [WEIGHT.grad.clone(), x.grad.clone()]
    WEIGHT.grad = None
    return grads


def _mutating(allow: bool):
    return functools.partial(
        create_selective_checkpoint_contexts, good_policy, allow_cache_entry_mutation=allow
    )


def test_saved_output_modified_in_place_is_named_where_torch_refuses() -> None:
    with pytest.raises(RuntimeError) as plain:
        gradients(_mutating(False), fn=doubled)
    assert str(plain.value) == ckptguard._explain.MUTATED_TORCH  # torch: no op, no place
    for strict in (False, True):
        with pytest.raises(ckptguard.CheckpointMismatchError) as info:
            gradients(_mutating(False), fn=doubled, guard={"strict": strict})
        error = info.value
        assert error.kind == "selective_cache" and error.details["outputs"] == [
            "aten.mm.default #0"
        ]
        assert type(error.__cause__) is RuntimeError
        assert str(error.__cause__) == ckptguard._explain.MUTATED_TORCH
        assert "aten.mm.default call #0 (version 0 -> 1)" in str(error)


def test_strict_mode_measures_that_the_modified_output_changes_the_gradients() -> None:
    plain, _ = gradients(_mutating(True), fn=doubled)
    assert not _equal(plain, _unchecked_of(doubled)), "plain torch: wrong, without a word"
    _, messages = gradients(_mutating(True), fn=doubled, guard={})
    assert len(messages) == 1 and messages[0].startswith("ckptguard [selective_cache]")
    assert "the gradients may be wrong" in messages[0] and "strict=True" in messages[0]
    with pytest.raises(ckptguard.CheckpointMismatchError) as info:
        gradients(_mutating(True), fn=doubled, guard={"strict": True})
    error = info.value
    assert error.kind == "selective_cache" and error.details["outputs"] == ["aten.mm.default #0"]
    text = str(error)
    assert "(allow_cache_entry_mutation=True)" in text
    assert "the gradients are affected" in text
    assert "first differing op: #0 aten.mul_.Tensor called at " in text
    assert error.details["relative"] == pytest.approx(0.5, rel=1e-3)


def test_strict_mode_measures_that_an_idempotent_change_leaves_the_gradients() -> None:
    plain, _ = gradients(_mutating(True), fn=rectified)
    assert _equal(plain, _unchecked_of(rectified))
    guarded, messages = gradients(_mutating(True), fn=rectified, guard={"strict": True})
    assert _equal(plain, guarded)
    assert len(messages) == 1 and messages[0].startswith("ckptguard [selective_cache]")
    assert "the gradients are not affected" in messages[0]
