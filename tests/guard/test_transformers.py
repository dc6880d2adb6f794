"""transformers' own gradient checkpointing under the guard (runs only where it is installed).

Models are built from small configs with random weights: nothing is downloaded.
"""

from __future__ import annotations

import pytest
import torch

import ckptguard

transformers = pytest.importorskip("transformers")


def _llama():
    config = transformers.LlamaConfig(
        num_hidden_layers=2,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=100,
        max_position_embeddings=64,
    )
    return transformers.LlamaForCausalLM(config)


def _gpt2():
    config = transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=64, attn_pdrop=0.1
    )
    return transformers.GPT2LMHeadModel(config)


def _gradients(make, reentrant: bool) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = make()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    model.train()
    ids = torch.randint(0, 100, (2, 16))
    grads = []
    for _ in range(2):
        model(input_ids=ids, labels=ids).loss.backward()
        grads += [p.grad.clone() for p in model.parameters() if p.grad is not None]
        model.zero_grad()
    return grads


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("strict", [False, True], ids=["guard", "strict"])
@pytest.mark.parametrize("reentrant", [False, True], ids=["nonreentrant", "reentrant"])
@pytest.mark.parametrize("make", [_gpt2, _llama], ids=["gpt2", "llama"])
def test_bit_identical_without_alarm(make, reentrant: bool, strict: bool) -> None:
    plain = _gradients(make, reentrant)
    with ckptguard.guard(strict=strict):
        guarded = _gradients(make, reentrant)
    assert len(plain) == len(guarded) > 0
    assert all(torch.equal(a, b) for a, b in zip(plain, guarded, strict=True))


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_attribute_change_in_a_decoder_layer_is_named() -> None:
    torch.manual_seed(0)
    model = _llama()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    ids = torch.randint(0, 100, (2, 16))
    ckptguard.enable()
    out = model(input_ids=ids, labels=ids)
    model.model.layers[0].self_attn.scaling = 0.5
    with pytest.raises(ckptguard.CheckpointMismatchError) as info:
        out.loss.backward()
    assert info.value.kind == "attribute"
    assert info.value.region.startswith("model.layers.0 (LlamaDecoderLayer.forward, ")
    assert "modeling_llama.py" in info.value.region
    assert "model.layers.0.self_attn.scaling" in str(info.value)
