"""Run ``sage-rl`` commands in fresh processes forked from one that has already imported what they
import (torch, transformers, every command module): each command skips the ~4-8 s its interpreter
spends importing them, and still runs in a process of its own, from ``main()`` to interpreter exit
(atexit handlers, finalizers and all), in its own folder and environment, with stdin from
/dev/null. The server only imports: it never runs a command, a torch op or a thread, so each child
starts from the state a fresh ``python -m sage_rl.cli`` would reach after its imports.

``run_cli(args, cwd, env, timeout)`` -> ``subprocess.CompletedProcess``, as
``subprocess.run([python, "-m", "sage_rl.cli", *args], cwd=cwd, env=env, stdin=DEVNULL, ...)``
would return it. Tests of the process itself (start-up time, what it imports, signals) and
test_cli_smoke.py run the real entry point in a plain subprocess.

Run as a script, this file is the server: one JSON request a line on stdin (argv, cwd, env and
the two output files), answered on stdout by ``{"pid": N}`` when the child starts, then
``{"returncode": R}`` when it ends.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: What the commands import, imported once by the server (a module that fails to import is left
#: to the command, which reports it as it would anyway).
PRELOAD = (
    "torch", "transformers", "transformers.models.llama.modeling_llama", "sage_rl.cli",
    *(f"sage_rl.cli.{m}" for m in ("eval", "train", "recipe", "collect", "sft", "choose", "view", "world",
                                   "appworld", "skills")),
    "sage_rl.integrations.verl.main", "sage_rl.runs.train", "sage_rl.runs.eval", "sage_rl.train.loop",
    "sage_rl.train.sft", "sage_rl.policies.transformers_policy", "sage_rl.recipe.pipeline",
)  # fmt: skip


def _serve() -> dict:
    """The server's loop; returns only in a child, with the request it is to run."""
    for name in PRELOAD:
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:  # a fork would copy a thread's locks, not the thread: no children then
        print(json.dumps({"refused": f"{threads} threads after the imports"}), flush=True)
        sys.exit(0)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            return req
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), flush=True)
    sys.exit(0)


def _child(req: dict) -> None:
    """In the forked child: become ``python -m sage_rl.cli *argv`` run in ``cwd`` with ``env``."""
    os.setpgid(0, 0)  # its own process group: a timeout kills it and the processes of its group
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, req["stdout"], os.O_WRONLY),
                            (2, req["stderr"], os.O_WRONLY)):  # fmt: skip
        new = os.open(path, flags)
        os.dup2(new, fd)
        os.close(new)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    sys.path[0] = req["cwd"]  # as `python -m` puts the working folder first
    sys.argv = [str(Path(__file__).parents[1] / "sage_rl" / "cli" / "__main__.py"), *req["argv"]]
    from sage_rl.cli import main

    main()  # its SystemExit ends this process as the command's would


class CliServer:
    """One server process; commands run one at a time."""

    def __init__(self, env: dict[str, str]) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, __file__], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self._buffer = b""
        self.refused = self._reply(300).get("refused")

    def _reply(self, timeout: float) -> dict:
        """The server's next line (read off the pipe itself: a file object's buffer could hold a
        second line that ``select`` no longer sees)."""
        end, fd = time.monotonic() + timeout, self._proc.stdout.fileno()
        while b"\n" not in self._buffer:
            ready, _, _ = select.select([fd], [], [], max(0.0, end - time.monotonic()))
            if not ready:
                raise TimeoutError
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError(f"the command server ended (exit {self._proc.wait()})")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)

    def run(
        self, argv: list[str], cwd: Path, env: dict[str, str], timeout: float
    ) -> subprocess.CompletedProcess:
        with tempfile.TemporaryDirectory(prefix="sage-cli-") as tmp:
            out, err = Path(tmp, "stdout"), Path(tmp, "stderr")
            out.touch()
            err.touch()
            req = {"argv": argv, "cwd": str(cwd), "env": env, "stdout": str(out), "stderr": str(err)}
            self._proc.stdin.write(json.dumps(req) + "\n")
            self._proc.stdin.flush()
            pid = self._reply(60)["pid"]
            try:
                code = self._reply(timeout)["returncode"]
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                self._reply(60)
                raise subprocess.TimeoutExpired(argv, timeout, out.read_text(), err.read_text()) from None
            return subprocess.CompletedProcess(
                argv, code, out.read_text(errors="replace"), err.read_text(errors="replace")
            )

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._proc.stdin.close()
        self._proc.wait(timeout=60)


#: Variables read when a library loads (libgomp's thread count, the hub's offline flag) or that
#: decide what is imported: a child cannot change them, so each setting has its own server.
IMPORT_TIME_ENV = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "PYTHONPATH",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
)
_SERVERS: dict[tuple[str | None, ...], CliServer] = {}  # this process's servers, started on first use


def run_cli(
    args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    """``python -m sage_rl.cli *args`` in ``cwd`` with ``env`` (default: this process's): a child
    of a command server, or a plain process where the server cannot fork."""
    env = dict(os.environ if env is None else env)
    key = tuple(env.get(k) for k in IMPORT_TIME_ENV)
    if key not in _SERVERS:
        _SERVERS[key] = CliServer(env)
        atexit.register(_SERVERS[key].close)
    if _SERVERS[key].refused:
        cmd = [sys.executable, "-m", "sage_rl.cli", *args]
        return subprocess.run(
            cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
    return _SERVERS[key].run(args, cwd, env, timeout)


if __name__ == "__main__":
    sys.path[0] = str(Path(__file__).parents[1])  # not tests/: the children import as the CLI does
    _child(_serve())
