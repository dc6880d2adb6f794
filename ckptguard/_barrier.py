"""The exception barrier around each stage of the guard's work on a region (``stage``)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from ckptguard.errors import (
    CheckpointGuardError,
    CheckpointGuardWarning,
    CheckpointMismatchWarning,
)

# NOTE [ The guard never stops training ]
# The guard's own failure (a bug, or an object it cannot read: a proxy, a tensor subclass
# without storage) must not stop the user's training or change what it computes. Every stage of
# the guard's work on a region (prepare, fingerprint, verify, the torch-settings, strict,
# side-effect, DDP and selective-checkpointing checks, explaining, warning) is a function
# decorated with ``stage``: a failure there becomes one ``CheckpointGuardWarning`` ``[internal]``
# (``Region.give_up``) and the region runs on unguarded, as torch alone runs it. The barrier
# never wraps the user's function, whose errors (torch's ``_StopRecomputationError`` among them)
# pass through untouched, and it lets the guard's verdicts through: its errors, and its warnings
# where a filter makes them errors. Guard code that runs inside the user's function (the
# forward pre-hook that sees the modules a function region runs, the dispatch modes) must not
# raise there: it notes its failure, which a stage raises once the function has returned.
#
# A verdict, once reached, stands: where wording it fails, the error says so and is raised all
# the same (``_explain.worded``), rather than become an ``[internal]`` warning that would let
# training go on with gradients the guard knows are wrong.

VERDICTS = (CheckpointGuardError, CheckpointGuardWarning, CheckpointMismatchWarning)
_Work = TypeVar("_Work", bound=Callable[..., Any])


def stage(name: str) -> Callable[[_Work], _Work]:
    """Run the decorated function, whose first argument is the region it works on, inside the
    barrier: nothing where the guard already gave the region up, and None where it fails now
    (the region is then given up, ``name`` saying which stage failed).
    See NOTE [ The guard never stops training ]"""

    def decorate(work: _Work) -> _Work:
        @functools.wraps(work)
        def in_barrier(region: Any, *args: Any, **kwargs: Any) -> Any:
            if region.unguarded:
                return None
            try:
                return work(region, *args, **kwargs)
            except VERDICTS:
                raise
            except Exception as error:
                region.give_up(name, error)
                return None

        return in_barrier  # type: ignore[return-value]

    return decorate
