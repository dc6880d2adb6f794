"""Issue 20: PEFT LoRA models with transformers' ``gradient_checkpointing_enable()`` whose
adapters get no gradient (the reentrant variant behind frozen embeddings), named by the
``lost_gradients`` report with its cause and both fixes; the fixed setups stay silent with
bit-identical gradients. Tiny random-weight models built from configs: nothing is downloaded.

Measured with transformers 5.24 and peft 0.21: ``gradient_checkpointing_enable()`` calls
``enable_input_require_grads()`` itself for a model whose input is ``input_ids`` (a Llama), so
there the adapters train; a vision model (ViT, input ``pixel_values``) gets no such call, and
with ``use_reentrant=True`` none of its LoRA weights gets a gradient. Removing the hook
(``disable_input_require_grads()``, the state older transformers left a PEFT model in) brings
the same loss to the Llama.
"""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch

import ckptguard

transformers = pytest.importorskip("transformers")
try:
    import peft
except Exception as error:  # not installed, or built against another transformers
    pytest.skip(f"peft cannot be imported: {error}", allow_module_level=True)

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")
NO_GRAD_WARNING = "None of the inputs have requires_grad=True. Gradients will be None"


def _vit() -> tuple[torch.nn.Module, dict]:
    config = transformers.ViTConfig(
        image_size=16,
        patch_size=8,
        num_channels=3,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_labels=3,
    )
    model = transformers.ViTForImageClassification(config)
    pixels = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    return model, {"pixel_values": pixels, "labels": torch.tensor([0, 2])}


def _llama() -> tuple[torch.nn.Module, dict]:
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
    )
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    return transformers.LlamaForCausalLM(config), {"input_ids": ids, "labels": ids}


def _lora(make, reentrant: bool, input_grads: str | None = None) -> tuple[torch.nn.Module, dict]:
    """A LoRA model with transformers' gradient checkpointing; ``input_grads``: "enable" or
    "disable" the hook making the embeddings' output require grad, after enabling."""
    torch.manual_seed(0)
    base, batch = make()
    head = ["classifier"] if isinstance(base, transformers.ViTForImageClassification) else None
    config = peft.LoraConfig(
        r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0, modules_to_save=head
    )
    model = peft.get_peft_model(base, config)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    if input_grads == "enable":
        model.enable_input_require_grads()
    elif input_grads == "disable":
        model.disable_input_require_grads()
    model.train()
    return model, batch


def _step(make, reentrant: bool, input_grads: str | None = None, **guard) -> tuple:
    """One training step: the LoRA weights' gradients by name, the warnings, and the error
    backward raised (a Llama whose adapters all lose their gradients has a loss that
    requires none: "element 0 of tensors does not require grad")."""
    model, batch = _lora(make, reentrant, input_grads)
    error = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with ckptguard.guard(**guard) if guard else contextlib.nullcontext():
            loss = model(**batch).loss
            try:
                loss.backward()
            except RuntimeError as caught_error:
                error = str(caught_error)
    grads = {n: p.grad for n, p in model.named_parameters() if "lora_" in n}
    assert len(grads) == 8  # q_proj and v_proj of 2 layers, A and B each
    return grads, [str(w.message) for w in caught if w.category is not FutureWarning], error


def _lora_names(layer: int) -> list[str]:
    return sorted(
        f"base_model.model.vit.layers.{layer}.attention.{proj}.lora_{ab}.default.weight"
        for proj in ("q_proj", "v_proj")
        for ab in "AB"
    )


def test_vit_lora_with_reentrant_checkpointing_trains_no_adapter_and_is_named() -> None:
    grads, messages, error = _step(_vit, reentrant=True)
    assert error is None  # the classifier head trains: nothing fails
    assert all(g is None for g in grads.values()), "plain torch: no adapter gets a gradient"
    assert NO_GRAD_WARNING in messages and not any("ckptguard" in m for m in messages)

    grads, messages, error = _step(_vit, reentrant=True, on_lost_gradients="warn")
    assert error is None and all(g is None for g in grads.values())
    reports = [m for m in messages if m.startswith("ckptguard [lost_gradients]")]
    assert len(reports) == 2  # one per layer: layer 0's output requires no grad either
    for layer, report in enumerate(reports):
        assert f"region base_model.model.vit.layers.{layer} (ViTLayer.forward, " in report
        assert all(name in report for name in _lora_names(layer))
        assert "none does (positional argument 0: tensor (2, 5, 32) torch.float32)" in report
        assert "as the embeddings in front of LoRA adapters are" in report
        assert "use use_reentrant=False" in report
        assert "call model.enable_input_require_grads() (this model has it" in report

    with pytest.raises(ckptguard.LostGradientsError) as info:
        _step(_vit, reentrant=True, on_lost_gradients="raise")
    assert sorted(info.value.details["parameters"]) == _lora_names(0)
    assert info.value.details["inputs"] == [
        "positional argument 0: tensor (2, 5, 32) torch.float32"
    ]


@pytest.mark.parametrize(
    ("make", "reentrant", "input_grads"),
    [
        (_vit, False, None),  # fix 1: the non-reentrant variant
        (_vit, True, "enable"),  # fix 2: the inputs require grad
        (_llama, True, None),  # transformers enables the inputs' grad itself for input_ids
        (_llama, False, None),
    ],
    ids=["vit-nonreentrant", "vit-enable_input_require_grads", "llama-reentrant", "llama"],
)
def test_fixed_setups_train_every_adapter_silently_and_bit_identically(
    make, reentrant: bool, input_grads: str | None
) -> None:
    plain, plain_messages, error = _step(make, reentrant, input_grads)
    assert error is None
    assert all(g is not None and g.abs().sum() > 0 for n, g in plain.items() if "lora_B" in n)
    assert all(g is not None for g in plain.values())
    assert NO_GRAD_WARNING not in plain_messages
    guarded, messages, error = _step(make, reentrant, input_grads, strict=False)
    assert error is None
    assert not any("ckptguard" in m for m in messages), messages
    assert all(torch.equal(plain[n], guarded[n]) for n in plain)


def test_llama_lora_without_the_input_hook_is_named() -> None:
    """What older transformers left a PEFT model in (no hook on the embeddings): plain torch
    fails in backward with an error that names no cause; the guard names it at the forward."""
    grads, messages, error = _step(_llama, reentrant=True, input_grads="disable")
    assert error == "element 0 of tensors does not require grad and does not have a grad_fn"
    assert all(g is None for g in grads.values())
    assert NO_GRAD_WARNING in messages
    with pytest.raises(ckptguard.LostGradientsError) as info:
        _step(_llama, reentrant=True, input_grads="disable", on_lost_gradients="raise")
    assert "base_model.model.model.layers.0 (LlamaDecoderLayer.forward, " in info.value.region
    assert all("layers.0.self_attn" in n for n in info.value.details["parameters"])
    assert len(info.value.details["parameters"]) == 4
    assert "call model.enable_input_require_grads() (this model has it" in str(info.value)
