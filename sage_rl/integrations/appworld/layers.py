"""The sandbox's kernel layers for AppWorld's processes. Runs under the AppWorld venv.

AppWorld's venv cannot import ``sage_rl`` (AppWorld pins pydantic 1, sage-rl uses pydantic 2). The
layer modules of ``sage_rl/sandbox`` (``isolation``, ``landlock``, ``guard``, and ``readable`` where
it exists) use only the standard library, so this module loads them straight from their files, with
placeholder modules for the two packages and for ``limits`` (a pydantic model that ``isolation``
reads only by attribute), and calls them:

- the zygote calls ``enter_network_namespace()`` once, before it forks anything, and
  ``readable_paths()`` once;
- an episode worker calls ``apply(...)`` after AppWorld has loaded its task: rlimits, scratch as
  cwd, the drop from root to ``nobody``, no_new_privs, Landlock (reads only system, Python and
  venv folders; writes only its scratch), and the sandbox's friendly guard;
- the evaluator calls ``apply(...)`` too, with the task data and this integration's source
  (``evaluator_paths``) readable and only its output folder writable. Episode workers never read
  any of sage-rl's source, this folder included.

seccomp is left off on purpose (``pyseccomp`` is made unimportable here): an episode worker forks
a snapshot of itself after every cell (``snapshots.py``), and the sandbox's filter refuses fork.
"""

from __future__ import annotations

import importlib
import os
import sys
import types
from dataclasses import dataclass
from typing import Any

_SAGE_RL = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: This integration's source. Readable by the evaluator only (``evaluator_paths``): AppWorld's
#: evaluator reads the source of every frame of a failing test (its fail trace), ours included.
INTEGRATION_DIR = os.path.realpath(os.path.dirname(os.path.abspath(__file__)))


@dataclass(frozen=True)
class Limits:
    """What ``isolation.apply_worker_layers`` reads of ``SandboxLimits``, filled from a request."""

    address_space_bytes: int
    file_size_bytes: int
    open_files: int
    episode_cpu_seconds: int
    threads: int
    drop_user: str
    restrict_reads: bool = True

    @property
    def cpu_seconds(self) -> int:
        # No per-cell CPU limit: AppWorld's own alarm and the parent's kill bound a cell; the soft
        # limit equals the hard one, the CPU budget of the whole episode.
        return self.episode_cpu_seconds

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Limits:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


def sandbox_module(name: str) -> types.ModuleType:
    """``sage_rl.sandbox.<name>``, loaded from its file without the packages' ``__init__``."""
    if "sage_rl.sandbox" not in sys.modules:
        package = types.ModuleType("sage_rl")
        package.__path__ = [_SAGE_RL]
        package.__file__ = os.path.join(_SAGE_RL, "__init__.py")
        sandbox = types.ModuleType("sage_rl.sandbox")
        sandbox.__path__ = [os.path.join(_SAGE_RL, "sandbox")]
        limits = types.ModuleType("sage_rl.sandbox.limits")
        limits.SandboxLimits = Limits  # type: ignore[attr-defined]
        sys.modules.update({"sage_rl": package, "sage_rl.sandbox": sandbox, "sage_rl.sandbox.limits": limits})
        sys.modules["pyseccomp"] = None  # type: ignore[assignment]  # seccomp off: see the docstring
    return importlib.import_module(f"sage_rl.sandbox.{name}")


def enter_network_namespace() -> tuple[str, str]:
    """(layer, note): a new, empty network namespace for this process and all it forks later."""
    return sandbox_module("isolation").enter_network_namespace()


def readable_paths() -> tuple[list[str], list[str]]:
    """(readable, listable) folders for Landlock: system, this Python and its venv. Never
    sage-rl's source, this integration's included: agent code has no use for the evaluator's
    plumbing (the worker loaded every module it needs before its layers went on)."""
    try:
        found = sandbox_module("readable").readable_paths()  # newer sandbox: (readable, listable)
    except ModuleNotFoundError:
        found = (sandbox_module("isolation").readable_paths(), [])
    readable, listable = found
    hidden = os.path.realpath(_SAGE_RL)
    inside = [p for p in readable if p == hidden or p.startswith(hidden + os.sep)]
    if inside:  # the sandbox hides the package itself; checked, as agent code's reads depend on it
        raise RuntimeError(f"the sandbox would let agent code read sage-rl's source: {inside[0]}")
    return list(readable), list(listable)


def evaluator_paths(paths: tuple[list[str], list[str]]) -> tuple[list[str], list[str]]:
    """What the evaluator (no agent code) may read besides a worker's ``paths``: this
    integration's source, for AppWorld's fail traces."""
    readable, listable = paths
    return [*readable, INTEGRATION_DIR], list(listable)


def apply(
    limits: Limits, scratch: str, network: str, paths: tuple[list[str], list[str]], extra_readable: list[str]
) -> dict[str, Any]:
    """Apply every worker layer this machine supports; return the sandbox's ``IsolationReport``
    as a dict (which layers took effect, and why the others did not)."""
    readable, listable = paths
    readable = [*readable, *(os.path.realpath(p) for p in extra_readable)]
    isolation = sandbox_module("isolation")
    args = (
        (limits, scratch, network, readable, listable) if listable else (limits, scratch, network, readable)
    )
    return isolation.apply_worker_layers(*args).to_dict()
