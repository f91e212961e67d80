"""Every worker's memory is bounded, shared memory included, and the trainer is never the OOM
killer's choice (issue 30, item 8; docs/sandbox.md "Memory").

The attack of the issue: one worker held 1,984 MiB of host memory under a 1 GiB RLIMIT_AS, in
memfds (16 MiB each, the file size limit), which no process's RSS shows. These tests stay cheap on a
shared machine: a refused memfd allocates nothing, and the cgroup test's worker is stopped at 32 MiB.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from test_sandbox_support import TEST_LIMITS, rules_off  # noqa: F401 - a fixture

from sage_rl.sandbox import Sandbox, SandboxLimits, isolation, memory, seccomp_layer
from sage_rl.sandbox.session import RESTARTED

MIB = 1 << 20


def _in_worker(tmp_path, body) -> dict:
    """Fork a child that applies the real worker layers, runs ``body()`` (raw syscalls, around the
    guard and any rule of the agent language) and returns its JSON-able result through a pipe."""
    libc = ctypes.CDLL(None, use_errno=True)
    seccomp_layer.syscall_numbers()  # as the template does: libseccomp loaded before Landlock closes reads
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            rep = isolation.apply_worker_layers(SandboxLimits(drop_user=""), str(tmp_path), "none", [])
            out = {"report": rep.to_dict(), **body(libc)}
            os.write(write_end, json.dumps(out).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    data = os.read(read_end, 65536)
    os.waitpid(pid, 0)
    return json.loads(data)


def _memfd(libc) -> dict:
    fd = libc.memfd_create(b"hold", 0)  # glibc's wrapper, not os.memfd_create: around the guard
    err = ctypes.get_errno()
    try:
        os.memfd_create("hold")
        guard = ""
    except OSError as e:
        guard = str(e)
    return {"fd": fd, "errno": err, "guard": guard}


def test_memfd_create_is_refused_in_a_worker(tmp_path):
    """The attack's first step fails in the kernel (seccomp: EPERM), whatever the agent code goes
    through; Python's entry point says why. No page is ever allocated."""
    out = _in_worker(tmp_path, _memfd)
    assert out["report"]["seccomp"]
    assert out["fd"] == -1 and out["errno"] == 1  # EPERM from the filter
    assert "os.memfd_create: the sandbox does not allow memory files" in out["guard"]


def test_a_worker_memory_cgroup_bounds_shared_memory(tmp_path):
    """The cgroup layer alone (no seccomp in this child): a worker in its own memory cgroup limited to
    32 MiB writes memfd pages 4 MiB at a time, aiming at 128 MiB; the kernel kills it before it holds
    more than its limit. Its cgroup is removed afterwards, and so is the base."""
    base = memory.create_base(f"test-{os.getpid()}")
    if not base.path:
        pytest.skip(f"no memory cgroup can be made here: {base.note}")
    limit, chunk = 32 * MIB, b"x" * (4 * MIB)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            memory.join(base, limit)
            fd = os.memfd_create("hold")
            for _ in range(32):
                os.write(fd, chunk)
                os.write(write_end, b".")  # one dot per 4 MiB held
        finally:
            os._exit(0)
    os.close(write_end)
    _, status = os.waitpid(pid, 0)
    held = len(os.read(read_end, 1024)) * 4 * MIB
    try:
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL  # the memcg OOM killer
        assert held <= limit
        memory.sweep(base)
        assert not os.path.exists(os.path.join(base.path, f"w{pid}"))
    finally:
        assert memory.remove_base(base.path)
    assert not os.path.exists(base.path)


def test_workers_are_bounded_and_the_oom_killer_takes_them_first():
    """Real workers: each in its own memory cgroup with the sandbox's limit (where the machine
    allows), with oom_score_adj 1000 like their template, which the trainer keeps below; the report
    says which layers hold; the cgroups are gone once the sandbox is closed."""
    with Sandbox(TEST_LIMITS, spares=0) as sandbox:
        rep = sandbox.isolation
        assert rep.oom_score_adj == memory.OOM_SCORE_ADJ
        assert f"memory={rep.memory}, oom_score_adj=1000" in rep.line()
        if rep.filesystem == "landlock":
            assert "seccomp" in rep.memory.split("+")
        template = sandbox._proc.pid
        base = sandbox._cgroup

        async def worker_pid() -> int:
            session = await sandbox.acquire(lambda app, api, kwargs: None)
            pid = session._worker.pid
            assert _read(f"/proc/{pid}/oom_score_adj") == "1000"
            if base:
                line = next(x for x in _read(f"/proc/{pid}/cgroup").splitlines() if "memory" in x)
                assert line.endswith(f"/sage-sandbox-{template}/w{pid}")
                limit = "memory.max" if rep.memory.startswith("cgroup-v2") else "memory.limit_in_bytes"
                assert int(_read(os.path.join(base, f"w{pid}", limit))) == TEST_LIMITS.address_space_bytes
            await session.close()
            return pid

        asyncio.run(worker_pid())
        assert _read(f"/proc/{template}/oom_score_adj") == "1000"
        assert int(_read("/proc/self/oom_score_adj")) < memory.OOM_SCORE_ADJ
        if base:
            assert rep.memory.startswith("cgroup-v")
        else:
            assert any(n.startswith("memory cgroup:") for n in rep.notes)
    assert not base or not os.path.exists(base)


_FILL = """
import os
chunk = b"x" * (4 << 20)
for i in range(12):  # 12 files of 16 MiB (the file size limit): 192 MiB, twice the limit
    with open(f"f{i}", "wb") as f:
        for _ in range(4):
            f.write(chunk)
print("held", sum(os.path.getsize(f"f{i}") for i in range(12)) >> 20, "MiB")
"""


@pytest.mark.usefixtures("rules_off")
def test_files_in_a_tmpfs_scratch_count_to_the_worker_limit():
    """The attack through a cell (the rules switched off: the layers must hold for any code):
    files in a scratch folder on a tmpfs are memory outside RLIMIT_AS and any RSS. Before: 192 MiB
    held under a 96 MiB limit, the cell fine. Now the worker's cgroup ends it, the observation says
    the interpreter was restarted, and what its files hold stays within the limit."""
    # the wall limit is not what is tested: writing 192 MiB towards a cgroup's OOM kill took > 1 s
    # beside two evaluations and the suite (CI at 7514172), and the timeout then won the race
    limits = TEST_LIMITS.model_copy(
        update={"address_space_bytes": 96 * MIB, "file_size_bytes": 16 * MIB, "scratch_root": "/dev/shm",
                "wall_timeout_s": 30.0}
    )  # fmt: skip
    with Sandbox(limits, spares=0) as sandbox:
        if not sandbox.isolation.memory.startswith("cgroup"):
            pytest.skip(f"no memory cgroup here: {sandbox.isolation.notes}")

        async def go():
            session = await sandbox.acquire(lambda app, api, kwargs: None)
            try:
                r = await session.execute(_FILL, "<cell-1>")
                held = sum(f.stat().st_size for f in os.scandir(session.scratch))
                return r, held
            finally:
                await session.close()

        r, held = asyncio.run(go())
    assert not r.ok and "ended its interpreter process" in r.observation and RESTARTED in r.observation
    assert held <= limits.address_space_bytes


_HOLD = """
import asyncio, sys, time
from sage_rl.sandbox import Sandbox
sandbox = Sandbox(spares=1).__enter__()
async def hold():
    return await sandbox.acquire(lambda app, api, kwargs: None)
session = asyncio.run(hold())
print(sandbox._cgroup, flush=True)
time.sleep(600)
"""


def test_a_trainer_killed_with_sigkill_leaves_no_cgroup_behind():
    """The template notices its parent is gone, ends its workers and removes their cgroups (a cgroup
    left inside the trainer's own would stop whoever made that one from removing it)."""
    proc = subprocess.Popen([sys.executable, "-c", _HOLD], stdout=subprocess.PIPE, text=True)
    try:
        base = proc.stdout.readline().strip()
        if not base:
            pytest.skip("no memory cgroup here")
        assert [n for n in os.listdir(base) if n.startswith("w")]  # the session's worker (and the spare's)
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 30  # the template waits up to 15 s for its killed workers to leave
    while os.path.exists(base) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(base)


def test_own_memory_cgroup_is_found_from_proc_texts():
    """v1 (a memory hierarchy mounted at its root, or at a sub-folder in a container) and a cgroup
    outside what is mounted."""
    cgroup = "4:memory:/jobs/a\n0::/\n"
    mounts = "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
    assert memory.own_memory_cgroup(cgroup, mounts) == ("/sys/fs/cgroup/memory/jobs/a", 1)
    nested = "35 31 0:32 /jobs /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
    assert memory.own_memory_cgroup(cgroup, nested) == ("/sys/fs/cgroup/memory/a", 1)
    elsewhere = "35 31 0:32 /other /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
    assert memory.own_memory_cgroup(cgroup, elsewhere) is None
    assert memory.own_memory_cgroup("0::/\n", "41 31 0:38 / /x rw - cgroup2 cgroup2 rw\n") is None


def _read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()
