"""Shared fixtures for the ckptguard tests; they need torch and skip without it."""

import re
import sys
import warnings

import pytest

torch = pytest.importorskip("torch")

import ckptguard  # noqa: E402
from ckptguard import _explain  # noqa: E402
from ckptguard.errors import CheckpointGuardError  # noqa: E402

ADDRESS = re.compile(r"\bat 0x[0-9a-fA-F]+")


class _RecordingWarnings:
    """The ``warnings`` module as ckptguard's messages see it, noting each message issued."""

    def __init__(self, messages: list) -> None:
        self.messages = messages

    def warn_explicit(self, message, *args, **kwargs):
        self.messages.append(str(message))
        return warnings.warn_explicit(message, *args, **kwargs)

    def warn(self, message, category=None, stacklevel=1, **kwargs):
        self.messages.append(str(message))
        return warnings.warn(message, category, stacklevel + 1, **kwargs)


@pytest.fixture(autouse=True)
def _messages_name_no_address(monkeypatch):
    """No guard error or warning names a value by its memory address (issue 28): checked on
    every one the tests raise, over the whole catalogue of faults."""
    messages: list = []
    init = CheckpointGuardError.__init__

    def recording_init(self, message, **kwargs):
        messages.append(message)
        init(self, message, **kwargs)

    monkeypatch.setattr(CheckpointGuardError, "__init__", recording_init)
    monkeypatch.setattr(_explain, "warnings", _RecordingWarnings(messages))
    yield messages
    with_addresses = [m for m in messages if ADDRESS.search(m)]
    assert not with_addresses, with_addresses


@pytest.fixture(autouse=True)
def _guard_off_between_tests():
    """Every test starts and ends with torch.utils.checkpoint untouched and no report pending."""
    ckptguard.disable()
    yield
    ckptguard.disable()
    intercept = sys.modules.get("ckptguard._intercept")
    if intercept is not None:
        intercept.collector = None


def grads_of(module, *inputs):
    """Gradients of the module's parameters and of the inputs, in a fixed order, cloned."""
    named = [p.grad for p in module.parameters()] + [x.grad for x in inputs]
    return [None if g is None else g.clone() for g in named]


def grads_equal(first, second):
    return len(first) == len(second) and all(
        (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))
        for a, b in zip(first, second, strict=True)
    )


def silently_wrong_then_named(step, change, undo, kind, *texts):
    """``step(change)`` runs a checkpointed forward, calls ``change`` (if any) before backward
    and returns the gradients. Plain torch must give different gradients without a word; the
    guard must raise ``CheckpointMismatchError`` of ``kind`` naming ``texts``; an unchanged
    step under the guard must match plain torch bit for bit. Returns the error."""
    honest = step(None)
    try:
        changed = step(change)
    finally:
        undo()
    assert not grads_equal(honest, changed), "plain torch should silently differ"
    ckptguard.enable()
    try:
        with pytest.raises(ckptguard.CheckpointMismatchError) as info:
            step(change)
    finally:
        undo()
        ckptguard.disable()
    error = info.value
    assert error.kind == kind, str(error)
    for text in texts:
        assert text in str(error), (text, str(error))
    with ckptguard.guard():
        assert grads_equal(step(None), honest)
    return error
