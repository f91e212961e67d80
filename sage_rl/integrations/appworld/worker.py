"""AppWorld workers: one process per live world, JSON lines over a Unix socket.

Runs under the AppWorld virtualenv's Python (``.venv-appworld/bin/python worker.py SOCKET``),
never in sage-rl's own environment: AppWorld pins pydantic<2, freezes the process clock and
patches builtins while executing (PLATFORM.md). So this file imports only the standard library
and ``appworld``, and nothing from ``sage_rl``.

The process started is a *zygote*: it imports AppWorld and builds its API routes once (seconds),
then forks one worker per connection to ``SOCKET`` (milliseconds), so a pool of workers, or the
replacement of a killed one, costs no new start-up. Each worker holds one ``AppWorld`` at a time.

Protocol on a worker's connection: the worker first sends ``{"ok": true, "ready": true, "pid"}``;
then each request is one JSON object on one line, and so is each answer. Everything that writes
to stdout (AppWorld's warnings, prints outside a captured cell) goes to stderr instead.

Requests (``op`` and its fields) -> answer fields (besides ``ok``):
- ``reset`` task_id, experiment, cell_timeout_s -> instruction
- ``execute`` code -> output, failed, timed_out, completed, defined
- ``evaluate`` -> passes, failures, num_tests, success
- ``info`` -> rss_mb, pss_mb, pid
- ``close`` -> (closes the world; the process then exits)
A failing request answers ``{"ok": false, "error": "<Type>: <message>"}``; the worker keeps going.
"""

from __future__ import annotations

import ast
import json
import os
import selectors
import signal
import socket
import sys
import traceback

# Run as a script from inside the sage_rl package: drop the script's folder from the import path
# so sibling modules can never shadow a library AppWorld imports.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

FAILED_PREFIX = "Execution failed."
TIMEOUT_MARK = "timed out after"


class Worker:
    """Holds the one live ``AppWorld`` of this process."""

    def __init__(self) -> None:
        self.world = None

    def reset(self, task_id: str, experiment: str, cell_timeout_s: int) -> dict:
        from appworld import AppWorld

        self._close_world()
        self.world = AppWorld(task_id, experiment_name=experiment, timeout_seconds=cell_timeout_s)
        return {"instruction": self.world.task.instruction}

    def execute(self, code: str) -> dict:
        world = self._live()
        names = _top_level_defs(code)
        before = {n: world.shell.user_ns.get(n) for n in names}
        output = world.execute(code)
        failed = output.startswith(FAILED_PREFIX)
        after = world.shell.user_ns
        # A definition "executed" when the name is now bound to a new function object.
        defined = [n for n in names if callable(after.get(n)) and after.get(n) is not before[n]]
        return {
            "output": output,
            "failed": failed,
            "timed_out": failed and TIMEOUT_MARK in output,
            "completed": bool(world.task_completed()),
            "defined": defined,
        }

    def evaluate(self) -> dict:
        tracker = self._live().evaluate(suppress_errors=True)
        return {
            "passes": [p["requirement"] for p in tracker.passes],
            "failures": [
                {"requirement": f["requirement"], "trace": f.get("trace", "")} for f in tracker.failures
            ],
            "num_tests": tracker.num_tests,
            "success": bool(tracker.success),
        }

    def info(self) -> dict:
        return {
            "rss_mb": _proc_kb("status", "VmRSS:") / 1024,
            "pss_mb": _proc_kb("smaps_rollup", "Pss:") / 1024,
            "pid": os.getpid(),
        }

    def close(self) -> dict:
        self._close_world()
        return {}

    def _live(self):
        if self.world is None:
            raise RuntimeError("no task is loaded: send 'reset' first")
        return self.world

    def _close_world(self) -> None:
        if self.world is not None:
            world, self.world = self.world, None
            world.close()


def _top_level_defs(code: str) -> list[str]:
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return []
    return [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _proc_kb(name: str, key: str) -> float:
    """A ``kB`` field of ``/proc/self/<name>`` (0 where absent). PSS shares copy-on-write pages
    with the zygote fairly, so it is the honest per-worker memory; RSS counts them in full."""
    try:
        with open(f"/proc/{os.getpid()}/{name}") as f:
            for line in f:
                if line.startswith(key):
                    return float(line.split()[1])
    except OSError:
        pass
    return 0.0


def handle(worker: Worker, request: dict) -> dict:
    op = request.get("op")
    try:
        if op == "reset":
            out = worker.reset(request["task_id"], request["experiment"], int(request["cell_timeout_s"]))
        elif op == "execute":
            out = worker.execute(request["code"])
        elif op == "evaluate":
            out = worker.evaluate()
        elif op == "info":
            out = worker.info()
        elif op == "close":
            out = worker.close()
        else:
            raise ValueError(f"unknown op {op!r}")
    except Exception as e:  # the worker must answer every request, whatever AppWorld raised
        traceback.print_exc(file=sys.stderr)
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}
    return {"ok": True, **out}


def serve(rfile, wfile) -> None:
    """Answer requests from ``rfile`` on ``wfile`` until ``close`` or end of input."""
    worker = Worker()
    wfile.write(json.dumps({"ok": True, "ready": True, "pid": os.getpid()}) + "\n")
    wfile.flush()
    for line in rfile:
        if not line.strip():
            continue
        request = json.loads(line)
        wfile.write(json.dumps(handle(worker, request)) + "\n")
        wfile.flush()
        if request.get("op") == "close":
            break


def preload() -> None:
    """Import AppWorld and build every app's API routes (most of a world's first construction),
    once, in the zygote; forked workers inherit it all copy-on-write."""
    from appworld.apps import get_all_apps
    from appworld.common.utils import import_apis_module
    from appworld.environment import AppWorld  # noqa: F401

    for app in get_all_apps():
        import_apis_module(app)


def fork_worker(conn: socket.socket, listener: socket.socket) -> None:
    """In the zygote: fork; the child serves ``conn`` and exits, the parent goes back to accepting."""
    if os.fork() != 0:
        conn.close()
        return
    try:
        listener.close()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setpgid(0, 0)  # its own group, so a kill aimed at it never reaches the zygote
        serve(conn.makefile("r"), conn.makefile("w"))
    finally:
        os._exit(0)


def zygote(socket_path: str) -> None:
    """Preload AppWorld, listen on ``socket_path`` and fork one worker per connection.

    Says ``ready`` on stdout once listening, and exits when its stdin closes (its parent is gone).
    """
    protocol_out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stray prints from AppWorld now go to stderr, not into a protocol
    preload()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(64)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps finished workers
    protocol_out.write(json.dumps({"ok": True, "ready": True, "pid": os.getpid()}) + "\n")
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    sel.register(sys.stdin.fileno(), selectors.EVENT_READ)
    while True:
        for key, _ in sel.select():
            if key.fileobj is listener:
                conn, _ = listener.accept()
                fork_worker(conn, listener)
            elif not os.read(sys.stdin.fileno(), 4096):
                os._exit(0)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: worker.py SOCKET_PATH")
    zygote(sys.argv[1])
