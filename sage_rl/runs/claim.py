"""One process at a time in a run folder, and whether one is in it now.

Runs resume by stage and by step, so the same command is often started again on the same folder;
started twice at once (a second terminal, a restart script run before the first had ended), both
processes would write the same checkpoints, journals and trajectories. And a folder's files cannot
say whether the process that writes them is alive, stopped or hung (``recipe/status.py`` could only
guess from how recently they were written: a hung run read "running" for an hour, 2026-12-05).

A process working in a run folder holds :data:`OWNER` in it locked (``flock``: the kernel releases
it when the process ends, however it ends; one machine's processes see it) and writes its pid, host
and start time there. :func:`claim` takes it or raises :class:`RunInUse` naming the holder;
:func:`holder` reads who holds it now without taking it. A process may claim a folder it already
holds (a recipe and the stage it runs in the same folder).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # not POSIX: no claims
    fcntl = None  # type: ignore[assignment]

OWNER = ".owner"
_held: dict[Path, int] = {}  # folder -> claims this process holds on it


class RunInUse(RuntimeError):
    """Another live process works in this run folder."""


@contextlib.contextmanager
def claim(folder: Path | str) -> Iterator[None]:
    """Hold ``folder`` for this process while the block runs (made if missing)."""
    if fcntl is None:
        yield
        return
    folder = Path(folder).resolve()
    if _held.get(folder):
        _held[folder] += 1
        try:
            yield
        finally:
            _held[folder] -= 1
        return
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / OWNER, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if not _lock(fd):
            raise RunInUse(
                f"{folder} is in use by another process ({describe(_read(folder / OWNER))}): wait for it to "
                "end, or stop it, before running in this folder again"
            )
        record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": time.time(),
            "argv": sys.argv[:8],
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        _held[folder] = 1
        try:
            yield
        finally:
            del _held[folder]
    finally:
        os.close(fd)  # releases the lock


def _lock(fd: int) -> bool:
    """Take the claim; three tries 50 ms apart, since :func:`holder` holds a shared lock for an instant."""
    for attempt in range(3):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if attempt < 2:
                time.sleep(0.05)
    return False


def holder(folder: Path | str) -> dict[str, Any] | None:
    """The record of the live process holding ``folder`` (``{}`` when it is held but its record
    cannot be read); None when no process on this machine holds it, or it was never claimed."""
    if fcntl is None:
        return None
    path = Path(folder) / OWNER
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _read(path)
    finally:
        os.close(fd)
    return None


def claimed_ever(folder: Path | str) -> bool:
    """Whether a process has claimed ``folder`` (then :func:`holder` None means no one is in it;
    a folder made before claims existed says nothing either way)."""
    return (Path(folder) / OWNER).is_file()


def _read(path: Path) -> dict[str, Any]:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def describe(record: dict[str, Any]) -> str:
    """``pid 123 on host, since 18:52`` from a holder's record (what of it could be read)."""
    parts = [f"pid {record['pid']}" if isinstance(record.get("pid"), int) else "pid unknown"]
    if isinstance(record.get("host"), str):
        parts.append(f"on {record['host']}")
    if isinstance(record.get("since"), int | float):
        parts.append(f"since {time.strftime('%Y-%m-%d %H:%M', time.localtime(record['since']))}")
    return " ".join(parts)
