"""Config section of the AppWorld environment (the ``appworld`` part of eval/collect/train YAML),
and the start-up checks the composition root runs for AppWorld."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from sage_rl.config import Section
from sage_rl.integrations.appworld.paths import AppWorldPaths, SetupError, default_paths

#: AppWorld's test splits: its authors ask that they be used only for final numbers.
TEST_SPLITS = ("test_normal", "test_challenge")


class AppWorldLimits(Section):
    """Resource limits of an AppWorld episode worker (and of an evaluator), set as rlimits. The
    other layers (network namespace, Landlock, a scrubbed environment) are not optional: see
    ``AppWorldEnvConfig.sandbox``."""

    address_space_bytes: int = Field(
        8 << 30, ge=1 << 30, description="Virtual memory per process (RLIMIT_AS); AppWorld maps ~1.5 GiB."
    )
    file_size_bytes: int = Field(
        256 << 20, ge=1 << 20, description="Largest file a process may write (RLIMIT_FSIZE)."
    )
    open_files: int = Field(1024, ge=64, le=65536, description="Open file descriptors (RLIMIT_NOFILE).")
    episode_cpu_seconds: int = Field(
        3600, ge=10, description="CPU seconds per episode worker (RLIMIT_CPU); SIGKILL past it."
    )
    threads: int = Field(
        4096,
        ge=64,
        description="Processes and threads of the worker's user, summed over all (RLIMIT_NPROC), where not root.",
    )
    output_chars: int = Field(
        20_000,
        ge=100,
        le=10_000_000,
        description="Printed characters a cell's observation keeps; the rest is cut (as the sandbox's).",
    )
    drop_user: str = Field(
        "nobody",
        description="When sage-rl runs as root, episode workers switch to this user ('' keeps root).",
    )
    restrict_reads: bool = Field(
        True,
        description="Landlock limits reads to system, Python and venv folders. Where agent code could "
        "still read the task data, reset refuses to run (appworld.sandbox=false runs without layers).",
    )


class AppWorldEnvConfig(Section):
    """Where AppWorld is, which of its tasks to run, and how its processes run. Paths left null use
    ``default_paths()`` (``SAGE_RL_APPWORLD_VENV`` / ``SAGE_RL_APPWORLD_ROOT``, else beside the
    repository)."""

    venv: str | None = None
    root: str | None = None
    #: AppWorld's own per-cell alarm (SIGALRM inside the worker); the world survives it.
    cell_timeout_s: int = Field(60, ge=1)
    #: The parent kills a worker that has not answered ``kill_grace_s`` after the alarm should have
    #: fired (code stuck in C); its snapshot then takes over, in the state before that cell.
    kill_grace_s: float = Field(15.0, gt=0)
    #: Starting the zygote (AppWorld import), loading a task, evaluating.
    start_timeout_s: float = Field(180.0, gt=0)
    #: AppWorld's limits: code cells per episode, and API calls per cell.
    max_interactions: int = Field(1000, ge=1)
    max_api_calls_per_interaction: int = Field(1000, ge=1)
    #: Keep only tasks of these difficulties (1-3; empty: all), and tasks numbered up to N in each
    #: scenario (null: all). Both as AppWorld's ``load_task_ids`` applies them.
    difficulties: list[Literal[1, 2, 3]] = []
    num_tasks_per_scenario: int | None = Field(None, ge=1)
    #: Name of the AppWorld experiment a run's outputs are kept under (``<experiment>_<split>``):
    #: lowercase letters, digits, ``-`` and ``_``, as AppWorld's leaderboard requires.
    experiment: str = Field("sage-rl", pattern=r"^[a-z0-9][a-z0-9_-]*$")
    #: Train on test_normal / test_challenge even though that contaminates their numbers.
    allow_test_contamination: bool = False
    #: Run agent code under the sandbox's kernel layers (docs/appworld.md). Off only to debug.
    sandbox: bool = True
    limits: AppWorldLimits = AppWorldLimits()

    def paths(self) -> AppWorldPaths:
        base = default_paths()
        return AppWorldPaths(
            venv=Path(self.venv).resolve() if self.venv else base.venv,
            root=Path(self.root).resolve() if self.root else base.root,
        )

    def check_training_split(self, split: str, key: str = "split", use: str = "training on it") -> None:
        """Raise ``ValueError`` (one sentence naming ``key``) when ``split`` is a test split and
        ``allow_test_contamination`` is not set: training or collecting on it, or choosing
        checkpoints by it (``use``), would contaminate AppWorld's test numbers."""
        if split in TEST_SPLITS and not self.allow_test_contamination:
            raise ValueError(
                f"{key}={split} is one of AppWorld's test splits, which its authors keep for final "
                f"numbers: {use} contaminates them. Use train or dev, or set "
                "appworld.allow_test_contamination=true to do it anyway."
            )


def check_policy(kind: str) -> None:
    """Raise ``SetupError`` (one sentence) for a policy that cannot act on AppWorld."""
    if kind == "scripted":
        raise SetupError(
            "policy.kind=scripted is PocketWorld's scripted expert and there is no AppWorld expert: "
            "use policy.kind=openai (a served model) or policy.kind=transformers with env=appworld."
        )
