"""ckptlint's speed against ruff (a speed reference) and flake8, and its peer TorchFix.

On the 15 pinned public trees of ``benchmarks/trees.py`` (fetched once into
benchmarks/.cache), in one run with interleaved repetitions and medians. The trees are linked
(hard links, no copy) into a folder outside any git work tree, so that each is a project of
its own as on a user's machine (inside this repository the git work tree would be the
project):

- **cold**: ``ckptlint --no-cache -j 1 .`` run from inside each tree in turn, its own
  project (every file read, candidates parsed and analysed, one process), the times summed;
  also with worker processes as the CLI chooses them;
- **warm**: the same again, nothing changed (each tree's cache is reused);
- **from the parent folder**: ``ckptlint TREE1 ... TREE15`` from the folder holding the
  trees, cold and warm: each tree is still its own project (its setup.py, pyproject.toml or
  package top), so this should cost what the runs from inside cost (goal: within 1.2x);
- **ruff**: ``ruff check --select E9 --no-cache`` over the same trees;
- **parse floor**: CPython's ``ast.parse`` alone on the files that name a region source (the
  files any cold run must parse), spread over the cores: what no Python linter can go under;
- **pre-commit, one changed file**: transformers 5.24 as a project, its cache warm, one file
  (``modeling_llama.py``) edited, then ``ckptlint`` on that file alone (what a commit runs):
  a comment added, a statement added to a method body no other module reads
  (``LlamaForCausalLM.forward``), and a new wrapper function (a new exported name);
- **whole tree after an edit**: the same method-body edit, then ``ckptlint .`` (what CI or
  an editor's project-wide run does): only the files whose findings ran that body are
  analysed again (early cutoff);
- **chunks**: all of transformers 5.24's files passed in two chunks run at once, as
  pre-commit does on a 2-CPU machine, cold and warm, beside one whole-tree run;
- **flake8**: ``flake8 --select E9`` on transformers 4.34.1 in two virtualenvs, without and
  with ckptlint installed (flake8 runs every installed plugin on every file), cold (no
  ckptlint cache) and warm, wall and CPU time;
- with ``--torchfix``: ``torchfix --select TOR003`` on transformers 4.34.1 (~13 minutes).

    python benchmarks/lint_speed.py [--repeat N] [--torchfix] [--skip-flake8] [--write-docs]

``--write-docs`` writes the table into docs/performance.md (the README links it).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import trees  # noqa: E402

from ckptlint.regions.sources import SourceTable  # noqa: E402
from ckptlint.source import Prefilter  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "benchmarks" / ".cache"
WORK = Path(tempfile.gettempdir()) / f"ckptlint-bench-{os.getuid()}"
CKPTLINT = [sys.executable, "-m", "ckptlint", "--no-respect-gitignore", "--exit-zero", "--quiet"]
BIN = str(Path(sys.executable).parent)
RUFF = shutil.which("ruff", path=BIN) or "ruff"
TORCHFIX = shutil.which("torchfix", path=BIN) or "torchfix"
EDITED = "src/transformers/models/llama/modeling_llama.py"


def linked_trees(folders: list[Path]) -> list[Path]:
    """Each tree hard-linked under WORK (made once): outside any git work tree."""
    WORK.mkdir(exist_ok=True)
    linked = []
    for folder in folders:
        target = WORK / folder.name
        if not target.exists():
            subprocess.run(["cp", "-al", str(folder.resolve()), str(target)], check=True)
        linked.append(target)
    return linked


def virtualenv(name: str, *packages: str) -> Path:
    """A cached virtualenv holding only flake8 (and what else is asked for)."""
    folder = CACHE / name
    python = folder / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *packages], check=True)
    return python


# Every command runs with compiled bytecode, as an installed package does (pip compiles it;
# a checkout compiles on first import): where PYTHONDONTWRITEBYTECODE is set, compiling
# ckptlint's 80 modules again at each start would add ~0.1 s to every run measured. The
# bytecode goes to the benchmark's cache, not into the checkout.
BYTECODE = {
    **{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
    "PYTHONPYCACHEPREFIX": str(CACHE / "bytecode"),
}


def timed(
    command: list[str], cwd: Path, environment: dict[str, str] | None = None
) -> tuple[float, float, int, str]:
    """Wall seconds, CPU seconds (all its processes), peak memory (KiB) and stdout."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run(
        command, cwd=cwd, capture_output=True, text=True, env=environment or BYTECODE
    )
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode not in (0, 1):
        raise SystemExit(f"{command[:4]} failed ({result.returncode}): {result.stderr[-2000:]}")
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return elapsed, cpu, after.ru_maxrss, result.stdout


def timed_together(commands: list[list[str]], cwd: Path) -> float:
    """Wall seconds of commands run at the same time (pre-commit's chunks)."""
    start = time.perf_counter()
    processes = [
        subprocess.Popen(c, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for c in commands
    ]
    for process in processes:
        _, error = process.communicate()
        if process.returncode not in (0, 1):
            raise SystemExit(f"chunk failed ({process.returncode}): {error[-2000:]!r}")
    return time.perf_counter() - start


# The seven trees of issue 36's goals, and the floor every Python linter pays on them: one
# process that reads every ``.py`` file and parses those whose bytes name a region source the
# way a plain text test can tell (start-up included).
SEVEN = (
    "transformers-4.34.1",
    "transformers-5.24.0",
    "diffusers",
    "timm",
    "litgpt",
    "deepspeed",
    "megatron",
)
READ_AND_PARSE = """
import ast, os, sys
for root, _, names in os.walk("."):
    for name in names:
        if name.endswith(".py"):
            path = os.path.join(root, name)
            if os.path.isfile(path) and not os.path.islink(path):
                data = open(path, "rb").read()
                if b"checkpoint" in data or b"GradientCheckpointingLayer" in data:
                    try:
                        ast.parse(data)
                    except (SyntaxError, ValueError):
                        pass
"""


def seven_trees(folders: list[Path], repeat: int, against: Path | None) -> list[str]:
    """Cold ``-j 1`` CPU against the read-and-parse floor and ruff E9 on the seven trees, each
    run from inside its tree, interleaved; with ``against``, that checkout's ckptlint too."""
    chosen = [f for f in folders if f.name.startswith(SEVEN)]
    commands = {
        "ckptlint": [*CKPTLINT, "--no-cache", "-j", "1", "."],
        "floor": [sys.executable, "-c", READ_AND_PARSE],
        "ruff": [
            RUFF,
            "check",
            "--select",
            "E9",
            "--no-cache",
            "--isolated",
            "--quiet",
            "--exit-zero",
            ".",
        ],
    }
    if against is not None:
        commands["against"] = commands["ckptlint"]
    cpu: dict[tuple[str, str], list[float]] = {}
    peak: dict[str, int] = {}
    for _ in range(repeat):
        for folder in chosen:
            for label, command in commands.items():
                environment = None
                if label == "against":
                    environment = {**BYTECODE, "PYTHONPATH": str(against)}
                _, seconds, memory, _ = timed(command, folder, environment)
                cpu.setdefault((folder.name, label), []).append(seconds)
                if label == "ckptlint":
                    peak[folder.name] = max(peak.get(folder.name, 0), memory)
    median = {key: statistics.median(values) for key, values in cpu.items()}
    other = ""
    if against:
        commit = subprocess.run(
            ["git", "-C", str(against), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        other = f" (other checkout: {commit or against})"
    rows = [
        "",
        f"the seven trees, cold `-j 1` from inside each, {repeat} interleaved rounds, median CPU s"
        + other,
        "| tree | ckptlint | read-and-parse floor | x floor | ruff E9 | x ruff |"
        + (" other checkout | x other |" if against else ""),
        "| --- | --- | --- | --- | --- | --- |" + (" --- | --- |" if against else ""),
    ]
    totals = dict.fromkeys(commands, 0.0)
    for folder in chosen:
        value = {label: median[folder.name, label] for label in commands}
        for label in commands:
            totals[label] += value[label]
        row = (
            f"| {folder.name} | {value['ckptlint']:.2f} | {value['floor']:.2f} | "
            f"x{value['ckptlint'] / value['floor']:.2f} | {value['ruff']:.2f} | "
            f"x{value['ckptlint'] / value['ruff']:.1f} |"
        )
        if against:
            row += f" {value['against']:.2f} | x{value['ckptlint'] / value['against']:.2f} |"
        rows.append(row)
    row = (
        f"| all seven | {totals['ckptlint']:.2f} | {totals['floor']:.2f} | "
        f"x{totals['ckptlint'] / totals['floor']:.2f} | {totals['ruff']:.2f} | "
        f"x{totals['ckptlint'] / totals['ruff']:.1f} |"
    )
    if against:
        row += f" {totals['against']:.2f} | x{totals['ckptlint'] / totals['against']:.2f} |"
    rows.append(row)
    largest = max(peak, key=peak.__getitem__)
    rows.append(f"peak memory of a cold `-j 1` run: {peak[largest] / 1024:.0f} MiB ({largest})")
    return rows


def parse_floor(folders: list[Path]) -> tuple[int, float]:
    """Files naming a region source, and the CPU seconds ``ast.parse`` takes on them in one
    process (the median of three passes)."""
    prefilter = Prefilter(SourceTable.build().words)
    texts = [
        data
        for folder in folders
        for path in folder.rglob("*.py")
        if prefilter.passes(data := path.read_bytes())
    ]
    passes = []
    for _ in range(3):
        start = time.process_time()
        for data in texts:
            try:
                ast.parse(data)
            except (SyntaxError, ValueError):
                pass
        passes.append(time.process_time() - start)
    return len(texts), statistics.median(passes)


EDITS = {
    "a comment": "comment",
    "a method body": "body",
    "a new exported name": "export",
}


def edit(path: Path, round_number: int, kind: str = "comment") -> None:
    """A new version of the file (a new file replaces the link: the shared tree stays)."""
    original = path.with_suffix(".py.original")
    if not original.exists():
        shutil.copyfile(path, original)
    text = original.read_text()
    if kind == "body":  # a statement in LlamaForCausalLM.forward, which no module subclasses
        where = text.index("        outputs", text.index("class LlamaForCausalLM"))
        text = f"{text[:where]}        edited = {round_number}\n{text[where:]}"
    elif kind == "export":  # a wrapper: its name is a new word for discovery
        text += (
            f"\n\ndef checkpointed_{round_number}(function, *args):\n"
            "    return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False)\n"
        )
    else:
        text += f"\n# edited in round {round_number}\n"
    temporary = path.with_suffix(".py.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def restore(path: Path) -> None:
    original = path.with_suffix(".py.original")
    if original.exists():
        temporary = path.with_suffix(".py.tmp")
        shutil.copyfile(original, temporary)
        os.replace(temporary, path)


def median_of(runs: dict[str, list[float]]) -> dict[str, float]:
    return {name: statistics.median(values) for name, values in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--torchfix", action="store_true", help="(it takes ~13 minutes)")
    parser.add_argument("--skip-flake8", action="store_true")
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument(
        "--against", type=Path, help="another checkout's root: its cold runs beside these"
    )
    parser.add_argument(
        "--seven-only", action="store_true", help="only the seven trees against the floor"
    )
    arguments = parser.parse_args()
    rows: list[str] = []

    def say(line: str = "") -> None:
        print(line, flush=True)
        rows.append(line)

    folders = linked_trees(trees.all_trees())
    for row in seven_trees(folders, arguments.repeat, arguments.against):
        say(row)
    if arguments.seven_only:
        return
    names = [f.name for f in folders]
    files = sum(1 for f in folders for _ in f.rglob("*.py"))
    lines = sum(p.read_bytes().count(b"\n") for f in folders for p in f.rglob("*.py"))
    say(f"{len(folders)} trees, {files:,} .py files, {lines:,} lines; {os.cpu_count()} cores")

    # -- the 15 trees: each from inside it, from the parent folder, ruff ----------------------
    timed([*CKPTLINT, *names], WORK)  # warm the OS file cache and ckptlint's caches alike

    def inside(*options: str) -> tuple[float, float, int]:
        """Each tree linted from inside it, one after another: summed wall and CPU seconds."""
        found = [timed([*CKPTLINT, *options, "."], folder) for folder in folders]
        return sum(r[0] for r in found), sum(r[1] for r in found), max(r[2] for r in found)

    runs: dict[str, list[tuple[float, float]]] = {
        "cold": [],
        "cold workers": [],
        "warm": [],
        "parent cold": [],
        "parent warm": [],
        "ruff": [],
    }
    memory = []
    ruff = [RUFF, "check", "--select", "E9", "--no-cache", "--isolated", "--quiet"]
    for _ in range(arguments.repeat):
        wall, cpu, peak = inside("--no-cache", "-j", "1")
        runs["cold"].append((wall, cpu))
        memory.append(peak)
        runs["cold workers"].append(inside("--no-cache")[:2])
        runs["warm"].append(inside()[:2])
        runs["parent cold"].append(timed([*CKPTLINT, "--no-cache", *names], WORK)[:2])
        runs["parent warm"].append(timed([*CKPTLINT, *names], WORK)[:2])
        runs["ruff"].append(timed([*ruff, "--exit-zero", *names], WORK)[:2])
    wall = {name: statistics.median(r[0] for r in values) for name, values in runs.items()}
    cpu = {name: statistics.median(r[1] for r in values) for name, values in runs.items()}
    count, floor = parse_floor(folders)
    cores = os.cpu_count() or 1
    say()
    say("| run | wall s | vs ruff | vs parse floor | CPU s | CPU vs parse floor's CPU |")
    say("| --- | --- | --- | --- | --- | --- |")
    labels = {
        "cold": "ckptlint, cold (`--no-cache -j 1`), each tree from inside it",
        "cold workers": "ckptlint, cold (`--no-cache`, workers as chosen), each from inside",
        "warm": "ckptlint, warm (nothing changed), each tree from inside it",
        "parent cold": "ckptlint, cold, the 15 trees named from their parent folder",
        "parent warm": "ckptlint, warm, the 15 trees named from their parent folder",
        "ruff": "`ruff check --select E9 --no-cache`",
    }
    for name, seconds in wall.items():
        say(
            f"| {labels[name]} | {seconds:.2f} | x{seconds / wall['ruff']:.2f} | "
            f"x{seconds / (floor / cores):.2f} | {cpu[name]:.2f} | x{cpu[name] / floor:.2f} |"
        )
    say(
        f"| `ast.parse` of the {count:,} files naming a source (wall: per core) | "
        f"{floor / cores:.2f} | x{floor / cores / wall['ruff']:.2f} | x1 | {floor:.2f} | x1 |"
    )
    say(f"peak memory of a cold `-j 1` run (the largest tree): {max(memory) / 1024:.0f} MiB")
    project = WORK / next(n for n in names if n.startswith("transformers-5.24"))
    alone = [timed([*CKPTLINT, "--no-cache", "-j", "1", "."], project) for _ in range(3)]
    own_count, own_floor = parse_floor([project])
    alone_cpu = statistics.median(r[1] for r in alone)
    say(
        f"transformers 5.24 alone, cold `-j 1`: {alone_cpu:.2f} s CPU, x{alone_cpu / own_floor:.2f}"
        f" the CPU of `ast.parse` of its {own_count:,} files naming a source ({own_floor:.2f} s);"
        f" peak memory {max(r[2] for r in alone) / 1024:.0f} MiB"
    )
    for state in ("cold", "warm"):
        say(
            f"from the parent folder against from inside, {state}: wall "
            f"x{wall['parent ' + state] / wall[state]:.2f}, CPU "
            f"x{cpu['parent ' + state] / cpu[state]:.2f} (goal: within x1.2)"
        )

    # -- transformers 5.24: pre-commit, one changed file; chunks ------------------------------
    edited = project / EDITED
    restore(edited)
    every = sorted(str(p.relative_to(project)) for p in project.rglob("*.py"))
    halves = [every[0::2], every[1::2]]
    base = [sys.executable, "-m", "ckptlint", "--exit-zero", "--quiet"]
    timed([*base, "."], project)
    runs = {
        **{f"one file, {label}": [] for label in EDITS},
        **{f"one file CPU, {label}": [] for label in EDITS},
        "whole tree": [],
        "whole tree, body edited": [],
        "whole tree CPU, body edited": [],
        "chunks warm": [],
        "chunks cold": [],
        "whole tree cold": [],
    }
    for round_number in range(arguments.repeat):
        for label, kind in EDITS.items():
            edit(edited, round_number, kind)
            one_file = timed([*base, EDITED], project)
            runs[f"one file, {label}"].append(one_file[0])
            runs[f"one file CPU, {label}"].append(one_file[1])
            restore(edited)
            timed([*base, "."], project)
        runs["whole tree"].append(timed([*base, "."], project)[0])
        edit(edited, round_number, "body")
        after_edit = timed([*base, "."], project)
        runs["whole tree, body edited"].append(after_edit[0])
        runs["whole tree CPU, body edited"].append(after_edit[1])
        restore(edited)
        timed([*base, "."], project)
        runs["chunks warm"].append(timed_together([[*base, *h] for h in halves], project))
        shutil.rmtree(project / ".ckptlint_cache", ignore_errors=True)
        runs["chunks cold"].append(timed_together([[*base, *h] for h in halves], project))
        runs["whole tree cold"].append(timed([*base, "--no-cache", "."], project)[0])
        timed([*base, "."], project)
    medians = median_of(runs)
    say()
    say(f"transformers 5.24 as a project ({len(every):,} files), 2 chunks as pre-commit makes:")
    say("| run | seconds |")
    say("| --- | --- |")
    for label in EDITS:
        say(
            f"| pre-commit: one changed file (`{EDITED.rsplit('/', 1)[1]}`, {label}), warm | "
            f"{medians[f'one file, {label}']:.2f} (CPU {medians[f'one file CPU, {label}']:.2f}) |"
        )
    say(f"| whole tree, warm | {medians['whole tree']:.2f} |")
    say(
        f"| whole tree, warm, after the method-body edit | "
        f"{medians['whole tree, body edited']:.2f} "
        f"(CPU {medians['whole tree CPU, body edited']:.2f}) |"
    )
    say(f"| two chunks at once, warm | {medians['chunks warm']:.2f} |")
    say(f"| two chunks at once, cold | {medians['chunks cold']:.2f} |")
    say(f"| whole tree, cold | {medians['whole tree cold']:.2f} |")

    source = WORK / next(n for n in names if n.startswith("transformers-4.34"))
    if arguments.torchfix:
        report = timed([*base, "--no-cache", "--select", "CKP001", "--format", "json", "."], source)
        ours = {(item["path"], item["line"]) for item in json.loads(report[3])}
        torchfix_time, _, _, output = timed([TORCHFIX, "--select", "TOR003", "."], source)
        pattern = re.compile(r"(?:\./)?([^\s,]+?\.py):(\d+):\d+: TOR003")
        theirs = {(path, int(line)) for path, line in pattern.findall(output)}
        say(f"\ntorchfix --select TOR003 on transformers 4.34.1: {torchfix_time:.1f} s")
        say(f"use_reentrant sites: ckptlint {len(ours)}, TorchFix {len(theirs)}")

    if not arguments.skip_flake8:
        plain = virtualenv("venv-flake8", "flake8")
        with_plugin = virtualenv("venv-flake8-ckptlint", "flake8", str(ROOT))
        install = [str(with_plugin), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall"]
        subprocess.run([*install, str(ROOT)], check=True)  # this checkout, not an older one
        flake8 = ["-m", "flake8", "--isolated", "--select", "E9", "--exit-zero", "."]
        results: dict[str, list[tuple[float, float]]] = {"without": [], "cold": [], "warm": []}
        for _ in range(arguments.repeat):  # interleaved; up to a minute a run
            results["without"].append(timed([str(plain), *flake8], source)[:2])
            shutil.rmtree(source / ".ckptlint_cache", ignore_errors=True)
            results["cold"].append(timed([str(with_plugin), *flake8], source)[:2])
            results["warm"].append(timed([str(with_plugin), *flake8], source)[:2])
        say()
        say(
            f"flake8 --select E9 on transformers 4.34.1 ({sum(1 for _ in source.rglob('*.py'))}"
            " files), without and with the plugin:"
        )
        say("| run | wall s | CPU s | wall vs without | CPU vs without |")
        say("| --- | --- | --- | --- | --- |")
        wall = {k: statistics.median(r[0] for r in v) for k, v in results.items()}
        cpu = {k: statistics.median(r[1] for r in v) for k, v in results.items()}
        for kind, label in (
            ("without", "without ckptlint"),
            ("cold", "with, no cache"),
            ("warm", "with, cache warm"),
        ):
            say(
                f"| {label} | {wall[kind]:.2f} | {cpu[kind]:.2f} | "
                f"x{wall[kind] / wall['without']:.3f} | x{cpu[kind] / cpu['without']:.3f} |"
            )
    say(f"[{arguments.repeat} interleaved rounds, medians]")

    if arguments.write_docs:
        write_docs(rows)


def write_docs(rows: list[str]) -> None:
    """Replace the ckptlint section of docs/performance.md with this run's figures."""
    path = ROOT / "docs" / "performance.md"
    start, end = "<!-- lint_speed: start -->", "<!-- lint_speed: end -->"
    text = path.read_text() if path.exists() else "# Performance\n\n" + start + "\n" + end + "\n"
    head, _, rest = text.partition(start)
    _, _, tail = rest.partition(end)
    body = "\n".join(["## ckptlint (`benchmarks/lint_speed.py`)", "", *rows])
    path.write_text(f"{head}{start}\n{body}\n{end}{tail}")


if __name__ == "__main__":
    main()
