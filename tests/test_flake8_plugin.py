"""The real flake8 executable with the plugin installed reports what the CLI reports."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ckptlint.flake8_plugin import CheckpointChecker
from tests.conftest import SUBPROCESS_TIMEOUT, run_ckptlint, run_cli

SOURCE = textwrap.dedent(
    """\
    import functools
    import torch.utils.checkpoint as cp
    from torch.utils.checkpoint import checkpoint, checkpoint_sequential

    run = functools.partial(checkpoint, preserve_rng_state=True)


    def forward(self, x, é="é"):
        x = cp.checkpoint(self.block, x)
        x = run(self.block, x)
        x = checkpoint_sequential(self.layers, 2, x)
        x = checkpoint(self.block, x)  # noqa: CKP001
        x = checkpoint(self.block, x, use_reentrant=False)
        return é, cp.checkpoint(
            self.block,
            x,
        )
    """
)


def python(*arguments: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *arguments],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
    )


def flake8(*arguments: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return python("-m", "flake8", *arguments, cwd=cwd)


def test_flake8_reports_the_same_places_as_the_cli(project: Path) -> None:
    (project / "model.py").write_text(SOURCE)
    result = flake8("--select", "CKP", "model.py", cwd=project)
    assert result.returncode == 1, result.stderr
    from_flake8 = [line.split(" ", 2)[:2] for line in result.stdout.splitlines()]
    cli = json.loads(run_cli("--format", "json", "model.py", cwd=project).stdout)
    from_cli = [[f"model.py:{i['line']}:{i['column']}:", i["code"]] for i in cli]
    assert from_flake8 == from_cli
    assert [place for place, _ in from_flake8] == [
        "model.py:9:9:",
        "model.py:10:9:",
        "model.py:11:9:",
        "model.py:14:15:",
    ]


def test_plugin_is_registered_with_flake8(project: Path) -> None:
    result = flake8("--version", cwd=project)
    assert "ckptlint" in result.stdout


def test_extend_checkpoint_functions_through_flake8_config(project: Path) -> None:
    (project / "model.py").write_text("from mylib.mem import ckpt\n\nckpt(f, x)\n")
    assert flake8("--select", "CKP", "model.py", cwd=project).stdout == ""
    (project / "setup.cfg").write_text(
        "[flake8]\nextend-checkpoint-functions = mylib.mem.ckpt, other.wrapper\n"
    )
    result = flake8("--select", "CKP", "model.py", cwd=project)
    assert result.stdout.startswith("model.py:3:1: CKP001 ")


def test_files_without_checkpoint_are_untouched(project: Path) -> None:
    (project / "plain.py").write_text("def checkpointing_helper():\n    return 1\n")
    result = flake8("--select", "CKP", "plain.py", cwd=project)
    assert result.returncode == 0 and result.stdout == ""


def test_files_that_cannot_reach_a_checkpoint_parse_nothing(project: Path) -> None:
    """flake8 runs the plugin on every file: where no file of the project can reach a
    checkpoint, the project's discovery is a text scan and no module is ever parsed."""
    (project / "plain.py").write_text("def checkpointing_helper():\n    return 1\n")
    (project / "other.py").write_text("import os\n")
    script = (
        "import ckptlint.project.index as index\n"
        "from flake8.main.cli import main\n"
        "loads = []\n"
        "original = index.Project._load\n"
        "index.Project._load = lambda self, path: loads.append(path) or original(self, path)\n"
        "try:\n"
        "    main(['-j', '1', '--select', 'CKP', '.'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(len(loads))\n"
    )
    result = python("-c", script, cwd=project)
    assert result.stdout.split() == ["0"], result.stderr


def test_the_analysis_is_out_of_the_cycle_collectors_way(project: Path) -> None:
    """A flake8 process keeps the engine's analysis for the next file; pyflakes' and
    pycodestyle's allocations set off full collections, which must not walk it again and
    again: after a file is checked, no module the engine parsed is left to the collector."""
    (project / "model.py").write_text(SOURCE, encoding="utf-8")
    (project / "helpers.py").write_text("from model import run\n")
    script = (
        "import gc\n"
        "from flake8.main.cli import main\n"
        "from ckptlint.flake8_plugin import CheckpointChecker\n"
        "from ckptlint.project.index import Module\n"
        "try:\n"
        "    main(['-j', '1', '--select', 'CKP', '.'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "(engine,) = CheckpointChecker._engines.values()\n"
        "_, analysis = engine.analysis()\n"
        "modules = [m for m in analysis.project._modules.values() if m is not None]\n"
        "walked = {id(o) for o in gc.get_objects()}\n"
        "print(len(modules), sum(id(m) in walked or id(m.tree) in walked for m in modules))\n"
    )
    result = python("-c", script, cwd=project)
    parsed, walked = map(int, result.stdout.splitlines()[-1].split())
    assert parsed > 0 and walked == 0, result.stderr


def plugin_results(source: str) -> list[tuple[int, int, str]]:
    """The plugin run in this process on the tree flake8 would hand it."""
    checker = CheckpointChecker(ast.parse(source), source.splitlines(True))
    return [(line, column, message.split(" ", 1)[0]) for line, column, message, _ in checker.run()]


SUPPRESSION_CASES = {
    "lowercase noqa code": ("y = cp.checkpoint(f, x)  # noqa: ckp001\n", []),
    "noqa prefix in another case": ("y = cp.checkpoint(f, x)  # NOQA:ckp0\n", []),
    "unrelated noqa code": ("y = cp.checkpoint(f, x)  # noqa: E501\n", ["CKP001"]),
    "flake8 file exemption": ("# flake8: noqa\ny = cp.checkpoint(f, x)\n", []),
    "ckptlint file exemption": ("# ckptlint: noqa\ny = cp.checkpoint(f, x)\n", []),
    "ckptlint file exemption of one code": (
        "# ckptlint: noqa: ckp101\ny = cp.checkpoint(f, x)\nz = cp.checkpoint(torch.relu, x,"
        " use_reentrant=False)\n",
        ["CKP001"],
    ),
    "flake8: noqa after code does not exempt (flake8's rule)": (
        "y = cp.checkpoint(f, x)  # flake8: noqa\n",
        ["CKP001"],
    ),
}


@pytest.mark.parametrize(
    ("body", "expected"), SUPPRESSION_CASES.values(), ids=SUPPRESSION_CASES.keys()
)
def test_cli_and_flake8_agree_on_suppressions(project: Path, body: str, expected: list) -> None:
    source = "import torch\nimport torch.utils.checkpoint as cp\n" + body
    (project / "model.py").write_text(source)
    from_flake8 = flake8("--select", "CKP", "model.py", cwd=project).stdout
    cli = json.loads(run_cli("--format", "json", "model.py", cwd=project).stdout)
    assert [item["code"] for item in cli] == expected
    assert [line.split(" ")[1] for line in from_flake8.splitlines()] == expected


def test_flake8_disable_noqa_reports_everything(project: Path) -> None:
    source = "import torch.utils.checkpoint as cp\ny = cp.checkpoint(f, x)  # noqa: ckp001\n"
    (project / "model.py").write_text(source)
    result = flake8("--select", "CKP", "--disable-noqa", "model.py", cwd=project)
    assert result.stdout.startswith("model.py:2:5: CKP001 ")


def deep_sum(terms: int) -> str:
    return (
        "import torch.utils.checkpoint as cp\n\n"
        f"y = cp.checkpoint(lambda a: {' + '.join(['a'] * terms)}, x)\n"
    )


def test_deep_input_through_the_real_flake8(project: Path) -> None:
    """300 terms: as deep as flake8's own pyflakes goes (it fails from ~330 terms, and
    flake8 then stops the whole run: that failure is pyflakes', not this plugin's)."""
    (project / "deep.py").write_text(deep_sum(300))
    (project / "other.py").write_text("import torch.utils.checkpoint as cp\ncp.checkpoint(f, x)\n")
    result = flake8("--select", "CKP", ".", cwd=project)
    assert "failed during execution" not in result.stderr + result.stdout
    places = sorted(line.split(" ")[:2] for line in result.stdout.splitlines())
    assert places in (
        [["./deep.py:3:5:", "CKP001"], ["./other.py:2:1:", "CKP001"]],
        [["./deep.py:3:1:", "CKP901"], ["./other.py:2:1:", "CKP001"]],
    )


@pytest.mark.parametrize("terms", [400, 2400])
def test_the_plugin_never_raises_on_deep_input(terms: int) -> None:
    results = plugin_results(deep_sum(terms))
    assert results in ([(3, 4, "CKP001")], [(3, 0, "CKP901")])


def test_a_bug_in_the_analysis_is_a_finding_not_an_exception(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import ckptlint.analyser

    def broken(*arguments: object) -> list:
        raise KeyError("boom")

    monkeypatch.setattr(ckptlint.analyser, "analyze_safely", broken)
    checker = CheckpointChecker(ast.parse(SOURCE), SOURCE.splitlines(True))
    ((line, column, message, _),) = list(checker.run())
    assert (line, column) == (1, 0)
    assert message == (
        "CKP901 file not analysed: internal error KeyError: 'boom' (please report it to ckptlint)"
    )


def test_cross_file_wrappers_are_known_to_flake8_cold_and_warm(project: Path) -> None:
    """flake8 hands over one file, yet the plugin knows the project: a wrapper defined in
    another file is recognised with no cache at all, and again once the cache is warm, with
    the CLI's finding at the CLI's place."""
    (project / "pyproject.toml").write_text("[tool.ckptlint]\n")
    (project / "wrap.py").write_text(
        "from torch.utils.checkpoint import checkpoint\n\n"
        "def run(function, *args):\n"
        "    return checkpoint(function, *args, use_reentrant=False, preserve_rng_state=False)\n"
    )
    (project / "blocks.py").write_text(
        "import torch.nn as nn\n\n"
        "class Block(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.dropout = nn.Dropout(0.1)\n\n"
        "    def forward(self, x):\n"
        "        return self.dropout(x) * 2\n"
    )
    (project / "model.py").write_text(
        "from blocks import Block\nfrom wrap import run\n\n"
        "def forward(x):\n    return run(Block(), x)\n"
    )
    command = [sys.executable, "-m", "flake8", "--select", "CKP", "model.py"]
    cold = subprocess.run(
        command, cwd=project, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT
    )
    assert cold.stdout.startswith("model.py:5:12: CKP301 "), cold.stdout + cold.stderr
    assert (project / ".ckptlint_cache").is_dir()
    warm = subprocess.run(
        command, cwd=project, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT
    )
    assert warm.stdout == cold.stdout
    cli = run_ckptlint("model.py", cwd=project)
    assert cli.stdout.splitlines()[0] == cold.stdout.splitlines()[0]


def test_a_flake8_process_stores_what_it_learned_once(project: Path) -> None:
    """flake8 calls the plugin once a file: what the findings learn of the project (the
    searches they ran, the words each file names) is stored when the process ends, not
    after each file (200 rewrites of the project's entry on transformers 4.34.1), and the
    next run, in two processes, finds it and reports the same."""
    (project / "pyproject.toml").write_text("[tool.ckptlint]\n")
    (project / "wrap.py").write_text(
        "from torch.utils.checkpoint import checkpoint\n\n"
        "def run(function, *args):\n"
        "    return checkpoint(function, *args)\n"
    )
    for index in range(12):
        (project / f"model_{index}.py").write_text(
            f"from wrap import run\nimport helpers_{index}\n\n"
            f"def forward(x):\n    return run(helpers_{index}.block, x)\n"
        )
        (project / f"helpers_{index}.py").write_text("def block(x):\n    return x * 2\n")
    script = (
        "import atexit, sys\n"
        "writes = []\n"
        "atexit.register(lambda: print(len(writes), file=sys.stderr))  # runs last\n"
        "from ckptlint.project import cache\n"
        "original = cache.Store.write\n"
        "def write(self, name, content):\n"
        "    writes.append(name) if name == 'project.json' else None\n"
        "    original(self, name, content)\n"
        "cache.Store.write = write\n"
        "from flake8.main.cli import main\n"
        "main(['-j', '1', '--select', 'CKP', '.'])\n"
    )
    cold = python("-c", script, cwd=project)
    assert len(cold.stdout.splitlines()) == 13, cold.stdout + cold.stderr
    # once: the project worked out, with the words the findings' lookup asks of each file;
    # the findings searched for nothing discovery had not, so there was nothing more to store
    assert cold.stderr.split() == ["1"]
    warm = flake8("-j", "2", "--select", "CKP", ".", cwd=project)
    assert sorted(warm.stdout.splitlines()) == sorted(cold.stdout.splitlines())


def test_a_file_over_the_size_cap_is_the_clis_ckp901_in_flake8(project: Path) -> None:
    """flake8 reads any file whole; the plugin still answers from the file's bytes, so a file
    over the project's ``max-file-size`` is CKP901 "too large" as in the CLI, not linted."""
    (project / "pyproject.toml").write_text("[tool.ckptlint]\nmax-file-size = 64\n")
    (project / "model.py").write_text(SOURCE)
    from_flake8 = flake8("--select", "CKP", "model.py", cwd=project).stdout.splitlines()
    cli = run_cli("--quiet", "model.py", cwd=project).stdout.splitlines()
    assert len(cli) == 1 and " CKP901 " in cli[0] and "too large" in cli[0]
    assert from_flake8 == cli


# Rule selection: flake8's options are the command-line layer, with the CLI's precedence
# (a command-line select beats the configured ignore). Each cell runs the real CLI and the
# real flake8 with the same options on the command line and the same [tool.ckptlint].
MATRIX_SOURCE = (
    "import torch\nfrom torch.utils.checkpoint import checkpoint\n\n\n"
    "def f(x):\n    return checkpoint(torch.relu, x)\n"
)  # CKP001 and CKP101 at line 6
COMMAND_LINES = [
    (),
    ("--select", "CKP101"),
    ("--select", "CKP0,CKP101"),
    ("--ignore", "CKP101"),
    ("--extend-select", "CKP101"),
    ("--select", "CKP", "--ignore", "CKP1"),
]
CONFIGURATIONS = [
    "",
    'ignore = ["CKP101"]\n',
    'select = ["CKP0"]\n',
    'select = ["CKP"]\nignore = ["CKP0"]\n',
]


@pytest.mark.parametrize("options", COMMAND_LINES)
def test_flake8_follows_the_cli_precedence(tmp_path: Path, options: tuple[str, ...]) -> None:
    """One project per configuration, side by side: one flake8 run over their files (each
    file takes its own project's configuration, as in a monorepo), one CLI run in each."""
    for index, configured in enumerate(CONFIGURATIONS):
        project = tmp_path / f"project{index}"
        (project / ".git").mkdir(parents=True)
        (project / "pyproject.toml").write_text("[tool.ckptlint]\n" + configured)
        (project / "model.py").write_text(MATRIX_SOURCE)
    files = [f"project{index}/model.py" for index in range(len(CONFIGURATIONS))]
    result = flake8(*options, *files, cwd=tmp_path)
    assert result.returncode in (0, 1), result.stderr
    by_flake8: dict[str, list[str]] = {file: [] for file in files}
    for line in result.stdout.splitlines():
        if " CKP" in line:
            by_flake8[line.split(":", 1)[0]].append(line.split(" ", 2)[1])
    for index, configured in enumerate(CONFIGURATIONS):
        project = tmp_path / f"project{index}"
        cli = json.loads(run_cli("--format", "json", *options, "model.py", cwd=project).stdout)
        by_cli = sorted(item["code"] for item in cli)
        assert sorted(by_flake8[files[index]]) == by_cli, configured
        if options == ("--select", "CKP101"):  # the case that disagreed: select beats ignore
            assert by_cli == ["CKP101"]
