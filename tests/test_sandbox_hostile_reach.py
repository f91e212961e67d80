"""The answer out of reach, and no channel between episodes (issue 11). The project's source
determines every answer, so a worker can neither import nor read it; System V IPC and POSIX
message queues cannot carry anything from one episode to another, nor outlive the trainer.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
from test_sandbox_support import (
    PID,
    FakeWorld,
    assert_trainer_unharmed,
    rules_off,  # noqa: F401  (a fixture, used by name below)
    run,
)

from sage_rl.sandbox.landlock import abi_version

# These tests check the layers below the rules agent code lives under (sandbox/rules.py): the OS
# isolation and the parent's limits must hold for any code, so the parent's check is switched off.
pytestmark = pytest.mark.usefixtures("rules_off")


@pytest.fixture
def world():
    return FakeWorld()


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
    if sandbox.isolation.ipc == "none":
        pytest.skip("neither an IPC namespace nor seccomp is available here")
    a = run(sandbox, [IPC_WRITE], world)[0]
    b = run(sandbox, [IPC_READ], FakeWorld())[0]
    q, err_q, sent, s, err_s = (int(x) for x in a.observation.split())
    if "seccomp" in sandbox.isolation.ipc:
        assert q == -1 and s == -1 and sent == -1 and err_q == err_s == 1  # EPERM: refused outright
    else:  # the namespace alone: A's objects exist, in A's namespace only
        assert q >= 0 and s >= 0 and sent == 0
    assert b.observation == "-1 -1 b'' -1\n"
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
