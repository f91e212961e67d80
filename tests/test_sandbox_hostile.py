"""Hostile and broken cells (issue 3). Each asserts: contained, trainer unharmed, clear observation.

"Contained" is checked where it happened: files outside scratch, processes, the parent's world.
Several cases go around the friendly guard (``posix``, ``_socket``, ``ctypes``) to show that the
kernel layers, not the guard, hold.
"""

from __future__ import annotations

import asyncio
import os
import stat

import pytest
from test_sandbox_support import TEST_LIMITS, FakeWorld, assert_trainer_unharmed, run

from sage_rl.sandbox import Sandbox
from sage_rl.sandbox.landlock import abi_version

PID = os.getpid()
# Where the kernel has no Landlock, only file permissions guard the file system (docs/sandbox.md):
# a file the trainer made world-writable is then writable, so these cases are skipped, not weakened.
NEEDS_LANDLOCK = pytest.mark.skipif(abi_version() < 1, reason="Landlock is not available on this kernel")
RESTARTED = "The interpreter was restarted"


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(TEST_LIMITS) as sb:
        yield sb


@pytest.fixture
def world():
    return FakeWorld()


def hostile(sandbox, world, code, then="print('still here', x)"):
    """Run ``x = 1``, the hostile cell, then ``then``; return (hostile result, follow-up result)."""
    r = run(sandbox, ["x = 1", code, then], world)
    assert r[0].ok
    return r[1], r[2]


def kept(follow):
    return follow.ok and follow.observation == "still here 1\n"


def restarted(follow):
    return not follow.ok and "NameError: name 'x' is not defined" in follow.observation


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
    big = "x" * (1 << 20)

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


# -- files --------------------------------------------------------------------------------------------


@NEEDS_LANDLOCK
def test_writing_outside_scratch(sandbox, world, tmp_path):
    victim = tmp_path / "trainer-file.txt"
    victim.write_text("original")
    victim.chmod(0o666)  # file permissions would allow it: only Landlock stands in the way
    tmp_path.chmod(0o777)
    code = f"open({str(victim)!r}, 'w').write('pwned')"
    r, f = hostile(sandbox, world, code)
    assert "PermissionError" in r.observation and victim.read_text() == "original" and kept(f)
    r2 = run(sandbox, [f"open({str(tmp_path / 'new.txt')!r}, 'w')", "open('/tmp/sage-evil', 'w')"])
    assert all("PermissionError" in x.observation for x in r2)
    assert not (tmp_path / "new.txt").exists() and not os.path.exists("/tmp/sage-evil")
    assert_trainer_unharmed(sandbox, world, PID)


@NEEDS_LANDLOCK
def test_links_out_of_scratch(sandbox, world, tmp_path):
    """A hard link or symlink in scratch must not turn into a write outside it."""
    victim = tmp_path / "trainer_module.py"
    victim.write_text("SAFE = True\n")
    victim.chmod(0o666)
    tmp_path.chmod(0o777)
    code = (
        "import os\n"
        "for make in (os.link, os.symlink):\n"
        "    try:\n"
        f"        make({str(victim)!r}, 'alias.py')\n"
        "        open('alias.py', 'a').write('SAFE = False\\n')\n"
        "    except OSError as e:\n"
        "        print(make.__name__, type(e).__name__)\n"
        "    if os.path.lexists('alias.py'):\n"
        "        os.remove('alias.py')\n"
    )
    r, f = hostile(sandbox, world, code)
    assert victim.read_text() == "SAFE = True\n" and kept(f)
    assert "link " in r.observation and "symlink " in r.observation  # both attempts were refused
    assert_trainer_unharmed(sandbox, world, PID)


def test_chmod_of_trainer_files(sandbox, world, tmp_path):
    victim = tmp_path / "ckpt.bin"
    victim.write_text("weights")
    mode = stat.S_IMODE(victim.stat().st_mode)
    r, f = hostile(sandbox, world, f"import os\nos.chmod({str(victim)!r}, 0)")
    assert "PermissionError" in r.observation and stat.S_IMODE(victim.stat().st_mode) == mode and kept(f)
    assert_trainer_unharmed(sandbox, world, PID)


@NEEDS_LANDLOCK
def test_reading_private_files_outside_allowed_folders(sandbox, world, tmp_path):
    secret = tmp_path / "answers.json"
    secret.write_text('{"answer": 42}')
    secret.chmod(0o644)
    tmp_path.chmod(0o755)
    r, f = hostile(sandbox, world, f"print(open({str(secret)!r}).read())")
    assert "PermissionError" in r.observation and "42" not in r.observation and kept(f)
    assert_trainer_unharmed(sandbox, world, PID)


@NEEDS_LANDLOCK
def test_reading_host_and_trainer_secrets(sandbox, world):
    paths = ("/etc/shadow", f"/proc/{PID}/environ", f"/proc/{PID}/mem", "/proc/1/environ", "/dev/kmsg")
    code = (
        f"for path in {paths!r}:\n"
        "    try:\n        open(path, 'rb').read(16)\n        print(path, 'READ')\n"
        "    except OSError as e:\n        print(path, type(e).__name__)\n"
    )
    r, f = hostile(sandbox, world, code)
    assert (
        "READ" not in r.observation
        and r.observation.count("PermissionError") + r.observation.count("FileNotFoundError") == 5
    )
    assert kept(f)
    assert_trainer_unharmed(sandbox, world, PID)


def test_file_size_limit(sandbox, world):
    r, f = hostile(sandbox, world, "with open('big.bin', 'wb') as fh:\n    fh.write(b'x' * (2 << 20))")
    assert "File too large" in r.observation and kept(f)
    assert_trainer_unharmed(sandbox, world, PID)


def test_trainer_environment_is_not_inherited(sandbox, world, monkeypatch):
    monkeypatch.setenv("SAGE_TEST_API_KEY", "sk-very-secret")
    with Sandbox(TEST_LIMITS) as fresh:
        r = run(fresh, ["import os\nprint('SAGE_TEST_API_KEY' in os.environ, sorted(os.environ)[:8])"])
    assert r[0].observation.startswith("False ") and "sk-very-secret" not in r[0].observation
    assert_trainer_unharmed(sandbox, world, PID)


# -- signals ------------------------------------------------------------------------------------------


def test_kill_the_trainer(sandbox, world):
    r, f = hostile(sandbox, world, f"import os, signal\nos.kill({PID}, signal.SIGKILL)")
    assert "the sandbox allows signals only to its own process" in r.observation and kept(f)
    assert_trainer_unharmed(sandbox, world, PID)


def test_kill_around_the_guard(sandbox, world):
    code = f"import posix\nfor target in ({PID}, 0, -1, posix.getppid()):\n    try:\n        posix.kill(target, 9)\n    except OSError as e:\n        print(target == {PID} or target, e.errno)"
    r, f = hostile(sandbox, world, code)
    assert r.observation.splitlines()[0] == "True 1" and len(r.observation.splitlines()) == 4
    assert all(line.endswith(" 1") for line in r.observation.splitlines()) and kept(f)
    assert_trainer_unharmed(sandbox, world, PID)


def test_kill_another_episode(sandbox, world):
    async def go():
        other_world = FakeWorld()
        a = await sandbox.acquire(world.dispatch)
        b = await sandbox.acquire(other_world.dispatch)
        await b.execute("y = 7", "<cell-0>")
        pid_b = (await b.execute("import os\nprint(os.getpid())", "<cell-1>")).observation.strip()
        r = await a.execute(f"import posix\nposix.kill({pid_b}, 9)", "<cell-0>")
        after = await b.execute("print(y)", "<cell-2>")
        await a.close()
        await b.close()
        return r, after

    r, after = asyncio.run(go())
    assert "Operation not permitted" in r.observation and after.observation == "7\n"
    assert_trainer_unharmed(sandbox, world, PID)


def test_keyboard_interrupt(sandbox, world):
    r, f = hostile(sandbox, world, "raise KeyboardInterrupt")
    assert r.observation.endswith("KeyboardInterrupt\n") and kept(f)
    r2, f2 = hostile(
        sandbox, world, "import os, signal\nos.kill(os.getpid(), signal.SIGINT)\nimport time\ntime.sleep(1)"
    )
    assert "KeyboardInterrupt" in r2.observation and kept(f2)
    assert_trainer_unharmed(sandbox, world, PID)


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


# -- the world and the evaluator ----------------------------------------------------------------------


def test_gc_and_frames_cannot_reach_the_world(sandbox, world):
    code = (
        "import gc, sys\n"
        "hits = [o for o in gc.get_objects() if isinstance(o, dict) and ('balance' in o or 'secret_answer' in o)]\n"
        "f = sys._getframe()\nnames = set()\n"
        "while f is not None:\n    names |= set(f.f_globals)\n    f = f.f_back\n"
        "print(len(hits), 'FakeWorld' in names, 'world' in names)"
    )
    r, f = hostile(sandbox, world, code)
    assert r.observation == "0 False False\n" and kept(f)
    assert_trainer_unharmed(sandbox, world, PID)


def test_subclasses_cannot_reach_the_evaluator(sandbox, world):
    code = (
        "names = {c.__name__ for c in object.__subclasses__()}\n"
        "import sys\nprint('FakeWorld' in names, 'WorldError' in names, any('test_sandbox' in m for m in sys.modules))"
    )
    r, f = hostile(sandbox, world, code)
    assert r.observation == "False False False\n" and kept(f)
    assert_trainer_unharmed(sandbox, world, PID)


def test_monkey_patching_apis(sandbox, world):
    code = (
        "class Fake:\n    def __getattr__(self, name):\n        return lambda **k: {'balance': 150}\n"
        "type(apis).__getattr__ = lambda self, app: Fake()\n"
        "print(apis.bank.deposit(amount=50))\n"
        "apis = None\n"
        "import builtins\nbuiltins.score = 1.0\n"
    )
    r, f = hostile(sandbox, world, code)
    assert r.ok and "{'balance': 150}" in r.observation and kept(f)
    assert world.log == [] and world.score() == 0.0  # the "deposit" never reached the world
    assert_trainer_unharmed(sandbox, world, PID)


def test_forged_channel_messages(sandbox, world):
    code = (
        "import os, struct\n"
        "fds = [int(n) for n in os.listdir('/proc/self/fd')]\n"
        "for fd in fds:\n"
        "    try:\n        os.write(fd, struct.pack('>I', 0xFFFFFFF0) + b'garbage')\n"
        "    except OSError:\n        pass\n"
        "import time\ntime.sleep(0.5)"
    )
    r, f = hostile(sandbox, world, code)
    assert "broke the sandbox's channel" in r.observation and RESTARTED in r.observation and restarted(f)
    assert_trainer_unharmed(sandbox, world, PID)


def test_forged_api_call_with_private_name(sandbox, world):
    code = (
        "import socket, struct, json\n"
        "bridge = apis._bridge\n"
        "body = json.dumps({'op': 'call', 'app': '__class__', 'api': '__init__', 'kwargs': {}}).encode()\n"
        "bridge.chan.sock.sendall(struct.pack('>I', len(body)) + body)\n"
        "print(bridge.chan.recv())"
    )
    r, f = hostile(sandbox, world, code)
    assert "malformed API call" in r.observation and world.log == [] and kept(f)
    assert_trainer_unharmed(sandbox, world, PID)


def test_kernel_escape_syscalls(sandbox, world):
    code = (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        # a user namespace, ptrace(PTRACE_ATTACH, pid 1), io_uring_setup (its operations bypass seccomp)
        "print(libc.unshare(0x10000000), libc.ptrace(16, 1, 0, 0), libc.syscall(425, 8, 0))"
    )
    r, f = hostile(sandbox, world, code)
    assert r.observation == "-1 -1 -1\n" and kept(f)
    assert_trainer_unharmed(sandbox, world, PID)


def test_raising_rlimits(sandbox, world):
    r, f = hostile(sandbox, world, "import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))")
    assert ("ValueError" in r.observation or "PermissionError" in r.observation) and kept(f)
    assert_trainer_unharmed(sandbox, world, PID)
