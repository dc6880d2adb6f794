"""Issue 19: every alarm is for a change the recompute sees (or says it may not be), in the
shapes PyTorch's own checkpoint tests and a new user met; messages name what they mean and
point at the user's code; the guard switches on without code changes."""

from __future__ import annotations

import contextlib
import logging
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
import torch.nn as nn
from conftest import grads_equal, grads_of
from torch.utils._python_dispatch import _get_current_dispatch_mode
from torch.utils.checkpoint import (
    CheckpointError,
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

import ckptguard
from ckptguard import _reader, _readplan, _strict
from tests.conftest import SUBPROCESS_TIMEOUT

VARIANTS = pytest.mark.parametrize("reentrant", [False, True], ids=["nonreentrant", "reentrant"])


def _linear(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 6))


def _input(seed: int = 1) -> torch.Tensor:
    return torch.randn(4, 6, generator=torch.Generator().manual_seed(seed), requires_grad=True)


def _guarded_and_plain(run, **options) -> None:
    """``run()`` returns gradients: plain and guarded must be bit-identical, with no warning
    and no error from the guard."""
    plain = run()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ckptguard.CheckpointGuardWarning)
        warnings.simplefilter("error", ckptguard.CheckpointMismatchWarning)
        with ckptguard.guard(**options):
            guarded = run()
    assert grads_equal(plain, guarded)


# ------------------------------------------------------------ false alarms of torch's tests


@VARIANTS
@pytest.mark.parametrize("strict", [False, True], ids=["default", "strict"])
def test_region_counting_its_own_calls_in_a_closure_list(reentrant: bool, strict: bool) -> None:
    """One graph backpropagated twice (retain_graph): the region's own ``calls[0] += 1`` in
    its first recompute is no input change for the second."""
    model = _linear()

    def run() -> list:
        calls = [0]

        def region(x: torch.Tensor) -> torch.Tensor:
            calls[0] += 1
            return model(x)

        x = _input()
        out = checkpoint(region, x, use_reentrant=reentrant).sum()
        if reentrant:  # the reentrant variant cannot backpropagate one graph twice
            out.backward()
            out = checkpoint(region, x, use_reentrant=reentrant).sum()
            out.backward()
        else:
            out.backward(retain_graph=True)
            out.backward()
        assert calls[0] == (4 if reentrant else 3)
        grads = grads_of(model, x)
        model.zero_grad(set_to_none=True)
        return grads

    _guarded_and_plain(run, strict=strict)


def test_a_closure_list_changed_by_someone_else_is_still_caught() -> None:
    """The region's own writes are re-read after its recompute; a change made after the
    forward by other code is still a change."""
    model = _linear()
    factors = [1.0]

    def region(x: torch.Tensor) -> torch.Tensor:
        factors.append(0.0)  # the region mutates the list (its own write)...
        factors.pop()
        return model(x) * factors[0]

    ckptguard.enable()
    out = checkpoint(region, _input(), use_reentrant=False)
    factors[0] = 2.0  # ...and someone else changes it after the forward
    with pytest.raises(ckptguard.CheckpointMismatchError) as info:
        out.sum().backward()
    assert info.value.kind == "closure"
    assert "factors[0]" in str(info.value)
    assert "changed in place after the forward" in str(info.value)


class Flagged(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(6, 6)
        self.flag = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * (2.0 if self.flag else 1.0)


@pytest.mark.parametrize("strict", [False, True], ids=["default", "strict"])
def test_context_fn_that_sets_state_in_both_passes(strict: bool) -> None:
    """context_fn's contexts set ``module.flag = False`` around the forward and around the
    recompute alike: the fingerprint is taken inside the forward context, as it is verified
    inside the recompute context."""
    module = Flagged()

    @contextlib.contextmanager
    def unflagged():
        module.flag = False
        try:
            yield
        finally:
            module.flag = True

    def run() -> list:
        x = _input()
        out = checkpoint(
            module, x, use_reentrant=False, context_fn=lambda: (unflagged(), unflagged())
        )
        out.sum().backward()
        grads = grads_of(module, x)
        module.zero_grad(set_to_none=True)
        return grads

    _guarded_and_plain(run, strict=strict)


class _Holder:
    extra = False


HOLDERS = [_Holder() for _ in range(20)]  # a long list: compared by identity, not content


def test_mismatch_error_is_torchs_checkpoint_error_and_keeps_its_report() -> None:
    """``except CheckpointError`` keeps matching the guard's explanation of torch's error,
    and torch's whole debug=True report (its op traces) stays in the message."""
    model = _linear()

    def region(x: torch.Tensor) -> torch.Tensor:
        if HOLDERS[0].extra:  # state no fingerprint reaches
            x = x.repeat(2, 1)
        return model(x)[:4]

    ckptguard.enable()
    out = checkpoint(region, _input(), use_reentrant=False, debug=True)
    HOLDERS[0].extra = True
    try:
        with pytest.raises(CheckpointError) as info:
            out.sum().backward()
    finally:
        HOLDERS[0].extra = False
    error = info.value
    found = error if isinstance(error, ckptguard.CheckpointMismatchError) else error.__cause__
    assert isinstance(found, ckptguard.CheckpointMismatchError), repr(error)
    assert found.kind == "saved_tensors"
    torch_report = str(found.__cause__)
    assert "torch.Size([8, 6])" in torch_report  # torch's own facts ...
    assert torch_report.strip().splitlines()[-1].strip() in str(found)  # ... all of them


def _sac_policy(ctx, op, *args, **kwargs):
    if op == torch.ops.aten.mm.default:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def test_strict_mode_is_not_seen_by_code_under_a_selective_checkpoint_mode() -> None:
    """Inside a selective-checkpoint region, the innermost dispatch mode the region's code
    sees is torch's own (in both passes), as without the guard."""
    torch.manual_seed(0)
    weight = torch.randn(6, 6, requires_grad=True)

    def run() -> list:
        seen = []

        def region(x: torch.Tensor) -> torch.Tensor:
            seen.append(type(_get_current_dispatch_mode()).__name__)
            return torch.mm(x, weight).sin()

        x = _input()
        context = lambda: create_selective_checkpoint_contexts(_sac_policy)  # noqa: E731
        checkpoint(region, x, use_reentrant=False, context_fn=context).sum().backward()
        grads = [weight.grad.clone(), x.grad.clone(), *seen]
        weight.grad = None
        return grads

    plain = run()
    with ckptguard.guard(strict=True):
        guarded = run()
    assert plain[2:] == guarded[2:] and len(plain) == 4, (plain[2:], guarded[2:])
    assert torch.equal(plain[0], guarded[0]) and torch.equal(plain[1], guarded[1])


def test_strict_mode_flags_the_cache_entry_mutated_in_place() -> None:
    """allow_cache_entry_mutation=True with an in-place op on a cached mm output: plain torch
    computes wrong gradients, and strict mode says so."""
    torch.manual_seed(0)
    weight = torch.randn(6, 6, requires_grad=True)

    def region(x: torch.Tensor) -> torch.Tensor:
        y = torch.mm(x, weight)
        y.mul_(2.0)
        return y.sin()

    def run(checkpointed: bool) -> torch.Tensor:
        x = _input()
        if checkpointed:
            context = lambda: create_selective_checkpoint_contexts(  # noqa: E731
                _sac_policy, allow_cache_entry_mutation=True
            )
            out = checkpoint(region, x, use_reentrant=False, context_fn=context)
        else:
            out = region(x)
        out.sum().backward()
        grad, weight.grad = weight.grad, None
        return grad

    assert not torch.equal(run(False), run(True)), "plain torch's gradients should be wrong"
    with ckptguard.guard(strict=True), pytest.raises(ckptguard.CheckpointMismatchError) as info:
        run(True)
    # issue 20: named as the saved output modified in place, measured (test_selective.py)
    assert info.value.kind == "selective_cache"
    assert "the gradients are affected" in str(info.value)


@VARIANTS
def test_strict_mode_on_tensors_holding_the_dtype_extremes(reentrant: bool) -> None:
    """Attention masks filled with finfo.min and inf overflow a checksum (inf - inf = nan)
    in an order-dependent way: no evidence, so no alarm."""
    model = _linear()

    def region(x: torch.Tensor) -> torch.Tensor:
        scores = model(x) @ model(x).T
        mask = torch.ones(4, 4, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(mask, torch.finfo(scores.dtype).min)
        big = scores + torch.full_like(scores, torch.finfo(scores.dtype).max) * 0
        return torch.softmax(big, -1) + torch.where(mask, float("inf"), 0.0).exp().clamp(max=1)

    def run() -> list:
        x = _input()
        checkpoint(region, x, use_reentrant=reentrant).sum().backward()
        grads = grads_of(model, x)
        model.zero_grad(set_to_none=True)
        return grads

    _guarded_and_plain(run, strict=True)
    # an overflowed checksum is no evidence either way: compared by shape, dtype and device
    overflowing = ((3,), torch.float32, "cpu", float("nan"), float("inf"), None)
    finite = ((3,), torch.float32, "cpu", 1.0, 2.0, None)
    assert _strict.compare_signatures(overflowing, finite) is None
    assert _strict.compare_signatures(finite, ((3,), torch.float32, "cpu", 1.0, 9.0, None))


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def _sizes_of_reductions(monkeypatch) -> list:
    """Records (op, elements) of each reduction a checksum runs."""
    seen: list = []

    def recording(name, original):
        def run(tensor, *args, **kwargs):
            seen.append((name, tensor.numel()))
            return original(tensor, *args, **kwargs)

        return run

    monkeypatch.setattr(torch, "dot", recording("dot", torch.dot))
    monkeypatch.setattr(torch, "mul", recording("mul", torch.mul))
    monkeypatch.setattr(torch.linalg, "vector_norm", recording("norm", torch.linalg.vector_norm))
    monkeypatch.setattr(torch.Tensor, "sum", recording("sum", torch.Tensor.sum))
    return seen


def test_checksums_never_use_threads(monkeypatch, two_threads) -> None:
    """With torch on several threads a checksum runs no BLAS dot (MKL may split one across
    threads at any size: on a loaded 2-core machine a 22k-element dot took up to 18 ms,
    its median 4 us) and hands no op more elements than torch runs on one thread."""
    tensor = torch.randn(88_064)
    seen = _sizes_of_reductions(monkeypatch)
    found = _strict.signatures([tensor])[0]
    assert seen and all(name != "dot" for name, _ in seen)
    assert max(size for _, size in seen) == _strict.ONE_THREAD
    monkeypatch.undo()
    torch.set_num_threads(1)  # one thread: a BLAS dot is the cheapest and stays on it
    seen = _sizes_of_reductions(monkeypatch)
    alone = _strict.signatures([tensor])[0]
    assert {name for name, _ in seen} == {"dot"}
    assert max(size for _, size in seen) == _strict.ONE_THREAD
    assert _strict.compare_signatures(found, alone) is None  # the same up to rounding
    exact = tensor.double()
    weights = torch.frac(torch.arange(88_064, dtype=torch.float64) * _strict._GOLDEN) - 0.5
    assert found[3] == pytest.approx(float(exact @ weights), rel=1e-4)
    assert found[4] == pytest.approx(float(exact @ exact), rel=1e-5)


def test_chunked_checksums_see_chunks_swapped(two_threads) -> None:
    """Each chunk is weighted by its own positions: swapping two chunks of a tensor (the same
    values, the same sum of squares) changes the weighted sum, on one thread and on two."""
    tensor = torch.randn(3 * _strict.ONE_THREAD)
    swapped = torch.cat(tensor.split(_strict.ONE_THREAD)[::-1])
    for threads in (2, 1):
        torch.set_num_threads(threads)
        before, after = _strict.signatures([tensor, swapped])
        assert before[4] == pytest.approx(after[4], rel=1e-5)
        assert _strict.compare_signatures(before, after) is not None


# ------------------------------------------------------------------- process-wide settings


def _default_dtype_step(creates: bool):
    model = _linear()

    def region(x: torch.Tensor) -> torch.Tensor:
        out = model(x)
        if creates:  # a ramp made in the default dtype, cast back
            out = out + torch.linspace(0.0, 1.0, 7)[:6].to(out.dtype)
        return out.tanh()

    def step(change) -> list:
        x = _input()
        out = checkpoint(region, x, use_reentrant=False)
        if change is not None:
            change()
        try:
            out.sum().backward()
        finally:
            torch.set_default_dtype(torch.float32)
        grads = grads_of(model, x)
        model.zero_grad(set_to_none=True)
        return grads

    return step


def test_default_dtype_the_region_never_uses_is_silent() -> None:
    step = _default_dtype_step(creates=False)
    change = lambda: torch.set_default_dtype(torch.float64)  # noqa: E731
    plain = step(None)
    assert grads_equal(plain, step(change))  # the recompute never reads it
    with ckptguard.guard():
        assert grads_equal(plain, step(change))


def test_default_dtype_the_region_creates_tensors_from_is_named() -> None:
    step = _default_dtype_step(creates=True)
    change = lambda: torch.set_default_dtype(torch.float64)  # noqa: E731
    assert not grads_equal(step(None), step(change))
    with ckptguard.guard(), pytest.raises(ckptguard.CheckpointMismatchError) as info:
        step(change)
    error = info.value
    assert error.kind == "torch_state" and error.details["certain"] is True
    assert "aten.linspace.default" in error.details["evidence"]
    assert f"{__file__}:" in error.details["evidence"]
    assert "was recomputed differently" in str(error)


def test_a_setting_that_changes_no_recomputed_value_is_silent() -> None:
    """Issue 28: the matmul precision changed before backward of a small CPU Linear region,
    whose recomputed matmul is bit-identical under either precision: no alarm (the guard runs
    the op again under the forward's precision to know; test_settings.py covers the rest)."""
    model = _linear()
    previous = torch.get_float32_matmul_precision()
    other = "medium" if previous != "medium" else "high"

    def run() -> list:
        x = _input()
        out = checkpoint(model, x, use_reentrant=False)
        torch.set_float32_matmul_precision(other)
        try:
            out.sum().backward()
        finally:
            torch.set_float32_matmul_precision(previous)
        grads = grads_of(model, x)
        model.zero_grad(set_to_none=True)
        return grads

    _guarded_and_plain(run)


# ------------------------------------------------------------------------------- messages


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x).tanh()


def _patched(self: Block, x: torch.Tensor) -> torch.Tensor:
    return self.fc(x).sin()


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(Block() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = checkpoint(lambda t: block(t), x, use_reentrant=False)  # noqa: B023
        return x


def test_late_bound_closure_names_the_modules() -> None:
    model = Stack()
    ckptguard.enable()
    out = model(_input())
    with pytest.raises(ckptguard.CheckpointMismatchError) as info:
        out.sum().backward()
    error = info.value
    assert error.kind == "closure"
    assert "0x" not in str(error)
    assert error.details["old"] in ("blocks.0 (Block)", "blocks.1 (Block)")
    assert error.details["new"] == "blocks.2 (Block)"
    line = Stack.forward.__code__.co_firstlineno
    assert f"closure cell of Stack.forward.<locals>.<lambda> ({__file__}:" in error.details["where"]
    assert line > 0


def test_patched_forward_keeps_the_region_name_and_names_both_functions() -> None:
    torch.manual_seed(0)
    block = Block()
    original = Block.forward
    ckptguard.enable()
    out = checkpoint(block, _input(), use_reentrant=False)
    Block.forward = _patched
    try:
        with pytest.raises(ckptguard.CheckpointMismatchError) as info:
            out.sum().backward()
    finally:
        Block.forward = original
    error = info.value
    line = original.__code__.co_firstlineno
    assert error.region == f"Block.forward ({__file__}:{line})"
    assert error.details["old"] == f"forward (Block.forward, {__file__}:{line})"
    patched_line = _patched.__code__.co_firstlineno
    assert error.details["new"] == f"_patched ({__file__}:{patched_line})"
    assert "0x" not in str(error)


def test_training_switch_says_what_plain_torch_does() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 6), nn.Dropout(0.5))
    ckptguard.enable()
    out = checkpoint(model, _input(), use_reentrant=True)
    model.eval()
    with pytest.raises(ckptguard.CheckpointMismatchError) as info:
        out.sum().backward()
    assert "plain PyTorch does not notice" not in str(info.value)
    assert "plain PyTorch raises an opaque CheckpointError" in str(info.value)


def test_warnings_point_at_the_users_backward_call() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 6), nn.BatchNorm1d(6))
    with ckptguard.guard(), warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        out = checkpoint(model, _input(), use_reentrant=False)
        out.sum().backward()
        line = sys._getframe().f_lineno - 1
    guard_warnings = [w for w in record if w.category is ckptguard.CheckpointGuardWarning]
    assert [(w.filename, w.lineno) for w in guard_warnings] == [(__file__, line)]
    # so a module filter works on it
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 6), nn.BatchNorm1d(6))
    with ckptguard.guard(), warnings.catch_warnings():
        warnings.filterwarnings("error", category=ckptguard.CheckpointGuardWarning, module=__name__)
        out = checkpoint(model, _input(), use_reentrant=False)
        with pytest.raises(ckptguard.CheckpointGuardWarning):
            out.sum().backward()


# ------------------------------------------------------------------------ switching it on


def test_enable_logs_once_what_it_guards(caplog, monkeypatch) -> None:
    monkeypatch.setattr(ckptguard, "_announced", set())
    with caplog.at_level(logging.INFO, logger="ckptguard"):
        ckptguard.enable()
        ckptguard.enable()
        ckptguard.disable()
        ckptguard.enable()
        ckptguard.enable(strict=True)
    lines = [r.getMessage() for r in caplog.records if r.name == "ckptguard"]
    assert len(lines) == 2, lines
    assert "default mode" in lines[0] and "use_reentrant=True and False" in lines[0]
    assert "strict mode" in lines[1]


_SCRIPT = textwrap.dedent(
    """
    import torch
    from torch.utils.checkpoint import checkpoint

    SCALE = 1.0

    def region(x):
        return (x * SCALE).tanh()

    x = torch.randn(3, requires_grad=True)
    out = checkpoint(region, x, use_reentrant=False)
    SCALE = 2.0
    out.sum().backward()
    print("no error")
    """
)


def _run_script(tmp_path, *command: str, environment: dict | None = None):
    import os

    script = tmp_path / "train.py"
    script.write_text(_SCRIPT)
    env = {**os.environ, **(environment or {})}
    env.pop("CKPTGUARD", None) if environment is None else None
    arguments = [a if a != "SCRIPT" else str(script) for a in command]
    return subprocess.run(
        [sys.executable, *arguments],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
        env=env,
    )


def test_python_m_ckptguard_runs_a_script_guarded(tmp_path) -> None:
    """(The script run unguarded ends well: the CKPTGUARD=0 run below.)"""
    guarded = _run_script(tmp_path, "-m", "ckptguard", "SCRIPT")
    assert guarded.returncode != 0
    assert "CheckpointMismatchError: ckptguard [global]" in guarded.stderr
    assert "ckptguard: guarding every torch.utils.checkpoint region" in guarded.stderr
    strict = _run_script(tmp_path, "-m", "ckptguard", "--strict", "SCRIPT")
    assert "in strict mode" in strict.stderr


def test_ckptguard_environment_variable(tmp_path) -> None:
    script = tmp_path / "uses_ckptguard.py"
    script.write_text("import ckptguard\n" + _SCRIPT)
    import os

    # a process per way the variable reaches the import (set, or set to off); the
    # other spellings are the same parse, checked below without a process each
    for value, enabled in (("strict", True), ("0", False)):
        env = {**os.environ, "CKPTGUARD": value}
        result = subprocess.run(
            [sys.executable, str(script)],
            capture_output=True,
            text=True,
            timeout=SUBPROCESS_TIMEOUT,
            env=env,
        )
        assert (result.returncode != 0) is enabled, (value, result.stderr)
        assert ("no error" in result.stdout) is not enabled
    assert ckptguard.options_from_environment("1") == {}
    assert ckptguard.options_from_environment("") is None
    assert ckptguard.options_from_environment("strict,warn") == {
        "strict": True,
        "on_mismatch": "warn",
    }
    with pytest.raises(ValueError, match="CKPTGUARD"):
        ckptguard.options_from_environment("yes please")


# ------------------------------------------------------------------------- bounded caches


def test_generated_code_does_not_grow_the_plan_caches(monkeypatch) -> None:
    """Every torch.fx or exec'd model brings new code objects; the caches keyed by code
    objects stay bounded, and the guard still guards them bit-identically."""
    monkeypatch.setattr(_readplan, "PLAN_CACHE_ENTRIES", 16)
    model = _linear()
    ckptguard.enable()
    for index in range(60):
        namespace = {"model": model}
        exec(  # noqa: S102
            compile(
                f"def region_{index}(x):\n    return model(x) * 1.0\n", f"<gen {index}>", "exec"
            ),
            namespace,
        )
        region = namespace[f"region_{index}"]
        x = _input()
        checkpoint(region, x, use_reentrant=False).sum().backward()
        model.zero_grad(set_to_none=True)
    sizes = _reader.cache_sizes()
    assert sizes["code_reads"] <= 16 and sizes["function_plans"] <= 16, sizes
    assert len(_readplan._library_files) <= 16
