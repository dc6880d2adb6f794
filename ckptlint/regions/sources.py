"""Region sources: every API through which code runs once in forward and again in backward.

One table, one row per mechanism: which argument names the region, whether the callee takes
``use_reentrant`` (only there does CKP001 apply), which keyword turns RNG restoration off,
and what the library restores for the recompute. Users add rows from configuration
(``extend-checkpoint-functions``). A project's own wrappers are not listed here: the region
layer finds them (a function passing a parameter on as the region of any source).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Literal

SourceKind = Literal["function", "sequence", "module", "apply", "layer"]
CONFIGURATION = "configuration"  # the library of rows from ``extend-checkpoint-functions``


class ReentrantArgument(Enum):
    """How a source takes ``use_reentrant`` (CKP001 checks calls of these)."""

    KEYWORD_ONLY = "keyword-only"  # checkpoint(function, *args, use_reentrant=...)
    FOURTH_POSITIONAL = "4th positional"  # checkpoint_sequential(functions, segments, input, ...)
    UNKNOWN = "unknown"  # a user's function from configuration: keyword, or maybe in *args


@dataclass(frozen=True)
class RegionSource:
    """One recompute mechanism.

    ``names`` are qualified names (every public path of the same object), or attribute names
    when ``attribute`` is set (``self._gradient_checkpointing_func(...)``, bound at run time).
    ``region`` is the region argument's position and keyword. ``kind`` says what the region
    is: the ``function`` called, each module of a ``sequence``, the ``module`` wrapped, the
    modules an ``apply`` call selects, or the ``forward`` of every subclass of a ``layer``.
    """

    library: str
    names: tuple[str, ...]
    kind: SourceKind
    region: tuple[int, str | None] = (0, None)
    reentrant: ReentrantArgument | None = None
    rng_keyword: str | None = None
    rng: str = ""
    attribute: bool = False
    reentrant_since: str | None = None  # the torch release that added ``use_reentrant``
    rng_position: int | None = None  # the positional argument that switches RNG saving off
    restores_rng: bool = True  # False: the recompute never replays the forward's RNG state
    display: str = ""  # how messages name it, when not by the last part of its name

    @property
    def label(self) -> str:
        return self.display or self.names[0].rsplit(".", 1)[-1]

    @property
    def configured(self) -> bool:
        """A row from ``extend-checkpoint-functions``."""
        return self.library == CONFIGURATION


_WRAPPER = "torch.distributed.algorithms._checkpoint.checkpoint_wrapper"
# Rows that rules tell apart by name (what each passes on to torch's checkpoint).
CHECKPOINT = "torch.utils.checkpoint.checkpoint"
CHECKPOINT_SEQUENTIAL = "torch.utils.checkpoint.checkpoint_sequential"
CHECKPOINT_WRAPPER = f"{_WRAPPER}.checkpoint_wrapper"
CHECKPOINT_WRAPPER_CLASS = f"{_WRAPPER}.CheckpointWrapper"
# The factory and the class it builds take the same arguments (``checkpoint_impl`` second).
CHECKPOINT_WRAPPERS = (CHECKPOINT_WRAPPER, CHECKPOINT_WRAPPER_CLASS)

_TORCH_RNG = "CPU and the devices of tensor positional arguments, unless preserve_rng_state=False"

SOURCES: tuple[RegionSource, ...] = (
    RegionSource(
        "torch",
        (CHECKPOINT,),
        "function",
        (0, "function"),
        ReentrantArgument.KEYWORD_ONLY,
        "preserve_rng_state",
        _TORCH_RNG,
        reentrant_since="1.11",
    ),
    RegionSource(
        "torch",
        (CHECKPOINT_SEQUENTIAL,),
        "sequence",
        (0, "functions"),
        ReentrantArgument.FOURTH_POSITIONAL,
        "preserve_rng_state",
        _TORCH_RNG,
        reentrant_since="2.0",
    ),
    RegionSource(
        "torch",
        (CHECKPOINT_WRAPPER,),
        "module",
        (0, "module"),
        rng_keyword="preserve_rng_state",
        rng=f"torch's checkpoint: {_TORCH_RNG} (passed through **checkpoint_fn_kwargs)",
    ),
    RegionSource(
        "torch",
        (CHECKPOINT_WRAPPER_CLASS,),
        "module",
        (0, "mod"),
        rng_keyword="preserve_rng_state",
        rng=f"torch's checkpoint: {_TORCH_RNG} (passed through **checkpoint_fn_kwargs)",
    ),
    RegionSource(
        "torch",
        (f"{_WRAPPER}.apply_activation_checkpointing",),
        "apply",
        (0, "model"),
        rng="as the checkpoint_wrapper_fn it applies (torch's checkpoint_wrapper by default)",
    ),
    RegionSource(
        "torch",
        (
            "torch.distributed._composable.checkpoint",
            "torch.distributed._composable.checkpoint_activation.checkpoint",
        ),
        "module",
        (0, "module"),
        rng_keyword="preserve_rng_state",
        rng=f"non-reentrant checkpoint: {_TORCH_RNG}",
    ),
    RegionSource(
        "transformers",
        (
            "transformers.modeling_layers.GradientCheckpointingLayer",
            "transformers.GradientCheckpointingLayer",
        ),
        "layer",
        rng="`_gradient_checkpointing_func`, a partial of torch's checkpoint: CPU and devices of"
        " positional tensors",
    ),
    RegionSource(
        "transformers, diffusers",
        ("_gradient_checkpointing_func",),
        "function",
        rng_keyword="preserve_rng_state",
        rng="a partial of torch's checkpoint bound by the library's gradient_checkpointing_enable",
        attribute=True,
    ),
    RegionSource(
        "timm",
        ("timm.models._manipulate.checkpoint", "timm.models.checkpoint"),
        "function",
        (0, "function"),
        rng_keyword="preserve_rng_state",
        rng=f"torch's checkpoint (use_reentrant from timm's setting): {_TORCH_RNG}",
    ),
    RegionSource(
        "timm",
        ("timm.models._manipulate.checkpoint_seq", "timm.models.checkpoint_seq"),
        "sequence",
        (0, "functions"),
        rng=f"torch's checkpoint per segment: {_TORCH_RNG}",
    ),
    RegionSource(
        "Megatron-LM",
        (
            "megatron.core.tensor_parallel.checkpoint",
            "megatron.core.tensor_parallel.random.checkpoint",
        ),
        "function",
        (0, "function"),
        rng="its own CheckpointFunction: CPU, CUDA and the model-parallel CUDA RNG tracker",
    ),
    RegionSource(
        "Megatron-LM",
        (
            "megatron.core.tensor_parallel.CheckpointWithoutOutput.checkpoint",
            "megatron.core.tensor_parallel.random.CheckpointWithoutOutput.checkpoint",
        ),
        "function",
        (0, "run_function"),
        rng="CPU, CUDA and the model-parallel CUDA RNG tracker",
    ),
    RegionSource(
        "DeepSpeed",
        (
            "deepspeed.checkpointing.checkpoint",
            "deepspeed.runtime.activation_checkpointing.checkpointing.checkpoint",
        ),
        "function",
        (0, "function"),
        rng="CPU, the accelerator and the model-parallel RNG tracker",
    ),
    RegionSource(
        "fairscale",
        (
            "fairscale.nn.checkpoint_wrapper",
            "fairscale.nn.checkpoint.checkpoint_wrapper",
            "fairscale.nn.checkpoint.checkpoint_activations.checkpoint_wrapper",
        ),
        "module",
        (0, "module"),
        rng="CPU and CUDA RNG states",
    ),
    RegionSource(
        "fairscale",
        ("fairscale.nn.model_parallel.random.checkpoint",),
        "function",
        (0, "function"),
        rng="CPU, CUDA and the model-parallel CUDA RNG tracker",
    ),
    RegionSource(
        "Transformer Engine",
        (
            "transformer_engine.pytorch.checkpoint",
            "transformer_engine.pytorch.distributed.checkpoint",
        ),
        "function",
        (0, "function"),
        rng="CPU, CUDA and Transformer Engine's RNG state tracker",
    ),
    RegionSource(
        "torch_xla",
        (
            "torch_xla.distributed.fsdp.checkpoint_module",
            "torch_xla.distributed.fsdp.wrap.checkpoint_module",
        ),
        "module",
        (0, "m"),
        rng="torch_xla.utils.checkpoint (CPU and XLA device RNG states)",
    ),
    RegionSource(
        "xformers",
        ("xformers.checkpoint", "xformers.checkpoint.checkpoint"),
        "function",
        (0, "function"),
        rng_keyword="preserve_rng_state",
        rng=f"torch's checkpoint with a selective policy: {_TORCH_RNG}",
    ),
)

CONFIG_KINDS: tuple[SourceKind, ...] = ("function", "sequence", "module", "layer")


@dataclass(frozen=True)
class SourceTable:
    """The rows in force for a run: the built-in ones and the configured ones."""

    by_name: dict[str, RegionSource]
    by_attribute: dict[str, RegionSource]

    @classmethod
    def build(cls, extra: Iterable[RegionSource] = ()) -> SourceTable:
        by_name: dict[str, RegionSource] = {}
        by_attribute: dict[str, RegionSource] = {}
        for source in (*SOURCES, *extra):
            table = by_attribute if source.attribute else by_name
            for name in source.names:
                table[name] = source
        return cls(by_name, by_attribute)

    @property
    def words(self) -> frozenset[str]:
        """Identifiers any reference to a source must spell (the last part of each name)."""
        names = [*self.by_name, *self.by_attribute]
        return frozenset(name.rsplit(".", 1)[-1] for name in names)


def configured_source(name: str, kind: SourceKind = "function", region: int = 0) -> RegionSource:
    """A row for a user's own function from ``extend-checkpoint-functions``."""
    return RegionSource(
        CONFIGURATION,
        (name,),
        kind,
        (region, None),
        ReentrantArgument.UNKNOWN if kind == "function" else None,
        "preserve_rng_state",
        "as configured",
    )
