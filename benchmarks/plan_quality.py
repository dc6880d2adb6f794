"""How good are ckptguard.plan's plans? Predicted against measured memory, and recompute time
against checkpointing every layer, on transformers Llama and GPT-2 and a timm ViT (CPU).

Models are built from small configs with random weights (nothing is downloaded). Each model is
measured once by the planner; then for each budget the optimal plan is applied and the training
step is measured: activation peak by the allocator (independent of the planner's hooks), the
gradients against the unplanned model's (torch.equal, dropout on, same seed), and step time in
interleaved rounds (unplanned, every layer, each budget; medians), so load on the shared
machine hits all configurations alike. "recompute" is the median step time minus the unplanned
median. The "vs every layer" column compares with checkpointing every layer whenever the plan's
budget is at least every layer's memory (the planner's goal there: never slower).

    python benchmarks/plan_quality.py [--models llama,gpt2,vit] [--rounds 5] [--plot docs/x.png]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

import ckptguard
from ckptguard.planner import PlanInfeasibleError, plan_for_choices, plan_from_tree
from ckptguard.planner.measure import isolated_steps, run_step
from ckptguard.planner.verify import measured_peak
from ckptguard.pricing import MIB

FRACTIONS = (0.3, 0.5, 0.75)


def build(name: str):
    """(model, args, kwargs, loss_fn) with activations well above the parameters."""
    torch.manual_seed(0)
    if name == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(
            hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=4, vocab_size=2000, max_position_embeddings=512,
            attention_dropout=0.1,
        )  # fmt: skip
        ids = torch.randint(0, 2000, (4, 256))
        return LlamaForCausalLM(config).train(), (), {"input_ids": ids, "labels": ids}, None
    if name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(
            n_embd=256, n_layer=4, n_head=4, vocab_size=2000, n_positions=512,
            bos_token_id=0, eos_token_id=0,
        )  # fmt: skip
        ids = torch.randint(0, 2000, (4, 256))
        return GPT2LMHeadModel(config).train(), (), {"input_ids": ids, "labels": ids}, None
    if name == "vit":
        import timm

        model = timm.create_model(
            "vit_tiny_patch16_224", pretrained=False, num_classes=10, drop_path_rate=0.1
        )
        images, labels = torch.randn(8, 3, 224, 224), torch.randint(0, 10, (8,))

        def loss_fn(logits):
            return torch.nn.functional.cross_entropy(logits, labels)

        return model.train(), (images,), {}, loss_fn
    raise ValueError(f"unknown model {name!r}")


def run_model(name: str, rounds: int, plot: str | None) -> list[str]:
    try:
        model, args, kwargs, loss_fn = build(name)
    except ImportError as exc:
        return [f"| {name} | skipped: {exc} |"]
    start = time.perf_counter()
    reference_plan = ckptguard.plan(model, *args, budget=1.0, loss_fn=loss_fn, **kwargs)
    plan_seconds = time.perf_counter() - start
    tree = reference_plan.tree
    every = reference_plan.every_layer()
    every_plan = plan_for_choices(tree, every["choices"], every["peak_bytes"], type(model).__name__)
    configs = [("every layer", every_plan)]
    budgets = [("= every layer", every["peak_bytes"])]
    budgets += [(f"{f:.2f} x unplanned", int(f * tree.unplanned_peak)) for f in FRACTIONS]
    notes = {}
    for label, budget in budgets:
        try:
            configs.append((label, plan_from_tree(tree, budget, type(model).__name__)))
        except PlanInfeasibleError as exc:
            notes[label] = f"infeasible: least achievable {exc.minimum_bytes / MIB:.1f} MiB"
    device = torch.device("cpu")
    measured, identical, times = {}, {}, {label: [] for label in ["unplanned", *dict(configs)]}
    with isolated_steps(model, device) as state:

        def step():
            run_step(model, args, kwargs, loss_fn)

        state.reset()
        step()
        reference = [p.grad.clone() for p in state.params]
        state.reset()
        measured["unplanned"], _ = measured_peak(device, step)
        for label, plan in configs:
            plan.apply(model)
            state.reset()
            measured[label], _ = measured_peak(device, step)
            state.reset()
            step()
            identical[label] = all(
                torch.equal(p.grad, r) for p, r in zip(state.params, reference, strict=True)
            )
            plan.remove(model)
        order = [("unplanned", None), *configs]
        for round_index in range(rounds):  # each round starts with another configuration
            shift = round_index % len(order)
            for label, plan in order[shift:] + order[:shift]:
                if plan is not None:
                    plan.apply(model)
                state.reset()
                begin = time.perf_counter()
                step()
                times[label].append(time.perf_counter() - begin)
                if plan is not None:
                    plan.remove(model)
    median = {label: statistics.median(values) for label, values in times.items()}
    recompute = {label: median[label] - median["unplanned"] for label in median}
    rows = [
        f"| {name} | unplanned | - | {tree.unplanned_peak / MIB:.1f} | "
        f"{measured['unplanned'] / MIB:.1f} | - | - | - | - | {median['unplanned'] * 1e3:.0f} "
        f"| - | - | planned in {plan_seconds:.0f} s |"
    ]
    for label, plan in configs:
        error = (plan.predicted_peak_bytes - measured[label]) / measured[label]
        is_every = label == "every layer"
        met = "-" if is_every else ("yes" if measured[label] <= plan.budget_bytes else "NO")
        versus = "-"
        if not is_every and plan.budget_bytes >= every_plan.predicted_peak_bytes:
            ratio = plan.recompute_seconds / max(1e-12, every_plan.recompute_seconds)
            versus = f"{ratio:.0%} of every layer's (predicted)"
        rows.append(
            f"| {name} | {label} | {plan.budget_bytes / MIB:.1f} | "
            f"{plan.predicted_peak_bytes / MIB:.1f} | {measured[label] / MIB:.1f} | "
            f"{error:+.1%} | {met} | {len(plan.regions)} | {plan.recompute_seconds * 1e3:.0f} | "
            f"{median[label] * 1e3:.0f} | {recompute[label] * 1e3:+.0f} | "
            f"{'yes' if identical[label] else 'NO'} | {versus} |"
        )
    for label, note in notes.items():
        rows.append(f"| {name} | {label} | {note} |")
    if plot:
        half = dict(configs).get(f"{FRACTIONS[1]:.2f} x unplanned")
        if half is not None:
            half.plot(plot)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="llama,gpt2,vit")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--plot", default=None, help="draw the first model's curve here")
    parser.add_argument("--threads", type=int, default=1)
    options = parser.parse_args()
    torch.set_num_threads(options.threads)
    print(
        f"torch {torch.__version__}, CPU, {options.threads} threads, "
        f"{options.rounds} interleaved rounds (medians)\n"
    )
    print(
        "| model | budget | budget MiB | predicted peak MiB | measured peak MiB | error | "
        "budget met | regions | recompute ms (model) | step ms | step - unplanned ms | "
        "grads bit-identical | recompute vs every layer |"
    )
    print("|" + " --- |" * 13)
    for index, name in enumerate(options.models.split(",")):
        for row in run_model(name, options.rounds, options.plot if index == 0 else None):
            print(row, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
