"""One process at a time in a run folder (sage_rl/runs/claim.py), and ``--status`` telling a run
whose process ended from one that is alive (sage_rl/recipe/status.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from test_recipe_status import T, _lines, _written_at

from sage_rl.recipe.status import stages
from sage_rl.runs.claim import OWNER, RunInUse, claim, claimed_ever, holder

ROOT = Path(__file__).resolve().parents[1]
HOLD = "import sys, time\nfrom sage_rl.runs.claim import claim\nwith claim(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(120)"


@pytest.fixture
def other_process():
    """Start another process that claims a folder and keeps it (until killed)."""
    procs = []

    def start(folder: Path) -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True)
        procs.append(p)
        assert p.stdout.readline().strip() == "held"
        return p

    yield start
    for p in procs:
        p.kill()
        p.wait()


def test_a_second_process_is_refused_naming_the_holder_until_it_ends(tmp_path, other_process):
    run = tmp_path / "run"
    holder_proc = other_process(run)
    with pytest.raises(RunInUse, match=f"in use by another process \\(pid {holder_proc.pid} on "), claim(run):
        pass
    assert holder(run)["pid"] == holder_proc.pid
    holder_proc.send_signal(signal.SIGKILL)  # however it ends, the kernel drops its lock
    holder_proc.wait()
    assert holder(run) is None and claimed_ever(run)
    with claim(run):
        assert holder(run)["pid"] == os.getpid()
        with claim(run / "."):  # the same process again (a recipe and its stage): allowed
            pass
        assert holder(run)["pid"] == os.getpid()  # still held after the inner claim ended
    assert holder(run) is None


def test_a_folder_never_claimed_has_no_holder(tmp_path):
    assert holder(tmp_path) is None and not claimed_ever(tmp_path)


def test_the_commands_refuse_a_busy_folder_before_writing(tmp_path, other_process):
    from sage_rl.config import load_config
    from sage_rl.runs.eval import run_evaluation
    from sage_rl.runs.train import run_train
    from sage_rl.settings import EvalRunConfig, TrainConfig

    run = tmp_path / "busy"
    other_process(run)
    ev = load_config(EvalRunConfig, "configs/eval.yaml", [f"out_dir={run}", "policy.kind=scripted"])
    with pytest.raises(RunInUse):
        run_evaluation(ev)
    tr = load_config(TrainConfig, "configs/quickstart.yaml", [f"out_dir={run}", "init_from=null"])
    with pytest.raises(RunInUse):
        run_train(tr, resume=True)
    assert sorted(p.name for p in run.iterdir()) == [OWNER]  # nothing written


def test_the_command_line_says_so_in_one_line(tmp_path, other_process):
    run = tmp_path / "busy"
    proc = other_process(run)
    r = subprocess.run(
        [sys.executable, "-m", "sage_rl.cli", "eval", "policy.kind=scripted", f"out_dir={run}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"is in use by another process (pid {proc.pid}" in r.stderr and "Traceback" not in r.stderr


def test_status_reads_a_run_whose_process_ended_as_stopped_at_once(tmp_path, other_process):
    out = tmp_path / "run"
    _lines(out / "eval" / "sft_train_heldout" / "trajectories.same_scenario.jsonl", [{}] * 12)
    proc = other_process(out)
    _written_at(out)

    def state(now: float) -> tuple[str, str]:
        return next((s.state, s.detail) for s in stages(out, now=now) if s.name == "eval sft train_heldout")

    assert state(T + 60) == ("running", "12 scenarios finished; last written 1 min ago")
    assert state(T + 2 * 3600) == (  # alive but silent for two hours
        "running",
        "12 scenarios finished; last written 2 h 0 min ago (its process is alive: stuck?)",
    )
    proc.kill()
    proc.wait()
    assert state(T + 60) == ("stopped", "12 scenarios finished; last written 1 min ago")
