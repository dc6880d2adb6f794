"""ckptguard.pricing: saved-activation bytes, recompute FLOPs and the worth-it verdict."""

import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from ckptguard.pricing import (  # noqa: E402
    DEFAULT_POLICY,
    SavedBytesCounter,
    format_price_table,
    judge,
    measure_saved_bytes,
    price,
)

FP32 = 4


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def test_lone_activation_is_not_worth_it():
    x = torch.randn(8, 64, 128)
    result = price(nn.GELU(), x)
    # GELU saves exactly its input; checkpoint keeps exactly its input: nothing is freed.
    assert result.bytes_without_checkpoint == x.nbytes
    assert result.bytes_with_checkpoint == x.nbytes
    assert result.bytes_saved == 0
    assert not result.worth_it
    assert result.verdict == "not worth it"
    assert result.rule == "saved_per_input_byte"
    assert result.threshold == DEFAULT_POLICY.min_saved_per_input_byte


def test_transformer_block_is_worth_it():
    block = nn.TransformerEncoderLayer(64, 4, dim_feedforward=256, batch_first=True)
    x = torch.randn(4, 32, 64)
    result = price(block, x)
    assert result.worth_it
    assert result.verdict == "worth it"
    assert result.rule == "mib_saved_per_gflop"
    assert result.ratio == result.mib_saved_per_gflop > DEFAULT_POLICY.min_mib_saved_per_gflop
    # Attention, two FFN matmuls, norms and dropout masks: many inputs' worth of activations.
    assert result.bytes_saved > 10 * x.nbytes
    assert result.recompute_flops > 0
    assert result.recompute_seconds > 0


def test_mlp_saved_bytes_equal_hand_count():
    batch, d_in, hidden, d_out = 4, 8, 32, 2
    mlp = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, d_out))
    result = price(mlp, torch.randn(batch, d_in))
    # What autograd saves (x requires grad, fp32), parameters excluded:
    #   Linear1 = addmm(b1, x, W1.T): saves x [4, 8] for dW1 (and W1.T for dx: a parameter)
    #   ReLU: saves its result h [4, 32]
    #   Linear2 = addmm(b2, h, W2.T): saves h again (same storage, counted once) and W2.T
    x_bytes = batch * d_in * FP32  # 128
    h_bytes = batch * hidden * FP32  # 512
    assert result.bytes_without_checkpoint == x_bytes + h_bytes == 640
    assert result.bytes_with_checkpoint == x_bytes  # checkpoint keeps only the input
    assert result.bytes_saved == h_bytes
    assert result.saved_per_input_byte == 4.0
    # Forward: 2*4*8*32 + 2*4*32*2 = 2560 FLOPs. Non-reentrant recompute stops once h (the last
    # saved tensor) is rebuilt, so the second addmm never runs again: 2048 recomputed.
    assert result.forward_flops == 2 * batch * d_in * hidden + 2 * batch * hidden * d_out
    assert result.recompute_flops == 2 * batch * d_in * hidden


def test_views_of_one_storage_count_once():
    x = torch.randn(16, 16, requires_grad=True)
    # mul saves both operands: two row views of x, one storage (its full 1 KiB is held).
    assert measure_saved_bytes(lambda t: t[0] * t[1], [x]) == x.nbytes == 1024


def test_module_buffers_excluded_also_through_closure_and_globals():
    channels, batch = 16, 8
    norm = nn.BatchNorm1d(channels)
    x = torch.randn(batch, channels)
    # native_batch_norm saves input, weight, running mean/var, and save_mean/save_invstd [C]:
    # only the input and the two per-batch statistics are activations.
    expected = x.nbytes + 2 * channels * FP32
    assert price(norm, x).bytes_without_checkpoint == expected
    assert price(lambda t: norm(t), x).bytes_without_checkpoint == expected
    assert price(norm.forward, x).bytes_without_checkpoint == expected


def test_price_leaves_model_rng_and_inputs_as_they_were():
    block = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Dropout(0.5), nn.Linear(8, 8))
    x = torch.randn(4, 8)
    buffers_before = [b.clone() for b in block.buffers()]
    rng_before = torch.get_rng_state()
    price(block, x)
    assert torch.equal(torch.get_rng_state(), rng_before)
    assert all(torch.equal(a, b) for a, b in zip(buffers_before, block.buffers(), strict=True))
    assert not x.requires_grad and x.grad is None
    assert all(p.grad is None for p in block.parameters())


def test_price_does_not_run_the_graph_upstream_of_its_inputs():
    weight = torch.randn(4, 8, requires_grad=True)
    activation = weight * 2  # an input produced by an earlier layer
    price(nn.Sequential(nn.Linear(8, 8), nn.Tanh()), activation)
    assert weight.grad is None


def test_counter_leaves_backward_exact_and_keeps_the_inplace_check():
    x = torch.randn(6, requires_grad=True)
    with SavedBytesCounter() as counter:
        y = x.exp() * x  # exp saves its result; mul saves that result again, and x
    (grad,) = torch.autograd.grad(y.sum(), x)
    assert counter.bytes == 2 * x.nbytes
    assert torch.equal(grad, x.exp() * x + x.exp())
    with SavedBytesCounter():
        z = x.exp()
    z.add_(1)  # modifies the tensor exp saved for its backward
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.sum().backward()


def test_keyword_arguments_reach_the_region_and_count_as_kept():
    def scaled_mlp(x, *, scale):
        return torch.relu(x @ scale)

    x, scale = torch.randn(4, 8), torch.randn(8, 8)
    result = price(scaled_mlp, x, scale=scale)
    # matmul saves x and scale (both need grad), relu saves its [4, 8] result.
    assert result.bytes_without_checkpoint == x.nbytes + scale.nbytes + 4 * 8 * FP32
    assert result.bytes_with_checkpoint == x.nbytes + scale.nbytes
    assert result.name.endswith("scaled_mlp")


def test_judge_flags_costly_recompute_and_negative_saving():
    heavy = judge("heavy", bytes_without=3 << 20, bytes_with=1 << 20, recompute_flops=100 * 10**9,
                  recompute_seconds=0.1)  # fmt: skip
    assert heavy.rule == "mib_saved_per_gflop" and not heavy.worth_it
    assert heavy.mib_saved_per_gflop == pytest.approx(0.02)
    reduction = judge("sum", bytes_without=0, bytes_with=1024, recompute_flops=0,
                      recompute_seconds=0.0)  # fmt: skip
    assert reduction.bytes_saved == -1024 and not reduction.worth_it
    assert reduction.reason == "saved_per_input_byte -1 < 1"


def test_record_is_json_serialisable_and_tabulates():
    result = price(nn.GELU(), torch.randn(4, 4))
    data = json.loads(json.dumps(result.to_dict(), allow_nan=False))
    assert data["verdict"] == "not worth it"
    assert data["bytes_saved"] == 0
    assert data["mib_saved_per_gflop"] is None
    table = format_price_table([result])
    assert "GELU" in table and "not worth it" in table


def test_importing_pricing_does_not_need_torch():
    code = "import sys; sys.modules['torch'] = None; import ckptguard.pricing; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"
