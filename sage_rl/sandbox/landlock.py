"""Landlock (Linux >= 5.13) through raw syscalls: writes only in scratch, reads only where allowed.

Landlock is an unprivileged, stackable LSM: a process restricts itself and all its future
threads, and can never lift the restriction. Features come in ABI versions; each one here is used
only where the kernel has it:
- ABI 1: file access rights (read, write, make, remove, execute);
- ABI 2: REFER (rename/link across folders); ABI 3: TRUNCATE;
- ABI 4: TCP bind/connect (a second "no network" layer when there is no network namespace);
- ABI 6: scopes: no signals to, and no abstract Unix sockets of, processes outside the sandbox.
"""

from __future__ import annotations

import ctypes
import os
import struct
from collections.abc import Iterable

_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446  # same on x86_64 and arm64
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1

EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_MAKE_AND_REMOVE = sum(1 << i for i in range(4, 13))  # REMOVE_DIR .. MAKE_SYM
REFER, TRUNCATE = 1 << 13, 1 << 14
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX, SCOPE_SIGNAL = 1 << 0, 1 << 1

_FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE  # the rights that apply to a non-folder

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class LandlockError(OSError):
    """A Landlock syscall failed."""


def abi_version() -> int:
    """The kernel's Landlock ABI version, 0 when Landlock is missing or disabled."""
    v = _libc.syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return max(int(v), 0)


def _check(ret: int, what: str) -> int:
    if ret < 0:
        err = ctypes.get_errno()
        raise LandlockError(err, f"landlock {what}: {os.strerror(err)}")
    return ret


def write_rights(abi: int) -> int:
    """Rights that change the file system, as far as ``abi`` knows them."""
    rights = WRITE_FILE | _MAKE_AND_REMOVE
    if abi >= 2:
        rights |= REFER
    if abi >= 3:
        rights |= TRUNCATE
    return rights


def restrict(
    abi: int,
    scratch: str,
    readable: Iterable[str],
    restrict_reads: bool,
    writable_files: Iterable[str],
    listable: Iterable[str] = (),
) -> list[str]:
    """Restrict this process: read+write under ``scratch``; read-only under ``readable``, and
    folder listing only under ``listable`` (when ``restrict_reads``, nothing else is readable); no
    TCP; no signals out. Returns what was applied.

    Needs no_new_privs set beforehand (or CAP_SYS_ADMIN). Raises LandlockError when it cannot apply.
    """
    read = READ_FILE | READ_DIR | EXECUTE if restrict_reads else EXECUTE
    fs = write_rights(abi) | read
    net = NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0
    scoped = SCOPE_SIGNAL | SCOPE_ABSTRACT_UNIX if abi >= 6 else 0
    size = 8 if abi < 4 else (16 if abi < 6 else 24)
    attr = struct.pack("<QQQ", fs, net, scoped)[:size]
    buf = ctypes.create_string_buffer(attr, size)
    fd = _check(_libc.syscall(_SYS_CREATE_RULESET, buf, ctypes.c_size_t(size), ctypes.c_uint32(0)), "create")
    try:
        _allow(fd, scratch, fs)
        for path in readable if restrict_reads else ():
            _allow(fd, path, read & ~EXECUTE, missing_ok=True)
        for path in listable if restrict_reads else ():
            _allow(fd, path, READ_DIR, missing_ok=True)
        for path in writable_files:
            _allow(fd, path, (READ_FILE | WRITE_FILE) & fs, missing_ok=True)
        _check(_libc.syscall(_SYS_RESTRICT_SELF, ctypes.c_int(fd), ctypes.c_uint32(0)), "restrict_self")
    finally:
        os.close(fd)
    applied = ["fs-write"] + (["fs-read"] if restrict_reads else []) + ["no-exec"]
    return applied + (["tcp"] if net else []) + (["signal-scope", "abstract-unix-scope"] if scoped else [])


def _allow(ruleset_fd: int, path: str, rights: int, missing_ok: bool = False) -> None:
    try:
        pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        if missing_ok:
            return
        raise
    try:
        if not os.path.isdir(path):
            rights &= _FILE_RIGHTS
        attr = ctypes.create_string_buffer(struct.pack("<Qi", rights, pfd), 12)  # packed struct
        _check(
            _libc.syscall(
                _SYS_ADD_RULE,
                ctypes.c_int(ruleset_fd),
                ctypes.c_int(_RULE_PATH_BENEATH),
                attr,
                ctypes.c_uint32(0),
            ),
            f"add_rule {path}",
        )
    finally:
        os.close(pfd)
