"""Config section of the AppWorld environment (the ``env.appworld`` part of eval/collect/train YAML)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from sage_rl.config import Section
from sage_rl.integrations.appworld.paths import AppWorldPaths, default_paths


class AppWorldEnvConfig(Section):
    """Where AppWorld is and how its workers run. Paths left null use ``default_paths()``
    (``SAGE_RL_APPWORLD_VENV`` / ``SAGE_RL_APPWORLD_ROOT``, else beside the repository)."""

    venv: str | None = None
    root: str | None = None
    #: AppWorld's own per-cell alarm (SIGALRM inside the worker); the world survives it.
    cell_timeout_s: int = Field(60, ge=1)
    #: The parent kills and replaces a worker that has not answered ``kill_grace_s`` after the
    #: alarm should have fired (code stuck in C, or a dead process).
    kill_grace_s: float = Field(15.0, gt=0)
    #: Starting a worker (AppWorld import) and loading a task.
    start_timeout_s: float = Field(180.0, gt=0)
    experiment: str = Field("sage-rl", min_length=1)
    keep_outputs: bool = False

    def paths(self) -> AppWorldPaths:
        base = default_paths()
        return AppWorldPaths(
            venv=Path(self.venv).resolve() if self.venv else base.venv,
            root=Path(self.root).resolve() if self.root else base.root,
        )
