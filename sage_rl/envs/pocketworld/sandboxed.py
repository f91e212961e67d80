"""PocketWorld's default executors: agent code in the sandbox (issue 3), one worker per episode.

The ``Sandbox`` (a pre-imported template process that forks workers) is owned by whoever composes
the run (``sage_rl.build.open_suite``, ``sage-rl world``, a benchmark), as a context manager; this
module only opens sessions on it. ``Session`` is itself an ``Executor``: ``execute`` and ``close``
are awaited directly, and ``apis`` calls run ``dispatch`` on the same event loop.
"""

from __future__ import annotations

from dataclasses import dataclass

from sage_rl.envs.pocketworld.proxy import Dispatch
from sage_rl.sandbox import Fingerprint, Sandbox, Session


@dataclass(frozen=True)
class SandboxExecutors:
    """``Executors`` whose episodes each get a fresh worker of ``sandbox`` (with call records)."""

    sandbox: Sandbox
    reports_calls: bool = True

    async def open(self, dispatch: Dispatch, fingerprint: Fingerprint | None = None) -> Session:
        return await self.sandbox.acquire(dispatch, fingerprint)
