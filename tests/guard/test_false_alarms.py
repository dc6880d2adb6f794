"""Clean configurations that once raised false alarms (issue 9): silent, bit-identical.

Each test runs the same steps with plain torch and under the guard and compares every gradient
with ``torch.equal``; any ``CheckpointMismatchError`` (or warning) fails the test.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import threading
import warnings

import pytest
import torch
import torch.nn as nn
from conftest import grads_equal, grads_of
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

import ckptguard
from ckptguard import _verify

VARIANTS = pytest.mark.parametrize("reentrant", [False, True], ids=["nonreentrant", "reentrant"])

output = torch.zeros(4)  # notebook style: a global that shares a name with an attribute


class Remembering(nn.Module):
    """Reads ``self.output`` (an attribute) and writes attributes in a helper it calls."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 4)
        self.output = torch.ones(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.fc(x) * self.output
        self._remember(hidden)
        return torch.sin(hidden)

    def _remember(self, hidden: torch.Tensor) -> None:
        self.last = hidden.detach()  # written by a helper: an output of the region


def _strict_silence(run, strict: bool):
    plain = run()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ckptguard.CheckpointMismatchWarning)
        warnings.simplefilter("error", ckptguard.CheckpointGuardWarning)
        with ckptguard.guard(strict=strict):
            guarded = run()
    assert grads_equal(plain, guarded)


@pytest.mark.parametrize("strict", [False, True], ids=["guard", "strict"])
@pytest.mark.parametrize("reentrant", [False, True], ids=["nonreentrant", "reentrant"])
def test_notebook_global_and_helper_written_attributes(reentrant: bool, strict: bool) -> None:
    module = Remembering()

    def run():
        global output
        collected = []
        for step in range(2):
            x = torch.randn(3, 4, generator=torch.Generator().manual_seed(step), requires_grad=True)
            first = checkpoint(module, x, use_reentrant=reentrant)
            second = checkpoint(module, x * 2, use_reentrant=reentrant)  # rewrites .last
            output = torch.full((4,), float(step))  # the global, never read by the region
            (first.sum() + second.sum()).backward()
            collected += grads_of(module, x)
            module.zero_grad(set_to_none=True)
        return collected

    _strict_silence(run, strict)


class SmallBlock(nn.Module):
    def __init__(self, hidden: int = 8) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.fc = nn.Linear(hidden, hidden)
        self.scale = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(self.norm(x))) * self.scale


def _segments(functions: list, x: torch.Tensor, every: int, reentrant: bool) -> torch.Tensor:
    """Closures over the whole module list with start/end indices, as timm's checkpoint_seq
    builds them: each region holds every block but runs only its own."""

    def run(start: int, end: int):
        def forward(value):
            for index in range(start, end + 1):
                value = functions[index](value)
            return value

        return forward

    for start in range(0, len(functions), every):
        end = min(start + every, len(functions)) - 1
        x = checkpoint(run(start, end), x, use_reentrant=reentrant)
    return x


def _sequence_run(depth: int, how: str, reentrant: bool):
    torch.manual_seed(0)
    blocks = nn.Sequential(*(SmallBlock() for _ in range(depth)))

    def run():
        x = torch.randn(2, 8, generator=torch.Generator().manual_seed(1), requires_grad=True)
        if how == "checkpoint_sequential":
            out = checkpoint_sequential(blocks, depth, x, use_reentrant=reentrant)
        else:
            out = _segments(list(blocks), x, 1, reentrant)
        out.square().mean().backward()
        grads = grads_of(blocks, x)
        blocks.zero_grad(set_to_none=True)
        return grads

    return blocks, run


def _modules_per_region(run) -> list[int]:
    counts: list[int] = []
    original = _verify.capture

    def counting(*args, **kwargs):
        fingerprint = original(*args, **kwargs)
        counts.append(len(fingerprint.reader.module_plans))
        return fingerprint

    _verify.capture = counting
    try:
        with ckptguard.guard():
            run()
    finally:
        _verify.capture = original
    return counts


@pytest.mark.parametrize("how", ["checkpoint_sequential", "segments_closure"])
@pytest.mark.parametrize("reentrant", [False, True], ids=["nonreentrant", "reentrant"])
def test_sequential_segments_are_silent_and_flat_in_depth(how: str, reentrant: bool) -> None:
    """Segment 0 does not fingerprint later blocks: each region reads the 3 modules of its own
    block (block, norm, fc), at depth 8 as at depth 32 (counted work, not time)."""
    for depth in (8, 32):
        blocks, run = _sequence_run(depth, how, reentrant)
        _strict_silence(run, strict=False)
        counts = _modules_per_region(run)
        assert counts and set(counts) == {3}, counts
    # a change in a later block between forward and backward is named by its path
    model = Model(_sequence_run(8, how, reentrant)[0], how, reentrant)
    x = torch.randn(2, 8, requires_grad=True)
    with ckptguard.guard():
        out = model(x)
        model.blocks[5].scale = 2.0
        with pytest.raises(ckptguard.CheckpointMismatchError) as info:
            out.sum().backward()
    assert info.value.kind == "attribute"
    assert info.value.details["name"] == "blocks.5.scale"
    assert info.value.region.startswith("blocks.5 (")


class Model(nn.Module):
    def __init__(self, blocks: nn.Sequential, how: str, reentrant: bool) -> None:
        super().__init__()
        self.blocks = blocks
        self.how = how
        self.reentrant = reentrant

    def forward(self, x):
        if self.how == "checkpoint_sequential":
            return checkpoint_sequential(self.blocks, len(self.blocks), x, use_reentrant=False)
        return _segments(list(self.blocks), x, 1, self.reentrant)


def test_timm_checkpoint_seq_is_silent_and_named() -> None:
    timm = pytest.importorskip("timm", exc_type=ImportError)
    torch.manual_seed(0)
    model = timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=4
    )
    model.set_grad_checkpointing(True)
    images = torch.randn(2, 3, 32, 32)

    def run():
        model(images).square().mean().backward()
        grads = grads_of(model)
        model.zero_grad(set_to_none=True)
        return grads

    _strict_silence(run, strict=False)
    counts = _modules_per_region(run)
    assert len(set(counts)) == 1, counts
    with ckptguard.guard():
        out = model(images)
        model.blocks[2].attn.scale = 2.0
        with pytest.raises(ckptguard.CheckpointMismatchError) as info:
            out.sum().backward()
    assert "blocks.2.attn.scale" in info.value.details["name"]


def _deterministic_region(x: torch.Tensor) -> torch.Tensor:
    for _ in range(300):  # long enough for the other thread to get the GIL many times
        x = torch.tanh(x @ x.T @ x * 0.01)
    return x


@pytest.mark.parametrize("reentrant", [False, True], ids=["nonreentrant", "reentrant"])
def test_other_thread_drawing_random_numbers_is_not_blamed(reentrant: bool) -> None:
    stop = threading.Event()
    started = threading.Event()

    def draw() -> None:
        while not stop.is_set():
            torch.rand(16)
            started.set()

    x = torch.randn(8, 8, requires_grad=True)
    thread = threading.Thread(target=draw)
    thread.start()
    started.wait()
    try:
        ckptguard.enable()
        before = torch.get_rng_state()
        out = checkpoint(
            _deterministic_region, x, use_reentrant=reentrant, preserve_rng_state=False
        )
        moved = not torch.equal(before, torch.get_rng_state())
        out.sum().backward()
    finally:
        stop.set()
        thread.join()
        ckptguard.disable()
    assert moved, "the other thread must have drawn during the region's forward"


# ------------------------------------------------------------------------------ strict mode


class Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inner = SmallBlock()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(checkpoint(self.inner, x, use_reentrant=False))


def test_strict_nested_checkpoint_under_reentrant_outer() -> None:
    module = Outer()

    def run():
        x = torch.randn(2, 8, generator=torch.Generator().manual_seed(1), requires_grad=True)
        checkpoint(module, x, use_reentrant=True).sum().backward()
        grads = grads_of(module, x)
        module.zero_grad(set_to_none=True)
        return grads

    _strict_silence(run, strict=True)


@pytest.mark.parametrize("reentrant", [False, True], ids=["nonreentrant", "reentrant"])
def test_strict_autocast_weight_used_twice(reentrant: bool) -> None:
    torch.manual_seed(0)
    shared = nn.Linear(8, 8)

    def run():
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1), requires_grad=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            warm = shared(x)  # caches the weight's cast before the region
            out = checkpoint(lambda t: shared(shared(t)), x, use_reentrant=reentrant)
        (out.float().sum() + warm.float().sum()).backward()
        grads = grads_of(shared, x)
        shared.zero_grad(set_to_none=True)
        return grads

    _strict_silence(run, strict=True)


def test_strict_reentrant_transformer_layer_in_eval() -> None:
    """Fast path in the no_grad forward, composite path in the recompute: outputs differ by
    rounding only, so strict mode stays silent."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, batch_first=True).eval()

    def run():
        x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1), requires_grad=True)
        checkpoint(layer, x, use_reentrant=True).square().sum().backward()
        grads = grads_of(layer, x)
        layer.zero_grad(set_to_none=True)
        return grads

    _strict_silence(run, strict=True)


@pytest.mark.parametrize("reentrant", [False, True], ids=["nonreentrant", "reentrant"])
def test_strict_batchnorm_without_momentum_reports_only_its_side_effect(reentrant: bool) -> None:
    """BatchNorm(momentum=None) reads num_batches_tracked, which its forward increments: the
    recompute's running statistics differ, the tensors backward uses do not. Strict mode warns
    about the double update (side_effect), never raises, and the gradients are plain torch's."""

    def build() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8, momentum=None))

    def step(module: nn.Module) -> list:
        x = torch.randn(6, 8, generator=torch.Generator().manual_seed(0), requires_grad=True)
        checkpoint(module, x, use_reentrant=reentrant).sum().backward()
        return grads_of(module, x)

    plain = step(build())
    with ckptguard.guard(strict=True), pytest.warns(ckptguard.CheckpointGuardWarning) as record:
        guarded = step(build())
    assert grads_equal(plain, guarded)
    message = str(record[0].message)
    assert "[side_effect]" in message and "Sequential.1.num_batches_tracked" in message
    assert "gradients are not affected" in message


@pytest.mark.parametrize("reentrant", [False, True], ids=["nonreentrant", "reentrant"])
def test_lazy_modules_initialised_inside_the_region(reentrant: bool) -> None:
    """A lazy module materialises its parameters and buffers in its first forward, inside the
    region: uninitialised ones have no storage when the region starts."""

    def build() -> nn.Module:
        torch.manual_seed(0)
        layers = nn.Sequential(nn.LazyLinear(6), nn.LazyBatchNorm1d(), nn.Tanh())
        return layers.eval()  # in eval: no running-statistics update (a side effect)

    def steps(module: nn.Module) -> list:
        grads = []
        for seed in range(2):
            x = torch.randn(3, 4, generator=torch.Generator().manual_seed(seed), requires_grad=True)
            checkpoint(module, x, use_reentrant=reentrant).sum().backward()
            grads += grads_of(module, x)
            module.zero_grad(set_to_none=True)
        return grads

    plain = steps(build())
    with warnings.catch_warnings():
        warnings.simplefilter("error", ckptguard.CheckpointGuardWarning)
        with ckptguard.guard():
            guarded = steps(build())
    assert grads_equal(plain, guarded)


class Watched:
    """A config with its own ``__getattribute__`` (transformers' configs have one), recording
    every name looked up on it."""

    def __init__(self) -> None:
        object.__setattr__(self, "looked_up", [])
        object.__setattr__(self, "scale", 2.0)

    def __getattribute__(self, name: str):
        object.__getattribute__(self, "looked_up").append(name)
        return object.__getattribute__(self, name)


class WithWatchedConfig(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 4)
        self.config = Watched()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(self.fc(x) * self.config.scale)


@pytest.mark.parametrize("reentrant", [False, True], ids=["nonreentrant", "reentrant"])
def test_the_guard_runs_no_user_code_to_read_a_config(reentrant: bool) -> None:
    """Reading ``self.config.scale`` must not call the config's ``__getattribute__``: only
    the region's own code does (``isinstance`` would look up ``__class__`` through it)."""
    module = WithWatchedConfig()
    looked_up = object.__getattribute__(module.config, "looked_up")
    looked_up.clear()  # torch's own __setattr__ asked for __class__ while building
    x = torch.randn(3, 4, requires_grad=True)
    with ckptguard.guard():
        checkpoint(module, x, use_reentrant=reentrant).sum().backward()
    assert set(looked_up) == {"scale"}, looked_up


class Growing(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList([nn.Linear(4, 4)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.sin(block(x))
        return x


class Tracker:
    """A closure object whose attribute the region assigns before it reads it: an output of
    the region, which its recompute assigns again before reading, not an input."""

    def __init__(self) -> None:
        self.scale = 1.0


@pytest.mark.parametrize("reentrant", [False, True], ids=["nonreentrant", "reentrant"])
@pytest.mark.parametrize("region", ["module", "function"])
def test_changes_between_steps_and_outputs_of_the_region(reentrant: bool, region: str) -> None:
    """A layer appended to a ModuleList between two steps (not between a forward and its
    backward) stays silent; so does an attribute of a closure object that each region
    assigns, then reads (the second region's forward changes it before the first one's
    recompute, which assigns it again)."""
    tracker = Tracker()

    def steps(module: Growing) -> list:
        def tracked(h: torch.Tensor) -> torch.Tensor:
            tracker.scale = float(h.detach().abs().mean())
            return module(h) * tracker.scale

        grads = []
        for step in range(3):
            if step == 2:
                torch.manual_seed(1)
                module.blocks.append(nn.Linear(4, 4))
            x = torch.randn(3, 4, generator=torch.Generator().manual_seed(step), requires_grad=True)
            if region == "module":
                out = checkpoint(module, x, use_reentrant=reentrant)
            else:
                first = checkpoint(tracked, x, use_reentrant=reentrant)
                out = checkpoint(tracked, first * 2, use_reentrant=reentrant)
            out.sum().backward()
            grads += grads_of(module, x)
            module.zero_grad(set_to_none=True)
        return grads

    plain = steps(Growing())
    with warnings.catch_warnings():
        warnings.simplefilter("error", ckptguard.CheckpointGuardWarning)
        with ckptguard.guard():
            guarded = steps(Growing())
    assert grads_equal(plain, guarded)


# ---------------------------------------------------- issue 28: alarms that went silent


@pytest.mark.parametrize("strict", [False, True], ids=["default", "strict"])
@VARIANTS
def test_batchnorm_momentum_changed_in_training_is_silent(strict: bool, reentrant: bool) -> None:
    """BatchNorm reads momentum only to update its running statistics (its output in training
    comes from the batch): a momentum changed before backward changes no gradient. The
    statistics updated twice stay the side-effect warning they always were."""

    def run(guard: dict | None) -> list:
        torch.manual_seed(0)
        block = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
        block.train()
        x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1), requires_grad=True)
        context = ckptguard.guard(**guard) if guard is not None else contextlib.nullcontext()
        with context, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = checkpoint(block, x, use_reentrant=reentrant)
            block[1].momentum = 0.5
            out.sum().backward()
        mismatches = [
            w for w in caught if issubclass(w.category, ckptguard.CheckpointMismatchWarning)
        ]
        assert not mismatches, [str(w.message) for w in mismatches]
        return [p.grad.clone() for p in block.parameters()] + [x.grad.clone()]

    plain = run(None)
    assert grads_equal(plain, run({"strict": strict}))


CACHE_SCALE = 2.0


@functools.cache
def _cached_gains(n: int) -> torch.Tensor:
    return torch.linspace(1.0, CACHE_SCALE, n)


def _cached_region(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x * _cached_gains(x.shape[-1]))


def _set_cache_scale(value: float) -> None:
    global CACHE_SCALE
    CACHE_SCALE = value


@VARIANTS
def test_lru_cached_helper_whose_global_changed_while_the_cache_holds(reentrant: bool) -> None:
    """The helper's global changes before backward, but the cache still holds the forward's
    result, which the recompute's call gets: same values, no alarm. Cleared, the recompute
    would compute from the new global: named."""
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1), requires_grad=True)

    def run(clear: bool) -> list:
        x.grad = None
        _cached_gains.cache_clear()
        out = checkpoint(_cached_region, x, use_reentrant=reentrant)
        _set_cache_scale(5.0)
        if clear:
            _cached_gains.cache_clear()
        try:
            out.sum().backward()
        finally:
            _set_cache_scale(2.0)
        return [x.grad.clone()]

    _strict_silence(lambda: run(clear=False), strict=False)
    with ckptguard.guard(), pytest.raises(ckptguard.CheckpointMismatchError) as info:
        run(clear=True)
    assert info.value.kind == "global" and "CACHE_SCALE" in str(info.value)


class Flagged(nn.Module):
    """Its forward needs ``ready``, which the region's context_fn sets for the forward only."""

    def __init__(self) -> None:
        super().__init__()
        self.ready = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.ready:
            raise RuntimeError("Flagged runs only under its forward context")
        return torch.sin(x)


def test_context_fn_setting_state_for_the_forward_only_lets_the_model_s_error_through() -> None:
    """The forward context sets ``ready``, the recompute context does not: the recompute
    raises the model's own error, which is what the user sees under the guard too (the
    guard's finding added as a note)."""
    module = Flagged()

    @contextlib.contextmanager
    def ready():
        module.ready = True
        try:
            yield
        finally:
            module.ready = False

    def run() -> BaseException:
        x = torch.randn(3, requires_grad=True)
        out = checkpoint(
            module, x, use_reentrant=False, context_fn=lambda: (ready(), contextlib.nullcontext())
        )
        with pytest.raises(RuntimeError) as info:
            out.sum().backward()
        return info.value

    plain = run()
    with ckptguard.guard():
        guarded = run()
    assert type(guarded) is type(plain) and str(guarded) == str(plain)
    assert not isinstance(guarded, ckptguard.CheckpointMismatchError)
    if hasattr(guarded, "__notes__"):
        assert "Flagged" in guarded.__notes__[0] and "ready" in guarded.__notes__[0]


# ------------------- issue 38: torch's own checkpoint tests (benchmarks/torch_checkpoint_tests.py)


def _closure_region(layer: nn.Module, scale: float):
    """A region closing over a helper closure, as TestNestedCheckpoint's wrappers do: each call
    makes new functions of the same code, so the plan cached for that code follows a helper of
    an earlier call, which may have been collected since. ``rescale`` rebinds the helper's
    cell."""

    def helper(y: torch.Tensor) -> torch.Tensor:
        return torch.tanh(y) * scale

    def rescale(value: float) -> None:
        nonlocal scale
        scale = value

    def region(x: torch.Tensor) -> torch.Tensor:
        return helper(layer(x))

    return region, rescale


@pytest.mark.parametrize("collected", [True, False], ids=["earlier_collected", "earlier_alive"])
@VARIANTS
def test_a_region_whose_earlier_closure_was_collected(collected: bool, reentrant: bool) -> None:
    """The code's plan, made for the first region, still follows its helper; a region of the
    same code running another module is read afresh. Its helper collected, the reader once met
    a None function (``[internal]`` AttributeError, the region left unguarded): now silent,
    bit-identical to plain torch, and still guarded (its own helper's cell rebound is named)."""
    torch.manual_seed(0)
    x = torch.randn(3, 4, requires_grad=True)

    def run(rebind: bool = False) -> list:
        first, _ = _closure_region(nn.Linear(4, 4), 2.0)
        checkpoint(first, x, use_reentrant=reentrant).sum().backward()
        if collected:
            del first
            gc.collect()
        torch.manual_seed(1)
        layer = nn.Linear(4, 4)
        second, rescale = _closure_region(layer, 2.0)
        x.grad = None
        out = checkpoint(second, x, use_reentrant=reentrant)
        if rebind:
            rescale(3.0)
        out.sum().backward()
        return grads_of(layer, x)

    _strict_silence(run, strict=False)
    with ckptguard.guard(), pytest.raises(ckptguard.CheckpointMismatchError) as info:
        run(rebind=True)
    assert info.value.kind == "closure" and "scale" in str(info.value)
