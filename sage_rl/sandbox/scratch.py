"""Per-episode scratch folders: their names, and the removal of those a killed run left.

A scratch folder is the working directory, ``HOME`` and ``TMPDIR`` of one episode's worker
(``Sandbox.new_scratch``), removed when the episode ends. A run killed at once (SIGKILL, the end of
a session) removes none, so each name carries its maker, ``<pid namespace>.<pid>``, and a
sandbox's start removes those whose maker is gone (``remove_stale_scratch``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import tempfile

from sage_rl.sandbox import memory

#: A scratch folder is ``sage-sandbox-<pid namespace>.<pid of the process that made it>-<random>``.
SCRATCH_PREFIX = "sage-sandbox-"


@functools.cache
def _namespace() -> str:
    """This process's pid namespace (its inode number), read once: a pid means something only in
    its namespace (another container sharing the temp folder has its own)."""
    try:
        return "".join(c for c in os.readlink("/proc/self/ns/pid") if c.isdigit())
    except OSError:
        return "0"


def scratch_tag(pid: int | None = None) -> str:
    """``<pid namespace>.<pid>`` of this process (or of ``pid``, in this namespace)."""
    return f"{_namespace()}.{os.getpid() if pid is None else pid}"


def remove_stale_scratch(root: str | None) -> list[str]:
    """Remove the scratch folders (and what agent code wrote there) left in ``root`` (the temp
    folder when None) by processes of this pid namespace that are gone: a run killed at once
    (SIGKILL, the end of a session) never removes its episodes' folders. A folder whose maker is
    alive, made in another namespace, or whose name carries no pid is left alone. Returns the
    paths removed."""
    removed = []
    with contextlib.suppress(OSError), os.scandir(root or tempfile.gettempdir()) as entries:
        for entry in entries:
            tag, _, rest = entry.name.removeprefix(SCRATCH_PREFIX).partition("-")
            ns, _, pid = tag.partition(".")
            ours = entry.name.startswith(SCRATCH_PREFIX) and rest and ns == _namespace() and pid.isdigit()
            if ours and entry.is_dir(follow_symlinks=False) and not memory.alive(int(pid)):
                shutil.rmtree(entry.path, ignore_errors=True)  # another user's: left, not listed
                if not os.path.lexists(entry.path):
                    removed.append(entry.path)
    return removed
