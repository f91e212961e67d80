"""AppWorld as a sage-rl ``Suite`` and ``Environment`` (issue 8).

Each open ``AppWorldEnvironment`` owns one worker process (one live ``AppWorld``), reused across
the episodes it is reset to; concurrency comes from opening several. Workers are forked from one
per-suite zygote that has already imported AppWorld (``worker.py``). In the worker:
reset -> ``AppWorld(task_id)``, execute -> ``world.execute(code)``, completion ->
``world.task_completed()``, evaluation -> AppWorld's own evaluator (score = fraction of its tests
passed, success = all passed).

What differs from PocketWorld:
- ``reports_calls`` is False: AppWorld's interpreter cannot report which functions were called, so
  skill usage is found statically (SAGE.md section 2). ``ExecResult.defined`` is reported: names
  bound to a new function object by the cell.
- ``origin`` is ignored: AppWorld compiles cells itself.
- A cell that outlives AppWorld's own alarm plus a grace period (stuck in C code) gets its worker
  killed. A freshly forked worker reloads the task and replays the episode's earlier cells, which rebuilds
  the same state because AppWorld's clock is frozen and its random seed fixed; the stuck cell's
  partial effects are lost, and the observation says so.
"""

from __future__ import annotations

import random
import time

from sage_rl.integrations.appworld.client import (
    WorkerCrashed,
    WorkerError,
    WorkerFactory,
    WorkerProcess,
    WorkerSpec,
    WorkerTimeout,
)
from sage_rl.integrations.appworld.config import AppWorldEnvConfig
from sage_rl.integrations.appworld.paths import require_ready
from sage_rl.integrations.appworld.prompts import APPWORLD_PROMPTS
from sage_rl.integrations.appworld.tasks import load_split, sample_chain
from sage_rl.types import CheckResult, ExecResult, Outcome, Task

RESTART_NOTE = (
    "Execution failed. Traceback:\nExecution {what}. The environment was restarted and the task "
    "reloaded; earlier cells were replayed, so their variables and effects are back, but this cell's "
    "partial effects are lost."
)


class EnvironmentBroken(RuntimeError):
    """The environment could not be brought back after a worker crash; open a new one."""


class AppWorldEnvironment:
    """One live AppWorld episode at a time, in its own worker process."""

    reports_calls = False

    def __init__(self, config: AppWorldEnvConfig, factory: WorkerFactory, worker: WorkerProcess) -> None:
        self.config = config
        self._factory = factory
        self._worker = worker
        self._task: Task | None = None
        self._cells: list[str] = []
        self._completed = False

    @classmethod
    async def open(cls, config: AppWorldEnvConfig, factory: WorkerFactory) -> AppWorldEnvironment:
        return cls(config, factory, await factory.new_worker())

    @property
    def completed(self) -> bool:
        return self._completed

    @property
    def worker_pid(self) -> int:
        return self._worker.pid

    async def reset(self, task: Task) -> None:
        if not self._worker.alive:
            self._worker = await self._factory.new_worker()
        await self._load(task)
        self._task, self._cells, self._completed = task, [], False

    async def execute(self, code: str, origin: str = "<cell>") -> ExecResult:
        if self._task is None:
            raise RuntimeError("AppWorldEnvironment.execute before reset")
        t0 = time.perf_counter()
        if not self._worker.alive:  # killed after a cancelled request, or died between cells
            await self._restart()
        try:
            ans = await self._worker.request({"op": "execute", "code": code}, self._kill_after_s())
        except (WorkerTimeout, WorkerCrashed) as e:
            what = "timed out" if isinstance(e, WorkerTimeout) else "crashed the environment"
            await self._restart()
            return ExecResult(
                observation=RESTART_NOTE.format(what=what),
                ok=False,
                timed_out=isinstance(e, WorkerTimeout),
                calls=None,
                defined=None,
                duration_s=time.perf_counter() - t0,
            )
        self._cells.append(code)
        self._completed = bool(ans["completed"])
        return ExecResult(
            observation=ans["output"],
            ok=not ans["failed"],
            completed=self._completed,
            timed_out=bool(ans["timed_out"]),
            calls=None,
            defined=tuple(ans["defined"]),
            duration_s=time.perf_counter() - t0,
        )

    async def evaluate(self) -> Outcome:
        if self._task is None:
            raise RuntimeError("AppWorldEnvironment.evaluate before reset")
        if not self._worker.alive:  # the state is rebuilt by replay before it is judged
            await self._restart()
        ans = await self._worker.request({"op": "evaluate"}, self.config.start_timeout_s)
        checks = [CheckResult(name=r, passed=True) for r in ans["passes"]]
        checks += [
            CheckResult(name=f["requirement"], passed=False, detail=f["trace"]) for f in ans["failures"]
        ]
        if len(checks) != ans["num_tests"]:
            raise WorkerError(f"AppWorld evaluation ran {len(checks)} tests but expected {ans['num_tests']}")
        return Outcome.from_checks(tuple(checks))

    async def info(self) -> dict:
        """The worker's pid, RSS and PSS (MB)."""
        return await self._worker.request({"op": "info"}, 30.0)

    async def close(self) -> None:
        await self._worker.close()

    def _kill_after_s(self) -> float:
        return self.config.cell_timeout_s + self.config.kill_grace_s

    async def _load(self, task: Task) -> None:
        payload = {
            "op": "reset",
            "task_id": task.task_id,
            "experiment": self._worker.experiment,
            "cell_timeout_s": self.config.cell_timeout_s,
        }
        await self._worker.request(payload, self.config.start_timeout_s)

    async def _restart(self) -> None:
        """Replace the killed worker, reload the task and replay the episode's cells."""
        assert self._task is not None
        await self._worker.close()
        try:
            self._worker = await self._factory.new_worker()
            await self._load(self._task)
            for cell in self._cells:
                ans = await self._worker.request({"op": "execute", "code": cell}, self._kill_after_s())
                self._completed = bool(ans["completed"])
        except (WorkerTimeout, WorkerCrashed, WorkerError) as e:
            raise EnvironmentBroken(f"AppWorld task {self._task.task_id} could not be restored: {e}") from e


def _spec(config: AppWorldEnvConfig) -> WorkerSpec:
    return WorkerSpec(
        paths=config.paths(),
        start_timeout_s=config.start_timeout_s,
        experiment=config.experiment,
        keep_outputs=config.keep_outputs,
    )


class AppWorldSuite:
    """AppWorld's splits (train, dev, test_normal, test_challenge) and its live environments.

    The constructor checks that the AppWorld venv and data are installed and raises ``SetupError``
    with a one-line message that says how to install them otherwise.
    """

    name = "appworld"
    #: AppWorld's prompt templates, for ``PromptBuilder(template_dir=suite.prompt_dir)``.
    prompt_dir = APPWORLD_PROMPTS

    def __init__(self, config: AppWorldEnvConfig | None = None) -> None:
        self.config = config or AppWorldEnvConfig()
        self.paths = require_ready(self.config.paths())
        self._splits: dict[str, tuple[Task, ...]] = {}
        self._factory = WorkerFactory(_spec(self.config))

    def split(self, split: str) -> tuple[Task, ...]:
        if split not in self._splits:
            self._splits[split] = load_split(self.paths.data, split)
        return self._splits[split]

    def sample_chain(self, rng: random.Random, length: int, split: str = "train") -> tuple[Task, ...]:
        return sample_chain(self.split(split), rng, length)

    async def open(self) -> AppWorldEnvironment:
        """A new environment with its own worker, forked from this suite's AppWorld zygote (which
        the first call starts: seconds; later calls take milliseconds)."""
        return await AppWorldEnvironment.open(self.config, self._factory)

    def worked_example(self) -> None:
        """None: no solved AppWorld task is shown in the prompt."""

    async def close(self) -> None:
        """Stop the zygote and remove its folder. Open environments keep working; close them with
        ``await env.close()``."""
        self._factory.close()
