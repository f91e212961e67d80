"""An AppWorld evaluator child (``worker.py``): AppWorld's own ``evaluate_task`` on the state an
episode saved, in a process that runs no agent code. Runs under the AppWorld venv; loaded by
``worker.py`` after ``layers.py``, which it imports under the name registered there.

Two requests, in order, on one child:
- ``prepare`` (task_id, experiment, dest_root, data, sandbox, limits, readable): before any file
  that agent code wrote is read, load the task with its ground truth and its start state, freeze
  the clock at the task's date (AppWorld's own ``set_local_date_and_time``) and configure the
  models; then apply the sandbox's layers: from here on it reads the data, this integration's
  source and the ``readable`` folders (the episode's scratch), and writes only its destination.
  The environment sends it while the episode runs, so the evaluation that follows costs what is
  left.
- ``evaluate`` (source, save_report; or everything ``prepare`` takes, when it was not sent):
  copy the regular files AppWorld saved for the episode into the destination AppWorld root and
  score them there with ``evaluate_task``, as ``appworld evaluate`` does. Then the child exits:
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

import sage_rl_appworld_layers as layers  # type: ignore[import-not-found]

#: What of an episode's AppWorld output folder the evaluator copies (regular files only): all of
#: it for a run that keeps its outputs, the saved state alone when the copy is thrown away.
OUTPUT_SUBFOLDERS = ("dbs", "logs", "version", "misc")
STATE_SUBFOLDERS = ("dbs",)


class Evaluator:
    """One evaluation of one task (see the module docstring)."""

    def __init__(self, network: str, paths: tuple[list[str], list[str]]) -> None:
        self.network, self.paths = network, paths
        self._ready: tuple[str, str, str] | None = None  # task_id, experiment, destination
        self._clock = None

    def prepare(self, req: dict) -> dict:
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
        if req.get("sandbox", True):
            limits = layers.Limits.from_dict({**req["limits"], "drop_user": ""})
            readable = [req["data"], *req.get("readable", [])]
            layers.apply(limits, dest, self.network, layers.evaluator_paths(self.paths), readable)
        self._ready = (task_id, experiment, dest)
        return {}

    def evaluate(self, req: dict) -> dict:
        """Copy the episode's saved outputs to the destination and score them there."""
        if self._ready is None:
            self.prepare({**req, "readable": [req["source"]]})
        task_id, experiment, dest = self._ready  # type: ignore[misc]
        save_report = bool(req.get("save_report", True))
        for entry in os.scandir(dest):  # an earlier evaluation of the task in this experiment
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
        copy_outputs(req["source"], dest, OUTPUT_SUBFOLDERS if save_report else STATE_SUBFOLDERS)
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
        }


def use_root(root: str) -> None:
    """Point AppWorld at another root. AppWorld reads ``APPWORLD_ROOT`` at each use but caches
    ``get_db_home_path`` by its arguments only: drop what the zygote cached for its own root."""
    from appworld.apps.model_lib import get_db_home_path

    os.environ["APPWORLD_ROOT"] = root
    get_db_home_path.cache_clear()


def copy_outputs(source: str, dest: str, subfolders: tuple[str, ...] = OUTPUT_SUBFOLDERS) -> None:
    """Regular files of AppWorld's output subfolders (never links: the folder is agent-writable)."""
    for sub in subfolders:
        folder = os.path.join(source, sub)
        if os.path.islink(folder) or not os.path.isdir(folder):
            continue
        os.makedirs(os.path.join(dest, sub), exist_ok=True)
        for entry in os.scandir(folder):
            if entry.is_file(follow_symlinks=False):
                shutil.copyfile(entry.path, os.path.join(dest, sub, entry.name), follow_symlinks=False)
