"""AppWorld as a sage-rl ``Suite`` and ``Environment`` (issues 8 and 14).

Each episode runs in its own worker process, forked from the suite's AppWorld zygote at
``reset`` (``worker.py``): reset -> ``AppWorld(task_id)`` without the ground truth, then the
sandbox's layers; execute -> ``world.execute(code)``; completion -> ``world.task_completed()``.
Evaluation runs in another process, which copies the state AppWorld saved after the last cell and
scores it with AppWorld's own evaluator (score = fraction of its tests passed, success = all
passed): the ground truth never enters the process that runs agent code.

What differs from PocketWorld:
- ``reports_calls`` is False: AppWorld's interpreter cannot report which functions were called, so
  skill usage is found statically (SAGE.md section 2). ``ExecResult.defined`` is reported: names
  bound to a new function object by the cell.
- ``origin`` is ignored: AppWorld compiles cells itself.
- A cell that outlives AppWorld's own alarm plus a grace period (stuck in C code) gets its worker
  killed; the snapshot the worker forked after its previous cell takes over, so the world is
  exactly as it was before that cell (nothing is replayed), and the observation says so.

Failures of the environment itself are specific exceptions with one-line messages, and leave no
process or folder behind: ``TaskLoadError`` (reset), ``EvaluationError``, ``EnvironmentBroken``.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import time
import uuid
import weakref
from collections.abc import Callable
from pathlib import Path

from sage_rl.integrations.appworld.client import WorkerFactory, WorkerSpec, memory_mb
from sage_rl.integrations.appworld.config import AppWorldEnvConfig
from sage_rl.integrations.appworld.connection import WorkerError, WorkerLost, WorkerProcess, WorkerTimeout
from sage_rl.integrations.appworld.outputs import Recording, start_recording
from sage_rl.integrations.appworld.paths import require_ready
from sage_rl.integrations.appworld.prompts import APPWORLD_PROMPTS
from sage_rl.integrations.appworld.tasks import filter_tasks, first_scenarios, load_split, sample_chain
from sage_rl.types import CheckResult, ExecResult, Outcome, Task

RESTORE_NOTE = (
    "Execution failed. Traceback:\nExecution {what}. The environment was stopped and restored to "
    "its state before this cell: earlier variables and effects are all there, this cell's are not."
)
CANCELLED = "was cancelled by the harness"

#: (AppWorld root to evaluate in, experiment name, keep the outputs there) for a task and an
#: episode's token.
Destination = Callable[[Task, str], tuple[Path, str, bool]]
#: An evaluator being prepared for one destination (``scoring.py``).
Prepared = tuple[tuple[Path, str, bool], "asyncio.Future[WorkerProcess]"]


class AppWorldError(RuntimeError):
    """An AppWorld environment failed (not the agent's code). One-line message."""


class TaskLoadError(AppWorldError):
    """AppWorld could not load the task (e.g. its data's db_version does not match AppWorld's)."""


class EvaluationError(AppWorldError):
    """AppWorld's evaluator failed on the task (e.g. its ground truth is broken)."""


class EnvironmentBroken(AppWorldError):
    """The episode's worker is gone and could not be restored; reset or open a new environment."""


def _reason(e: BaseException, limit: int = 2000) -> str:
    """The error's text on one line (a log tail, a multi-line AppWorld message)."""
    text = e.reason if isinstance(e, WorkerError) else str(e)
    return " | ".join(line.strip() for line in text.splitlines() if line.strip())[:limit]


class AppWorldEnvironment:
    """One live AppWorld episode at a time, each in a fresh worker process."""

    reports_calls = False

    def __init__(self, config: AppWorldEnvConfig, factory: WorkerFactory, destination: Destination) -> None:
        self.config = config
        self._factory = factory
        self._destination = destination
        self._worker: WorkerProcess | None = None
        self._scratch: Path | None = None
        self._output_dir: Path | None = None
        self._task: Task | None = None
        self._completed = False
        self._cancelled: str | None = None  # the code of a cell whose request was cancelled
        self._token = ""  # names this episode's evaluations (when the run does not record them)
        self._evaluator: Prepared | None = None
        #: The sandbox's report of the layers that took effect in the current worker.
        self.isolation: dict = {}

    @property
    def completed(self) -> bool:
        return self._completed

    @property
    def worker_pid(self) -> int:
        return self._worker.pid if self._worker else 0

    async def reset(self, task: Task) -> None:
        """A fresh worker loads ``task``; the previous episode's processes stop meanwhile."""
        previous = self._detach()
        scratch = self._scratch = self._factory.new_scratch()
        started, _ = await asyncio.gather(
            self._start(task, scratch), self._stop(*previous), return_exceptions=True
        )
        if isinstance(started, BaseException):
            await self._stop(*self._detach())
            if isinstance(started, WorkerError | WorkerLost):
                raise TaskLoadError(
                    f"AppWorld could not load task {task.task_id}: {_reason(started)}"
                ) from started
            raise started
        self._task, self._output_dir = task, Path(started["output_dir"])
        self._token = uuid.uuid4().hex[:12]
        self.isolation = started["isolation"]

    async def _start(self, task: Task, scratch: Path) -> dict:
        self._worker = await self._factory.new_worker()
        return await self._worker.request(self._reset_request(task, scratch), self.config.start_timeout_s)

    async def execute(self, code: str, origin: str = "<cell>") -> ExecResult:
        worker = self._live()
        t0 = time.perf_counter()
        self.prepare_evaluation()
        await self._settle()
        try:
            answer = await worker.request({"op": "execute", "code": code}, self._kill_after_s())
        except asyncio.CancelledError:
            self._cancelled = code
            raise
        except WorkerLost as e:
            if not e.restored:
                raise EnvironmentBroken(f"AppWorld task {self._task_id}: {_reason(e)}") from e
            what = "timed out" if isinstance(e, WorkerTimeout) else "crashed the environment"
            observation = RESTORE_NOTE.format(what=what)
            await self._record_lost(code, observation)
            return ExecResult(
                observation=observation,
                ok=False,
                completed=self._completed,
                timed_out=isinstance(e, WorkerTimeout),
                calls=None,
                defined=None,
                duration_s=time.perf_counter() - t0,
            )
        except WorkerError as e:
            raise AppWorldError(f"AppWorld task {self._task_id}: {_reason(e)}") from e
        self._completed = bool(answer["completed"])
        return ExecResult(
            observation=answer["output"],
            ok=not answer["failed"],
            completed=self._completed,
            timed_out=bool(answer["timed_out"]),
            calls=None,
            defined=tuple(answer["defined"]),
            duration_s=time.perf_counter() - t0,
        )

    def prepare_evaluation(self) -> asyncio.Future[WorkerProcess] | None:
        """Start preparing this episode's evaluator in the background, if not yet (the first cell
        does): a process that loads the task, its ground truth and its start state while the
        episode runs, so that ``evaluate`` pays only for scoring the saved state. Returns what
        ``evaluate`` will await (e.g. for a caller that wants it ready); None before reset."""
        if self._task is None or self._scratch is None:
            return None
        if self._evaluator is None:
            dest = self._destination(self._task, self._token)
            job = asyncio.ensure_future(self._prepare(self._task, dest, self._scratch))
            self._evaluator = (dest, job)
        return self._evaluator[1]

    async def _prepare(self, task: Task, dest: tuple[Path, str, bool], scratch: Path) -> WorkerProcess:
        root, experiment, _ = dest
        worker = await self._factory.new_worker()
        request = {
            "op": "prepare",
            "task_id": task.task_id,
            "experiment": experiment,
            "dest_root": str(root),
            "data": str(self.config.paths().data),
            "sandbox": self.config.sandbox,
            "limits": self.config.limits.model_dump(),
            "readable": [str(scratch)],  # the episode's saved outputs are in there
        }
        try:
            await worker.request(request, self.config.start_timeout_s)
        except BaseException:
            await worker.close(wait=False)
            raise
        return worker

    async def evaluate(self) -> Outcome:
        """AppWorld's evaluator on the state saved after the last cell, in its own process (the
        one ``prepare_evaluation`` started, else a new one). Each evaluation uses up its process."""
        task = self._task
        if task is None or self._output_dir is None:
            raise RuntimeError("AppWorldEnvironment.evaluate before reset")
        await self._settle()
        dest = self._destination(task, self._token)
        if self._evaluator is not None and self._evaluator[0] != dest:  # record_to came since
            await _drop_evaluator(self._evaluator)
            self._evaluator = None
        job = self.prepare_evaluation()
        self._evaluator = None
        root, experiment, keep = dest
        worker = None
        try:
            worker = await job  # type: ignore[misc]
            answer = await worker.request(
                {"op": "evaluate", "source": str(self._output_dir), "save_report": keep},
                self.config.start_timeout_s,
            )
        except (WorkerError, WorkerLost) as e:
            raise EvaluationError(f"AppWorld could not evaluate task {task.task_id}: {_reason(e)}") from e
        finally:
            if worker is not None:
                await worker.close(wait=False)  # it exits after its answer
            if not keep:
                shutil.rmtree(root / "experiments" / "outputs" / experiment, ignore_errors=True)
        checks = [CheckResult(name=r, passed=True) for r in answer["passes"]]
        checks += [
            CheckResult(name=f["requirement"], passed=False, detail=f["trace"]) for f in answer["failures"]
        ]
        if len(checks) != answer["num_tests"]:
            raise EvaluationError(
                f"AppWorld's evaluation of task {task.task_id} ran {len(checks)} tests but expected "
                f"{answer['num_tests']}"
            )
        return Outcome.from_checks(tuple(checks))

    async def info(self) -> dict:
        """The worker's pid, RSS and PSS (MB)."""
        return memory_mb(self._live().pid)

    async def close(self) -> None:
        await self._stop(*self._detach())

    @property
    def _task_id(self) -> str:
        return self._task.task_id if self._task else "?"

    def _live(self) -> WorkerProcess:
        if self._task is None or self._worker is None:
            raise RuntimeError("AppWorldEnvironment used before reset (or after a failed reset)")
        return self._worker

    def _kill_after_s(self) -> float:
        return self.config.cell_timeout_s + self.config.kill_grace_s

    def _reset_request(self, task: Task, scratch: Path) -> dict:
        return {
            "op": "reset",
            "task_id": task.task_id,
            "experiment": self.config.experiment,
            "scratch": str(scratch),
            "data": str(self.config.paths().data),
            "cell_timeout_s": self.config.cell_timeout_s,
            "max_interactions": self.config.max_interactions,
            "max_api_calls_per_interaction": self.config.max_api_calls_per_interaction,
            "output_chars": self.config.limits.output_chars,
            "sandbox": self.config.sandbox,
            "limits": self.config.limits.model_dump(),
        }

    async def _settle(self) -> None:
        """After a cancelled cell: wait for the snapshot to take over; record the cell as lost
        unless the snapshot ran it (the dead worker had not read it)."""
        if self._cancelled is None:
            return
        code, self._cancelled = self._cancelled, None
        try:
            answer = await self._live().recover()
        except WorkerLost as e:
            raise EnvironmentBroken(
                f"AppWorld task {self._task_id} could not be restored: {_reason(e)}"
            ) from e
        if answer is None:
            await self._record_lost(code, RESTORE_NOTE.format(what=CANCELLED))
        else:
            self._completed = bool(answer.get("completed", self._completed))

    async def _record_lost(self, code: str, observation: str) -> None:
        """Tell the restored worker to log the lost cell as AppWorld logs a failed one."""
        try:
            answer = await self._live().request(
                {"op": "lost", "code": code, "output": observation}, self.config.start_timeout_s
            )
        except (WorkerError, WorkerLost) as e:
            raise EnvironmentBroken(
                f"AppWorld task {self._task_id} could not be restored: {_reason(e)}"
            ) from e
        self._completed = bool(answer["completed"])

    def _detach(self) -> tuple[WorkerProcess | None, Path | None, Prepared | None]:
        """Forget the current episode; return its worker, scratch folder and evaluator, to ``_stop``."""
        worker, scratch, evaluator = self._worker, self._scratch, self._evaluator
        self._worker = self._scratch = self._output_dir = self._task = self._evaluator = None
        self._cancelled, self._completed = None, False
        return worker, scratch, evaluator

    @staticmethod
    async def _stop(
        worker: WorkerProcess | None, scratch: Path | None, evaluator: Prepared | None = None
    ) -> None:
        """Stop an episode's processes and remove its scratch folder."""
        if evaluator is not None:
            await _drop_evaluator(evaluator)
        if worker is not None:
            await worker.close()
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


async def _drop_evaluator(prepared: Prepared) -> None:
    """Stop an evaluator prepared for an evaluation that will not come, and remove its folder when
    the run does not keep it. One from another (finished) event loop is left to the zygote, which
    kills its children when the suite closes."""
    (root, experiment, keep), job = prepared
    try:
        job.cancel()  # a no-op when it is done
        done = await asyncio.gather(job, return_exceptions=True)
    except (RuntimeError, ValueError):  # its event loop is closed, or another one
        return
    if isinstance(done[0], WorkerProcess):
        await done[0].close(wait=False)
    if not keep:
        shutil.rmtree(root / "experiments" / "outputs" / experiment, ignore_errors=True)


class AppWorldSuite:
    """AppWorld's splits (train, dev, test_normal, test_challenge) and its live environments.

    The constructor checks that the AppWorld venv and data are installed and raises ``SetupError``
    with a one-line message that says how to install them otherwise. ``await close()`` stops every
    process and removes every temporary folder; so does the end of the Python process.
    """

    name = "appworld"
    #: AppWorld's prompt templates, for ``PromptBuilder(template_dir=suite.prompt_dir)``.
    prompt_dir = APPWORLD_PROMPTS

    def __init__(self, config: AppWorldEnvConfig | None = None) -> None:
        self.config = config or AppWorldEnvConfig()
        self.paths = require_ready(self.config.paths())
        self._splits: dict[str, tuple[Task, ...]] = {}
        self._factory = WorkerFactory(WorkerSpec(self.paths, self.config.start_timeout_s))
        self._envs: weakref.WeakSet[AppWorldEnvironment] = weakref.WeakSet()
        self._recording: Recording | None = None
        # Whoever forgets close(): the zygote and the temporary folder still go when Python exits.
        self._finalizer = weakref.finalize(self, self._factory.close)

    def split(self, split: str, limit: int | None = None) -> tuple[Task, ...]:
        """The tasks of ``split`` that pass the config's difficulty and per-scenario filters (of
        their first ``limit`` scenarios only, when given)."""
        if split not in self._splits:
            tasks = load_split(self.paths.data, split)
            self._splits[split] = filter_tasks(
                tasks, self.config.difficulties, self.config.num_tasks_per_scenario
            )
        return first_scenarios(self._splits[split], limit)

    def sample_chain(self, rng: random.Random, length: int, split: str = "train") -> tuple[Task, ...]:
        return sample_chain(self.split(split), rng, length)

    def worked_example(self) -> None:
        """None: no solved AppWorld task is shown in the prompt."""

    def record_to(self, run_dir: Path, variant: str | None = None) -> Path:
        """Keep every evaluated episode's AppWorld outputs under ``run_dir/appworld`` from now on,
        as experiment ``<config.experiment>[-<variant>]_<split>`` (``outputs.py``); return that
        AppWorld root. Each task should be evaluated once per experiment (as ``sage-rl eval``
        does): a second evaluation replaces the first's outputs."""
        self._recording = start_recording(Path(run_dir), self.paths.data, self.config.experiment, variant)
        return self._recording.root

    async def open(self) -> AppWorldEnvironment:
        """A new environment; its first ``reset`` starts this suite's AppWorld zygote (seconds),
        later ones fork a worker from it (milliseconds)."""
        env = AppWorldEnvironment(self.config, self._factory, self._destination)
        self._envs.add(env)
        return env

    async def close(self) -> None:
        """Close every environment still open, stop the zygote, remove the temporary folder."""
        await asyncio.gather(*(env.close() for env in list(self._envs)))
        self._finalizer()

    def _destination(self, task: Task, token: str) -> tuple[Path, str, bool]:
        if self._recording is not None:
            return self._recording.root, self._recording.experiment(task.split), True
        root = self._factory.tmp / "evaluations"
        return root, f"{self.config.experiment}-{token}", False
