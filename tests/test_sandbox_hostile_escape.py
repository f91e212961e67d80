"""Hostile cells that try to get out (issue 3): files, signals, the world and the evaluator. Each
asserts: contained, trainer unharmed, clear observation. The project's source and channels between
episodes: test_sandbox_hostile_reach.py.
"""

from __future__ import annotations

import asyncio
import os
import stat

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
    run,
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
    # the error quotes the path, and pytest's numbered temp folder may be pytest-42
    assert "PermissionError" in r.observation and "42" not in r.observation.replace(str(secret), "")
    assert kept(f)
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
    # refused since session 40 (sandbox/stores.py: apis's class is read-only); the "deposit" never
    # reached the world before either
    assert not r.ok and "RuleError: a type object is read-only" in r.observation and kept(f)
    assert world.log == [] and world.score() == 0.0
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
