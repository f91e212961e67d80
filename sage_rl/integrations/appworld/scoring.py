"""An AppWorld evaluator child (``worker.py``): AppWorld's own ``evaluate_task`` on the state an
episode saved, in a process that runs no agent code. Runs under the AppWorld venv; loaded by
``worker.py`` after ``layers.py``, which it imports under the name registered there.

Two requests, in order, on one child:
- ``prepare`` (task_id, experiment, dest_root, data, sandbox, limits, readable): before any file
  that agent code wrote is read, load the task with its ground truth and its start state, freeze
  the clock at the task's date (AppWorld's own ``set_local_date_and_time``) and configure the
  models; score a no-op episode in a private folder and keep its end-state databases
  (``warm_up``); then apply the sandbox's layers: from here on it reads the data, this
  integration's source and the ``readable`` folders (the episode's scratch), and writes only its
  destination. The environment sends it while the episode runs, so the evaluation that follows
  costs what is left.
- ``evaluate`` (source, save_report; or everything ``prepare`` takes, when it was not sent):
  read the regular files AppWorld saved for the episode, write them into the destination AppWorld
  root and score them there with ``evaluate_task``, as ``appworld evaluate`` does (an app whose
  saved changes are the no-op's keeps the no-op's database; a throw-away evaluation then skips
  writing its file). Then the child exits:
  one evaluation per process, so nothing the replayed state did outlives it.

``evaluate_task`` freezes the clock itself; with the clock already frozen (same date), freezegun
nests its freeze and patches no module again, which otherwise walks every loaded module (~1,800
in a zygote that preloaded the standard library). The start state ``prepare`` loaded stays in
AppWorld's database cache, where ``evaluate_task`` finds it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

import sage_rl_appworld_layers as layers  # type: ignore[import-not-found]

#: What of an episode's AppWorld output folder the evaluator copies (regular files only) besides
#: the saved state (``dbs``), for a run that keeps its outputs.
LOG_SUBFOLDERS = ("logs", "version", "misc")


class Evaluator:
    """One evaluation of one task (see the module docstring)."""

    def __init__(self, network: str, paths: tuple[list[str], list[str]]) -> None:
        self.network, self.paths = network, paths
        self._ready: tuple[str, str, str] | None = None  # task_id, experiment, destination
        self._clock = None
        self._loaded: dict[str, bytes] = {}  # app -> the changes its warmed end-state database holds

    def prepare(self, req: dict, warm: bool = True) -> dict:
        if self._ready is not None:
            raise RuntimeError("an evaluator prepares one task only")
        dest_root, task_id, experiment = req["dest_root"], req["task_id"], req["experiment"]
        dest = os.path.join(dest_root, "experiments", "outputs", experiment, "tasks", task_id)
        os.makedirs(dest, exist_ok=True)  # emptied by ``evaluate``: an earlier evaluation's stay till then
        with contextlib.suppress(FileExistsError):  # concurrent evaluators share the root
            os.symlink(req["data"], os.path.join(dest_root, "data"))
        use_root(dest_root)
        from appworld.apps.api_lib import set_local_date_and_time
        from appworld.task import Task

        task = Task.load(task_id=task_id)  # with its ground truth: no agent code runs here
        task.ground_truth.evaluation_module()  # a broken ground truth fails here, as it would later
        self._clock = set_local_date_and_time(task.datetime)  # kept: see the module docstring
        task.model_collection.admin.MainUser.find_one(**task.supervisor)  # loads and configures
        if warm:  # in the background, while the episode runs; a cold evaluation pays no no-op
            self._loaded = warm_up(task_id, req["data"], dest_root)
        if req.get("sandbox", True):
            limits = layers.Limits.from_dict({**req["limits"], "drop_user": ""})
            readable = [req["data"], *req.get("readable", [])]
            layers.apply(limits, dest, self.network, layers.evaluator_paths(self.paths), readable)
        self._ready = (task_id, experiment, dest)
        return {}

    def evaluate(self, req: dict) -> dict:
        """Copy the episode's saved outputs to the destination and score them there."""
        if self._ready is None:
            self.prepare({**req, "readable": [req["source"]]}, warm=False)
        task_id, experiment, dest = self._ready  # type: ignore[misc]
        save_report = bool(req.get("save_report", True))
        for entry in os.scandir(dest):  # an earlier evaluation of the task in this experiment
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
        # What is scored is what was read here, once: agent code may still be writing its folder.
        state = os.path.join(req["source"], "dbs")
        saved = read_files(state)
        kept = keep_unchanged(task_id, self._loaded, saved)
        reloaded = sorted(
            name.removesuffix(".jsonl") for name in saved.keys() - kept if name.endswith(".jsonl")
        )
        if not save_report:  # a kept database is not read from its file: no need to write it
            saved = {name: data for name, data in saved.items() if name not in kept}
        if _real_folder(state):  # none: AppWorld's own error names the missing state
            write_files(os.path.join(dest, "dbs"), saved)
        if save_report:
            copy_outputs(req["source"], dest, LOG_SUBFOLDERS)
        from appworld.evaluator import evaluate_task

        tracker = evaluate_task(
            task_id=task_id, experiment_name=experiment, suppress_errors=True, save_report=save_report
        )
        return {
            "passes": [p["requirement"] for p in tracker.passes],
            "failures": [
                {"requirement": f["requirement"], "trace": f.get("trace", "")} for f in tracker.failures
            ],
            "num_tests": tracker.num_tests,
            "success": bool(tracker.success),
            "difficulty": tracker.difficulty,
            "reloaded": reloaded,
            "kept": len(kept),
        }


def warm_up(task_id: str, data: str, root: str) -> dict[str, bytes]:
    """Score a no-op episode (the task's start state saved as its end state) in a private AppWorld
    root, then point AppWorld at ``root`` again; return, per app whose end-state database that left
    in AppWorld's cache, the saved changes it was loaded from.

    A process pays once for what every later ``evaluate_task`` reuses: SQLAlchemy configures its
    mappers and compiles the ground truth's statements, the SQLite engines are made. AppWorld's own
    ``world.evaluate()`` runs in the process that ran the episode, so it never pays them, and finds
    the end state already in memory; an evaluator, a fresh process per evaluation, paid both in
    ``evaluate``. Paid here, in ``prepare``, they come off the evaluation's critical path. It reads
    the task data alone (no file agent code wrote) and runs before the sandbox's layers, in a
    temporary folder: nothing of it touches the destination, where an earlier evaluation's outputs
    may be kept.

    AppWorld caches a loaded end state under its in-memory path (the task's, whatever the root),
    and ``evaluate_task`` scores what it finds there (that is how ``world.evaluate()`` finds its
    live databases). So an app's cached database stays only while the episode saved the very same
    changes for it (``evaluate`` drops the others): a database loaded from the same bytes, and
    since read by an evaluation, which only reads (AppWorld evaluates a live world again and
    again). Nothing stays if the no-op failed: its result, or its failure, is thrown away, and
    ``evaluate`` then loads everything itself."""
    from appworld.apps.model_lib import CachedDBHandler, db_home_to_app_path, get_db_home_path
    from appworld.evaluator import evaluate_task

    loaded: dict[str, bytes] = {}
    home = _end_home(task_id)
    with tempfile.TemporaryDirectory(prefix="sage-rl-appworld-no-op-") as private:
        try:
            os.symlink(data, os.path.join(private, "data"))
            use_root(private)
            start = read_files(get_db_home_path(storage_type="disk", type="task_input", task_id=task_id))
            write_files(
                os.path.join(private, "experiments", "outputs", "no-op", "tasks", task_id, "dbs"), start
            )
            evaluate_task(task_id=task_id, experiment_name="no-op", suppress_errors=True, save_report=False)
            cached = {_app_of(key) for key in CachedDBHandler.cache if os.path.dirname(key) == home}
            loaded = {app: start[f"{app}.jsonl"] for app in cached if f"{app}.jsonl" in start}
        except Exception:  # noqa: BLE001 - only an optimization (see above)
            loaded = {}
        finally:
            for key in list(CachedDBHandler.cache):
                if os.path.dirname(key) == home and _app_of(key) not in loaded:
                    CachedDBHandler.reset(key_substring=key)
            db_home_to_app_path.cache_clear()  # it remembers which files the no-op's folder held
            use_root(root)
    return loaded


def _app_of(key: str) -> str:
    """The app of a database cache key ``<home>/<app>.db``."""
    return os.path.basename(key).removesuffix(".db")


def _end_home(task_id: str) -> str:
    """Where AppWorld keeps a task's end state in memory (its cache's keys are ``<home>/<app>.db``)."""
    from appworld.apps.model_lib import get_db_home_path

    return get_db_home_path(storage_type="memory", type="task_output", task_id=task_id)


def keep_unchanged(task_id: str, loaded: dict[str, bytes], saved: dict[str, bytes]) -> set[str]:
    """Drop from AppWorld's cache each warmed end-state database whose app the episode changed
    (``saved``: the saved state's files by name), so that ``evaluate_task`` loads it from them;
    return the names of the files whose databases stay."""
    from appworld.apps.model_lib import CachedDBHandler

    kept = set()
    for app, changes in loaded.items():
        if saved.get(f"{app}.jsonl") == changes:
            kept.add(f"{app}.jsonl")
        else:
            CachedDBHandler.reset(key_substring=os.path.join(_end_home(task_id), f"{app}.db"))
    return kept


def use_root(root: str) -> None:
    """Point AppWorld at another root. AppWorld reads ``APPWORLD_ROOT`` at each use but caches
    ``get_db_home_path`` by its arguments only: drop what the zygote cached for its own root."""
    from appworld.apps.model_lib import get_db_home_path

    os.environ["APPWORLD_ROOT"] = root
    get_db_home_path.cache_clear()


def _real_folder(path: str) -> bool:
    """A folder, not a link to one (the episode's output folder is agent-writable)."""
    return os.path.isdir(path) and not os.path.islink(path)


def _regular_files(folder: str) -> list[os.DirEntry]:
    """The regular files directly in ``folder`` (never links)."""
    if not _real_folder(folder):
        return []
    return [entry for entry in os.scandir(folder) if entry.is_file(follow_symlinks=False)]


def read_files(folder: str) -> dict[str, bytes]:
    """``folder``'s regular files (``_regular_files``) by name."""
    out = {}
    for entry in _regular_files(folder):
        with open(entry.path, "rb") as f:
            out[entry.name] = f.read()
    return out


def write_files(folder: str, files: dict[str, bytes]) -> None:
    os.makedirs(folder, exist_ok=True)
    for name, data in files.items():
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)


def copy_outputs(source: str, dest: str, subfolders: tuple[str, ...]) -> None:
    """The regular files of AppWorld's output subfolders (``_regular_files``), streamed."""
    for sub in subfolders:
        folder = os.path.join(source, sub)
        if not _real_folder(folder):
            continue
        os.makedirs(os.path.join(dest, sub), exist_ok=True)
        for entry in _regular_files(folder):
            shutil.copyfile(entry.path, os.path.join(dest, sub, entry.name), follow_symlinks=False)
