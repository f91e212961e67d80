"""A run's AppWorld outputs, kept where AppWorld's own tools read them, and AppWorld's own
evaluation report of them.

``AppWorldSuite.record_to(run_dir)`` makes ``RUN_DIR/appworld`` an AppWorld root:

    RUN_DIR/appworld/data -> the AppWorld data the run used
    RUN_DIR/appworld/experiments/outputs/<experiment>/tasks/<task_id>/
        dbs/             the state AppWorld saved after the episode's last cell
        logs/            api_calls.jsonl, environment_io.md
        version/         code.txt, data.txt
        evaluation/      report.md (AppWorld's evaluator), version.txt

``<experiment>`` is ``<appworld.experiment>[-<variant>]_<split>``: one experiment per split (and
per variant, e.g. a retrieval strategy), named as AppWorld's leaderboard tools expect
(``..._test_normal``). So AppWorld's own command scores a sage-rl run::

    APPWORLD_ROOT=RUN_DIR/appworld appworld evaluate sage-rl_test_normal test_normal

and ``sage-rl appworld evaluate RUN_DIR`` (``evaluate_run``) does it for every experiment of the
run, in AppWorld's venv, also for a run over part of a split (``report.py``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sage_rl.integrations.appworld.client import zygote_env
from sage_rl.integrations.appworld.paths import AppWorldPaths, SetupError

REPORT_SCRIPT = Path(__file__).with_name("report.py")


@dataclass(frozen=True)
class Recording:
    """Where a run keeps its AppWorld outputs: ``root`` (an AppWorld root) and the experiments'
    name prefix."""

    root: Path
    prefix: str

    def experiment(self, split: str) -> str:
        return f"{self.prefix}_{split}"

    @property
    def outputs(self) -> Path:
        return self.root / "experiments" / "outputs"


def start_recording(run_dir: Path, data: Path, experiment: str, variant: str | None = None) -> Recording:
    """Make ``run_dir/appworld`` an AppWorld root over ``data``; return where episodes go."""
    root = Path(run_dir).resolve() / "appworld"
    (root / "experiments" / "outputs").mkdir(parents=True, exist_ok=True)
    link = root / "data"
    if link.is_symlink() and Path(os.readlink(link)) != data:
        link.unlink()
    if not link.is_symlink():
        link.symlink_to(data, target_is_directory=True)
    prefix = experiment + (f"-{re.sub(r'[^a-z0-9_-]', '-', variant.lower())}" if variant else "")
    return Recording(root, prefix)


def experiments(root: Path) -> list[tuple[str, str]]:
    """(experiment, split) for every experiment folder under an AppWorld root, the split being
    the longest ``_<split>`` suffix naming one of the data's splits."""
    splits = sorted((p.stem for p in (root / "data" / "datasets").glob("*.txt")), key=len, reverse=True)
    found = []
    for folder in sorted((root / "experiments" / "outputs").glob("*/tasks")):
        name = folder.parent.name
        split = next((s for s in splits if name.endswith("_" + s)), None)
        if split:
            found.append((name, split))
    return found


def evaluate_run(
    run_dir: Path, paths: AppWorldPaths, sandbox: bool = True, timeout_s: float = 3600
) -> list[dict]:
    """AppWorld's own evaluation of every experiment of a sage-rl run. Returns, per experiment,
    ``experiment``, ``split``, ``output`` (what AppWorld printed: its report table) and
    ``evaluation`` (its ``evaluations/<split>.json``: aggregate TGC/SGC and per-task results).
    Raises ``SetupError`` (one line) when the run has no AppWorld outputs or AppWorld fails."""
    root = Path(run_dir).resolve() / "appworld"
    found = experiments(root) if (root / "data").exists() else []
    if not found:
        raise SetupError(
            f"{run_dir} holds no AppWorld outputs ({root}/experiments/outputs/<experiment>_<split>/tasks): "
            "was it a `sage-rl eval` run with env=appworld?"
        )
    out = []
    for experiment, split in found:
        args = [str(paths.python), str(REPORT_SCRIPT), str(root), experiment, split]
        with tempfile.TemporaryDirectory(prefix="sage-rl-appworld-report-") as home:
            proc = subprocess.run(
                args + ([] if sandbox else ["--no-sandbox"]),
                env=zygote_env(paths, Path(home)),
                cwd=root,
                capture_output=True,
                text=True,
                timeout=timeout_s,
            )
        if proc.returncode != 0:
            tail = proc.stderr.strip().splitlines()[-1:] or ["no message"]
            raise SetupError(
                f"AppWorld's evaluation of {experiment} failed (exit {proc.returncode}): {tail[0]}"
            )
        report = root / "experiments" / "outputs" / experiment / "evaluations" / f"{split}.json"
        evaluation = json.loads(report.read_text()) if report.is_file() else {}
        out.append(
            {"experiment": experiment, "split": split, "output": proc.stdout, "evaluation": evaluation}
        )
    return out
