"""The public model trees the benchmarks read, pinned, fetched once into benchmarks/.cache.

Each tree is a package's source distribution from PyPI (its wheel where PyPI has no sdist:
a wheel holds the .py files too), unpacked as published. Nothing is installed or built.

    python benchmarks/trees.py            # fetch the pinned trees, print where they are
    python benchmarks/trees.py --new      # and issue 37's held-out trees
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
import zipfile
from pathlib import Path

CACHE = Path(__file__).resolve().parent / ".cache"

# (PyPI name, version): the 15 trees of issue 8's measurement.
TREES = [
    ("transformers", "4.34.1"),
    ("transformers", "5.24.0"),
    ("diffusers", "0.42.1"),
    ("timm", "1.0.31"),
    ("litgpt", "0.5.13"),
    ("deepspeed", "0.19.8"),
    ("megatron-core", "0.16.1"),
    ("fairscale", "0.4.13"),
    ("open_clip_torch", "3.3.0"),
    ("lightning", "2.6.6"),
    ("ai2-olmo", "0.6.0"),
    ("x-transformers", "2.31.10"),
    ("xformers", "0.0.35"),
    ("torchtitan", "0.3.0"),
    ("mmcv", "2.2.0"),
]

# (PyPI name, version): issue 37's held-out trees, packages that checkpoint and that no rule
# was written against; region_coverage.py --trees new measures them.
NEW_TREES = [
    ("peft", "0.21.2"),
    ("accelerate", "1.16.0"),
    ("mosaicml", "0.32.1"),
    ("nanotron", "0.4"),
    ("open_flamingo", "2.0.1"),
    ("salesforce-lavis", "1.0.2"),
    ("mmengine", "0.10.7"),
    ("mmpretrain", "1.2.0"),
    ("torchtune", "0.6.1"),
    ("monai", "1.6.1"),
    ("colossalai", "0.5.0"),
    ("trl", "1.16.0"),
    ("flash-linear-attention", "0.6.0"),
    ("diffsynth", "2.1.12"),
    ("ai2-olmo-core", "3.0.0"),
    ("alphafold3-pytorch", "0.8.3"),
]


def tree(name: str, version: str) -> Path:
    """The unpacked tree of ``name==version``, downloading it on first use."""
    normalized = name.replace("-", "_").lower()
    for folder in sorted(CACHE.glob("*")) if CACHE.is_dir() else []:
        if folder.is_dir() and folder.name.lower().startswith(f"{normalized}-{version}"):
            return folder
    CACHE.mkdir(parents=True, exist_ok=True)
    filename, payload = _download(name, version)
    folder = CACHE / f"{normalized}-{version}"
    partial = folder.with_name(folder.name + ".partial")
    partial.mkdir(exist_ok=True)
    if filename.endswith((".whl", ".zip")):
        with zipfile.ZipFile(io.BytesIO(payload)) as archive:
            archive.extractall(partial)
    else:
        with tarfile.open(fileobj=io.BytesIO(payload)) as archive:
            archive.extractall(partial, filter="data")
    entries = list(partial.iterdir())
    root = entries[0] if len(entries) == 1 and entries[0].is_dir() else partial
    root.rename(folder)
    if partial.exists():
        partial.rmdir()
    return folder


def _download(name: str, version: str) -> tuple[str, bytes]:
    """The sdist (else a wheel) through pip's configured indexes, else from PyPI's JSON API
    (an sdist whose metadata pip cannot build, such as mmcv's, is fetched as a file)."""
    with tempfile.TemporaryDirectory() as folder:
        for extra in (["--no-binary", ":all:"], []):
            command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", *extra]
            done = subprocess.run(
                [*command, "-d", folder, f"{name}=={version}"], capture_output=True
            )
            files = list(Path(folder).iterdir())
            if done.returncode == 0 and files:
                return files[0].name, files[0].read_bytes()
    with urllib.request.urlopen(f"https://pypi.org/pypi/{name}/json", timeout=60) as r:
        files_json = json.load(r)["releases"][version]
    chosen = next((f for f in files_json if f["packagetype"] == "sdist"), None) or next(
        f for f in files_json if f["filename"].endswith(".whl")
    )
    with urllib.request.urlopen(chosen["url"], timeout=300) as response:
        return chosen["filename"], response.read()


def all_trees() -> list[Path]:
    return [tree(name, version) for name, version in TREES]


def new_trees() -> list[Path]:
    return [tree(name, version) for name, version in NEW_TREES]


if __name__ == "__main__":
    for path in all_trees() + (new_trees() if sys.argv[1:] == ["--new"] else []):
        files = sum(1 for _ in path.rglob("*.py"))
        print(f"{path.name:40} {files:6d} .py files  {path}")
