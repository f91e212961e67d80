"""What an AppWorld episode worker runs: an episode's world (``Episode``); an evaluator runs
``scoring.py``. Runs under the AppWorld venv; loaded by ``worker.py`` (see its docstring for the
protocol), after ``layers.py``, ``scoring.py`` and ``snapshots.py``, which it registers under the
names imported here.
"""

from __future__ import annotations

import ast
import concurrent.futures
import contextlib
import gc
import io
import os
import pwd
import signal
import sys

import sage_rl_appworld_layers as layers  # type: ignore[import-not-found]
import sage_rl_appworld_scoring as scoring  # type: ignore[import-not-found]
import sage_rl_appworld_snapshots as snapshots  # type: ignore[import-not-found]

FAILED_PREFIX = "Execution failed."
#: Printed characters a cell's observation keeps when the request does not say (the sandbox's).
DEFAULT_OUTPUT_CHARS = 20_000


class AlarmWatch:
    """Stands in for the ``signal`` module inside ``appworld.common.utils``, whose
    ``timeout_call`` arms AppWorld's per-cell alarm: the handler it installs is wrapped, so the
    worker knows that the alarm fired rather than guessing from the cell's error message."""

    def __init__(self, real) -> None:
        self._real = real
        self.fired = False

    def __getattr__(self, name: str):
        return getattr(self._real, name)

    def signal(self, signum, handler):
        if signum == self._real.SIGALRM and callable(handler):
            inner = handler

            def handler(number, frame):
                self.fired = True
                return inner(number, frame)

        return self._real.signal(signum, handler)


class PendingCalls:
    """The calls a cell made through an anyio portal (AppWorld's API client runs each API request
    in one), until they complete. AppWorld's alarm can stop a cell while its last request is still
    running in the portal's thread; the worker waits for it before it answers (and so before it
    snapshots: fork copies no thread), then saves AppWorld's state again. Only calls started while
    a cell runs are tracked: the client's own lifespan task runs as long as the client. ``started``
    counts them (a cell that started none changed no app's database)."""

    def __init__(self) -> None:
        self.pending: set = set()
        self.tracking = False
        self.started = 0

    def install(self) -> None:
        """Wrap ``BlockingPortal.start_task_soon`` (``portal.call`` goes through it)."""
        from anyio.from_thread import BlockingPortal

        start, pending = BlockingPortal.start_task_soon, self.pending

        def start_task_soon(portal, *args, **kwargs):
            future = start(portal, *args, **kwargs)
            if self.tracking:
                self.started += 1
                pending.add(future)
                future.add_done_callback(pending.discard)
            return future

        BlockingPortal.start_task_soon = start_task_soon

    def drain(self, timeout_s: float = 10.0) -> bool:
        """Stop tracking and wait for the calls in flight; True when there were any."""
        self.tracking = False
        if not self.pending:
            return False
        concurrent.futures.wait(list(self.pending), timeout_s)
        self.pending.clear()
        return True


PENDING = PendingCalls()

#: Room kept beyond ``output_chars`` for an error's traceback, as the sandbox keeps (session.py).
TRACEBACK_ROOM = 20_000


class CappedText(io.StringIO):
    """A cell's stdout or stderr: keeps the first ``limit`` characters and counts the rest, so a
    cell that prints gigabytes holds kilobytes here (and in AppWorld's logs)."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit, self.size, self.dropped = limit, 0, 0

    def write(self, s: str) -> int:
        if not isinstance(s, str):
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        room = self.limit - self.size
        if room >= len(s):
            super().write(s)
            self.size += len(s)
        else:
            if room > 0:
                super().write(s[:room])
                self.size = self.limit
            self.dropped += len(s) - max(room, 0)
        return len(s)

    def getvalue(self) -> str:
        out = super().getvalue()
        if self.dropped:
            out += (
                f"\n[output truncated: {self.dropped} more characters not shown; "
                f"the limit is {self.limit} characters per cell]\n"
            )
        return out


def capped_capture(limit: int):
    """IPython's ``capture_output`` (which ``AppWorld.execute`` captures a cell with), writing to
    ``CappedText`` streams instead of unbounded ones."""
    from IPython.utils.capture import capture_output

    class CappedCapture(capture_output):
        def __enter__(self):
            captured = super().__enter__()
            if self.stdout:
                captured._stdout = sys.stdout = CappedText(limit)
            if self.stderr:
                captured._stderr = sys.stderr = CappedText(limit)
            return captured

    return CappedCapture


def cap_observation(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters plus room for a traceback (an exception's own message
    can be as long as any print)."""
    cap = limit + TRACEBACK_ROOM
    if len(text) <= cap:
        return text
    return text[:cap] + f"\n[observation truncated: {len(text)} characters in all]\n"


class Episode:
    """The one live ``AppWorld`` of an episode worker."""

    def __init__(self, network: str, paths: tuple[list[str], list[str]]) -> None:
        self.network, self.paths = network, paths
        self.world = None
        self.snapshots = snapshots.Snapshots()
        self._ran, self._result = False, None
        self._alarm: AlarmWatch | None = None
        self._dead_clients: list = []
        self._output_chars = DEFAULT_OUTPUT_CHARS
        self._completed: bool | None = None  # as of the last cell that made an API call

    def reset(self, req: dict) -> dict:
        if self.world is not None:
            raise RuntimeError("an episode worker loads one task only; start a new worker")
        root = os.path.join(req["scratch"], "root")
        os.makedirs(root, exist_ok=True)
        if not os.path.lexists(os.path.join(root, "data")):
            os.symlink(req["data"], os.path.join(root, "data"))
        scoring.use_root(root)
        from appworld import AppWorld

        self.world = world = AppWorld(
            req["task_id"],
            experiment_name=req["experiment"],
            load_ground_truth=False,  # the evaluator loads it, in its own process
            timeout_seconds=int(req["cell_timeout_s"]),
            max_interactions=int(req["max_interactions"]),
            max_api_calls_per_interaction=int(req["max_api_calls_per_interaction"]),
        )
        run = world._shell_run_cell

        def watched(code: str):  # tells a cell that ran from one refused before running
            self._ran, self._result = True, None
            self._result = run(code)
            return self._result

        world._shell_run_cell = watched
        import appworld.common.utils as utils
        import appworld.environment

        self._output_chars = int(req.get("output_chars", DEFAULT_OUTPUT_CHARS))
        appworld.environment.capture_output = capped_capture(self._output_chars)

        self._alarm = utils.signal = AlarmWatch(signal)
        self.snapshots.hot.open()
        if req.get("sandbox", True):
            isolation = self._isolate(req)
        else:
            _scrub_environment(req["scratch"], root)
            isolation = {}
        # The world lives as long as the worker: out of the collector's reach, so that a
        # collection never writes to (and so copies, after a snapshot's fork) all its pages.
        gc.freeze()
        return {
            "instruction": world.task.instruction,
            "isolation": isolation,
            "output_dir": world.output_directory,
        }

    def _isolate(self, req: dict) -> dict:
        """Apply the layers, then check the one thing they must do here: the task data (every
        task's ground truth) is out of reach. Raises when it is not (e.g. no Landlock)."""
        limits = layers.Limits.from_dict(req["limits"])
        _give_to(req["scratch"], limits.drop_user)
        _scrub_environment(req["scratch"], os.path.join(req["scratch"], "root"))
        report = layers.apply(limits, req["scratch"], self.network, self.paths, [])
        try:
            os.listdir(os.path.join(req["data"], "tasks"))
        except PermissionError:
            return report
        layers_seen = ", ".join(f"{k}={report.get(k)}" for k in ("filesystem", "user", "network"))
        raise RuntimeError(
            f"the sandbox does not hide AppWorld's task data from agent code here ({layers_seen}; "
            f"{'; '.join(report.get('notes', [])) or 'no note'}): agent code could read every answer. "
            "Run where Landlock is available, or set appworld.sandbox=false to run without isolation"
        )

    def execute(self, code: str) -> dict:
        world = self._live()
        names = _top_level_defs(code)
        before = {n: world.shell.user_ns.get(n) for n in names}
        self._ran, self._result = False, None
        self._alarm.fired = False  # type: ignore[union-attr]
        PENDING.tracking, PENDING.started = True, 0
        output = world.execute(code)
        called = PENDING.started > 0
        if PENDING.drain():  # a request outlived the cell: save the state it left
            world._save_state(world.output_db_home_path_on_disk)
        timed_out = self._alarm.fired  # type: ignore[union-attr]
        capped = cap_observation(output, self._output_chars)
        if capped is not output:  # a huge traceback: AppWorld logged it whole; log it as returned
            output = world.environment_io[-1]["output"] = capped
            world.save_logs()
        if self._ran:  # no result: the alarm ended run_cell itself; else the cell's own status
            failed = timed_out or self._result is None or not self._result.success
        else:  # refused before running (unsafe or invalid syntax) or empty: AppWorld's own message
            failed = output.startswith(FAILED_PREFIX)
        after = world.shell.user_ns
        # A definition "executed" when the name is now bound to a new function object.
        defined = [n for n in names if callable(after.get(n)) and after.get(n) is not before[n]]
        # Only an API request changes the task's status: a cell that made none keeps the last one
        # read (reading costs a query of the supervisor's database, a sixth of a bare cell).
        if called or self._completed is None:
            self._completed = completed(world)
        return {
            "output": output,
            "failed": failed,
            "timed_out": timed_out,
            "completed": self._completed,
            "defined": defined,
        }

    def lost(self, code: str, output: str) -> dict:
        world = self._live()
        world.environment_io.append({"input": code.strip(), "output": output})
        world.num_interactions += 1
        world._save_state(world.output_db_home_path_on_disk)  # the dead worker may have been mid-save
        world.save_logs()
        self._completed = completed(world)
        return {"completed": self._completed}

    def revive(self) -> None:
        """In a snapshot that took over: AppWorld's API client ran its event loop in a thread,
        which fork did not copy. Start a new one; keep the old one's objects referenced, because
        finalizing them would wait forever on the thread that is gone."""
        import anyio.from_thread
        from appworld.requester import Requester

        PENDING.pending.clear()  # calls of threads that fork did not copy: they never complete here
        for client in Requester.clients.values():
            self._dead_clients.append((client.exit_stack, client.portal))
            stack = contextlib.ExitStack()
            client.portal = stack.enter_context(
                anyio.from_thread.start_blocking_portal(**client.async_backend)
            )
            client.exit_stack = stack

    def _live(self):
        if self.world is None:
            raise RuntimeError("no task is loaded: send 'reset' first")
        return self.world


def completed(world) -> bool:
    """``world.task_completed()``, read from the supervisor's model in this thread. AppWorld's own
    call is an API request through its client's event-loop thread (a thread hop, and the pages
    it touches are copied after each snapshot's fork): 20 times the cost for the same row, in
    the same database (the world's models and its APIs share its in-memory databases)."""
    from typing import get_args

    from appworld.apps.supervisor.constants import TASK_STATUS_LITERAL

    models = getattr(world, "models", None)
    supervisor = getattr(models, "supervisor", None)
    if supervisor is None:  # not an in-process world: ask it
        return bool(world.task_completed())
    tasks = supervisor.Task.all()
    return bool(tasks) and tasks[0].status in get_args(TASK_STATUS_LITERAL)


def _give_to(scratch: str, user: str) -> None:
    """Hand the scratch folder (AppWorld's outputs included) to the user the worker drops to."""
    if os.getuid() != 0 or not user:
        return
    pw = pwd.getpwnam(user)
    for folder, dirs, files in os.walk(scratch):
        for name in (*dirs, *files):
            os.lchown(os.path.join(folder, name), pw.pw_uid, pw.pw_gid)
    os.chown(scratch, pw.pw_uid, pw.pw_gid)


def _scrub_environment(scratch: str, root: str) -> None:
    """Nothing of the parent's (or the zygote's) environment reaches agent code."""
    os.environ.clear()
    os.environ.update(
        PATH="/usr/bin:/bin",
        LANG="C.UTF-8",
        HOME=scratch,
        TMPDIR=scratch,
        APPWORLD_ROOT=root,
        APPWORLD_CACHE=os.path.join(scratch, "cache"),
        PYTHONDONTWRITEBYTECODE="1",
    )


def _top_level_defs(code: str) -> list[str]:
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # a null byte; nesting too deep
        return []
    return [n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
