"""PocketWorld's environment driven from plain (synchronous) test code.

``PocketWorldEnv`` is async only (one path to the executor). With the in-process executor nothing
in it ever waits, so each call can run on a short-lived event loop; a sandboxed environment must
live inside one coroutine instead (its session belongs to the loop that opened it).
"""

from __future__ import annotations

import asyncio

from sage_rl.envs.pocketworld.env import PocketWorldEnv
from sage_rl.types import ExecResult, Outcome, Task


class SyncEnv:
    """An in-process ``PocketWorldEnv`` with blocking ``reset`` / ``execute`` / ``evaluate``."""

    def __init__(self) -> None:
        self.env = PocketWorldEnv()

    def reset(self, task: Task) -> None:
        asyncio.run(self.env.reset(task))

    def execute(self, code: str, origin: str) -> ExecResult:
        return asyncio.run(self.env.execute(code, origin))

    def evaluate(self) -> Outcome:
        return asyncio.run(self.env.evaluate())
