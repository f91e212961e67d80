"""Friendly first messages for things the sandbox forbids. Not a boundary.

The kernel layers (seccomp, namespaces, Landlock) refuse these operations anyway, with a bare
"[Errno 1] Operation not permitted". These wrappers only make the common Python entry points say
why, so the agent learns faster. Agent code can undo them; that gains it nothing.
"""

from __future__ import annotations

import os
import socket
import subprocess
from typing import Any, NoReturn

_PROCESSES = "the sandbox does not allow starting processes"
_NETWORK = "the sandbox has no network (only socket.socketpair() exists)"
_MEMFD = "the sandbox does not allow memory files (their memory is outside the worker's limit)"


def _refuse(what: str, why: str) -> Any:
    def refused(*args: Any, **kwargs: Any) -> NoReturn:
        raise PermissionError(f"{what}: {why}")

    refused.__name__ = what
    return refused


def install() -> None:
    """Replace process-starting entry points, network socket creation and memory files with clear
    refusals."""
    for name in (
        "fork", "forkpty", "system", "popen", "posix_spawn", "posix_spawnp",
        "execv", "execve", "execl", "execle", "execlp", "execlpe", "execvp", "execvpe",
        "spawnv", "spawnve", "spawnl", "spawnle", "spawnlp", "spawnlpe", "spawnvp", "spawnvpe",
    ):  # fmt: skip
        if hasattr(os, name):
            setattr(os, name, _refuse(f"os.{name}", _PROCESSES))
    if hasattr(os, "memfd_create"):
        os.memfd_create = _refuse("os.memfd_create", _MEMFD)
    subprocess.Popen._execute_child = _refuse("subprocess", _PROCESSES)  # type: ignore[method-assign]
    own_init = socket.socket.__init__

    def socket_init(self: socket.socket, family: Any = -1, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("fileno") is None and not (args[2:3] and args[2] is not None):
            raise PermissionError(f"socket: {_NETWORK}")
        own_init(self, family, *args, **kwargs)

    socket.socket.__init__ = socket_init  # type: ignore[method-assign]
    own_kill = os.kill

    def kill(pid: int, sig: int) -> None:
        if pid != os.getpid():
            raise PermissionError(
                f"os.kill({pid}, {sig}): the sandbox allows signals only to its own process"
            )
        own_kill(pid, sig)

    os.kill = kill
