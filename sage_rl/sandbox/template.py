"""The template process: a warm, pre-imported interpreter that forks one worker per episode.

Started by ``Sandbox`` as a fresh interpreter (never forked from the trainer, so no trainer memory,
file or secret is inherited), with a clean environment, its own session (Ctrl-C in the trainer's
terminal does not reach it) and a SOCK_SEQPACKET control socket. It enters a new network
namespace once; each worker then applies the per-worker layers after fork.

Control messages (JSON, one per packet):
    parent -> template  {"op": "fork", "scratch": path}
    template -> parent  {"op": "ready", "network": ..., "note": ..., "cgroup": path or "",
                         "vm_bytes": its address space, which each worker starts with}
                        {"op": "forked", "pid": n} + the parent's end of the worker socket (SCM_RIGHTS)
                        {"op": "error", "error": text}
"""

from __future__ import annotations

# Pre-imports: modules agent code commonly uses, loaded once here and shared copy-on-write.
import ast  # noqa: F401
import collections  # noqa: F401
import contextlib
import dataclasses  # noqa: F401
import datetime
import encodings.idna  # noqa: F401 - socket calls encode host names first; keep the guard's message first
import functools  # noqa: F401
import gc
import importlib.machinery
import itertools  # noqa: F401
import json
import math  # noqa: F401
import os
import random  # noqa: F401
import re  # noqa: F401
import signal
import socket
import statistics  # noqa: F401
import string  # noqa: F401
import sys
import textwrap  # noqa: F401
import typing  # noqa: F401

from sage_rl.sandbox import isolation, memory, readable, seccomp_layer, shared
from sage_rl.sandbox.limits import SandboxLimits
from sage_rl.sandbox.protocol import BlockingChannel
from sage_rl.sandbox.worker import serve

with contextlib.suppress(ImportError):
    import pyseccomp  # noqa: F401 - loads libseccomp before fork


def _redirect_stdio() -> None:
    """Workers write nothing to the trainer's terminal: fds 0-2 go to /dev/null."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)


def _seal_project_imports() -> None:
    """No further module of the project can be imported here or in a worker: its package folders
    become empty search paths (Landlock then also refuses to read them; without Landlock this is a
    courtesy, not a boundary: docs/sandbox.md). Everything the worker runs is imported above."""
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] == readable.PACKAGE and hasattr(module, "__path__"):
            module.__path__ = []
    # An editable install's finder maps the package to its checkout whatever ``__path__`` says.
    sys.meta_path[:] = [f for f in sys.meta_path if not _finds_project(f)]


def _finds_project(finder: object) -> bool:
    if finder in (importlib.machinery.PathFinder, importlib.machinery.BuiltinImporter):
        return False
    try:
        return finder.find_spec(readable.PACKAGE, None) is not None  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - a finder that cannot answer finds nothing
        return False


def spawn_worker(
    ctl: socket.socket,
    limits: SandboxLimits,
    scratch: str,
    network: str,
    paths: tuple[list[str], list[str]],
    cgroup: memory.CgroupBase = memory.CgroupBase(),
) -> tuple[int, socket.socket]:
    """Fork one worker bound to ``scratch``; return its pid and the parent's end of its socket."""
    parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        code = 71
        try:
            ctl.close()
            parent_end.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            _redirect_stdio()
            report = isolation.apply_worker_layers(limits, scratch, network, *paths, cgroup=cgroup)
            hello = {"op": "hello", "isolation": report.to_dict()}
            serve(BlockingChannel(child_end), limits.message_bytes, limits.output_chars, hello)
        finally:
            os._exit(code)
    child_end.close()
    return pid, parent_end


def _vm_bytes() -> int:
    """This process's address space (VmSize), which a worker inherits before any agent code runs."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    ctl = socket.socket(fileno=int(sys.argv[1]))
    limits = SandboxLimits.model_validate_json(sys.argv[2])
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps workers; the parent kills by pidfd
    memory.raise_oom_score()  # the OOM killer takes the template (and its workers) before the trainer
    cgroup = memory.create_base(str(os.getpid()))  # before a user namespace could change who we are
    try:
        network, note = isolation.enter_network_namespace()
        paths = readable.readable_paths()
        _seal_project_imports()
        with contextlib.suppress(ImportError, OSError):
            seccomp_layer.syscall_numbers()  # resolve once; every worker inherits the cache
        shared.shared_objects()  # the walk of the allowed modules, once: every worker inherits it
        # _strptime (the worker's: C code imports it by name) set up once, with its time.tzset(), so that
        # a task's first strptime does not move the shared state (shared.py) and void later credit
        datetime.datetime.strptime("2000", "%Y")
        gc.freeze()  # keep the pre-imported heap out of the collector so forks share its pages
        ready = {
            "op": "ready",
            "network": network,
            "note": note,
            "cgroup": cgroup.path,
            "vm_bytes": _vm_bytes(),
        }
        ctl.send(json.dumps(ready).encode())
        # The loop stays in main, not in a helper: one more frame under every worker moves where
        # agent code's deep recursion stops (tests/test_sandbox_hostile.py::test_deep_recursion).
        while True:
            try:
                data = ctl.recv(65536)
            except OSError:
                break
            if not data:
                break
            msg = json.loads(data)
            if msg.get("op") != "fork":
                break
            memory.sweep(cgroup)  # the cgroups of workers that have exited
            try:
                pid, end = spawn_worker(ctl, limits, str(msg["scratch"]), network, paths, cgroup)
            except OSError as e:
                ctl.send(json.dumps({"op": "error", "error": f"fork failed: {e}"}).encode())
                continue
            socket.send_fds(ctl, [json.dumps({"op": "forked", "pid": pid}).encode()], [end.fileno()])
            end.close()
    finally:
        memory.end_all(cgroup)  # the parent closed or died: leave no cgroup behind


if __name__ == "__main__":
    main()
