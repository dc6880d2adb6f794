"""RNG consumed on a device torch does not stash, tested on a renamed PrivateUse1 device."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from tests.conftest import SUBPROCESS_TIMEOUT

WORKER = pathlib.Path(__file__).with_name("rng_device_worker.py")


@pytest.fixture(scope="module")
def results() -> dict:
    completed = subprocess.run(
        [sys.executable, str(WORKER)], capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT
    )
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout)


@pytest.mark.parametrize("mode", ["nonreentrant", "reentrant"])
def test_device_of_positional_argument_is_stashed(results: dict, mode: str) -> None:
    entry = results[f"stashed_positional/{mode}"]
    assert entry["plain_matches"]
    assert entry["guard"] is None and entry["guarded_matches"]


@pytest.mark.parametrize("mode", ["nonreentrant", "reentrant"])
def test_other_device_is_named(results: dict, mode: str) -> None:
    entry = results[f"other_device/{mode}"]
    assert not entry["plain_matches"], "plain torch silently replays different numbers"
    assert entry["guard"] == "rng_device" and entry["devices"] == ["fakegpu:1"]
    assert "positional argument" in entry["message"]


def test_device_passed_only_as_keyword_is_named(results: dict) -> None:
    entry = results["keyword_only/nonreentrant"]
    assert not entry["plain_matches"]
    assert entry["guard"] == "rng_device" and entry["devices"] == ["fakegpu:0"]
