"""Issue 28: a process-wide torch setting changed between a region's forward and its backward
counts only where the recompute runs an op whose result it changes, and that result reaches
what backward uses. Each case compares three runs with the same change made before backward:
without checkpoint (the reference: backward's own kernels see the setting too), checkpointed
without the guard, and checkpointed under the guard. The guard must raise exactly where the
checkpointed gradients differ from the reference, and stay silent, with gradients bit-identical
to plain torch's, everywhere else. Which cases differ depends on the machine's CPU (oneDNN
computes a large float32 matmul in bfloat16 under "medium" where it has AMX); the equivalence
must hold on any machine, and benchmarks/torch_settings.py prints this machine's table."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import grads_equal
from torch.utils.checkpoint import CheckpointError, checkpoint

import ckptguard

VARIANTS = pytest.mark.parametrize("reentrant", [False, True], ids=["nonreentrant", "reentrant"])


def _precision(value: str) -> tuple[Callable[[], None], Callable[[], None]]:
    before = torch.get_float32_matmul_precision()
    return (
        lambda: torch.set_float32_matmul_precision(value),
        lambda: torch.set_float32_matmul_precision(before),
    )


def _flag(owner: object, name: str, value: object) -> tuple[Callable, Callable]:
    before = getattr(owner, name)
    return lambda: setattr(owner, name, value), lambda: setattr(owner, name, before)


def _call(setter: Callable, getter: Callable, value: object) -> tuple[Callable, Callable]:
    before = getter()
    return lambda: setter(value), lambda: setter(before)


CHANGES = {
    "precision medium": lambda: _precision("medium"),
    "precision high": lambda: _precision("high"),
    "allow_tf32": lambda: _flag(torch.backends.cuda.matmul, "allow_tf32", True),
    "mkldnn off": lambda: _flag(torch.backends.mkldnn, "enabled", False),
    "deterministic": lambda: _call(
        torch.use_deterministic_algorithms, torch.are_deterministic_algorithms_enabled, True
    ),
    "flash attention off": lambda: _call(
        torch.backends.cuda.enable_flash_sdp, torch.backends.cuda.flash_sdp_enabled, False
    ),
}


class Region(nn.Module):
    """A Linear alone (backward uses its input and weight, not its output), or followed by
    tanh (backward uses tanh's output), at a size oneDNN computes in bfloat16 under "medium"
    on an AMX CPU and at one it does not; a convolution; causal attention."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.kind = kind
        width = 512 if kind.endswith("large") else 6
        self.fc = nn.Linear(width, width)
        self.conv = nn.Conv2d(4, 8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind.startswith("linear"):
            return self.fc(x)
        if self.kind.startswith("tanh"):
            return torch.tanh(self.fc(x))
        if self.kind == "conv":
            return torch.tanh(self.conv(x))
        q = x.view(2, 4, 32, 8)
        return torch.tanh(F.scaled_dot_product_attention(q, q, q, is_causal=True))


def _input(kind: str) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    if kind == "conv":
        shape: tuple[int, ...] = (2, 4, 8, 8)
    elif kind == "attention":
        shape = (2, 4, 32, 8)
    else:
        shape = (64, 512) if kind.endswith("large") else (4, 6)
    return torch.randn(*shape, generator=generator, requires_grad=True)


def _gradients(
    kind: str, change: str, checkpointed: bool, reentrant: bool, guard: dict | None
) -> tuple[list | None, BaseException | None]:
    """The gradients (None where backward raised) and the error raised: the guard's, or
    torch's own CheckpointError where the recompute saved tensors of other shapes."""
    region = Region(kind)
    x = _input(kind)
    apply, undo = CHANGES[change]()
    error = None
    context = ckptguard.guard(**guard) if guard is not None else contextlib.nullcontext()
    with context:
        try:
            if checkpointed:
                out = checkpoint(region, x, use_reentrant=reentrant)
            else:
                out = region(x)
            apply()
            out.sum().backward()
        except CheckpointError as found:  # the guard's errors are CheckpointErrors too
            error = found
        finally:
            undo()
    if error is not None:
        return None, error
    return [p.grad for p in region.parameters()] + [x.grad], error


KINDS = ["linear small", "linear large", "tanh small", "tanh large", "conv", "attention"]


@VARIANTS
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("change", list(CHANGES))
def test_a_setting_is_named_exactly_where_it_changes_the_gradients(
    change: str, kind: str, reentrant: bool
) -> None:
    reference, _ = _gradients(kind, change, False, reentrant, None)
    plain, torch_error = _gradients(kind, change, True, reentrant, None)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ckptguard.CheckpointMismatchWarning)
        guarded, error = _gradients(kind, change, True, reentrant, {})
    if plain is not None and grads_equal(reference, plain):
        assert error is None, str(error)
        assert grads_equal(guarded, plain)
    else:  # silently different gradients, or torch's own error about the saved tensors
        assert error is not None, f"the guard missed it (torch raised: {torch_error!r})"
        assert isinstance(error, ckptguard.CheckpointMismatchError), repr(error)
        assert error.kind == "torch_state" and error.details["certain"] is True
        assert "and backward uses it" in error.details["evidence"]


def _on_this_machine(kind: str, change: str, reentrant: bool) -> bool:
    reference, _ = _gradients(kind, change, False, reentrant, None)
    plain, _ = _gradients(kind, change, True, reentrant, None)
    return plain is None or not grads_equal(reference, plain)


@pytest.mark.parametrize("change", ["precision medium", "allow_tf32"])
@VARIANTS
def test_the_issue_s_cpu_linear_region_is_silent(change: str, reentrant: bool) -> None:
    """Issue 28's alarms: a CPU Linear region, the setting changed before backward, the
    gradients bit-identical with and without the guard: no error and no warning."""
    plain, _ = _gradients("linear small", change, True, reentrant, None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        guarded, error = _gradients("linear small", change, True, reentrant, {})
    assert error is None and plain is not None and grads_equal(plain, guarded)


def test_some_case_differs_on_this_machine() -> None:
    """The equivalence above is not vacuous here: a convolution without oneDNN computes
    different values on any CPU build that has it, and the guard names it."""
    if not torch.backends.mkldnn.is_available():
        pytest.skip("this torch has no oneDNN")
    assert _on_this_machine("conv", "mkldnn off", reentrant=False)
    _, error = _gradients("conv", "mkldnn off", True, False, {})
    assert error is not None and error.details["name"] == "torch.backends.mkldnn.enabled"
    assert "aten.convolution" in error.details["evidence"]


def _in_place_region(weight: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    def region(x: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(x.shape[0], weight.shape[1])
        out.addmm_(x, weight)  # an in-place matmul: it cannot be run a second time
        return torch.tanh(out)

    return region


@pytest.mark.parametrize("strict", [False, True], ids=["default", "strict"])
def test_an_op_the_guard_cannot_run_again_makes_it_a_may(strict: bool) -> None:
    """An in-place matmul the recompute runs under a changed precision: the guard cannot tell
    whether its result changed. Default mode warns that it may have; strict mode raises."""
    torch.manual_seed(0)
    weight = torch.randn(6, 6, requires_grad=True)
    x = torch.randn(4, 6, requires_grad=True)
    apply, undo = _precision(
        "medium" if torch.get_float32_matmul_precision() != "medium" else "high"
    )
    with ckptguard.guard(strict=strict), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = checkpoint(_in_place_region(weight), x, use_reentrant=False)
        apply()
        try:
            if strict:
                with pytest.raises(ckptguard.CheckpointMismatchError) as info:
                    out.sum().backward()
                error = info.value
            else:
                out.sum().backward()
        finally:
            undo()
    if not strict:
        found = [w for w in caught if issubclass(w.category, ckptguard.CheckpointMismatchWarning)]
        assert len(found) == 1, [str(w.message) for w in caught]
        text = str(found[0].message)
        assert "may have been recomputed differently" in text and "aten.addmm_" in text
    else:
        assert error.kind == "torch_state" and error.details["certain"] is False
        assert "aten.addmm_" in error.details["evidence"]


# ------------------------------------------ issue 38: SDPA backend contexts around the forward


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.qkv = nn.Linear(16, 48)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (t.transpose(1, 2) for t in self.qkv(x).view(2, 8, 3, 2, 8).unbind(2))
        return torch.tanh(F.scaled_dot_product_attention(q, k, v, is_causal=True))


def _attention_step(
    module: nn.Module, reentrant: bool, forward_context: Callable, backward_context: Callable
) -> list:
    x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(1), requires_grad=True)
    with forward_context():
        out = checkpoint(module, x, use_reentrant=reentrant)
    with backward_context():
        out.square().sum().backward()
    grads = [p.grad.clone() for p in module.parameters()] + [x.grad.clone()]
    module.zero_grad(set_to_none=True)
    return grads


def _math_only() -> contextlib.AbstractContextManager:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(SDPBackend.MATH)


def _math_first() -> contextlib.AbstractContextManager:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.MATH, SDPBackend.FLASH_ATTENTION], set_priority=True)


@VARIANTS
@pytest.mark.parametrize("strict", [False, True], ids=["default", "strict"])
def test_sdpa_kernel_around_the_forward_only_is_named(reentrant: bool, strict: bool) -> None:
    """``with sdpa_kernel(SDPBackend.MATH):`` around the forward, not the backward: the
    recompute picks another attention kernel. Plain torch computes other gradients (or, under
    the non-reentrant variant, raises its bare CheckpointError); the guard names the setting.
    The twin, the context around both passes, is silent and bit-identical."""
    nothing = contextlib.nullcontext
    honest = _attention_step(Attention(), reentrant, nothing, nothing)
    try:
        changed = _attention_step(Attention(), reentrant, _math_only, nothing)
    except CheckpointError:
        assert not reentrant
    else:
        assert not grads_equal(honest, changed)
    with ckptguard.guard(strict=strict), pytest.raises(ckptguard.CheckpointMismatchError) as info:
        _attention_step(Attention(), reentrant, _math_only, nothing)
    assert info.value.kind == "torch_state"
    assert "sdp" in info.value.details["name"].lower()
    plain = _attention_step(Attention(), reentrant, _math_only, _math_only)
    with warnings.catch_warnings(), ckptguard.guard(strict=strict):
        warnings.simplefilter("error", ckptguard.CheckpointMismatchWarning)
        assert grads_equal(_attention_step(Attention(), reentrant, _math_only, _math_only), plain)


@VARIANTS
def test_the_sdpa_priority_order_is_fingerprinted_and_judged(monkeypatch, reentrant: bool) -> None:
    """``sdpa_kernel([...], set_priority=True)`` around the forward changes the backends'
    order, which the fingerprint now holds; the recompute's attention is judged by running it
    under the forward's order: on this CPU the same kernel runs, so it is silent and the
    gradients are bit-identical to plain torch's."""
    from ckptguard import _compat, _settings

    seen: list = []
    made = _settings.SettingsWatch.__init__

    def recording(self, changes) -> None:
        seen.extend(name for name, _, _ in changes)
        made(self, changes)

    monkeypatch.setattr(_settings.SettingsWatch, "__init__", recording)
    nothing = contextlib.nullcontext
    plain = _attention_step(Attention(), reentrant, _math_first, nothing)
    with warnings.catch_warnings(), ckptguard.guard():
        warnings.simplefilter("error", ckptguard.CheckpointMismatchWarning)
        guarded = _attention_step(Attention(), reentrant, _math_first, nothing)
    assert grads_equal(plain, guarded)
    assert _compat.SDP_PRIORITY in seen


def test_torch_s_error_after_a_setting_judged_harmless_names_the_setting(monkeypatch) -> None:
    """Where the recompute's attention was judged to compute the same values (made so here)
    but torch finds it saved other tensors, the explanation names the setting that changed,
    instead of saying that no torch setting did."""
    from ckptguard import _settings

    monkeypatch.setattr(_settings.SettingsWatch, "verdict", lambda self: None)
    nothing = contextlib.nullcontext
    with ckptguard.guard(), pytest.raises(ckptguard.CheckpointMismatchError) as info:
        _attention_step(Attention(), False, _math_only, nothing)
    message = str(info.value)
    assert info.value.kind == "torch_state", message
    assert "ckptguard saw: [torch_state] torch.backends.cuda.flash_sdp_enabled()" in message
    assert "saw no change" not in message
    assert isinstance(info.value.__cause__, CheckpointError)
