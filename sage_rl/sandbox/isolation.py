"""The OS isolation layers, applied best-available with fallback, and the report of what took effect.

Order matters and is fixed here:
1. template (once): a new network namespace, so every worker starts with no network;
2. worker (after fork): its own memory cgroup and OOM score (memory.py) -> rlimits -> scratch as
   cwd -> own IPC namespace -> drop root to ``drop_user`` -> no_new_privs -> Landlock -> seccomp ->
   the friendly guard. Each step that fails is recorded, never fatal, with one exception: a root
   worker that cannot switch to ``drop_user`` exits (it would run agent code as root).
"""

from __future__ import annotations

import ctypes
import os
import pwd
import resource
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sage_rl.sandbox import guard, landlock, memory, seccomp_layer
from sage_rl.sandbox.limits import SandboxLimits

_CLONE_NEWNET, _CLONE_NEWUSER, _CLONE_NEWIPC = 0x40000000, 0x10000000, 0x08000000
_PR_SET_NO_NEW_PRIVS, _PR_SET_PDEATHSIG, _PR_SET_DUMPABLE, _PR_SET_KEEPCAPS = 38, 1, 4, 8
_CAP_VERSION_3, _CAP_DAC_READ_SEARCH = 0x20080522, 2
_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class IsolationReport:
    """Which layers took effect in a worker. ``none``/empty means the layer is missing.

    network: "netns" (own empty network namespace) | "landlock-tcp" | "seccomp" | "none";
    ipc: how System V IPC and POSIX message queues are kept from other episodes: "namespace" (the
    worker's own IPC namespace), "seccomp" (the calls are refused), both joined by "+", or "none";
    filesystem: "landlock" (writes only in scratch) | "user" (file permissions of ``nobody``) | "none";
    seccomp: True when the syscall filter is loaded (no processes, no network sockets, no signals out);
    user: the user the worker runs as; rlimits: the resource limits set; notes: why a layer is missing;
    memory: what bounds the worker's memory beyond RLIMIT_AS, "+"-joined: "cgroup-v1"/"cgroup-v2"
    (its own memory cgroup: shared memory and tmpfs files counted), "seccomp" (no memfd, and with
    Landlock no file outside scratch), or "rlimit" (RLIMIT_AS alone: memfd and /dev/shm unbounded);
    oom_score_adj: the worker's OOM score adjustment (1000: killed before anything else).
    """

    network: str = "none"
    filesystem: str = "none"
    seccomp: bool = False
    landlock: tuple[str, ...] = ()
    user: str = ""
    rlimits: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)
    ipc: str = "none"
    memory: str = "none"
    oom_score_adj: int = 0

    @property
    def level(self) -> str:
        """ "strong": processes, network and writes are all held by the kernel and the worker is not
        root; "partial": some are; "weak": none are (only the process boundary and the parent's
        timeouts remain)."""
        held = [self.seccomp, self.network != "none", self.filesystem == "landlock"]
        return "strong" if all(held) and self.user != "root" else ("partial" if any(held) else "weak")

    def line(self) -> str:
        return (
            f"sandbox isolation: {self.level} (network={self.network}, filesystem={self.filesystem}, "
            f"ipc={self.ipc}, memory={self.memory}, oom_score_adj={self.oom_score_adj}, "
            f"seccomp={'on' if self.seccomp else 'off'}, landlock={','.join(self.landlock) or 'off'}, "
            f"user={self.user}, rlimits={','.join(self.rlimits) or 'none'})"
            + (f"; missing: {'; '.join(self.notes)}" if self.notes else "")
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "network": self.network,
            "filesystem": self.filesystem,
            "ipc": self.ipc,
            "memory": self.memory,
            "oom_score_adj": self.oom_score_adj,
            "seccomp": self.seccomp,
            "landlock": list(self.landlock),
            "user": self.user,
            "rlimits": list(self.rlimits),
            "notes": list(self.notes),
            "level": self.level,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> IsolationReport:
        return cls(
            network=str(d.get("network", "none")),
            filesystem=str(d.get("filesystem", "none")),
            ipc=str(d.get("ipc", "none")),
            memory=str(d.get("memory", "none")),
            oom_score_adj=int(d.get("oom_score_adj", 0)),
            seccomp=bool(d.get("seccomp", False)),
            landlock=tuple(str(x) for x in d.get("landlock", ())),
            user=str(d.get("user", "")),
            rlimits=tuple(str(x) for x in d.get("rlimits", ())),
            notes=tuple(str(x) for x in d.get("notes", ())),
        )


def enter_network_namespace() -> tuple[str, str]:
    """In the template, before any fork: a new, empty network namespace (only a down loopback).

    Root (CAP_SYS_ADMIN) gets it directly; others through a user namespace mapping only their own
    ids. Returns (layer, note)."""
    if _libc.unshare(_CLONE_NEWNET) == 0:
        return "netns", ""
    first = os.strerror(ctypes.get_errno())
    uid, gid = os.getuid(), os.getgid()
    if _libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET) != 0:
        return (
            "none",
            f"network namespace unavailable ({first}; user namespace: {os.strerror(ctypes.get_errno())})",
        )
    try:
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
    except OSError as e:
        return "netns", f"user namespace id map failed ({e})"
    return "netns", ""


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def apply_worker_layers(
    limits: SandboxLimits,
    scratch: str,
    network: str,
    readable: list[str],
    listable: Sequence[str] = (),
    cgroup: memory.CgroupBase = memory.CgroupBase(),
) -> IsolationReport:
    """Apply every worker layer that this machine supports; return what took effect. ``readable``
    and ``listable`` come from ``readable.readable_paths()`` (listable: folder names only);
    ``cgroup`` from ``memory.create_base`` in the template. Raises PermissionError when a root
    worker cannot switch to ``limits.drop_user`` (fail closed: the worker must not serve)."""
    notes: list[str] = []
    template = os.getppid()
    # First, while still root: its own memory cgroup (shared memory counted) and the top OOM score.
    mem = _join_cgroup(cgroup, limits.address_space_bytes, notes)
    oom = memory.raise_oom_score()
    rl = _set_rlimits(limits, notes)
    os.chdir(scratch)
    os.environ.update(HOME=scratch, TMPDIR=scratch)
    # Its own IPC namespace, while it still holds the capability: message queues and shared memory
    # of other episodes are out of sight, and its own vanish with it.
    own_ipc = _libc.unshare(_CLONE_NEWIPC) == 0
    if not own_ipc:
        notes.append(f"IPC namespace unavailable ({os.strerror(ctypes.get_errno())})")
    abi = landlock.abi_version()
    # With Landlock limiting reads, the dropped user keeps CAP_DAC_READ_SEARCH so that an interpreter
    # installed under a private folder (e.g. /root/.pyenv) stays importable.
    keep_read = abi >= 1 and limits.restrict_reads
    user = _drop_user(limits.drop_user, keep_read, notes)
    if os.getuid() != 0:
        rl += _try_rlimit("NPROC", resource.RLIMIT_NPROC, limits.threads, notes)
    # Die with the template. Set after the user switch, which clears it; then check for the race.
    _libc.prctl(_PR_SET_PDEATHSIG, 9, 0, 0, 0)
    if os.getppid() != template:
        os._exit(0)
    _libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)  # no core dumps, no /proc/<pid>/mem for same-user peers
    _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    ll = _landlock(abi, limits, scratch, readable, listable, notes)
    sec = _seccomp(notes)
    if user.endswith("+read") and not ("fs-read" in ll and sec):
        _set_caps(0)  # the read capability is only safe under Landlock reads and seccomp
        user = user.removesuffix("+read")
    guard.install()
    net = (
        network if network != "none" else ("landlock-tcp" if "tcp" in ll else ("seccomp" if sec else "none"))
    )
    fs = "landlock" if ll else ("user" if user != "root" else "none")
    ipc = "+".join(name for name, on in (("namespace", own_ipc), ("seccomp", sec)) if on) or "none"
    # seccomp refuses memfd; only with Landlock are tmpfs folders such as /dev/shm closed too.
    if sec and "fs-write" in ll:
        mem.append("seccomp")
    elif not mem:
        notes.append("memory beyond RLIMIT_AS: no memory cgroup, and memfd or /dev/shm stay open")
    mem_layer = "+".join(mem) or ("rlimit" if "AS" in rl else "none")
    return IsolationReport(net, fs, sec, tuple(ll), user, tuple(rl), tuple(notes), ipc, mem_layer, oom)


def _join_cgroup(cgroup: memory.CgroupBase, limit: int, notes: list[str]) -> list[str]:
    if not cgroup.path:
        notes.append(cgroup.note)
        return []
    try:
        return [memory.join(cgroup, limit)]
    except OSError as e:
        notes.append(f"memory cgroup: could not join one under {cgroup.path} ({e.strerror or e})")
        return []


def _try_rlimit(name: str, which: int, value: int, notes: list[str]) -> list[str]:
    try:
        resource.setrlimit(which, (value, value))
        return [name]
    except (OSError, ValueError) as e:
        notes.append(f"RLIMIT_{name}: {e}")
        return []


def _set_rlimits(limits: SandboxLimits, notes: list[str]) -> list[str]:
    import signal  # noqa: PLC0415

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a too-large write fails with EFBIG instead of killing
    out = _try_rlimit("AS", resource.RLIMIT_AS, limits.address_space_bytes, notes)
    out += _try_rlimit("FSIZE", resource.RLIMIT_FSIZE, limits.file_size_bytes, notes)
    out += _try_rlimit("NOFILE", resource.RLIMIT_NOFILE, limits.open_files, notes)
    out += _try_rlimit("CORE", resource.RLIMIT_CORE, 0, notes)
    try:
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.episode_cpu_seconds))
        out.append("CPU")
    except (OSError, ValueError) as e:
        notes.append(f"RLIMIT_CPU: {e}")
    return out


def _drop_user(name: str, keep_read: bool, notes: list[str]) -> str:
    """Switch from root to ``name``; returns the user name, suffixed "+read" when
    CAP_DAC_READ_SEARCH was kept."""
    if os.getuid() != 0:
        # In the user-namespace fallback a worker holds every capability inside that namespace
        # (enough to ptrace a sibling worker); it needs none.
        _set_caps(0)
        return pwd.getpwuid(os.getuid()).pw_name if _known_uid(os.getuid()) else f"uid {os.getuid()}"
    if not name:
        notes.append("runs as root (drop_user is empty)")
        return "root"
    try:
        pw = pwd.getpwnam(name)
        os.setgroups([])
        os.setgid(pw.pw_gid)
        if keep_read:
            _libc.prctl(_PR_SET_KEEPCAPS, 1, 0, 0, 0)
        os.setuid(pw.pw_uid)
    except (KeyError, OSError) as e:
        # Fail closed: a misspelt name must not leave agent code running as root.
        reason = "no such user" if isinstance(e, KeyError) else str(e)
        raise PermissionError(
            f"sandbox.drop_user: cannot switch workers to user {name!r} ({reason})"
        ) from None
    if keep_read and _set_caps(1 << _CAP_DAC_READ_SEARCH):
        return name + "+read"
    _set_caps(0)
    if not os.access(os.path.dirname(os.__file__), os.R_OK | os.X_OK):
        notes.append(f"user {name!r} cannot read the Python library: imports not made by the template fail")
    return name


def _set_caps(mask: int) -> bool:
    """Set effective = permitted = ``mask`` (capabilities 0-31), inheritable = 0."""
    header = (ctypes.c_uint32 * 2)(_CAP_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)(mask, mask, 0, 0, 0, 0)
    return _libc.capset(header, data) == 0


def _known_uid(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


def _landlock(
    abi: int,
    limits: SandboxLimits,
    scratch: str,
    readable: list[str],
    listable: Sequence[str],
    notes: list[str],
) -> list[str]:
    if abi < 1:
        notes.append(
            "Landlock unavailable (kernel < 5.13 or LSM disabled): writes limited by file permissions only"
        )
        return []
    try:
        return landlock.restrict(abi, scratch, readable, limits.restrict_reads, ["/dev/null"], listable)
    except OSError as e:
        notes.append(f"Landlock failed ({e})")
        return []


def _seccomp(notes: list[str]) -> bool:
    try:
        seccomp_layer.install(os.getpid())
        return True
    except (ImportError, OSError, RuntimeError, ValueError, KeyError) as e:
        notes.append(f"seccomp unavailable ({type(e).__name__}: {e})")
        return False
