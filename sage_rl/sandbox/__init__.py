"""The sandbox for agent code (issue 3): real Python in isolated, limited worker processes.

Public API:
    SandboxLimits                       the limits (a config section; defaults in docs/sandbox.md)
    with Sandbox(limits) as sandbox:    start the template once (``start()`` returns the IsolationReport);
                                        leaving the block ends the template and its workers
    await sandbox.acquire(dispatch, fingerprint=None)
                                        -> Session; dispatch(app, api, kwargs) runs in the parent, on
                                        the event loop that awaits the session; fingerprint() (optional)
                                        tells world states apart, so replies say what changed the world
    await Session.execute(code, origin) -> sage_rl.types.ExecResult
    await Session.reset() / close()
    probe_isolation(limits)             the effective IsolationReport on this machine

There is no process-wide sandbox: whoever composes a run owns one as a context manager and passes
it down (``sage_rl.build.open_suite``).
"""

from sage_rl.sandbox.isolation import IsolationReport
from sage_rl.sandbox.limits import SandboxLimits
from sage_rl.sandbox.pool import Dispatch, Fingerprint, Sandbox, SandboxError
from sage_rl.sandbox.session import Session


def probe_isolation(limits: SandboxLimits | None = None) -> IsolationReport:
    """Start a sandbox, report which isolation layers take effect here, and stop it."""
    with Sandbox(limits) as sandbox:
        assert sandbox.isolation is not None
        return sandbox.isolation


__all__ = [
    "Dispatch",
    "Fingerprint",
    "IsolationReport",
    "Sandbox",
    "SandboxError",
    "SandboxLimits",
    "Session",
    "probe_isolation",
]
