"""Generated call shapes: CKP001 fires exactly when use_reentrant is absent and no ** is passed."""

from __future__ import annotations

import ast

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import codes

IMPORTS = {
    "torch.utils.checkpoint.checkpoint": "import torch",
    "cp.checkpoint": "import torch.utils.checkpoint as cp",
    "checkpoint.checkpoint": "from torch.utils import checkpoint",
    "ckpt": "from torch.utils.checkpoint import checkpoint as ckpt",
    "run": "import functools\nfrom torch.utils.checkpoint import checkpoint\n"
    "run = functools.partial(checkpoint)",
}

positional = st.lists(st.sampled_from(["x", "y", "mask", "*inputs", "block(x)"]), max_size=3)
keywords = st.lists(
    st.sampled_from(
        ["preserve_rng_state=False", "use_reentrant=False", "use_reentrant=True", "**kwargs"]
        + ["determinism_check='none'", "context_fn=make_contexts"]
    ),
    max_size=3,
    unique=True,
)


@settings(max_examples=300, deadline=None)
@given(
    callee=st.sampled_from(sorted(IMPORTS)),
    arguments=positional,
    keyword_arguments=keywords,
    nesting=st.integers(min_value=0, max_value=2),
    inside_function=st.booleans(),
)
def test_checkpoint_call_shapes(
    callee: str,
    arguments: list[str],
    keyword_arguments: list[str],
    nesting: int,
    inside_function: bool,
) -> None:
    ordered = [k for k in keyword_arguments if not k.startswith("**")]
    ordered += [k for k in keyword_arguments if k.startswith("**")]
    call = f"{callee}({', '.join(['self.block', *arguments, *ordered])})"
    for _ in range(nesting):
        call = f"norm(1 + {call})"
    body = f"def forward(self, x):\n    return {call}\n" if inside_function else f"y = {call}\n"
    source = f"{IMPORTS[callee]}\n{body}"
    ast.parse(source)

    has_keyword = any(k.startswith("use_reentrant") for k in keyword_arguments)
    has_double_star = "**kwargs" in keyword_arguments
    expected = [] if has_keyword or has_double_star else ["CKP001"]
    assert codes(source, select=("CKP001",)) == expected


@settings(max_examples=150, deadline=None)
@given(
    arguments=st.lists(st.sampled_from(["fs", "2", "x", "False", "*rest"]), max_size=5),
    keyword_arguments=keywords,
)
def test_checkpoint_sequential_positional_use_reentrant(
    arguments: list[str], keyword_arguments: list[str]
) -> None:
    ordered = [k for k in keyword_arguments if not k.startswith("**")]
    ordered += [k for k in keyword_arguments if k.startswith("**")]
    source = (
        "from torch.utils.checkpoint import checkpoint_sequential\n"
        f"checkpoint_sequential({', '.join([*arguments, *ordered])})\n"
    )
    plain_before_star = 0
    for argument in arguments:
        if argument.startswith("*"):
            break
        plain_before_star += 1
    may_carry = any(a.startswith("*") for a in arguments) or plain_before_star >= 4
    has_keyword = any(k.startswith("use_reentrant") or k == "**kwargs" for k in keyword_arguments)
    expected = [] if may_carry or has_keyword else ["CKP001"]
    assert codes(source, select=("CKP001",)) == expected
