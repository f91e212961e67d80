"""The memory layer: every worker's memory bounded, shared memory included, and sandbox processes
the OOM killer's first choice, never the trainer.

``RLIMIT_AS`` bounds what a worker maps, not what it holds outside its address space: pages of a
``memfd`` or of a file on a tmpfs (``/dev/shm``, a scratch folder there) written with ``write()``
are host memory that no process's RSS shows (issue 30: 1,984 MiB held in 0.9 s under a 1 GiB
``RLIMIT_AS``). The kernel charges those pages to the memory cgroup of the process that wrote them,
so the firm bound is a cgroup per worker:

1. **cgroup** (where the machine allows): each worker joins ``<base>/w<pid>`` with its limit
   (``address_space_bytes``) and no swap, while it is still root, before any agent code runs.
   ``<base>`` is ``sage-sandbox-<template pid>`` inside the trainer's own memory cgroup (never
   elsewhere: whatever limits the machine puts on the trainer hold for its sandbox too). cgroup v1:
   ``memory.limit_in_bytes``; cgroup v2: ``memory.max``, only where the trainer's cgroup already
   delegates the memory controller to its children (v2 forbids enabling it in a cgroup that holds
   processes, and the trainer is one). Past the limit the kernel's OOM killer ends the worker, the
   only process in its cgroup.
2. **seccomp** refuses ``memfd_create`` and ``memfd_secret`` (seccomp_layer.py), System V shared
   memory is refused and namespaced, and Landlock lets a worker create files only in its scratch
   folder (so not in ``/dev/shm``). Without a cgroup, a ``scratch_root`` on a tmpfs stays a hole.
3. **oom_score_adj** 1000 for the template and every worker, set while they hold
   ``CAP_SYS_RESOURCE`` (when root), so a worker cannot lower it again: in any out-of-memory event a
   sandbox process is chosen before the trainer (whose own score is left alone).

Nothing may be left behind, since a cgroup with children cannot be removed by whoever made the
trainer's: the template creates the base (``create_base``, which first removes bases of templates
that have died), removes dead workers' cgroups before each fork (``sweep``) and, when its parent
closes or dies, ends its workers and removes the base (``end_all``); the parent removes the base
too, should the template itself have been killed (``remove_base``).
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from dataclasses import dataclass

#: The OOM score every sandbox process gets: the highest, so it is killed before anything else.
OOM_SCORE_ADJ = 1000
_ROOT = "/sys/fs/cgroup"


@dataclass(frozen=True)
class CgroupBase:
    """Where workers' memory cgroups are made: ``path`` ("" when there is none; ``note`` says why)
    and the cgroup ``version`` (1 or 2)."""

    path: str = ""
    version: int = 0
    note: str = "no memory cgroup set up"


def own_memory_cgroup(proc_cgroup: str, mountinfo: str) -> tuple[str, int] | None:
    """The folder of this process's memory cgroup and its version, from the texts of
    ``/proc/self/cgroup`` and ``/proc/self/mountinfo``; None when no memory controller is mounted
    where this process's cgroup is visible. v2 is preferred where it has the memory controller."""
    v2_path = v1_path = ""
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2_path = parts[2]
        elif "memory" in parts[1].split(","):
            v1_path = parts[2]
    mounts = [_mount(line) for line in mountinfo.splitlines()]
    for root, point, fstype, _ in (m for m in mounts if m is not None):
        if fstype == "cgroup2" and v2_path:
            folder = _under(root, point, v2_path)
            if folder and "memory" in _read(os.path.join(folder, "cgroup.controllers")).split():
                return folder, 2
    for root, point, fstype, options in (m for m in mounts if m is not None):
        if fstype == "cgroup" and v1_path and "memory" in options.split(","):
            folder = _under(root, point, v1_path)
            if folder:
                return folder, 1
    return None


def _mount(line: str) -> tuple[str, str, str, str] | None:
    """(root, mount point, fs type, super options) of one mountinfo line."""
    head, sep, tail = line.partition(" - ")
    fields, rest = head.split(), tail.split()
    if not sep or len(fields) < 5 or len(rest) < 3:
        return None
    unescape = lambda s: re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)  # noqa: E731
    return unescape(fields[3]), unescape(fields[4]), rest[0], rest[2]


def _under(root: str, point: str, cgroup: str) -> str:
    """The folder of ``cgroup`` in a hierarchy whose ``root`` is mounted at ``point`` ("" when the
    cgroup is outside what is mounted)."""
    root = root.rstrip("/")
    if cgroup != root and not cgroup.startswith(root + "/"):
        return ""
    return os.path.normpath(point + "/" + cgroup[len(root) :])


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def create_base(tag: str) -> CgroupBase:
    """In the template, once: make ``sage-sandbox-<tag>`` in this process's memory cgroup, ready for
    one child cgroup per worker. Never raises: a machine that does not allow it gets a ``note``."""
    try:
        with open("/proc/self/cgroup") as f, open("/proc/self/mountinfo") as g:
            found = own_memory_cgroup(f.read(), g.read())
    except OSError as e:
        return CgroupBase(note=f"memory cgroup: cannot read this process's cgroup ({e})")
    if found is None:
        return CgroupBase(note="memory cgroup: no memory controller is mounted for this process's cgroup")
    own, version = found
    if version == 2 and "memory" not in _read(os.path.join(own, "cgroup.subtree_control")).split():
        return CgroupBase(
            note=f"memory cgroup: cgroup v2 {own} does not delegate the memory controller to its "
            "children (it holds the trainer; start the trainer in a cgroup whose children have it)"
        )
    _remove_stale(own)
    base = os.path.join(own, f"sage-sandbox-{tag}")
    try:
        os.mkdir(base, 0o755)
        if version == 2:
            _write(os.path.join(base, "cgroup.subtree_control"), "+memory")
    except OSError as e:
        with contextlib.suppress(OSError):
            os.rmdir(base)
        return CgroupBase(note=f"memory cgroup: cannot make one in {own} ({e.strerror or e})")
    return CgroupBase(base, version, "")


def _remove_stale(own: str) -> None:
    """Bases left by templates that died with their trainer (both killed at once)."""
    with contextlib.suppress(OSError), os.scandir(own) as entries:
        for entry in entries:
            tag = entry.name.removeprefix("sage-sandbox-")
            if tag != entry.name and tag.isdigit() and not alive(int(tag)):
                remove_base(entry.path, wait_s=0)


def join(base: CgroupBase, limit_bytes: int) -> str:
    """In a worker, while it is root (or owns the delegated base), before agent code: move into its
    own cgroup ``<base>/w<pid>`` limited to ``limit_bytes`` of memory (shared memory, tmpfs files
    and kernel memory it causes included) and no swap. Returns the layer's name, e.g. "cgroup-v1".
    Raises OSError when the machine refuses."""
    path = os.path.join(base.path, f"w{os.getpid()}")
    os.mkdir(path, 0o755)
    try:
        if base.version == 2:
            _write(os.path.join(path, "memory.max"), str(limit_bytes))
            _optional(os.path.join(path, "memory.swap.max"), "0")
        else:
            _write(os.path.join(path, "memory.limit_in_bytes"), str(limit_bytes))
            _optional(os.path.join(path, "memory.memsw.limit_in_bytes"), str(limit_bytes))
        _write(os.path.join(path, "cgroup.procs"), str(os.getpid()))
    except OSError:
        with contextlib.suppress(OSError):
            os.rmdir(path)
        raise
    return f"cgroup-v{base.version}"


def _optional(path: str, value: str) -> None:
    """Swap limits exist only where swap accounting is on; without swap there is nothing to limit."""
    if os.path.exists(path):
        with contextlib.suppress(OSError):
            _write(path, value)


def sweep(base: CgroupBase) -> None:
    """In the template, before each fork: remove the cgroups of workers that have exited. A folder
    whose worker still runs is kept (rmdir of a cgroup with a process fails anyway)."""
    if not base.path:
        return
    with contextlib.suppress(OSError), os.scandir(base.path) as entries:
        for entry in entries:
            if entry.name[:1] == "w" and entry.name[1:].isdigit() and not alive(int(entry.name[1:])):
                with contextlib.suppress(OSError):
                    os.rmdir(entry.path)


def alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def end_all(base: CgroupBase, wait_s: float = 15.0) -> bool:
    """In the template, as it exits: SIGKILL every process left in its workers' cgroups (they
    would die with it anyway, but then no one would remove their cgroups), then remove the base,
    waiting up to ``wait_s`` for them to go: the template has nothing else left to do, and on a
    loaded machine a killed worker can take seconds to leave its cgroup (2 s was too short for
    cgroup v1 beside the test suite's other worker, docs/LOG.md 2026-12-04)."""
    if not base.path:
        return True
    with contextlib.suppress(OSError), os.scandir(base.path) as entries:
        for entry in entries:
            for pid in _read(os.path.join(entry.path, "cgroup.procs")).split():
                with contextlib.suppress(OSError, ValueError):
                    os.kill(int(pid), 9)
    return remove_base(base.path, wait_s)


def remove_base(path: str, wait_s: float = 2.0) -> bool:
    """In the parent, after the template ended: remove the base and its workers' cgroups, waiting up
    to ``wait_s`` for workers still dying (they get SIGKILL when the template ends). Returns whether
    all is gone."""
    if not path:
        return True
    deadline = time.monotonic() + wait_s
    while True:
        with contextlib.suppress(OSError), os.scandir(path) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    with contextlib.suppress(OSError):
                        os.rmdir(entry.path)
        try:
            os.rmdir(path)
            return True
        except FileNotFoundError:
            return True
        except OSError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)


def raise_oom_score() -> int:
    """Make this process the OOM killer's first choice (``oom_score_adj`` 1000); return the value
    now in force (0 when it cannot be read). Raising it needs no privilege; when root, this also
    stops the process and its children from lowering it again."""
    with contextlib.suppress(OSError):
        _write("/proc/self/oom_score_adj", str(OOM_SCORE_ADJ))
    try:
        return int(_read("/proc/self/oom_score_adj").strip() or 0)
    except ValueError:
        return 0
