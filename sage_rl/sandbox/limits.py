"""The sandbox's limits: one validated config section, with the defaults documented in docs/sandbox.md."""

from __future__ import annotations

from pydantic import Field

from sage_rl.config import Section

#: Largest byte limit: far above any machine, and below what setrlimit takes (a signed 64-bit value).
MAX_BYTES = 1 << 60


class SandboxLimits(Section):
    """Limits for agent code. Per-cell limits reset at each cell; per-worker limits hold for an episode.

    A worker serves one episode: ``Session.reset()`` gives a fresh worker, so per-worker limits
    (the CPU budget, open files) start again with each episode.
    """

    wall_timeout_s: float = Field(
        10.0,
        gt=0,
        le=3600,
        description=(
            "Wall-clock time per cell. Waiting for API answers is the environment's time and does not "
            "count, up to as much again; waiting past that counts."
        ),
    )
    kill_grace_s: float = Field(
        2.0,
        gt=0,
        le=60,
        description="Extra time after the in-worker alarm before the parent kills a stuck worker.",
    )
    cpu_seconds: int = Field(10, ge=1, le=3600, description="CPU seconds per cell (soft RLIMIT_CPU).")
    episode_cpu_seconds: int = Field(
        600, ge=1, le=86400, description="CPU seconds per worker (hard RLIMIT_CPU; SIGKILL past it)."
    )
    address_space_bytes: int = Field(
        1 << 30,
        ge=16 << 20,
        le=MAX_BYTES,
        description="Memory per worker: virtual memory (RLIMIT_AS; MemoryError past it) and, where a "
        "memory cgroup is available, memory held in all (shared memory and tmpfs files included; the "
        "worker is killed past it). Sandbox start-up refuses a value below what the interpreter needs.",
    )
    output_chars: int = Field(
        20_000, ge=100, le=10_000_000, description="Printed characters kept per cell; the rest is cut."
    )
    file_size_bytes: int = Field(
        16 << 20,
        ge=0,
        le=MAX_BYTES,
        description="Largest file the worker may write (RLIMIT_FSIZE); EFBIG past it.",
    )
    open_files: int = Field(128, ge=32, le=65536, description="Open file descriptors (RLIMIT_NOFILE).")
    threads: int = Field(
        1024,
        ge=4,
        le=100_000,
        description="Threads of the sandbox user, summed over all its workers (RLIMIT_NPROC), where not root.",
    )
    api_calls_per_cell: int = Field(
        1000, ge=1, le=1_000_000, description="API calls per cell; later calls fail with a clear error."
    )
    message_bytes: int = Field(
        256 << 10,
        ge=64 << 10,
        le=64 << 20,
        description="Largest message between worker and parent (API args, results); a cell's API calls "
        "may carry 16x this in all.",
    )
    restrict_reads: bool = Field(
        True,
        description="With Landlock, allow reads only of system, Python and package folders plus scratch.",
    )
    drop_user: str = Field(
        "nobody", description="When the trainer runs as root, workers switch to this user ('' keeps root)."
    )
    scratch_root: str | None = Field(
        None, description="Folder for per-episode scratch folders (default: the system temp folder)."
    )
