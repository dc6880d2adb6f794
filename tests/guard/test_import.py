"""``import ckptguard`` must work without torch; only ``enable()`` needs it."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import SUBPROCESS_TIMEOUT

SCRIPT = """
import sys
sys.modules["torch"] = None  # makes any `import torch` fail, as if it were not installed
import ckptguard
from ckptguard import PlanInfeasibleError
assert issubclass(PlanInfeasibleError, ValueError)
assert ckptguard.PlanInfeasibleError is PlanInfeasibleError
assert not ckptguard.is_enabled()
ckptguard.disable()
try:
    ckptguard.enable()
except ImportError as error:
    print("ImportError:", error)
"""


def test_import_without_torch_fails_only_at_enable() -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == (
        "ImportError: ckptguard needs PyTorch >= 2.8: pip install torch (or, from a clone of "
        "ckptlint, pip install -e '.[guard]')\n"
    )
