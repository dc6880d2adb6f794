"""What the linter knows about torch's own API, in one place.

Names are canonical qualified names: ``torch.nn.modules.dropout.Dropout`` and
``torch.nn.Dropout`` are the same class, so every lookup goes through ``canonical``.
"""

from __future__ import annotations

import re

_SUBMODULE_PATH = re.compile(r"^torch\.nn\.modules\.\w+\.")


def canonical(qualified: str) -> str:
    """``torch.nn.modules.dropout.Dropout`` -> ``torch.nn.Dropout``."""
    return _SUBMODULE_PATH.sub("torch.nn.", qualified)


def is_torch_module_class(qualified: str) -> bool:
    """A class of ``torch.nn`` (``nn.Linear``), told by its capitalised name."""
    namespace, _, short = canonical(qualified).rpartition(".")
    return namespace == "torch.nn" and short[:1].isupper()


def short_name(qualified: str) -> str:
    return qualified.rpartition(".")[2]


# Containers: calling them runs their elements (in order), indexing picks one.
SEQUENTIAL_CONTAINERS = frozenset({"torch.nn.Sequential", "torch.nn.ModuleList"})
MAPPING_CONTAINERS = frozenset({"torch.nn.ModuleDict"})
CONTAINERS = SEQUENTIAL_CONTAINERS | MAPPING_CONTAINERS

# Functions that reparametrize a module's weight in place and return that same module
# (``weight_norm(nn.Conv2d(...))`` is the conv, with a hook or parametrization added).
_PARAMETRIZE = "torch.nn.utils.parametrize.register_parametrization"
RETURNS_ITS_MODULE = frozenset(
    {
        "torch.nn.utils.weight_norm",
        "torch.nn.utils.weight_norm.weight_norm",
        "torch.nn.utils.spectral_norm",
        "torch.nn.utils.spectral_norm.spectral_norm",
        "torch.nn.utils.parametrizations.weight_norm",
        "torch.nn.utils.parametrizations.spectral_norm",
        "torch.nn.utils.parametrizations.orthogonal",
        _PARAMETRIZE,
    }
)

# Modules that hold parameters (a region of an activation has none to reduce).
PARAMETER_MODULES = frozenset(
    "Linear Bilinear Conv1d Conv2d Conv3d ConvTranspose1d ConvTranspose2d ConvTranspose3d"
    " Embedding EmbeddingBag LayerNorm GroupNorm BatchNorm1d BatchNorm2d BatchNorm3d RMSNorm"
    " MultiheadAttention LSTM GRU RNN Transformer TransformerEncoder TransformerDecoder"
    " TransformerEncoderLayer TransformerDecoderLayer PReLU".split()
)


def is_parameter_module_class(qualified: str) -> bool:
    name = canonical(qualified)
    return is_torch_module_class(name) and short_name(name) in PARAMETER_MODULES


# Random numbers: functions, tensor methods (named so that no other common type has them)
# and modules that draw from torch's RNG.
RANDOM_FUNCTIONS = frozenset(
    "rand rand_like randn randn_like randint randint_like randperm bernoulli multinomial"
    " normal poisson dropout alpha_dropout feature_alpha_dropout dropout1d dropout2d dropout3d"
    " rrelu rrelu_ gumbel_softmax fractional_max_pool2d fractional_max_pool3d".split()
)
RANDOM_METHODS = frozenset(
    "bernoulli bernoulli_ normal_ uniform_ random_ exponential_ geometric_ cauchy_ log_normal_"
    " multinomial".split()
)
RANDOM_MODULES = frozenset(
    "Dropout Dropout1d Dropout2d Dropout3d AlphaDropout FeatureAlphaDropout RReLU".split()
)
RANDOM_NAMESPACES = frozenset({"torch", "torch.nn.functional", "torch.nn.init"})


def is_random_function(qualified: str) -> bool:
    namespace, _, short = qualified.rpartition(".")
    return namespace in RANDOM_NAMESPACES and (short in RANDOM_FUNCTIONS or short in RANDOM_METHODS)


def is_random_module_class(qualified: str) -> bool:
    name = canonical(qualified)
    return is_torch_module_class(name) and short_name(name) in RANDOM_MODULES


# Tensor methods and builtins that change the object they are called on.
MUTATING_METHODS = frozenset(
    "append extend insert update pop popitem setdefault clear remove discard add sort reverse"
    " __setitem__ __delitem__".split()
)
