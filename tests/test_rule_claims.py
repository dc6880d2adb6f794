"""What CKP002 and CKP501-503 tell users about torch, checked on the installed torch: if a
release changes it, these fail before the rules' messages go stale."""

from __future__ import annotations

import functools
import warnings

import pytest

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils.checkpoint import (  # noqa: E402
    CheckpointPolicy,
    checkpoint,
    checkpoint_sequential,
    create_selective_checkpoint_contexts,
)

from ckptlint.rules.missing_use_reentrant import REGION_KEYWORDS_ERROR  # noqa: E402
from ckptlint.rules.rejected_options import REENTRANT_ERROR  # noqa: E402

MM = torch.ops.aten.mm


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"use_reentrant": True, "context_fn": "sac"}, "only supported when use_reentrant=False"),
        ({"context_fn": "sac"}, "only supported when use_reentrant=False"),
        ({"use_reentrant": True, "debug": True}, "only supported when use_reentrant=False"),
        ({"use_reentrant": False, "context_fn": "sac", "debug": True}, "incompatible"),
    ],
)
def test_checkpoint_rejects_these_options_at_the_first_step(options: dict, error: str) -> None:
    if options.get("context_fn") == "sac":
        options["context_fn"] = functools.partial(create_selective_checkpoint_contexts, [])
    x = torch.randn(2, 4, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # use_reentrant left out
        with pytest.raises(ValueError, match=error):
            checkpoint(torch.nn.Linear(4, 4), x, **options)


def test_the_quoted_reentrant_error_is_torch_s() -> None:
    sac = functools.partial(create_selective_checkpoint_contexts, [])
    with pytest.raises(ValueError) as raised:
        checkpoint(torch.nn.Linear(4, 4), torch.randn(2, 4), use_reentrant=True, context_fn=sac)
    assert str(raised.value).replace("`", "") == REENTRANT_ERROR.removeprefix("ValueError: ") + "."


def test_checkpoint_sequential_rejects_context_fn_in_either_variant() -> None:
    sac = functools.partial(create_selective_checkpoint_contexts, [])
    layers = [torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)]
    with pytest.raises(ValueError, match="Unexpected keyword arguments: context_fn"):
        checkpoint_sequential(layers, 2, torch.randn(2, 4), use_reentrant=False, context_fn=sac)


class _CountMatmuls(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func is MM.default
        return func(*args, **(kwargs or {}))


def _matmuls_in_backward(policy) -> int:
    """aten.mm calls during the backward of a region of two matmuls: the gradient's own,
    plus those recomputed (a saved matmul is not run again)."""
    w = torch.randn(8, 8, requires_grad=True)
    x = torch.randn(4, 8, requires_grad=True)

    def region(h):
        return torch.tanh(torch.mm(torch.mm(h, w), w))

    context_fn = functools.partial(create_selective_checkpoint_contexts, policy)
    out = checkpoint(region, x, use_reentrant=False, context_fn=context_fn).sum()
    with _CountMatmuls() as counter:
        out.backward()
    return counter.count


def _saving(matches):
    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if matches(op) else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def test_a_policy_comparing_with_a_packet_or_a_python_function_saves_nothing() -> None:
    recompute_all = _matmuls_in_backward(lambda ctx, op, *a, **k: False)
    save_matmuls = _matmuls_in_backward(_saving(lambda op: op == MM.default))
    assert save_matmuls < recompute_all
    assert _matmuls_in_backward(_saving(lambda op: op == MM)) == recompute_all
    assert _matmuls_in_backward(_saving(lambda op: op in {MM})) == recompute_all
    assert _matmuls_in_backward(_saving(lambda op: op in (torch.mm, torch.matmul))) == recompute_all
    assert _matmuls_in_backward(_saving(lambda op: op.overloadpacket == MM)) == save_matmuls


def test_torch_reads_a_bool_as_a_policy_and_anything_else_as_recompute() -> None:
    recompute_all = _matmuls_in_backward(lambda ctx, op, *a, **k: False)
    save_matmuls = _matmuls_in_backward(_saving(lambda op: op == MM.default))
    assert _matmuls_in_backward(lambda ctx, op, *a, **k: op == MM.default) == save_matmuls
    assert _matmuls_in_backward(lambda ctx, op, *a, **k: int(op == MM.default)) == recompute_all
    value = CheckpointPolicy.MUST_SAVE.value
    assert _matmuls_in_backward(lambda ctx, op, *a, **k: value) == recompute_all


def test_which_releases_call_the_policy_again_in_the_recompute() -> None:
    """CKP503's premise: up to 2.12 the policy runs again with ``is_recompute=True``; from
    2.13 on only in the forward."""
    calls = {True: 0, False: 0}

    def policy(ctx, op, *args, **kwargs):
        calls[ctx.is_recompute] += 1
        return CheckpointPolicy.PREFER_RECOMPUTE

    _matmuls_in_backward(policy)
    major, minor = (int(part) for part in torch.__version__.split(".")[:2])
    assert calls[False] > 0
    assert (calls[True] == 0) == ((major, minor) >= (2, 13))


def test_the_reentrant_variant_rejects_keywords_for_the_region() -> None:
    """CKP001's message for ``checkpoint(fn, x, mask=m)``: torch's own error, raised with
    ``use_reentrant`` left out, None or True, never by the non-reentrant variant."""
    x, mask = torch.randn(2, 4, requires_grad=True), torch.randn(2, 4)

    def region(h: torch.Tensor, mask: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return (h * mask * scale).tanh()

    for options in ({}, {"use_reentrant": None}, {"use_reentrant": True}):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # use_reentrant left out
            with pytest.raises(ValueError) as raised:
                checkpoint(region, x, mask=mask, scale=2.0, **options)
        assert f"{type(raised.value).__name__}: {raised.value}" == (
            REGION_KEYWORDS_ERROR + "mask,scale"
        )
    out = checkpoint(region, x, mask=mask, scale=2.0, use_reentrant=False)
    assert torch.equal(out, region(x, mask, 2.0))
