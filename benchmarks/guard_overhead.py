"""Overhead of ckptguard on CPU training steps: plain, guarded and strict runs interleaved.

Every configuration runs its modes step by step in rotating order (plain, guard, strict, then
guard, strict, plain, ...), so drift on a shared machine hits all modes alike; it reports the
median step time of each mode (wall clock and process CPU time) and the median of the per-round
ratios to the plain step.

Configurations:
* transformers Llama, 4 layers, hidden 128, seq 64, batch 1 and 4, random weights from a config
  (goals: guard <= 1 % of the step at batch 4, <= 3 % at batch 1, <= 80 us of CPU per region;
  strict <= 1.4x at batch 4, also with torch on every core), with each mode's CPU time per
  region (median of the paired differences to the plain step); then the floor of any guard at
  the same hook point: torch's generator wrapped with nothing to fingerprint, and with only the
  parameters' version counters, against the guard; and where the guard's time goes: one
  region's read timed right after a plain step and again cached, beside the least any read
  that sees every write path must touch (each module's attribute, parameter, buffer, child
  and hook dicts, each parameter's version, data pointer and requires_grad);
* transformers Llama, 4 layers, hidden 1024, seq 256, batch 2 (goal: guard <= 0.5 %);
* a transformers ``Trainer`` run of a tiny PEFT LoRA Llama with the Trainer's gradient
  checkpointing (goal: guard <= 1 %; needs peft and accelerate, skipped without them);
* strict mode's checksums of one Llama layer's saved tensors, on one thread and on every core;
* timm ViT-tiny (vit_tiny_patch16_224, random weights), batch 2, timm's own checkpointing;
* a depth sweep: 8/16/32/64 blocks under ``checkpoint_sequential`` (one block per segment,
  64/depth steps per trial, so every depth's trial runs about as many regions):
  the guard's cost per region must stay flat (+-20 %); it also prints the counted work per
  region (modules and values fingerprinted), which must not grow with depth;
* 8 blocks x hidden 512 (the original configurations), batch 32 x seq 128 and batch 1 x seq 16.

``--only SECTION...`` runs some of them; ``--write-docs`` writes the summary table into
docs/guard.md (between its markers).

Run: python benchmarks/guard_overhead.py [--rounds N] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
import warnings
from collections.abc import Callable, Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

import ckptguard
from ckptguard import _compat, _verify

MODES = {"plain": None, "guard": {}, "strict": {"strict": True}}


def timed(step: Callable[[], None], mode: str) -> tuple[float, float]:
    """(wall, cpu) seconds of one step; a step that times its own part (a Trainer run leaves
    out its set-up) returns that pair instead."""
    with _mode(mode):
        wall, cpu = time.perf_counter(), time.process_time()
        own = step()
        if own is not None:
            return own
        return time.perf_counter() - wall, time.process_time() - cpu


@contextlib.contextmanager
def _mode(mode: str) -> Iterator[None]:
    if mode in FLOOR:
        with _floor(read_versions=mode == "versions"):
            yield
        return
    options = MODES[mode]
    if options is not None:
        ckptguard.enable(**options)
    try:
        yield
    finally:
        ckptguard.disable()


# ------------------------------------------------------------- the floor of any such guard

FLOOR = ("intercept", "versions")


class _FloorRegion:
    """What the least a guard at ckptguard's hook point must do: stand in for the region's
    function (torch calls it to recompute) and, with ``params``, compare the version counters
    of the region's parameters read after the forward with those before the recompute."""

    __slots__ = ("fn", "params", "seen")

    def __init__(self, fn: Callable, params: list | None) -> None:
        self.fn, self.params, self.seen = fn, params, None

    def versions(self) -> tuple:
        return tuple([p._version for p in self.params])

    def __call__(self, *args, **kwargs):
        if self.seen is not None and self.versions() != self.seen:
            raise RuntimeError("a parameter changed between forward and recompute")
        return self.fn(*args, **kwargs)


_floor_params: dict[int, list] = {}


@contextlib.contextmanager
def _floor(read_versions: bool) -> Iterator[None]:
    """Wraps torch's non-reentrant generator as ckptguard does (resolved by its compatibility
    module), with nothing or only parameter versions to fingerprint. transformers' layers
    hand torch ``partial(forward, layer, **kwargs)``."""
    patched = []
    for owner, name, original in _compat.resolve().generators:

        def generator(fn, *args, _original=original, **kwargs):
            params = None
            if read_versions:
                layer = fn.args[0]
                params = _floor_params.get(id(layer))
                if params is None:
                    params = _floor_params[id(layer)] = list(layer.parameters())
            region = _FloorRegion(fn, params)
            yield from _original(region, *args, **kwargs)
            if params is not None:
                region.seen = region.versions()

        patched.append((owner, name, original))
        setattr(owner, name, generator)
    try:
        yield
    finally:
        for owner, name, original in patched:
            setattr(owner, name, original)


def interleave(step: Callable[[], None], modes: list[str], rounds: int) -> dict[str, list]:
    return interleave_trials({mode: (step, mode) for mode in modes}, rounds)


def interleave_trials(trials: dict[str, tuple[Callable[[], None], str]], rounds: int) -> dict:
    """{label: [(wall, cpu), ...]} of each (step, mode) trial, every trial once per round in a
    rotating order, after two warm-up runs each (they build the guard's plans and readers)."""
    labels = list(trials)
    for label in labels:
        for _ in range(2):
            timed(*trials[label])
    results: dict[str, list] = {label: [] for label in labels}
    for index in range(rounds):
        shift = index % len(labels)
        for label in labels[shift:] + labels[:shift]:
            results[label].append(timed(*trials[label]))
    return results


def report(
    name: str, results: dict[str, list], goals: dict[str, str], regions: int = 0
) -> dict[str, tuple[float, float, float]]:
    """Prints each mode's medians; returns {mode: (cpu median, cpu ratio, cpu per region)}."""
    plain = results["plain"]
    print(f"{name}")
    summary = {}
    for mode, samples in results.items():
        wall = statistics.median(s[0] for s in samples)
        cpu = statistics.median(s[1] for s in samples)
        line = f"  {mode:<9} wall {wall * 1e3:8.2f} ms  cpu {cpu * 1e3:8.2f} ms"
        summary[mode] = (cpu, 1.0, 0.0)
        if mode != "plain":
            wall_ratio = statistics.median(s[0] / p[0] for s, p in zip(samples, plain, strict=True))
            cpu_ratio = statistics.median(s[1] / p[1] for s, p in zip(samples, plain, strict=True))
            line += (
                f"  ratio wall x{wall_ratio:.4f} ({(wall_ratio - 1) * 100:+.2f} %)"
                f"  cpu x{cpu_ratio:.4f} ({(cpu_ratio - 1) * 100:+.2f} %)"
            )
            if mode in goals:
                line += f"  goal {goals[mode]}"
            if regions:
                per_region = statistics.median(
                    (s[1] - p[1]) / regions for s, p in zip(samples, plain, strict=True)
                )
                line += f"  ({per_region * 1e6:.0f} us cpu per region)"
            else:
                per_region = 0.0
            summary[mode] = (cpu, cpu_ratio, per_region)
        print(line)
    print(f"  [{len(plain)} interleaved rounds, medians]")
    return summary


# ------------------------------------------------------------------------ transformers Llama


def llama_config(hidden: int = 128) -> object:
    import transformers

    return transformers.LlamaConfig(
        num_hidden_layers=4,
        hidden_size=hidden,
        intermediate_size=hidden * 43 // 16,  # 344 at 128, 2752 at 1024
        num_attention_heads=max(4, hidden // 64),  # 4 at 128, 16 at 1024
        num_key_value_heads=max(4, hidden // 64) // 2,
        vocab_size=1000,
        max_position_embeddings=256,
    )


def llama_step(batch: int, hidden: int = 128, seq: int = 64) -> Callable[[], None] | None:
    try:
        import transformers
    except ImportError:
        return None
    config = llama_config(hidden)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    model.train()
    ids = torch.randint(0, config.vocab_size, (batch, seq))

    def step() -> None:
        model(input_ids=ids, labels=ids).loss.backward()
        model.zero_grad(set_to_none=True)

    return step


FLOOR_TEXT = (
    "torch's generator wrapped as ckptguard wraps it, with no fingerprint (intercept) and with"
    " only the layer's parameter version counters (versions)"
)


# -------------------------------------------------------------- a tiny LoRA Trainer run


LORA_STEPS = 8  # optimizer steps per Trainer run
LORA_LAYERS = 4


def lora_trainer_run() -> Callable[[], tuple[float, float]] | None:
    """A transformers ``Trainer`` run (``LORA_STEPS`` steps, batch 4 x seq 32) of a tiny Llama
    (4 layers x hidden 64) with PEFT LoRA adapters on every projection (each a small module
    tree: Linear, lora_A, lora_B and dropout in ModuleDicts) and the Trainer's own gradient
    checkpointing; timed from the Trainer's ``on_train_begin`` to ``on_train_end``, so its
    set-up (optimizer, data loader) is left out. None without peft (or accelerate)."""
    try:
        import peft
        import transformers
    except ImportError:
        return None
    import tempfile

    transformers.logging.set_verbosity_error()
    config = transformers.LlamaConfig(
        num_hidden_layers=LORA_LAYERS,
        hidden_size=64,
        intermediate_size=172,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=500,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    projections = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    adapters = peft.LoraConfig(
        r=8, lora_alpha=16, lora_dropout=0.05, target_modules=projections, task_type="CAUSAL_LM"
    )
    model = peft.get_peft_model(transformers.LlamaForCausalLM(config), adapters)
    generator = torch.Generator().manual_seed(1)
    data = []
    for _ in range(64):
        ids = torch.randint(0, config.vocab_size, (32,), generator=generator)
        data.append({"input_ids": ids, "labels": ids})
    arguments = transformers.TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="guard-overhead-"),
        max_steps=LORA_STEPS,
        per_device_train_batch_size=4,
        gradient_checkpointing=True,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
    )
    clock: list[float] = []

    class Clock(transformers.TrainerCallback):
        def on_train_begin(self, *args, **kwargs):
            clock[:] = [time.perf_counter(), time.process_time()]

        def on_train_end(self, *args, **kwargs):
            clock[:] = [time.perf_counter() - clock[0], time.process_time() - clock[1]]

    trainer = transformers.Trainer(
        model=model, args=arguments, train_dataset=data, callbacks=[Clock()]
    )
    trainer.remove_callback(transformers.trainer_callback.PrinterCallback)

    def run() -> tuple[float, float]:
        trainer.train()
        return clock[0], clock[1]

    return run


# ------------------------------------------------------------------------------ timm ViT-tiny


def vit_step() -> Callable[[], None] | None:
    try:
        import timm
    except Exception:  # timm imports torchvision, which may not match this torch
        return None
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False)
    model.set_grad_checkpointing(True)
    model.train()
    images = torch.randn(2, 3, 224, 224)

    def step() -> None:
        model(images).square().mean().backward()
        model.zero_grad(set_to_none=True)

    return step


# ------------------------------------------------------------------------------ depth sweep


class SmallBlock(nn.Module):
    def __init__(self, hidden: int = 64) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.up = nn.Linear(hidden, 2 * hidden)
        self.down = nn.Linear(2 * hidden, hidden)
        self.scale = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x)))) * self.scale


def depth_step(depth: int, repeats: int = 1) -> Callable[[], None]:
    """``repeats`` training steps: the sweep gives every depth about as many regions per
    trial, so that the machine's noise weighs alike on each depth's cost per region."""
    torch.manual_seed(0)
    sequence = nn.Sequential(*(SmallBlock() for _ in range(depth)))
    x = torch.randn(4, 16, 64, requires_grad=True)

    def step() -> None:
        for _ in range(repeats):
            out = checkpoint_sequential(sequence, depth, x, use_reentrant=False)
            out.square().mean().backward()
            sequence.zero_grad(set_to_none=True)
            x.grad = None

    return step


def fingerprints_of(step: Callable[[], None]) -> list:
    """The fingerprints one guarded step takes, one per region."""
    taken: list = []
    original = _verify.capture

    def keeping(*args, **kwargs):
        fingerprint = original(*args, **kwargs)
        taken.append(fingerprint)
        return fingerprint

    _verify.capture = keeping
    try:
        timed(step, "guard")
    finally:
        _verify.capture = original
    return taken


def counted_work(step: Callable[[], None]) -> tuple[float, float]:
    """Modules and values fingerprinted per region, averaged over one guarded step."""
    taken = fingerprints_of(step)
    return (
        statistics.mean(len(f.reader.module_plans) for f in taken),
        statistics.mean(len(f.values) for f in taken),
    )


def read_cost(step: Callable[[], None], rounds: int) -> None:
    """Where the guard's time goes: one region's read (what it does after the forward and
    again before the recompute) timed right after a plain training step, whose kernels have
    pushed the reader's objects out of the CPU caches, and again at once, with them cached;
    beside it, on the same modules right after a step, the least a read can touch and still
    see a write that goes past ``nn.Module``'s methods (``__dict__``, ``object.__setattr__``,
    ``_parameters``, ``_modules``, the hook dicts, ``.data``, ``requires_grad_``): those
    dicts and the parameters' counters, nothing derived from them."""
    fingerprint = fingerprints_of(step)[0]
    reader, own = fingerprint.reader, frozenset()
    functions = sum(label[:2] == ("function", "function") for label in reader.labels)
    after_step, cached, least = [], [], []
    for _ in range(rounds):
        timed(step, "plain")
        for samples in (after_step, cached):
            start = time.perf_counter()
            reader.read(fingerprint.modules, fingerprint.roots, own)
            samples.append(time.perf_counter() - start)
        timed(step, "plain")
        start = time.perf_counter()
        _touch_every_write_path(fingerprint.modules)
        least.append(time.perf_counter() - start)
    print(
        f"  one region's read ({len(fingerprint.values)} values from "
        f"{len(fingerprint.modules)} modules and {functions} functions):"
        f" {statistics.median(after_step) * 1e6:.1f} us right after a plain step,"
        f" {statistics.median(cached) * 1e6:.1f} us cached; the least a read that sees every"
        f" write path touches, right after a step: {statistics.median(least) * 1e6:.1f} us"
        f" [{rounds} rounds, medians]"
    )


_HOOK_DICTS = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")


def _touch_every_write_path(modules: list) -> None:
    for module in modules:
        state = module.__dict__
        state.get("training")
        for name in _HOOK_DICTS:
            len(state[name])
        len(state["_buffers"]), len(state["_modules"])
        for parameter in state["_parameters"].values():
            if parameter is not None:
                parameter._version, parameter.data_ptr(), parameter.requires_grad


# ------------------------------------------------------------- 8 blocks x hidden 512 (original)


class Block(nn.Module):
    """Pre-norm transformer block: attention and a 4x MLP, with dropout."""

    def __init__(self, hidden: int, heads: int = 8, dropout: float = 0.1):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.norm2 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, seq, 3, self.heads, -1).unbind(2)
        attn = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        )
        x = x + self.dropout(self.proj(attn.transpose(1, 2).reshape(batch, seq, hidden)))
        return x + self.dropout(self.fc2(F.gelu(self.fc1(self.norm2(x)))))


def blocks_step(batch: int, seq: int) -> Callable[[], None]:
    torch.manual_seed(0)
    blocks = nn.ModuleList(Block(512) for _ in range(8))
    x = torch.randn(batch, seq, 512, requires_grad=True)

    def step() -> None:
        hidden = x
        for block in blocks:
            hidden = checkpoint(block, hidden, use_reentrant=False)
        hidden.square().mean().backward()
        blocks.zero_grad(set_to_none=True)

    return step


# --------------------------------------------------------------- strict mode's checksums


def saved_by_one_layer(step_batch: int) -> list:
    """The tensors one Llama layer saves for backward (without checkpoint), as strict mode
    checksums them at forward and at recompute."""
    import transformers

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(llama_config())
    model.train()
    saved: list = []
    contexts: list = []
    layer = model.model.layers[0]

    def enter(*_):
        contexts.append(torch.autograd.graph.saved_tensors_hooks(_keep(saved), lambda t: t))
        contexts[-1].__enter__()

    def leave(*_):
        contexts.pop().__exit__(None, None, None)

    layer.register_forward_pre_hook(enter)
    layer.register_forward_hook(leave)
    ids = torch.randint(0, 1000, (step_batch, 64))
    model(input_ids=ids, labels=ids)
    return saved


def _keep(saved: list) -> Callable:
    def pack(tensor):
        saved.append(tensor.detach())
        return tensor

    return pack


def checksum_cost(rounds: int) -> dict[int, float]:
    """Strict mode's checksums of one Llama layer's saved tensors (batch 4), timed with torch
    on one thread and on every core: {threads: median seconds}."""
    from ckptguard import _strict

    tensors = saved_by_one_layer(4)
    before = torch.get_num_threads()
    found = {}
    counts = sorted({1, os.cpu_count() or 1})
    try:
        samples: dict[int, list] = {n: [] for n in counts}
        for _ in range(rounds):
            for threads in counts:
                torch.set_num_threads(threads)
                start = time.perf_counter()
                _strict.signatures(tensors)
                samples[threads].append(time.perf_counter() - start)
        for threads in counts:
            found[threads] = statistics.median(samples[threads])
    finally:
        torch.set_num_threads(before)
    sizes = sorted(t.numel() for t in tensors)
    print(
        f"  strict checksums of one layer's {len(tensors)} saved tensors ({sizes[0]} to"
        f" {sizes[-1]} elements): "
        + ", ".join(f"{found[n] * 1e6:.0f} us with {n} thread(s)" for n in counts)
        + f" [{rounds} rounds, medians]"
    )
    return found


# ------------------------------------------------------------------------------ the table

DOCS = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "docs", "guard.md")
BEGIN, END = "<!-- guard_overhead.py: begin -->", "<!-- guard_overhead.py: end -->"


def write_table(rows: list[tuple[str, str, str, str]], header: str) -> None:
    """Replaces the table between the markers of docs/guard.md (appends the section the
    first time)."""
    lines = [
        BEGIN,
        header,
        "",
        "| configuration | plain step (cpu) | guard | strict mode |",
        "| --- | --- | --- | --- |",
        *(f"| {' | '.join(row)} |" for row in rows),
        END,
    ]
    with open(DOCS, encoding="utf-8") as handle:
        text = handle.read()
    block = "\n".join(lines)
    if BEGIN in text and END in text:
        start, stop = text.index(BEGIN), text.index(END) + len(END)
        text = text[:start] + block + text[stop:]
    else:
        text = text.rstrip("\n") + "\n\n## Cost, as last measured\n\n" + block + "\n"
    with open(DOCS, "w", encoding="utf-8") as handle:
        handle.write(text)
    print(f"table written to {os.path.normpath(DOCS)}")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds < 10 else f"{seconds:.1f} s"


def _guard_cell(summary: dict, regions: int) -> str:
    if "guard" not in summary:
        return "-"
    _, ratio, per_region = summary["guard"]
    cell = f"{(ratio - 1) * 100:+.2f} %"
    return f"{cell} ({per_region * 1e6:.0f} us per region)" if regions else cell


def _strict_cell(summary: dict) -> str:
    return f"x{summary['strict'][1]:.2f}" if "strict" in summary else "-"


def _row(name: str, summary: dict, regions: int = 0) -> tuple[str, str, str, str]:
    plain = _ms(summary["plain"][0])
    return (name, plain, _guard_cell(summary, regions), _strict_cell(summary))


SECTIONS = ("llama", "wide", "lora", "checksums", "vit", "depth", "blocks")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=40, help="interleaved rounds (Llama)")
    parser.add_argument("--quick", action="store_true", help="fewer rounds everywhere")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, default=SECTIONS)
    parser.add_argument(
        "--write-docs", action="store_true", help="write the summary table into docs/guard.md"
    )
    args = parser.parse_args()
    warnings.filterwarnings("ignore", category=FutureWarning)  # transformers' renames
    torch.set_num_threads(args.threads)
    rounds = 8 if args.quick else args.rounds
    header = f"torch {torch.__version__}, {torch.get_num_threads()} thread(s)"
    print(header)
    rows: list[tuple[str, str, str, str]] = []

    if "llama" in args.only:
        for batch, goal in ((1, "<= 3 %"), (4, "<= 1 %")):
            step = llama_step(batch)
            if step is None:
                print("transformers Llama: skipped (transformers is not installed)")
                break
            strict_goal = "<= x1.4" if batch == 4 else "none set"
            results = interleave(step, ["plain", "guard", "strict"], rounds)
            name = f"transformers Llama 4 x 128, seq 64, batch {batch}"
            summary = report(name, results, {"guard": goal, "strict": strict_goal}, regions=4)
            rows.append(_row(name, summary, regions=4))
            results = interleave(step, ["plain", *FLOOR, "guard"], rounds)
            report(f"  the floor at batch {batch}: {FLOOR_TEXT}", results, {}, regions=4)
            read_cost(step, rounds)
        cores = os.cpu_count() or 1
        step = llama_step(4)
        if step is not None and cores > 1:
            torch.set_num_threads(cores)
            try:
                results = interleave(step, ["plain", "strict"], rounds)
                name = f"transformers Llama 4 x 128, seq 64, batch 4, {cores} threads"
                rows.append(_row(name, report(name, results, {"strict": "<= x1.4"}, regions=4)))
            finally:
                torch.set_num_threads(args.threads)

    if "wide" in args.only:
        step = llama_step(2, hidden=1024, seq=256)
        if step is not None:
            wide_rounds = 4 if args.quick else max(8, rounds // 3)
            results = interleave(step, ["plain", "guard"], wide_rounds)
            name = "transformers Llama 4 x 1024, seq 256, batch 2"
            rows.append(_row(name, report(name, results, {"guard": "<= 0.5 %"}, regions=4), 4))

    if "lora" in args.only:
        run = lora_trainer_run()
        if run is None:
            print("LoRA Trainer run: skipped (peft or accelerate is not installed)")
        else:
            lora_rounds = 6 if args.quick else max(10, rounds // 2)
            results = interleave(run, ["plain", "guard"], lora_rounds)
            name = (
                f"transformers Trainer, PEFT LoRA Llama {LORA_LAYERS} x 64, gradient"
                f" checkpointing, {LORA_STEPS} steps of batch 4 x seq 32"
            )
            regions = LORA_LAYERS * LORA_STEPS
            summary = report(name, results, {"guard": "<= 1 %"}, regions=regions)
            rows.append(_row(name, summary, regions))

    if "checksums" in args.only and llama_step(1) is not None:
        checksum_cost(rounds)

    if "vit" in args.only:
        step = vit_step()
        if step is None:
            print("timm ViT-tiny: skipped (timm cannot be imported with this torch)")
        else:
            results = interleave(step, ["plain", "guard", "strict"], max(4, rounds // 4))
            name = "timm vit_tiny_patch16_224, batch 2"
            rows.append(_row(name, report(name, results, {})))

    if "depth" in args.only:
        rows.append(depth_sweep(rounds))

    if "blocks" in args.only:
        classic_rounds = 3 if args.quick else 5
        for batch, seq, rounds_here in ((32, 128, classic_rounds), (1, 16, rounds)):
            results = interleave(blocks_step(batch, seq), ["plain", "guard", "strict"], rounds_here)
            name = f"8 blocks x hidden 512, batch {batch} x seq {seq}"
            rows.append(_row(name, report(name, results, {})))

    if args.write_docs:
        write_table(rows, f"`python benchmarks/guard_overhead.py` ({header}, CPU time, medians):")


def depth_sweep(rounds: int) -> tuple[str, str, str, str]:
    print("depth sweep: checkpoint_sequential, one SmallBlock(64) per segment, input [4, 16, 64]")
    depths = (8, 16, 32, 64)
    # every depth in every round, so that the machine's drift reaches all of them alike
    repeats = {depth: max(depths) // depth for depth in depths}
    steps = {depth: depth_step(depth, repeats[depth]) for depth in depths}
    trials = {
        f"{mode} {depth}": (steps[depth], mode) for depth in depths for mode in ("plain", "guard")
    }
    sweep = interleave_trials(trials, max(8, rounds))
    per_region = {}
    plains = {}
    for depth in depths:
        step = steps[depth]
        guard, plain_runs = sweep[f"guard {depth}"], sweep[f"plain {depth}"]
        # checkpoint_sequential runs its last segment without checkpoint
        regions = (depth - 1) * repeats[depth]
        cost = statistics.median(
            (g[1] - p[1]) / regions for g, p in zip(guard, plain_runs, strict=True)
        )
        per_region[depth] = cost
        modules, values = counted_work(step)
        plain = plains[depth] = statistics.median(s[1] for s in plain_runs) / repeats[depth]
        print(
            f"  depth {depth:>2}: plain cpu {plain * 1e3:7.2f} ms per step ({repeats[depth]} steps"
            f" per trial), guard cost per region "
            f"{cost * 1e6:7.1f} us (cpu, median of paired differences); per region "
            f"{modules:.1f} modules and {values:.1f} values fingerprinted"
        )
    spread = max(per_region.values()) / min(per_region.values()) - 1
    print(f"  per-region cost spread across depth: +{spread * 100:.1f} % (goal: within 20 %)")
    costs = " / ".join(f"{per_region[d] * 1e6:.0f}" for d in depths)
    return (
        "`checkpoint_sequential`, depth 8 / 16 / 32 / 64 (one small block per segment)",
        f"{_ms(plains[8])} to {_ms(plains[64])}",
        f"{costs} us per region (spread +{spread * 100:.0f} %)",
        "-",
    )


if __name__ == "__main__":
    main()
