"""A synchronous face of a sandbox session, for callers that are not coroutines (CLI, executors).

The session lives on one private event loop in a daemon thread, shared by all ``SyncSession``s of a
process; each call blocks the caller until its coroutine finishes there. It works from inside a
running event loop too (it blocks that loop meanwhile), unlike ``asyncio.run``. ``dispatch`` runs on
the private loop's thread while the caller waits, so the world is never touched by two threads at
once.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from sage_rl.sandbox.pool import Dispatch, Sandbox
from sage_rl.sandbox.session import Session
from sage_rl.types import ExecResult

T = TypeVar("T")

_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def _io_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _loop_lock:
        if _loop is None:
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="sage-sandbox-io", daemon=True).start()
        return _loop


def _call(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run_coroutine_threadsafe(coro, _io_loop()).result()


class SyncSession:
    """``Session`` with blocking methods. Matches PocketWorld's ``Executor`` protocol
    (``reports_calls``, ``execute``, ``close``), so ``lambda d: SyncSession(sandbox, d)`` is an
    executor factory."""

    reports_calls = True

    def __init__(self, sandbox: Sandbox, dispatch: Dispatch) -> None:
        self.session: Session = _call(sandbox.acquire(dispatch))

    def execute(self, code: str, origin: str) -> ExecResult:
        return _call(self.session.execute(code, origin))

    def reset(self) -> None:
        _call(self.session.reset())

    def close(self) -> None:
        _call(self.session.close())

    @staticmethod
    def factory(sandbox: Sandbox) -> SyncSessionFactory:
        """``dispatch -> SyncSession`` with ``reports_calls`` readable on the factory itself."""
        return SyncSessionFactory(sandbox)


@dataclass(frozen=True)
class SyncSessionFactory:
    """An executor factory for PocketWorld: ``factory(dispatch)`` opens a session on ``sandbox``."""

    sandbox: Sandbox
    reports_calls: bool = True
    blocking: bool = True  # calls block on I/O and may run in a worker thread

    def __call__(self, dispatch: Dispatch) -> SyncSession:
        return SyncSession(self.sandbox, dispatch)
