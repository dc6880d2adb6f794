"""CKP101: a checkpoint around one cheap op."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ckptlint.rules.base import (
    UNKNOWN,
    Context,
    External,
    FileContext,
    Finding,
    FunctionValue,
    Instance,
    PartialValue,
    ProjectAnalysis,
    Rule,
    Value,
    Values,
    canonical,
    is_torch_module_class,
    short_name,
)

CHEAP_MODULES = frozenset(
    "ReLU ReLU6 GELU SiLU Mish Sigmoid Tanh LeakyReLU ELU SELU CELU PReLU GLU Hardswish"
    " Hardsigmoid Hardtanh Softplus Softsign LogSigmoid Tanhshrink Softshrink Hardshrink"
    " Threshold Identity Dropout Dropout1d Dropout2d Dropout3d AlphaDropout FeatureAlphaDropout"
    " LayerNorm GroupNorm RMSNorm BatchNorm1d BatchNorm2d BatchNorm3d InstanceNorm1d"
    " InstanceNorm2d InstanceNorm3d LocalResponseNorm Linear Conv1d Conv2d Conv3d"
    " ConvTranspose1d ConvTranspose2d ConvTranspose3d Embedding Flatten Unflatten"
    " MaxPool1d MaxPool2d MaxPool3d AvgPool1d AvgPool2d AvgPool3d".split()
)
CHEAP_FUNCTIONS = frozenset(
    "relu relu6 gelu silu mish sigmoid tanh leaky_relu elu selu celu prelu glu hardswish"
    " hardsigmoid hardtanh softplus softsign logsigmoid dropout dropout1d dropout2d dropout3d"
    " alpha_dropout layer_norm group_norm rms_norm batch_norm instance_norm normalize linear"
    " conv1d conv2d conv3d embedding add sub mul div neg abs exp log sqrt rsqrt pow square"
    " clamp erf sin cos max_pool1d max_pool2d max_pool3d avg_pool1d avg_pool2d avg_pool3d".split()
)
CHEAP_NAMESPACES = ("torch", "torch.nn.functional", "torch.special")
# Tensor methods that are one elementwise op.
CHEAP_METHODS = frozenset(
    "relu sigmoid tanh exp log sqrt rsqrt abs neg square clamp add mul sub div pow".split()
)


class TinyRegion(Rule):
    """A checkpoint region that is a single cheap op.

    Reported for torch modules (`nn.GELU()`, including modules assigned in `__init__` and
    elements of an `nn.ModuleList` built from one constructor, and a module behind a
    reparametrization: `weight_norm`, `spectral_norm`, `nn.utils.parametrizations.*` and
    `nn.utils.parametrize.register_parametrization` return the module they are given, still
    one conv or linear, its weight computed from others), torch functions
    (`torch.relu`, `F.gelu`), `functools.partial` of those, and lambdas, functions and
    methods whose body is one such op applied to their parameters, through every region
    source that takes a function or a module (also a module that
    `apply_activation_checkpointing` selects).

    ## Why is this bad?

    Checkpointing trades memory for compute: the region's intermediate activations are
    dropped after the forward and recomputed in the backward. A region that is one cheap
    op (an activation, dropout, a norm layer, an elementwise or arithmetic op, a single
    `Linear`/`Conv`/`Embedding`) has (almost) no intermediates: what it would save for the
    backward is its input, and that input is kept alive anyway as the checkpoint's input.
    So the checkpoint saves nothing and adds a recompute and the checkpoint's own overhead.

    Call the op directly, or checkpoint a larger block that contains it (a whole layer).

    ## Not reported

    A region that may be one of several things is reported only when each of them is one
    such op (the modules of an `nn.ModuleList` filled by `append`, `extend`, `insert` or
    item writes, checkpointed one per call). An `nn.Sequential` of several layers, a
    function of several statements, and anything that cannot be resolved are not reported.
    """

    code = "CKP101"
    GUARD = (
        "At run time, `with ckptguard.profile():` prices each region (the memory its checkpoint"
        " saves against the recompute it adds) and lists those that save nothing."
    )
    name = "tiny-region"
    summary = "checkpoint region is a single cheap op"

    EXAMPLE = """\
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.act = nn.GELU()

    def forward(self, x):
        return checkpoint(self.act, x, use_reentrant=False)  # expect: CKP101@16
"""
    CORRECTED = """\
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))

    def forward(self, x):
        return checkpoint(self.mlp, x, use_reentrant=False)
"""

    def check(self, context: FileContext) -> Iterator[Finding]:
        analysis = context.analysis
        for site in analysis.sites(context.module):
            if site.layer is not None:
                continue
            if any(source.kind == "sequence" for source in site.sources):
                continue  # a sequence is split into segments; its parts are not one op
            op = cheap_ops(analysis.region(site), analysis)
            if op is not None:
                message = (
                    f"{site.subject} is a single cheap op ({op}): its input stays alive as the"
                    " checkpoint input, so the checkpoint saves (almost) no memory and adds a"
                    " recompute; call it directly or checkpoint a larger block containing it"
                )
                yield context.finding(site.node, self.code, message)


def cheap_ops(
    values: Values, analysis: ProjectAnalysis, entered: frozenset[ast.AST] = frozenset()
) -> str | None:
    """The cheap ops a region may be (``nn.LayerNorm` or `nn.GELU``), when each value it
    may have is one (the modules of a list filled in a loop, one per call); None when any
    may be more, or is unknown. ``entered``: the bodies a chain of delegation went through
    to get here (a ``forward`` returning a new instance of its own class is no op)."""
    if not values or UNKNOWN in values:
        return None
    ops: list[str] = []
    for value in values:
        op = cheap_op(value, analysis, entered)
        if op is None:
            return None
        ops.append(op)
    ops = list(dict.fromkeys(ops))
    return ops[0] if len(ops) == 1 else f"{', '.join(ops[:-1])} or {ops[-1]}"


def cheap_op(
    region: Value, analysis: ProjectAnalysis, entered: frozenset[ast.AST] = frozenset()
) -> str | None:
    """A description of the one cheap op ``region`` is, or None when it is more (or unknown)."""
    if isinstance(region, PartialValue):
        return cheap_ops(region.inner, analysis, entered)
    if isinstance(region, External):
        namespace, _, short = region.name.rpartition(".")
        cheap = namespace in CHEAP_NAMESPACES and short in CHEAP_FUNCTIONS
        return f"`{region.name}`" if cheap else None
    if isinstance(region, Instance):
        if isinstance(region.cls, External):
            return _cheap_module(region, analysis)
        forward = single(analysis.member((region,), "forward"))
        call = single(analysis.member((region,), "__call__"))
        if isinstance(call, FunctionValue) or not isinstance(forward, FunctionValue):
            return None
        return _cheap_body(forward, analysis, entered)
    if isinstance(region, FunctionValue):
        return _cheap_body(region, analysis, entered)
    return None


def _cheap_module(module: Instance, analysis: ProjectAnalysis) -> str | None:
    name = canonical(module.cls.name)  # type: ignore[union-attr]
    short = short_name(name)
    if not is_torch_module_class(name):
        return None
    if short in CHEAP_MODULES:
        return f"`nn.{short}`"
    if short == "Sequential" and module.call is not None and len(module.call.args) == 1:
        inner = single(analysis.iterate((module,)))
        if isinstance(inner, Instance) and isinstance(inner.cls, External):
            return _cheap_module(inner, analysis)
    return None


def _cheap_body(
    function: FunctionValue, analysis: ProjectAnalysis, entered: frozenset[ast.AST]
) -> str | None:
    """A def or lambda whose whole body returns one cheap op applied to leaf values."""
    expression = _returned_expression(function.node)
    if expression is None or function.node in entered:
        return None
    if (
        isinstance(expression, ast.BinOp)
        and _is_leaf(expression.left)
        and _is_leaf(expression.right)
    ):
        return f"`{ast.unparse(expression)}`"
    if isinstance(expression, ast.UnaryOp) and _is_leaf(expression.operand):
        return f"`{ast.unparse(expression)}`"
    if not isinstance(expression, ast.Call) or not all(
        _is_leaf(argument)
        for argument in (*expression.args, *(k.value for k in expression.keywords))
    ):
        return None
    context = analysis.bind(function, None)
    func = expression.func
    if (
        isinstance(func, ast.Attribute)
        and func.attr in CHEAP_METHODS
        and isinstance(func.value, ast.Name)
        and _is_value(func.value, context)
    ):
        return f"`{ast.unparse(expression)}`"
    callee = single(analysis.evaluate(func, context))
    if isinstance(callee, (External, Instance, PartialValue)):
        return cheap_op(callee, analysis, entered | {function.node})
    return None


def _returned_expression(node: ast.AST) -> ast.expr | None:
    if isinstance(node, ast.Lambda):
        return node.body
    statements = node.body  # type: ignore[attr-defined]
    first = statements[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        statements = statements[1:]  # a docstring
    if len(statements) == 1 and isinstance(statements[0], ast.Return):
        return statements[0].value
    return None


def _is_leaf(expression: ast.expr) -> bool:
    """A name, constant or attribute of a name: no computation of its own."""
    if isinstance(expression, ast.Starred):
        expression = expression.value
    while isinstance(expression, ast.Attribute):
        expression = expression.value
    return isinstance(expression, (ast.Name, ast.Constant))


def _is_value(name: ast.Name, context: Context) -> bool:
    """A parameter or variable (``h`` in ``h.relu()``), not an imported module or a class."""
    bindings = context.scope.lookup(name.id, (name.lineno, name.col_offset))
    return bool(bindings) and all(
        b.imported is None and not isinstance(b.node, (ast.ClassDef, ast.FunctionDef))
        for b in bindings
    )


def single(values: Values) -> Value | None:
    """The value when exactly one, known, is possible: the rule speaks only of a region it is
    sure of."""
    return values[0] if len(values) == 1 and values[0] is not UNKNOWN else None
