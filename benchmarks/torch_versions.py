"""Run the guard's tests against several torch releases, each in its own virtual environment.

    python benchmarks/torch_versions.py [--versions 2.8 2.13 2.14.1 2.15] [--cache DIR]

The guard hooks torch's private checkpoint machinery, so the releases it claims to support
(the ``torch`` requirement of the ``guard`` extra in ``pyproject.toml``) are the ones whose
guard tests pass. For each version this makes (once) a plain virtual environment under the
cache folder (default ``benchmarks/.torch-envs/``, git-ignored) and installs into it
``torch==VERSION`` (from PyTorch's CPU index when it answers, otherwise from the configured
index: PyPI's Linux wheels are CUDA builds, which import and run without a GPU), then the
project's dependencies and its ``test`` extra, all held to that torch by a constraints file
(which also replaces any machine-wide constraint that would cap torch). The project itself is
not installed: the tests import it from this checkout (``PYTHONPATH``). Every wheel is
downloaded once into ``wheels/`` in the cache folder and installed from there, so a rebuilt
environment downloads nothing again (pip's own cache keeps nothing from an index whose answers
say nothing about caching); a wheel already on disk can be put there, or offered with
``PIP_FIND_LINKS``. The dependencies are reinstalled when ``pyproject.toml`` changes.

Each environment then runs ``python -m pytest -q tests/guard`` in the project root (the linter
never imports torch, so its tests are left out) and the script prints one table: the torch the
environment really imports, tests passed / failed / skipped / errors, seconds, and below it
every failing test with the first line of its message and every skip reason with its count.
A version that cannot be installed gets a row saying why. The whole pytest output of each run
is kept as ``pytest.log`` in its environment's folder. The exit status is 1 when a version the
project claims fails a test or cannot be tested; versions below the claimed floor are
reported only. This is not a timing benchmark and does not run in CI, which tests one torch
(README's test command).
"""

from __future__ import annotations

import argparse
import ast
import collections
import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import venv
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_CACHE = ROOT / "benchmarks" / ".torch-envs"
# the oldest release pyproject.toml claims, the one CI runs, the newest ones
DEFAULT_VERSIONS = ("2.8", "2.13", "2.14.1", "2.15")
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
READY = "ready"  # holds the hash of the pyproject.toml the dependencies were installed from
TEST_TIMEOUT_S = 3600


@dataclass
class Outcome:
    version: str
    claimed: bool  # whether pyproject.toml's guard extra admits this version
    torch: str = ""  # the version the environment really imports, as torch.__version__ says
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    errors: int = 0
    seconds: float = 0.0
    failures: list[tuple[str, str]] = field(default_factory=list)  # (test id, first line)
    skips: collections.Counter[str] = field(default_factory=collections.Counter)  # reason
    problem: str = ""  # why no tests ran

    @property
    def fine(self) -> bool:
        return not (self.problem or self.failed or self.errors)


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def claimed_torch() -> SpecifierSet:
    """The torch versions the guard extra admits."""
    for line in _project()["optional-dependencies"]["guard"]:
        requirement = Requirement(line)
        if requirement.name == "torch":
            return requirement.specifier
    return SpecifierSet()


def _test_requirements() -> list[str]:
    """What the tests need besides torch and this checkout: the project's dependencies and
    its test extra."""
    project = _project()
    return [*project["dependencies"], *project["optional-dependencies"]["test"]]


def _clean_environment() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}


def _pip_environment(constraints: pathlib.Path) -> dict[str, str]:
    environment = _clean_environment()
    environment["PIP_CONSTRAINT"] = str(constraints)
    environment["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return environment


def _run(command: list[str], environment: dict[str, str], log: pathlib.Path) -> bool:
    """Run ``command``, appending its output to ``log``; whether it succeeded."""
    with log.open("a") as stream:
        stream.write(f"$ {' '.join(command)}\n")
        stream.flush()
        done = subprocess.run(command, env=environment, stdout=stream, stderr=subprocess.STDOUT)
    return done.returncode == 0


def _last_error(log: pathlib.Path) -> str:
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines()]
    errors = [line for line in lines if line.startswith("ERROR")]
    return (errors or [line for line in lines if line] or ["no output"])[-1][:200]


def _cpu_index_answers() -> bool:
    try:
        with urllib.request.urlopen(f"{CPU_INDEX}/torch/", timeout=10) as response:
            return response.status == 200
    except OSError:
        return False


def _install(
    python: pathlib.Path,
    requirements: list[str],
    index: list[str],
    wheels: pathlib.Path,
    environment: dict[str, str],
    log: pathlib.Path,
) -> bool:
    """Install ``requirements`` from ``wheels``, downloading there first what it lacks (pip
    takes a file it finds there over the same file on an index)."""
    pip = [str(python), "-m", "pip"]
    options = ["--progress-bar", "off", "--find-links", str(wheels)]
    return _run(
        [*pip, "download", *options, *index, "--dest", str(wheels), *requirements],
        environment,
        log,
    ) and _run([*pip, "install", *options, "--no-index", *requirements], environment, log)


def _prepare(version: str, cache: pathlib.Path, cpu_index: bool) -> tuple[pathlib.Path, str]:
    """The environment's python for ``version``, built or brought up to date; or an empty
    path and the reason it could not be built."""
    home = cache / f"torch-{version}"
    python = home / "bin" / "python"
    ready = home / READY
    project = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if ready.exists() and ready.read_text() == project:
        return python, ""
    log = home / "install.log"
    constraints = home / "constraints.txt"
    environment = _pip_environment(constraints)
    wheels = cache / "wheels"
    wheels.mkdir(exist_ok=True)
    if not python.exists() or not (home / "torch-installed").exists():
        shutil.rmtree(home, ignore_errors=True)
        print(f"torch {version}: making {home}", file=sys.stderr, flush=True)
        venv.create(home, with_pip=True)
        constraints.write_text(f"torch=={version}\n")
        index = ["--index-url", CPU_INDEX] if cpu_index else []
        if not _install(python, [f"torch=={version}"], index, wheels, environment, log):
            return pathlib.Path(), f"torch=={version} not installable: {_last_error(log)}"
        (home / "torch-installed").touch()
    print(f"torch {version}: installing the test dependencies", file=sys.stderr, flush=True)
    ready.unlink(missing_ok=True)
    if not _install(python, _test_requirements(), [], wheels, environment, log):
        return pathlib.Path(), f"test dependencies not installable: {_last_error(log)}"
    ready.write_text(project)
    return python, ""


def _test_id(classname: str, name: str) -> str:
    """pytest's node id from a JUnit record's dotted class name (module path, then classes)."""
    parts = classname.split(".") if classname else name.split(".")  # a collection error
    name = name if classname else ""
    for split in range(len(parts), 0, -1):
        path = "/".join(parts[:split]) + ".py"
        if (ROOT / path).exists():
            return "::".join([path, *parts[split:], name][: None if name else -1])
    return f"{classname}::{name}"


def _first_line(element: ElementTree.Element) -> str:
    lines = (element.get("message") or element.text or "").strip().splitlines()
    return lines[0][:160] if lines else ""


def _skip_reason(skipped: ElementTree.Element) -> str:
    """A module skipped at collection is recorded as "collection skipped", with the
    ``(path, line, reason)`` tuple as text."""
    if skipped.get("message") != "collection skipped":
        return _first_line(skipped)
    path, line, reason = ast.literal_eval(skipped.text or "")
    return f"{pathlib.Path(path).relative_to(ROOT)}:{line}: {reason.removeprefix('Skipped: ')}"


def _read_report(report: pathlib.Path, outcome: Outcome) -> None:
    for case in ElementTree.parse(report).iter("testcase"):
        test = _test_id(case.get("classname", ""), case.get("name", ""))
        kinds = {child.tag: child for child in case}
        if "failure" in kinds:
            outcome.failed += 1
            outcome.failures.append((test, _first_line(kinds["failure"])))
        elif "error" in kinds:
            outcome.errors += 1
            outcome.failures.append((test, _first_line(kinds["error"])))
        elif "skipped" in kinds:
            outcome.skipped += 1
            outcome.skips[_skip_reason(kinds["skipped"])] += 1
        else:
            outcome.passed += 1


def _imported_torch(python: pathlib.Path) -> str:
    return subprocess.run(
        [str(python), "-c", "import torch; print(torch.__version__)"],
        env=_clean_environment(),
        capture_output=True,
        text=True,
    ).stdout.strip()


def _is_release(imported: str, version: str) -> bool:
    """Whether ``imported`` (say ``2.4.0+cpu``) is the release ``version`` (say ``2.4``)."""
    wanted = Version(version).release
    have = Version(imported).release
    return have[: len(wanted)] == wanted and not any(have[len(wanted) :])


def run_version(version: str, cache: pathlib.Path, cpu_index: bool, claimed: SpecifierSet):
    outcome = Outcome(version, claimed.contains(version))
    python, problem = _prepare(version, cache, cpu_index)
    if problem:
        outcome.problem = problem
        return outcome
    outcome.torch = _imported_torch(python)
    if not outcome.torch:
        outcome.problem = "import torch fails in the environment"
        return outcome
    if not _is_release(outcome.torch, version):
        outcome.problem = f"the environment imports torch {outcome.torch}, not {version}"
        return outcome
    print(f"torch {outcome.torch}: running tests/guard", file=sys.stderr, flush=True)
    log = python.parent.parent / "pytest.log"
    environment = {**_clean_environment(), "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory() as folder:
        report = pathlib.Path(folder) / "report.xml"
        command = [str(python), "-m", "pytest", "-q", "tests/guard", "-p", "no:cacheprovider"]
        command.append("--continue-on-collection-errors")  # a module this torch cannot import
        start = time.perf_counter()
        with log.open("w") as stream:
            try:
                done = subprocess.run(
                    [*command, f"--junitxml={report}"],
                    cwd=ROOT,
                    env=environment,
                    stdout=stream,
                    stderr=subprocess.STDOUT,
                    timeout=TEST_TIMEOUT_S,
                )
            except subprocess.TimeoutExpired:
                outcome.problem = f"the tests ran past {TEST_TIMEOUT_S} s (see {log})"
                return outcome
        outcome.seconds = time.perf_counter() - start
        if not report.exists():
            outcome.problem = f"pytest exited {done.returncode} without a report (see {log})"
            return outcome
        _read_report(report, outcome)
    return outcome


def table(outcomes: list[Outcome], claimed: SpecifierSet) -> str:
    header = ("version", "claimed", "torch", "passed", "failed", "skipped", "errors", "seconds")
    rows = [header]
    for o in outcomes:
        claim = "yes" if o.claimed else "no"
        if o.problem:
            rows.append((o.version, claim, o.torch or "-", "-", "-", "-", "-", "-"))
        else:
            counts = (o.passed, o.failed, o.skipped, o.errors)
            rows.append((o.version, claim, o.torch, *map(str, counts), f"{o.seconds:.0f}"))
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    lines = [f"guard tests (tests/guard) per torch release; claimed: torch{claimed}", ""]
    lines += [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        for row in rows
    ]
    for o in outcomes:
        if o.problem:
            lines.append(f"\ntorch {o.version}: {o.problem}")
            continue
        if o.failures:
            lines.append(f"\nfailing on torch {o.torch}:")
            lines.extend(f"  {test}: {message}" for test, message in o.failures)
        if o.skips:
            lines.append(f"\nskipped on torch {o.torch}:")
            lines.extend(f"  {count} x {reason}" for reason, count in sorted(o.skips.items()))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", nargs="+", default=list(DEFAULT_VERSIONS))
    parser.add_argument("--cache", type=pathlib.Path, default=DEFAULT_CACHE)
    arguments = parser.parse_args()
    cache = arguments.cache.resolve()
    cache.mkdir(parents=True, exist_ok=True)
    cpu_index = _cpu_index_answers()
    if not cpu_index:
        print(f"{CPU_INDEX} does not answer: torch from the configured index", file=sys.stderr)
    claimed = claimed_torch()
    outcomes = [run_version(v, cache, cpu_index, claimed) for v in arguments.versions]
    print(table(outcomes, claimed))
    sys.exit(0 if all(o.fine for o in outcomes if o.claimed) else 1)


if __name__ == "__main__":
    main()
