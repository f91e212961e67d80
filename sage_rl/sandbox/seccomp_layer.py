"""The seccomp filter of a worker: real Python keeps working; new processes, network sockets,
signals to other processes and kernel attack surface are refused with EPERM.

Allowed by default, denied by rule, because a Python interpreter and its extension modules use
hundreds of syscalls and an allow-list breaks on the next glibc. The deny rules:
- processes: execve/execveat, fork/vfork, clone without CLONE_THREAD (threads stay allowed);
  clone3 answers ENOSYS because its flags sit in memory a filter cannot read, and glibc then falls
  back to clone, which the filter can check;
- sockets: socket() of any family, connect and bind (a Unix socket path such as docker.sock is
  reachable whatever the network namespace); only socketpair(AF_UNIX) remains, which asyncio
  needs for its self-pipe;
- other processes: kill/tgkill/rt_sigqueueinfo/rt_tgsigqueueinfo unless aimed at this process,
  tkill, ptrace, process_vm_readv/writev, pidfd_*, prlimit64 on another pid;
- files: chmod/chown/xattr families (Landlock does not cover them), open_by_handle_at;
- kernel surface: io_uring (its operations bypass seccomp), bpf, perf_event_open, userfaultfd,
  namespaces and mounts, keyrings, modules, kexec, reboot, swap, acct;
- channels between episodes: System V message queues, semaphores and shared memory, and POSIX
  message queues (each worker also gets its own IPC namespace where the kernel allows it);
- memory outside RLIMIT_AS: memfd_create (pages written to a memfd are host memory that no
  process's address space counts) and memfd_secret (memory.py).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import socket

_CLONE_THREAD = 0x00010000

_DENY_ALWAYS = (
    "execve",
    "execveat",
    "socket",
    "connect",
    "bind",
    "fork",
    "vfork",
    "tkill",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "process_madvise",
    "pidfd_open",
    "pidfd_getfd",
    "pidfd_send_signal",
    "kcmp",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "unshare",
    "setns",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "keyctl",
    "add_key",
    "request_key",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "migrate_pages",
    "move_pages",
    # file handles bypass path checks (the "shocker" container escape)
    "open_by_handle_at",
    "name_to_handle_at",
    # owner, mode and attributes: not covered by Landlock, and harmful to the trainer's files
    "chmod",
    "fchmod",
    "fchmodat",
    "fchmodat2",
    "chown",
    "fchown",
    "lchown",
    "fchownat",
    "setxattr",
    "lsetxattr",
    "fsetxattr",
    "removexattr",
    "lremovexattr",
    "fremovexattr",
    # System V IPC and POSIX message queues: a channel between episodes that outlives the worker
    "msgget",
    "msgsnd",
    "msgrcv",
    "msgctl",
    "semget",
    "semop",
    "semtimedop",
    "semctl",
    "shmget",
    "shmat",
    "shmdt",
    "shmctl",
    "mq_open",
    "mq_unlink",
    "mq_timedsend",
    "mq_timedreceive",
    "mq_notify",
    "mq_getsetattr",
    # memory held outside the address space, so outside RLIMIT_AS (issue 30)
    "memfd_create",
    "memfd_secret",
)
_ENOSYS = ("clone3", "io_uring_setup", "io_uring_enter", "io_uring_register")


@functools.cache
def syscall_numbers() -> dict[str, int]:
    """Name -> number for this architecture, resolved once (in the template, before forking):
    adding rules by name costs libseccomp a slow lookup per rule, about 8 ms per worker."""
    import pyseccomp as sc  # noqa: PLC0415 - optional layer; its absence is reported, not fatal

    arch = sc.system_arch()
    names = (*_DENY_ALWAYS, *_ENOSYS, "clone", "socketpair", "kill", "tgkill")
    names += ("rt_sigqueueinfo", "rt_tgsigqueueinfo", "prlimit64", "setpriority")
    out = {}
    for name in names:
        # A syscall this architecture or libseccomp does not know (e.g. fork on arm64) is skipped.
        with contextlib.suppress(RuntimeError, ValueError, OSError):
            number = sc.resolve_syscall(arch, name)
            if isinstance(number, int) and number >= 0:
                out[name] = number
    return out


def install(self_pid: int) -> None:
    """Load the filter into this process (and its future threads). Raises OSError/ImportError when
    seccomp is unavailable; sets no_new_privs as a side effect (libseccomp's default)."""
    import pyseccomp as sc  # noqa: PLC0415

    nr = syscall_numbers()
    f = sc.SyscallFilter(defaction=sc.ALLOW)
    deny = sc.ERRNO(errno.EPERM)
    for name in _DENY_ALWAYS:
        if name in nr:
            f.add_rule(deny, nr[name])
    for name in _ENOSYS:
        if name in nr:
            f.add_rule(sc.ERRNO(errno.ENOSYS), nr[name])
    f.add_rule(deny, nr["clone"], sc.Arg(0, sc.MASKED_EQ, _CLONE_THREAD, 0))
    f.add_rule(deny, nr["socketpair"], sc.Arg(0, sc.NE, socket.AF_UNIX))
    for name in ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo"):
        f.add_rule(deny, nr[name], sc.Arg(0, sc.NE, self_pid))
    f.add_rule(deny, nr["prlimit64"], sc.Arg(0, sc.NE, 0))
    f.add_rule(deny, nr["setpriority"], sc.Arg(1, sc.NE, 0))
    f.load()
