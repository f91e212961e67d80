"""Hostile and broken cells (issue 3): time, memory, processes, network, exits. Each asserts:
contained, trainer unharmed, clear observation.

"Contained" is checked where it happened: processes, the network, the parent's world. Several
cases go around the friendly guard (``posix``, ``_socket``, ``ctypes``) to show that the kernel
layers, not the guard, hold. The other batteries: test_sandbox_hostile_escape.py (files, signals,
the world, the project's source, channels between episodes), test_sandbox_hostile_reward.py
(forged skill use, hostile answers, the parent's caps), test_sandbox_hostile_run.py (hostile
answers through a rollout batch and a training run).
"""

from __future__ import annotations

import asyncio
import os

import pytest
from test_sandbox_support import (
    PID,
    RESTARTED,
    TEST_LIMITS,
    FakeWorld,
    assert_trainer_unharmed,
    hostile,
    kept,
    restarted,
    rules_off,  # noqa: F401  (a fixture, used by name below)
)

from sage_rl.sandbox import Sandbox
from sage_rl.sandbox.landlock import abi_version

# These tests check the layers below the rules agent code lives under (sandbox/rules.py): the OS
# isolation and the parent's limits must hold for any code, so the parent's check is switched off.
pytestmark = pytest.mark.usefixtures("rules_off")

# Where the kernel has no Landlock, only file permissions guard the file system (docs/sandbox.md):
# a file the trainer made world-writable is then writable, so these cases are skipped, not weakened.
NEEDS_LANDLOCK = pytest.mark.skipif(abi_version() < 1, reason="Landlock is not available on this kernel")


@pytest.fixture
def world():
    return FakeWorld()


# -- time ------------------------------------------------------------------------------------------


def test_infinite_loop(sandbox, world):
    r, f = hostile(sandbox, world, "while True:\n    pass")
    assert r.timed_out and "CellTimeout: timed out after 1 s" in r.observation and kept(f)
    assert_trainer_unharmed(sandbox, world, PID)


def test_loop_that_swallows_the_timeout_is_killed(sandbox, world):
    code = "while True:\n    try:\n        while True:\n            pass\n    except BaseException:\n        pass"
    r, f = hostile(sandbox, world, code)
    assert r.timed_out and "was killed and replaced" in r.observation and RESTARTED in r.observation
    assert restarted(f)
    assert_trainer_unharmed(sandbox, world, PID)


def test_hung_c_call_with_signals_blocked(sandbox, world):
    code = "import signal, time\nsignal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM, signal.SIGXCPU})\ntime.sleep(1e9)"
    r, f = hostile(sandbox, world, code)
    assert r.timed_out and "stuck in a C call" in r.observation and RESTARTED in r.observation
    assert restarted(f)
    assert_trainer_unharmed(sandbox, world, PID)


def test_exception_whose_str_hangs(sandbox, world):
    code = "class Bad(Exception):\n    def __str__(self):\n        while True:\n            pass\nraise Bad()"
    r, f = hostile(sandbox, world, code)
    assert r.timed_out and "CellTimeout: timed out after 1 s" in r.observation and kept(f)
    assert_trainer_unharmed(sandbox, world, PID)


# -- memory, output, recursion --------------------------------------------------------------------


def test_memory_bomb_at_once(sandbox, world):
    r, f = hostile(sandbox, world, "b = bytearray(8 * 1024 ** 3)")
    assert r.observation.endswith("MemoryError\n") and kept(f)
    assert_trainer_unharmed(sandbox, world, PID)


def test_memory_bomb_growing(sandbox, world):
    # A smaller address space and a longer timeout: filling pages is slow on a shared machine.
    limits = TEST_LIMITS.model_copy(update={"address_space_bytes": 256 << 20, "wall_timeout_s": 20.0})
    with Sandbox(limits) as small:
        r, f = hostile(small, world, "hog = []\nwhile True:\n    hog.append(b'x' * (8 << 20))")
    assert r.observation.endswith("MemoryError\n") and not r.timed_out and kept(f)
    assert_trainer_unharmed(sandbox, world, PID)


def test_huge_print(sandbox, world):
    r, f = hostile(sandbox, world, "print('z' * 50_000_000)")
    assert (
        r.ok and len(r.observation) < 3000 and "output truncated: 49998001 more characters" in r.observation
    )
    assert kept(f)
    assert_trainer_unharmed(sandbox, world, PID)


def test_deep_recursion(sandbox, world):
    r, f = hostile(sandbox, world, "def down(n):\n    return down(n + 1)\ndown(0)")
    assert "RecursionError: maximum recursion depth exceeded" in r.observation
    assert "earlier frames not shown" in r.observation and r.observation.count("\n") < 80
    assert r.calls[0].name == "down" and r.calls[0].calls == r.calls[0].errors > 900  # the usual depth
    assert kept(f)
    assert_trainer_unharmed(sandbox, world, PID)


def test_recursion_past_the_c_stack(sandbox, world):
    code = "import sys\nsys.setrecursionlimit(10 ** 7)\ndef down(n):\n    return down(n + 1)\ndown(0)"
    r, f = hostile(sandbox, world, code)
    crashed = "ended its interpreter process" in r.observation and restarted(f)
    assert crashed or (("MemoryError" in r.observation or "RecursionError" in r.observation) and kept(f))
    assert_trainer_unharmed(sandbox, world, PID)


def test_threads_left_running_are_frozen_between_cells(sandbox, world):
    async def go():
        session = await sandbox.acquire(world.dispatch)
        start = (
            "import threading, time\nn = 0\ndef spin():\n    global n\n    while True:\n        n += 1\n"
            "threading.Thread(target=spin, daemon=True).start()\ntime.sleep(0.05)\na = n"
        )
        await session.execute(start, "<cell-0>")
        await asyncio.sleep(0.5)  # the policy "thinks"; a running thread would count all along
        r = await session.execute("b = n\ntime.sleep(0.2)\nc = n\nprint(b - a, c - b)", "<cell-1>")
        await session.close()
        return r

    r = asyncio.run(go())
    between, during = (int(v) for v in r.observation.split())
    assert during > 0 and between < during  # 0.5 s between cells counted less than 0.2 s within one
    assert_trainer_unharmed(sandbox, world, PID)


def test_thread_bomb(sandbox, world):
    code = "import threading, time\nfor _ in range(100_000):\n    threading.Thread(target=time.sleep, args=(30,), daemon=True).start()"
    r, f = hostile(sandbox, world, code)
    assert not r.ok and ("can't start new thread" in r.observation or "MemoryError" in r.observation)
    assert kept(f)
    assert_trainer_unharmed(sandbox, world, PID)


# -- processes --------------------------------------------------------------------------------------


def test_fork_bomb(sandbox, world):
    r, f = hostile(sandbox, world, "import os\nwhile True:\n    os.fork()")
    assert (
        "PermissionError: os.fork: the sandbox does not allow starting processes" in r.observation and kept(f)
    )
    assert_trainer_unharmed(sandbox, world, PID)


def test_fork_through_ctypes_is_refused_by_the_kernel(sandbox, world):
    code = "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nprint(libc.fork(), ctypes.get_errno())"
    r, f = hostile(sandbox, world, code)
    assert r.observation == "-1 1\n" and kept(f)  # EPERM from seccomp
    assert_trainer_unharmed(sandbox, world, PID)


def test_subprocess(sandbox, world, tmp_path):
    target = tmp_path / "made-by-subprocess"
    r, f = hostile(sandbox, world, f"import subprocess\nsubprocess.run(['touch', {str(target)!r}])")
    assert "PermissionError: subprocess: the sandbox does not allow starting processes" in r.observation
    assert not target.exists() and kept(f)
    assert_trainer_unharmed(sandbox, world, PID)


def test_posix_spawn_around_the_guard(sandbox, world, tmp_path):
    target = tmp_path / "made-by-spawn"
    r, f = hostile(
        sandbox, world, f"import posix\nposix.posix_spawn('/usr/bin/touch', ['touch', {str(target)!r}], {{}})"
    )
    assert "PermissionError: [Errno 1] Operation not permitted" in r.observation
    assert not target.exists() and kept(f)
    assert_trainer_unharmed(sandbox, world, PID)


def test_os_system_around_the_guard(sandbox, world, tmp_path):
    target = tmp_path / "made-by-system"
    r, f = hostile(sandbox, world, f"import posix\nprint(posix.system('touch {target}'))")
    # glibc reports a refused spawn as exit status 127 (32512), or -1 where fork itself fails
    assert r.observation in ("32512\n", "-1\n") and not target.exists() and kept(f)
    assert_trainer_unharmed(sandbox, world, PID)


# -- network ------------------------------------------------------------------------------------------


def test_socket_connect(sandbox, world):
    r, f = hostile(sandbox, world, "import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=1)")
    assert "PermissionError: socket: the sandbox has no network" in r.observation and kept(f)
    assert_trainer_unharmed(sandbox, world, PID)


def test_raw_socket_around_the_guard(sandbox, world):
    r, f = hostile(sandbox, world, "import _socket\n_socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)")
    assert "PermissionError: [Errno 1] Operation not permitted" in r.observation and kept(f)
    assert_trainer_unharmed(sandbox, world, PID)


def test_unix_socket_of_the_host(sandbox, world, tmp_path):
    """A path socket (think docker.sock) is reachable in any network namespace: seccomp refuses it."""
    import socket

    tmp_path.chmod(0o777)
    path = str(tmp_path / "host.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    os.chmod(path, 0o777)
    server.listen(1)
    server.setblocking(False)
    code = f"import _socket\ns = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)\ns.connect({path!r})"
    try:
        r, f = hostile(sandbox, world, code)
        with pytest.raises(BlockingIOError):
            server.accept()  # nobody connected
    finally:
        server.close()
    assert "PermissionError: [Errno 1] Operation not permitted" in r.observation and kept(f)
    assert_trainer_unharmed(sandbox, world, PID)


def test_api_call_flood(sandbox, world):
    code = "while True:\n    try:\n        apis.bank.balance()\n    except Exception:\n        pass"
    r, f = hostile(sandbox, world, code)
    assert "more than 200 API calls in one cell" in r.observation and RESTARTED in r.observation
    assert restarted(f) and len(world.log) == 50  # only the allowed calls reached the world
    assert_trainer_unharmed(sandbox, world, PID)


def test_calls_without_reading_the_replies(sandbox):
    """Replies the worker never reads must not pile up in the trainer's memory."""
    big = "x" * (200 << 10)  # under the 256 KiB message limit: every reply is sent

    def dispatch(app, api, kwargs):
        return big

    code = (
        "import json, struct\nsock = apis._bridge.chan.sock\n"
        "body = json.dumps({'op': 'call', 'app': 'a', 'api': 'b', 'kwargs': {}}).encode()\n"
        "for _ in range(45):\n    sock.sendall(struct.pack('>I', len(body)) + body)\n"
        "import time\ntime.sleep(0.9)"
    )

    async def go():
        session = await sandbox.acquire(dispatch)
        r = await session.execute(code, "<cell-0>")
        after = await session.execute("print('fresh')", "<cell-1>")
        await session.close()
        return r, after

    r, after = asyncio.run(go())
    assert "without reading the replies" in r.observation and RESTARTED in r.observation
    assert after.observation == "fresh\n"


# -- exits and crashes --------------------------------------------------------------------------------


def test_sys_exit(sandbox, world):
    r, f = hostile(sandbox, world, "import sys\nsys.exit(3)")
    assert "SystemExit: exit() was ignored" in r.observation and kept(f)
    r2, f2 = hostile(sandbox, world, "exit()")
    assert "SystemExit" in r2.observation and kept(f2)
    assert_trainer_unharmed(sandbox, world, PID)


def test_os_exit(sandbox, world):
    r, f = hostile(sandbox, world, "import os\nos._exit(0)")
    assert "ended its interpreter process" in r.observation and RESTARTED in r.observation and restarted(f)
    assert_trainer_unharmed(sandbox, world, PID)


def test_ctypes_segfault(sandbox, world):
    r, f = hostile(sandbox, world, "import ctypes\nctypes.string_at(0)")
    assert "ended its interpreter process" in r.observation and restarted(f)
    assert_trainer_unharmed(sandbox, world, PID)


def test_binary_garbage(sandbox, world):
    garbage = bytes(range(256)).decode("latin-1")
    r, f = hostile(sandbox, world, garbage)
    assert not r.ok and ("null bytes" in r.observation or "SyntaxError" in r.observation) and kept(f)
    r2, f2 = hostile(sandbox, world, "print('\\udcff bad surrogate', b'\\xff\\xfe'.decode('latin-1'))")
    assert r2.ok and "bad surrogate" in r2.observation and kept(f2)
    r2.observation.encode("utf-8")  # safe for a tokenizer
    assert_trainer_unharmed(sandbox, world, PID)
