"""The private torch symbols the planner relies on, resolved in one place.

* ``torch._C._autograd._get_sequence_nr``: the autograd node counter. Nodes created inside a
  module call get numbers in [counter at its start, counter at its end); the profiler labels
  each backward node evaluation with the same number, which maps backward time to module calls.
* The profiler's raw event tree (``profile.profiler.kineto_results.experimental_event_tree``):
  allocation events carry the allocator's running ``total_allocated`` (CPU: c10's profiled CPU
  allocator; CUDA: the caching allocator), the independent memory measure on CPU.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

BACKWARD_EVENT_PREFIX = "autograd::engine::evaluate_function: "


def autograd_sequence_nr() -> int:
    return torch._C._autograd._get_sequence_nr()


@dataclass(frozen=True)
class Allocation:
    time_ns: int
    ptr: int
    size: int  # negative for a free
    total: int  # allocator's running total after this event


@dataclass(frozen=True)
class BackwardNode:
    sequence_nr: int
    start_ns: int
    end_ns: int


def profiler_events(prof: Any, device: torch.device) -> tuple[list[Allocation], list[BackwardNode]]:
    """Allocations on ``device`` and backward node evaluations, each sorted by time."""
    from torch._C._profiler import _EventType

    allocations, backward = [], []
    for event in _walk(prof.profiler.kineto_results.experimental_event_tree()):
        if event.tag == _EventType.Allocation:
            fields = event.extra_fields
            if _same_device(fields.device, device):
                allocations.append(
                    Allocation(
                        event.start_time_ns,
                        fields.ptr,
                        fields.alloc_size,
                        fields.total_allocated,
                    )
                )
        elif event.tag == _EventType.TorchOp and event.name.startswith(BACKWARD_EVENT_PREFIX):
            sequence_nr = event.extra_fields.sequence_number
            if sequence_nr >= 0:
                backward.append(BackwardNode(sequence_nr, event.start_time_ns, event.end_time_ns))
    allocations.sort(key=lambda a: a.time_ns)
    backward.sort(key=lambda b: b.start_ns)
    return allocations, backward


def _walk(events: list) -> Iterator[Any]:
    stack = list(reversed(events))
    while stack:
        event = stack.pop()
        yield event
        stack.extend(reversed(event.children))


def _same_device(reported: Any, device: torch.device) -> bool:
    reported = torch.device(reported) if not isinstance(reported, torch.device) else reported
    if reported.type != device.type:
        return False
    return device.index is None or reported.index in (None, device.index)


@contextlib.contextmanager
def _stderr_silenced() -> Iterator[None]:
    """The process's stderr (file descriptor 2) sent to /dev/null: kineto prints its
    ``USDT ... profiler_start`` / ``profiler_stop`` lines from C++, past Python's streams."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no descriptor 2 to silence
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


@contextlib.contextmanager
def quiet_profile(**kwargs: Any) -> Iterator[Any]:
    """``torch.profiler.profile(**kwargs)`` whose start and stop print nothing on stderr."""
    from torch.profiler import profile

    prof = profile(**kwargs)
    with _stderr_silenced():
        prof.__enter__()
    try:
        yield prof
    finally:
        with _stderr_silenced():
            prof.__exit__(None, None, None)
