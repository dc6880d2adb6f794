"""A clean run through every checkpoint path: bit-identical gradients, no false alarm."""

from __future__ import annotations

import functools
import warnings

import pytest
import torch
import torch.nn as nn
import torch.utils.checkpoint as torch_checkpoint
from conftest import grads_equal, grads_of
from torch.utils.checkpoint import checkpoint as bound_before_enable
from torch.utils.checkpoint import checkpoint_sequential

import ckptguard

# the transformers pattern: a partial of checkpoint bound at import, long before enable()
gradient_checkpointing_func = functools.partial(bound_before_enable, use_reentrant=True)


class Block(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, 2 * width)
        self.fc2 = nn.Linear(2 * width, width)
        self.dropout = nn.Dropout(0.2)
        self.norm = nn.LayerNorm(width)
        self.gain = 1.0

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return x + self.dropout(self.fc2(torch.relu(self.fc1(self.norm(x))))) * scale * self.gain


class Nested(nn.Module):
    """An outer non-reentrant region that checkpoints its inner blocks again."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = Block()
        self.inner_reentrant = Block()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = bound_before_enable(self.inner, x, use_reentrant=False)
        return bound_before_enable(self.inner_reentrant, x, use_reentrant=True)


class Mixed(nn.Module):
    def __init__(self, allow_reentrant: bool = True) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.allow_reentrant = allow_reentrant
        self.kwargs_block = Block()
        self.partial_block = Block()
        self.nested = Nested()
        self.sequence = nn.Sequential(*(Block() for _ in range(4)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = bound_before_enable(self.kwargs_block, x, scale=0.5, use_reentrant=False)
        if self.allow_reentrant:
            x = gradient_checkpointing_func(self.partial_block.__call__, x)
            x = bound_before_enable(self.nested, x, use_reentrant=False)
        else:
            x = bound_before_enable(self.partial_block, x, use_reentrant=False)
        return checkpoint_sequential(self.sequence, 2, x, use_reentrant=False)


def _training_run(allow_reentrant: bool) -> list[torch.Tensor]:
    """Train steps, no_grad evaluation, double backward and autograd.grad; all gradients."""
    model = Mixed(allow_reentrant)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    torch.manual_seed(1)
    collected = []
    for step in range(3):
        x = torch.randn(4, 5, 16, requires_grad=True)
        loss = model(x).square().mean()
        loss.backward(retain_graph=True)
        loss.backward()  # recomputes every region a second time
        collected += grads_of(model, x)
        optimizer.step()
        optimizer.zero_grad()
        model.eval()
        with torch.no_grad():
            collected.append(model(x))
        model.train()
        if not allow_reentrant:
            out = model(x).sum()
            used = [x, *model.kwargs_block.parameters(), *model.sequence.parameters()]
            collected += list(torch.autograd.grad(out, used))
        del step
    return collected


@pytest.mark.parametrize("allow_reentrant", [True, False], ids=["mixed", "autograd_grad"])
def test_guarded_run_is_bit_identical_and_silent(allow_reentrant: bool) -> None:
    plain = _training_run(allow_reentrant)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ckptguard.CheckpointMismatchWarning)
        warnings.simplefilter("error", ckptguard.CheckpointGuardWarning)
        with ckptguard.guard():
            guarded = _training_run(allow_reentrant)
    assert grads_equal(plain, guarded)


def test_disable_restores_torch_exactly() -> None:
    generator = torch_checkpoint._checkpoint_without_reentrant_generator
    assert "apply" not in vars(torch_checkpoint.CheckpointFunction)
    ckptguard.enable()
    ckptguard.enable(on_mismatch="warn")  # enabling twice only updates the options
    assert ckptguard.is_enabled()
    assert torch_checkpoint._checkpoint_without_reentrant_generator is not generator
    ckptguard.disable()
    assert not ckptguard.is_enabled()
    assert torch_checkpoint._checkpoint_without_reentrant_generator is generator
    assert "apply" not in vars(torch_checkpoint.CheckpointFunction)
    assert torch_checkpoint.checkpoint is bound_before_enable


def test_guard_context_restores_previous_options() -> None:
    intercept = pytest.importorskip("ckptguard._intercept")
    ckptguard.enable(on_mismatch="warn")
    with ckptguard.guard():
        assert intercept.current_options().on_mismatch == "raise"
    assert intercept.current_options().on_mismatch == "warn"
    ckptguard.disable()
    with ckptguard.guard():
        assert ckptguard.is_enabled()
    assert not ckptguard.is_enabled()


def test_bad_on_mismatch_is_rejected() -> None:
    with pytest.raises(ValueError, match="on_mismatch"):
        ckptguard.enable(on_mismatch="ignore")


def _attribute_change_is_caught(run_region, block: Block) -> None:
    """A clean step passes; an attribute the forward never reads may change; then forward,
    change an attribute it reads, backward: the guard objects."""
    x = torch.randn(2, 16, requires_grad=True)
    block.extra = 1.0
    run_region(x).sum().backward()
    out = run_region(x)
    block.extra = 2.0  # never read by Block.forward: no alarm
    out.sum().backward()
    out = run_region(x)
    block.gain = 2.0
    try:
        with pytest.raises(ckptguard.CheckpointMismatchError) as info:
            out.sum().backward()
    finally:
        block.gain = 1.0
    assert info.value.kind == "attribute" and ".gain" in str(info.value)


@pytest.mark.parametrize("strict", [False, True], ids=["guard", "strict"])
def test_checkpoint_sequential_is_guarded(strict: bool) -> None:
    sequence = nn.Sequential(Block(), Block(), Block())
    ckptguard.enable(strict=strict)
    _attribute_change_is_caught(
        lambda x: checkpoint_sequential(sequence, 3, x, use_reentrant=False), sequence[0]
    )


@pytest.mark.parametrize("strict", [False, True], ids=["guard", "strict"])
@pytest.mark.parametrize("impl", ["NO_REENTRANT", "REENTRANT"])
def test_checkpoint_wrapper_is_guarded(impl: str, strict: bool) -> None:
    wrapper_module = pytest.importorskip(
        "torch.distributed.algorithms._checkpoint.checkpoint_wrapper"
    )
    block = Block()
    wrapped = wrapper_module.checkpoint_wrapper(
        block, checkpoint_impl=getattr(wrapper_module.CheckpointImpl, impl)
    )
    ckptguard.enable(strict=strict)
    _attribute_change_is_caught(wrapped, block)


@pytest.mark.parametrize("strict", [False, True], ids=["guard", "strict"])
def test_composable_checkpoint_is_guarded(strict: bool) -> None:
    composable = pytest.importorskip("torch.distributed._composable")
    block = Block()
    composable.checkpoint(block)
    ckptguard.enable(strict=strict)
    _attribute_change_is_caught(block, block)


@pytest.mark.parametrize("strict", [False, True], ids=["guard", "strict"])
def test_transformers_partial_pattern_is_guarded(strict: bool) -> None:
    block = Block()
    ckptguard.enable(strict=strict)
    _attribute_change_is_caught(lambda x: gradient_checkpointing_func(block.__call__, x), block)


def test_torch_compile_passes_through() -> None:
    block = Block()

    def region(x: torch.Tensor) -> torch.Tensor:
        return bound_before_enable(block, x, use_reentrant=False).sum()

    compiled = torch.compile(region, backend="eager")
    x = torch.randn(2, 16, requires_grad=True)
    torch.manual_seed(0)
    compiled(x).backward()
    expected = x.grad.clone()
    x.grad = None
    torch._dynamo.reset()
    with ckptguard.guard():
        torch.manual_seed(0)
        torch.compile(region, backend="eager")(x).backward()
    assert torch.equal(x.grad, expected)


class CompiledInside(nn.Module):
    """A block compiled on its own inside a checkpointed module: torch.compile's wrapper keeps
    no training flag of its own (a property over the module it wraps)."""

    def __init__(self) -> None:
        super().__init__()
        self.block = torch.compile(Block(), backend="eager")
        self.head = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(x))


@pytest.mark.filterwarnings("error::ckptguard.CheckpointGuardWarning")
@pytest.mark.parametrize("reentrant", [False, True], ids=["nonreentrant", "reentrant"])
def test_a_compiled_submodule_is_read_through_its_wrapper(reentrant: bool) -> None:
    torch.manual_seed(0)
    plain = CompiledInside()
    model = CompiledInside()
    model.load_state_dict(plain.state_dict())
    x = torch.randn(2, 16, requires_grad=True)
    torch.manual_seed(1)
    bound_before_enable(plain, x, use_reentrant=reentrant).sum().backward()
    ckptguard.enable()
    torch.manual_seed(1)
    bound_before_enable(model, x, use_reentrant=reentrant).sum().backward()
    assert grads_equal(grads_of(plain), grads_of(model))
    _attribute_change_is_caught(
        lambda t: bound_before_enable(model, t, use_reentrant=reentrant),
        model.block._orig_mod,
    )


def test_reentrant_without_grad_inputs_warns_with_parameter_names() -> None:
    block = Block()
    x = torch.randn(2, 16)  # no input requires grad: the block's parameters get no gradient
    ckptguard.enable()
    with pytest.warns(ckptguard.CheckpointGuardWarning, match=r"Block\.fc1\.weight"):
        bound_before_enable(block, x, use_reentrant=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ckptguard.CheckpointGuardWarning)
        bound_before_enable(block, x, use_reentrant=False)
        with torch.no_grad():
            bound_before_enable(block, x, use_reentrant=True)


def _shared_state_run() -> list[torch.Tensor]:
    """BatchNorm regions run twice before backward (one in eval(), reading its running
    statistics, one without running statistics), one block used twice, a region under autocast
    whose weight is cast once and used twice (autocast's cast cache)."""
    torch.manual_seed(0)
    normed = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.ReLU())
    normed[1].eval()
    batch_stats = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8, track_running_stats=False))
    shared = nn.Linear(8, 8)
    first, second = torch.randn(4, 8, requires_grad=True), torch.randn(4, 8, requires_grad=True)
    collected = []
    for reentrant in (False, True):
        a = bound_before_enable(normed, first, use_reentrant=reentrant)
        b = bound_before_enable(normed, second, use_reentrant=reentrant)
        b = bound_before_enable(batch_stats, b, use_reentrant=reentrant)
        b = bound_before_enable(batch_stats, b, use_reentrant=reentrant)
        hidden = bound_before_enable(shared, a, use_reentrant=reentrant)
        hidden = bound_before_enable(shared, hidden, use_reentrant=reentrant)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = bound_before_enable(lambda t: shared(shared(t)), b, use_reentrant=reentrant)
        (hidden.sum() + low.float().sum()).backward()
        collected += grads_of(normed, first, second) + grads_of(shared) + grads_of(batch_stats)
        collected += [normed[1].running_mean.clone(), normed[1].num_batches_tracked.clone()]
    return collected


@pytest.mark.parametrize("strict", [False, True], ids=["guard", "strict"])
def test_shared_modules_batchnorm_and_autocast_without_alarm(strict: bool) -> None:
    plain = _shared_state_run()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ckptguard.CheckpointGuardWarning)
        with ckptguard.guard(strict=strict):
            guarded = _shared_state_run()
    assert grads_equal(plain, guarded)


class Logging(nn.Module):
    """Writes attributes in its forward (a call counter, the last output): outputs, not inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.calls = 0
        self.last = torch.zeros(1)
        self.scale = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        out = self.fc(x) * self.scale
        self.last = out.detach()
        return out


def test_attributes_written_by_forward_are_not_inputs() -> None:
    module = Logging()
    x = torch.randn(2, 4, requires_grad=True)
    ckptguard.enable()
    first = bound_before_enable(module, x, use_reentrant=False)
    second = bound_before_enable(module, x * 2, use_reentrant=False)  # rewrites calls and last
    (first.sum() + second.sum()).backward()
    out = bound_before_enable(module, x, use_reentrant=False)
    module.scale = 3.0  # only read by forward: still an input
    with pytest.raises(ckptguard.CheckpointMismatchError, match="Logging.scale"):
        out.sum().backward()
