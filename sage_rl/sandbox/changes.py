"""The world's changes in an episode, numbered as they happen (``CallRecord.changes``: the events
``sandbox/flow.py`` gives skills and ``Outcome.lasting`` names)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class WorldChanges:
    """Numbers an episode's changes of the world, as ``fingerprint()`` (any comparable state; None:
    the environment cannot tell) tells them apart. Both executors call ``before()`` ahead of each API
    call and ``after()`` once it succeeded: 0 (it changed nothing), n (the episode's n-th change),
    or None (no fingerprint). A failed call changes nothing (Dispatch's contract)."""

    def __init__(self, fingerprint: Callable[[], Any] | None) -> None:
        self.fingerprint, self.count, self._state = fingerprint, 0, None

    def before(self) -> None:
        if self.fingerprint is not None and self._state is None:
            self._state = self.fingerprint()

    def after(self) -> int | None:
        if self.fingerprint is None:
            return None
        state, before = self.fingerprint(), self._state
        self._state = state
        if state == before:
            return 0
        self.count += 1
        return self.count
