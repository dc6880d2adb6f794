"""Gradient checkpointing in transformers model families, written for ckptguard's benchmark
(the transformers sdist ships no tests/models). Not transformers' own tests.

Each test builds a tiny random-weight model from its config, runs forward and backward once
without and once with activation checkpointing enabled (same seed, dropout left on, so RNG
restore is exercised too) and asserts that the gradients are the same.
"""

import copy

import pytest
import torch
from transformers import AutoConfig, AutoModel

SMALL = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=37,
    vocab_size=99,
    max_position_embeddings=64,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)

FAMILIES = {
    "gpt2": {},
    "gptj": {"rotary_dim": 4},
    "gpt_neox": {},
    "llama": {},
    "mistral": {},
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 32},
    "qwen2": {},
    "qwen3": {"head_dim": 8},
    "gemma": {"head_dim": 8},
    "gemma2": {"head_dim": 8},
    "phi": {},
    "stablelm": {},
    "olmo": {},
    "starcoder2": {},
    "granite": {},
    "falcon": {},
    "bloom": {},
    "opt": {"ffn_dim": 37, "word_embed_proj_dim": 32},
    "bert": {},
    "roberta": {},
    "electra": {"embedding_size": 32},
    "deberta-v2": {},
    "distilbert": {"dim": 32, "hidden_dim": 37, "n_layers": 2, "n_heads": 4},
    "vit": {"image_size": 16, "patch_size": 4},
    "t5": {
        "d_model": 32,
        "d_ff": 37,
        "d_kv": 8,
        "num_layers": 2,
        "num_decoder_layers": 2,
        "num_heads": 4,
        "decoder_start_token_id": 0,
    },
    "bart": {
        "d_model": 32,
        "encoder_layers": 2,
        "decoder_layers": 2,
        "encoder_attention_heads": 4,
        "decoder_attention_heads": 4,
        "encoder_ffn_dim": 37,
        "decoder_ffn_dim": 37,
        "decoder_start_token_id": 2,
    },
}
ENCODER_DECODER = {"t5", "bart"}


def _build(family: str) -> torch.nn.Module:
    torch.manual_seed(0)
    config = AutoConfig.for_model(family, **{**SMALL, **FAMILIES[family]})
    model = AutoModel.from_config(config)
    model.train()
    return model


def _inputs(family: str) -> dict:
    generator = torch.Generator().manual_seed(1)
    if family == "vit":
        return {"pixel_values": torch.randn(2, 3, 16, 16, generator=generator)}
    ids = torch.randint(3, 99, (2, 8), generator=generator)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if family in ENCODER_DECODER:
        inputs["decoder_input_ids"] = torch.randint(3, 99, (2, 5), generator=generator)
    return inputs


def _gradients(model: torch.nn.Module, inputs: dict) -> dict:
    torch.manual_seed(2)
    output = model(**inputs)
    output[0].float().square().mean().backward()
    return {
        name: param.grad.clone()
        for name, param in model.named_parameters()
        if param.grad is not None
    }


def _enable(model: torch.nn.Module, use_reentrant: bool) -> None:
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:  # transformers >= 5.25
        enable(activation_checkpointing_kwargs={"use_reentrant": use_reentrant})
    else:
        model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": use_reentrant}
        )


@pytest.mark.parametrize("use_reentrant", [True, False], ids=["reentrant", "non_reentrant"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_checkpointed_gradients_equal_plain(family: str, use_reentrant: bool) -> None:
    model = _build(family)
    reference = copy.deepcopy(model)
    inputs = _inputs(family)
    expected = _gradients(reference, inputs)
    _enable(model, use_reentrant)
    assert getattr(model, "is_activation_checkpointing", None) or model.is_gradient_checkpointing
    actual = _gradients(model, inputs)
    assert actual.keys() == expected.keys()
    for name, grad in expected.items():
        torch.testing.assert_close(actual[name], grad, msg=name)
