"""What a worker may read under Landlock: system folders, this Python and its packages, and never
the project's own source (issue 11).

The project's source determines every answer: with it, agent code could rebuild a task's world from
its seed and call the template's oracle. So the ``sage_rl`` package folders (the one imported, an
installed copy in site-packages, an editable checkout) are cut out of every readable root. Landlock
only allows (there is no "deny below an allowed folder"), so a root holding a hidden folder is
replaced by its entries, recursively, minus the hidden ones: e.g. a virtualenv's root becomes
``bin``, ``include``, ``lib/python3.X/site-packages/<every package but sage_rl>``, ...

Runs in the template (once); the worker adds one Landlock rule per path returned. Folders that
were split stay listable (file names only, no contents), so the import system still scans them.
"""

from __future__ import annotations

import glob
import os
import site
import sys
from collections.abc import Iterable

_ETC_READABLE = (
    "localtime", "timezone", "passwd", "group", "nsswitch.conf", "hosts", "resolv.conf", "mime.types",
    "ssl", "ca-certificates", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "locale.alias", "os-release",
)  # fmt: skip
_DEV_READABLE = ("null", "zero", "full", "random", "urandom")
_PROC_READABLE = ("cpuinfo", "meminfo", "stat", "loadavg", "uptime", "version", "filesystems")

#: Name of the project's package; its folders (and its installation records) are never readable.
PACKAGE = "sage_rl"


def readable_paths() -> tuple[list[str], list[str]]:
    """``(readable, listable)`` paths for a worker (realpaths, except ``/proc/...``): readable
    ones may be read, listable folders only listed; neither reaches the project's source."""
    paths = ["/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/sys/devices/system/cpu"]
    # The worker's own /proc entry only ("/proc/self" resolves when the worker adds the rule): a
    # trainer of the same user would otherwise expose /proc/<pid>/environ and its open files.
    proc = ["/proc/self", *(f"/proc/{name}" for name in _PROC_READABLE)]
    # Named files only under /etc and /dev: the worker may hold CAP_DAC_READ_SEARCH, which would
    # otherwise open /etc/shadow or a raw disk.
    paths += [f"/etc/{name}" for name in _ETC_READABLE] + [f"/dev/{name}" for name in _DEV_READABLE]
    paths += [sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))]
    # Site folders, not every sys.path entry: PYTHONPATH may name a checkout holding run outputs.
    paths += site.getsitepackages()
    roots = list(dict.fromkeys(os.path.realpath(p) for p in paths if os.path.exists(p)))
    readable, listable = without(roots, hidden_paths())
    return proc + readable, listable


def hidden_paths() -> list[str]:
    """Realpaths of the project's source: the imported package's folders, what any import finder
    would load it from (an editable install's checkout), and any ``sage_rl`` package folder on the
    import path. (Installation records and editable-install hooks hold names and paths, no code.)"""
    found: list[str] = []
    package = sys.modules.get(PACKAGE)
    found += list(getattr(package, "__path__", None) or [])
    for finder in sys.meta_path:  # e.g. an editable install's finder, mapping to a checkout
        try:
            spec = finder.find_spec(PACKAGE, None)  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - a finder that cannot answer hides nothing
            spec = None
        found += list(getattr(spec, "submodule_search_locations", None) or [])
    for entry in dict.fromkeys([*sys.path, *site.getsitepackages()]):
        if not entry or not os.path.isdir(entry):
            continue
        found += glob.glob(os.path.join(glob.escape(entry), PACKAGE))
    return sorted({os.path.realpath(p) for p in found})


def without(roots: Iterable[str], hidden: Iterable[str]) -> tuple[list[str], list[str]]:
    """``(readable, listable)``: everything under ``roots`` is readable except ``hidden`` and what
    lies below it; the folders split to leave hidden paths out stay listable (names only), so that
    the import system can still scan, say, site-packages.

    A root that holds a hidden path is replaced by its entries (resolved: a symlink to a hidden
    folder is hidden too), recursively. Unreadable folders are dropped.
    """
    hidden = [h.rstrip("/") for h in hidden]

    def holds(root: str) -> bool:
        return any(h.startswith(root.rstrip("/") + "/") for h in hidden)

    def is_hidden(path: str) -> bool:
        return any(path == h or path.startswith(h + "/") for h in hidden)

    readable: list[str] = []
    listable: list[str] = []
    todo = [os.path.realpath(r) for r in roots]
    seen: set[str] = set()
    while todo:
        root = todo.pop()
        if root in seen or is_hidden(root):
            continue
        seen.add(root)
        if not holds(root):
            readable.append(root)
            continue
        try:
            entries = os.listdir(root)
        except OSError:
            continue
        listable.append(root)
        todo += [os.path.realpath(os.path.join(root, e)) for e in sorted(entries, reverse=True)]
    return list(dict.fromkeys(readable)), list(dict.fromkeys(listable))
