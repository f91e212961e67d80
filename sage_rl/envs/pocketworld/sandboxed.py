"""PocketWorld's default executor: agent code in the sandbox (issue 3), one worker per episode.

One ``Sandbox`` (a pre-imported template process that forks workers) serves the whole process;
it starts on first use and logs its effective isolation level. ``executor_factory(limits)`` is what
``PocketWorldSuite`` / ``PocketWorldEnv`` take.
"""

from __future__ import annotations

import atexit
import functools
import sys

from sage_rl.sandbox import Sandbox, SandboxLimits, SyncSession


@functools.cache
def shared_sandbox(limits: SandboxLimits) -> Sandbox:
    """The process's sandbox for ``limits`` (started once, closed at exit)."""
    sandbox = Sandbox(limits)
    report = sandbox.start()
    print(f"[sage-rl] {report.line()}", file=sys.stderr)
    atexit.register(sandbox.close)
    return sandbox


def executor_factory(limits: SandboxLimits | None = None):
    """``dispatch -> executor`` running cells in a fresh sandbox worker (``reports_calls=True``)."""
    return SyncSession.factory(shared_sandbox(limits or SandboxLimits()))
