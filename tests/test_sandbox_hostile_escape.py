"""Hostile cells that try to get out (issues 3 and 11): files, signals, the world and the
evaluator, the project's source (which determines every answer), and channels between episodes.
Each asserts: contained, trainer unharmed, clear observation.
"""

from __future__ import annotations

import asyncio
import os
import stat
from types import SimpleNamespace

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
    run,
)

from sage_rl.sandbox import Sandbox
from sage_rl.sandbox.landlock import abi_version

# Where the kernel has no Landlock, only file permissions guard the file system (docs/sandbox.md):
# a file the trainer made world-writable is then writable, so these cases are skipped, not weakened.
NEEDS_LANDLOCK = pytest.mark.skipif(abi_version() < 1, reason="Landlock is not available on this kernel")


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(TEST_LIMITS) as sb:
        yield sb


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


# -- the project's source: it determines every answer (issue 11) -------------------------------------

STEAL = (
    "from sage_rl.envs.pocketworld import tasks\n"
    "t = tasks.task_by_id('payments_largest_payment_recipient_1')\n"
    "w = tasks.world_for(t)\n"
    "apis.supervisor.complete_task(answer=tasks.template_of(t).expect(w.db, t.spec['params']).answer)"
)


def test_the_answer_cannot_be_rebuilt_from_the_project(sandbox):
    """The attack of issue 11: import the task module, rebuild the world from its seed, ask the oracle."""
    from sage_rl.envs.pocketworld import tasks

    task = tasks.task_by_id("payments_largest_payment_recipient_1")
    world = tasks.world_for(task)
    initial = world.snapshot()
    r = run(sandbox, [STEAL], SimpleNamespace(dispatch=world.call))[0]
    assert "ModuleNotFoundError: No module named 'sage_rl.envs'" in r.observation
    assert not world.completed and not tasks.evaluate_task(task, initial, world).success


def test_what_a_worker_can_import_and_read_of_the_project(sandbox, world):
    """List it: the project modules loaded in a worker are the sandbox's own (plus config/types);
    none of world, task, template, generator or check is loaded or importable, even with the import
    path put back; no file of the package can be read or listed."""
    import json

    from sage_rl.sandbox import readable

    hidden = readable.hidden_paths()
    files = [os.path.join(h, f) for h in hidden for f in ("__init__.py", "envs/pocketworld/tasks.py")]
    code = (
        "import json, os, sys, importlib, pkgutil\n"
        "out = {'loaded': sorted(m for m in sys.modules if m.split('.')[0] == 'sage_rl'), 'imports': {}, 'reads': {}}\n"
        "for name in ('sage_rl.envs.pocketworld.tasks', 'sage_rl.envs.pocketworld.checks',\n"
        "             'sage_rl.envs.pocketworld.generator', 'sage_rl.envs.pocketworld.world',\n"
        "             'sage_rl.envs.pocketworld.scenarios', 'sage_rl.skills', 'sage_rl.rollout'):\n"
        "    try:\n        importlib.import_module(name)\n        out['imports'][name] = 'IMPORTED'\n"
        "    except Exception as e:\n        out['imports'][name] = type(e).__name__\n"
        f"sys.modules['sage_rl'].__path__[:] = {hidden!r}\n"
        f"sys.path[:0] = {[os.path.dirname(h) for h in hidden]!r}\n"
        "try:\n    importlib.import_module('sage_rl.envs.pocketworld.tasks')\n    out['restored'] = 'IMPORTED'\n"
        "except Exception as e:\n    out['restored'] = type(e).__name__\n"
        f"for path in {[*hidden, *files]!r}:\n"
        "    try:\n        out['reads'][path] = len(os.listdir(path) if os.path.isdir(path) else open(path).read())\n"
        "    except OSError as e:\n        out['reads'][path] = type(e).__name__\n"
        "out['found'] = sorted(m.name for m in pkgutil.iter_modules() if m.name == 'sage_rl')\n"
        "print(json.dumps(out))"
    )
    r = run(sandbox, [code], world)[0]
    out = json.loads(r.observation)
    allowed = {"sage_rl", "sage_rl.config", "sage_rl.types"}
    assert all(m in allowed or m.startswith("sage_rl.sandbox") for m in out["loaded"]), out["loaded"]
    assert set(out["imports"].values()) == {"ModuleNotFoundError"}, out["imports"]
    assert out["restored"] != "IMPORTED"
    assert_trainer_unharmed(sandbox, world, PID)
    if abi_version() >= 1:  # without Landlock, file permissions decide (docs/sandbox.md)
        assert out["restored"] == "PermissionError" and out["found"] == []
        assert set(out["reads"].values()) <= {"PermissionError", "FileNotFoundError"}, out["reads"]
        assert "PermissionError" in out["reads"].values()


def test_readable_paths_leave_out_an_installed_package(tmp_path):
    """A root holding the package (e.g. a virtualenv with sage_rl installed in site-packages) is
    split into its other entries; the folders split stay listable, and a symlink into the package
    is hidden too."""
    from sage_rl.sandbox.readable import without

    site = tmp_path / "venv" / "lib" / "site-packages"
    for d in ("numpy", "sage_rl/envs", "yaml"):
        (site / d).mkdir(parents=True)
    (site / "six.py").write_text("")
    (tmp_path / "venv" / "bin").mkdir()
    (site / "alias").symlink_to(site / "sage_rl" / "envs")
    readable, listable = without([str(tmp_path / "venv")], [str(site / "sage_rl")])
    assert sorted(readable) == sorted(
        str(p) for p in (tmp_path / "venv/bin", site / "numpy", site / "six.py", site / "yaml")
    )
    assert sorted(listable) == sorted(str(p) for p in (tmp_path / "venv", tmp_path / "venv/lib", site))
    assert without(["/usr"], [str(site / "sage_rl")]) == (["/usr"], [])


# -- channels between episodes (issue 11) ---------------------------------------------------------------

_MSG_KEY, _SHM_KEY = 0x5A6E11, 0x5A6E12
IPC_WRITE = (
    "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    f"q = libc.msgget({_MSG_KEY}, 0o1666)\nerr_q = ctypes.get_errno()\n"
    "buf = ctypes.create_string_buffer(b'\\x01' + b'\\0' * 7 + b'secret-of-A', 32)\n"
    "sent = libc.msgsnd(q, buf, 11, 0) if q >= 0 else -1\n"
    f"s = libc.shmget({_SHM_KEY}, 4096, 0o1666)\nerr_s = ctypes.get_errno()\n"
    "print(q, err_q, sent, s, err_s)"
)
IPC_READ = (
    "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    f"q = libc.msgget({_MSG_KEY}, 0)\nbuf = ctypes.create_string_buffer(32)\n"
    "n = libc.msgrcv(q, buf, 24, 0, 0o4000) if q >= 0 else -1\n"
    f"print(q, n, buf.raw[8:8 + max(n, 0)], libc.shmget({_SHM_KEY}, 0, 0))"
)


def _sysv_keys() -> set[int]:
    """Keys of the System V message queues and shared memory segments of the trainer's namespace."""
    keys = set()
    for kind in ("msg", "shm"):
        with open(f"/proc/sysvipc/{kind}") as f:
            keys |= {int(line.split()[0]) for line in list(f)[1:] if line.strip()}
    return keys


def test_no_ipc_channel_between_episodes(sandbox, world):
    """Episode A leaves a message queue and a shared memory segment; episode B (another task) finds
    neither, and nothing is left in the trainer's namespace."""
    a = run(sandbox, [IPC_WRITE], world)[0]
    b = run(sandbox, [IPC_READ], FakeWorld())[0]
    q, err_q, sent, s, err_s = (int(x) for x in a.observation.split())
    assert q == -1 and s == -1 and sent == -1 and err_q == err_s == 1  # EPERM: seccomp refuses SysV IPC
    assert b.observation == "-1 -1 b'' -1\n"
    assert sandbox.isolation.ipc in ("namespace+seccomp", "seccomp")
    assert not {_MSG_KEY, _SHM_KEY} & _sysv_keys()
    assert_trainer_unharmed(sandbox, world, PID)


def test_each_worker_has_its_own_ipc_namespace(monkeypatch, tmp_path):
    """The second layer alone (seccomp missing): A's queue exists in A's namespace only; B, in its
    own, cannot find it; the trainer never sees it, and it dies with A."""
    import ctypes
    import json

    from sage_rl.sandbox import isolation, seccomp_layer
    from sage_rl.sandbox.limits import SandboxLimits

    def no_seccomp(pid):
        raise ImportError("seccomp switched off for this test")

    monkeypatch.setattr(seccomp_layer, "install", no_seccomp)
    libc = ctypes.CDLL(None, use_errno=True)

    def worker(code: str, hold: int | None = None) -> tuple[int, int]:
        out_r, out_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                rep = isolation.apply_worker_layers(SandboxLimits(drop_user=""), str(tmp_path), "none", [])
                q = libc.msgget(_MSG_KEY, 0o1666 if code == "create" else 0)
                os.write(out_w, json.dumps([rep.ipc, q, ctypes.get_errno()]).encode())
                if hold is not None:
                    os.read(hold, 1)  # stay alive (and the namespace with it) until told
            finally:
                os._exit(0)
        os.close(out_w)
        return pid, out_r

    hold_r, hold_w = os.pipe()
    pid_a, out_a = worker("create", hold_r)
    ipc_a, q_a, _ = json.loads(os.read(out_a, 4096))
    pid_b, out_b = worker("open")
    ipc_b, q_b, err_b = json.loads(os.read(out_b, 4096))
    os.waitpid(pid_b, 0)
    in_trainer = _MSG_KEY in _sysv_keys()
    os.write(hold_w, b"x")
    os.waitpid(pid_a, 0)
    if ipc_a == "none":
        pytest.skip("this kernel or user cannot make IPC namespaces")
    assert ipc_a == ipc_b == "namespace" and q_a >= 0  # A made its queue, in its own namespace
    assert q_b == -1 and err_b == 2  # ENOENT: B's namespace has no such queue
    assert not in_trainer and _MSG_KEY not in _sysv_keys()
