"""Which process-wide torch settings change what an op computes, on this machine's devices.

    python benchmarks/torch_settings.py [--devices cpu cuda]

torch's checkpoint does not restore these settings for a recompute, so a setting changed
between a region's forward and its backward matters only where the recompute runs an op that
consults it on the region's device. For each setting this runs a few ops (Linear and a matmul
at a small and a larger size, a float32 convolution, causal scaled-dot-product attention, a
layer norm, a factory that uses the default dtype) once with the setting at its default and
once changed, and prints whether each result is bitwise the same. The guard's judgement of a
changed setting does the same thing for the ops a recompute runs (``ckptguard/_settings.py``);
this table is the one in docs/guard.md ("Torch settings").
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F


def _ops(device: str) -> dict[str, Callable[[], torch.Tensor]]:
    generator = torch.Generator(device="cpu").manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator).to(device)

    small_x, small_w = randn(4, 6), randn(6, 6)
    big_x, big_w, bias = randn(256, 512), randn(512, 512), randn(512)
    image, kernel = randn(2, 8, 16, 16), randn(16, 8, 3, 3)
    q = randn(2, 4, 64, 32)
    norm_x = randn(8, 64)
    return {
        "linear 4x6": lambda: F.linear(small_x, small_w),
        "linear 256x512": lambda: F.linear(big_x, big_w, bias),
        "matmul 256x512": lambda: big_x @ big_w,
        "conv2d": lambda: F.conv2d(image, kernel),
        "causal attention": lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True),
        "layer norm": lambda: F.layer_norm(norm_x, (64,)),
        "torch.linspace": lambda: torch.linspace(0, 1, 7, device=device),
    }


@contextlib.contextmanager
def _set(get: Callable[[], object], put: Callable[[object], None], value: object) -> Iterator:
    before = get()
    put(value)
    try:
        yield
    finally:
        put(before)


def _settings() -> list[tuple[str, Callable[[], object], Callable[[object], None], object]]:
    """(setting as changed, getter, setter, changed value)."""
    backends = torch.backends
    return [
        (
            'set_float32_matmul_precision("high")',
            torch.get_float32_matmul_precision,
            torch.set_float32_matmul_precision,
            "high",
        ),
        (
            'set_float32_matmul_precision("medium")',
            torch.get_float32_matmul_precision,
            torch.set_float32_matmul_precision,
            "medium",
        ),
        (
            "backends.cuda.matmul.allow_tf32 = True",
            lambda: backends.cuda.matmul.allow_tf32,
            lambda v: setattr(backends.cuda.matmul, "allow_tf32", v),
            True,
        ),
        (
            "backends.mkldnn.enabled = False",
            lambda: backends.mkldnn.enabled,
            lambda v: setattr(backends.mkldnn, "enabled", v),
            False,
        ),
        (
            "use_deterministic_algorithms(True)",
            torch.are_deterministic_algorithms_enabled,
            torch.use_deterministic_algorithms,
            True,
        ),
        (
            "backends.cuda.enable_flash_sdp(False)",
            backends.cuda.flash_sdp_enabled,
            backends.cuda.enable_flash_sdp,
            False,
        ),
        (
            "backends.cuda.enable_mem_efficient_sdp(False)",
            backends.cuda.mem_efficient_sdp_enabled,
            backends.cuda.enable_mem_efficient_sdp,
            False,
        ),
        (
            "backends.cudnn.allow_tf32 = False",
            lambda: backends.cudnn.allow_tf32,
            lambda v: setattr(backends.cudnn, "allow_tf32", v),
            False,
        ),
        (
            "set_default_dtype(torch.float64)",
            torch.get_default_dtype,
            torch.set_default_dtype,
            torch.float64,
        ),
    ]


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def table(device: str) -> list[tuple[str, list[str]]]:
    rows = []
    ops = _ops(device)
    plain = {name: op() for name, op in ops.items()}
    for label, get, put, value in _settings():
        with _set(get, put, value):
            changed = []
            for name, op in ops.items():
                try:
                    if not _same(plain[name], op()):
                        changed.append(name)
                except RuntimeError as error:  # e.g. no deterministic implementation
                    changed.append(f"{name} (raises: {str(error).splitlines()[0][:60]})")
        rows.append((label, changed))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--devices", nargs="+", default=None)
    args = parser.parse_args()
    devices = args.devices or ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]
    print(f"torch {torch.__version__}; ops: {', '.join(_ops('cpu'))}")
    for device in devices:
        print(f"\n{device}:")
        print("| setting changed | results that change on this device |")
        print("| --- | --- |")
        for label, changed in table(device):
            print(f"| `{label}` | {', '.join(changed) if changed else 'none (bitwise the same)'} |")


if __name__ == "__main__":
    main()
