"""The sandbox for agent code (issue 3): real Python in isolated, limited worker processes.

Public API:
    SandboxLimits                       the limits (a config section; defaults in docs/sandbox.md)
    Sandbox(limits).start()             start the template once; returns the IsolationReport
    await Sandbox.acquire(dispatch)     -> Session; dispatch(app, api, kwargs) runs in the parent
    await Session.execute(code, origin) -> sage_rl.types.ExecResult
    await Session.reset() / close()
    SyncSession(sandbox, dispatch)      blocking execute/reset/close (PocketWorld's Executor protocol)
    probe_isolation(limits)             the effective IsolationReport on this machine
"""

from sage_rl.sandbox.isolation import IsolationReport
from sage_rl.sandbox.limits import SandboxLimits
from sage_rl.sandbox.pool import Dispatch, Sandbox, SandboxError
from sage_rl.sandbox.session import Session
from sage_rl.sandbox.sync import SyncSession


def probe_isolation(limits: SandboxLimits | None = None) -> IsolationReport:
    """Start a sandbox, report which isolation layers take effect here, and stop it."""
    with Sandbox(limits) as sandbox:
        assert sandbox.isolation is not None
        return sandbox.isolation


__all__ = [
    "Dispatch",
    "IsolationReport",
    "Sandbox",
    "SandboxError",
    "SandboxLimits",
    "Session",
    "SyncSession",
    "probe_isolation",
]
