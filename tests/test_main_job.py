"""benchmarks/main_job.py: the figures it reads back from GNU time and a finished recipe run."""

import json
from pathlib import Path

from bench_script import load

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    return load("main_job")


TIME_V = """\tCommand being timed: ".venv/bin/sage-rl train"
\tUser time (seconds): 1500.25
\tElapsed (wall clock) time (h:mm:ss or m:ss): 1:02:03.5
\tMaximum resident set size (kbytes): 5859372
\tExit status: 0
"""


def test_wall_time_and_peak_rss_come_from_gnu_time():
    got = _bench().parse_time_v(TIME_V)
    assert got == {"wall_s": 3723.5, "peak_rss_bytes": 5859372 * 1024, "user_s": 1500.25}
    assert _bench().parse_time_v("\tElapsed (wall clock) time (h:mm:ss or m:ss): 23:51.57\n") == {
        "wall_s": 1431.6
    }


def test_the_stages_and_the_held_out_figures_come_from_the_run(tmp_path):
    metrics = {"tasks": 12, "tgc": 75.0, "tgc_ci": [50.0, 100.0], "sgc": 50.0, "avg_tokens": 310.4}
    state = {
        "eval_base": {"wall_s": 60.0, "result": {"train_heldout": {"metrics": {**metrics, "tgc": 0.0}}}},
        "sft": {"wall_s": 300.5, "peak_rss_gb": 4.65, "result": {}},
        "eval_sft": {"wall_s": 70.0, "result": {"train_heldout": {"metrics": metrics}}},
    }
    (tmp_path / "recipe.json").write_text(json.dumps(state))
    row = _bench().figures(tmp_path)
    assert row["stages_s"] == {"eval_base": 60.0, "sft": 300.5, "eval_sft": 70.0}
    assert row["stages_total_s"] == 430.5
    assert row["stages_peak_rss_gb"] == {"eval_base": None, "sft": 4.65, "eval_sft": None}
    assert "| stage sft | 300.5 s, peak RSS 4.65 GB |" in _bench().table(row)
    assert "| stage eval_base | 60.0 s |" in _bench().table(row)
    # each stage's reset leaves GNU time the last stage's peak: the job's is the largest stage's
    peak = _bench().job_peak(row | {"peak_rss_bytes": 2_430_000_000})
    assert peak == {"peak_rss_bytes": 4_650_000_000, "peak_rss_last_stage_bytes": 2_430_000_000}
    assert _bench().job_peak({"stages_peak_rss_gb": {"sft": None}}) == {}
    assert row["train_heldout_sft"] == {
        "tasks": 12,
        "tgc": 75.0,
        "tgc_ci": [50.0, 100.0],
        "sgc": 50.0,
        "avg_tokens": 310,
    }
    assert row["train_heldout_base"]["tgc"] == 0.0 and "train_heldout_sage" not in row


def test_it_runs_what_sage_rl_train_without_arguments_runs(tmp_path, monkeypatch):
    """`sage-rl train out_dir=X` trains one model (an argument was given); the main job is the recipe,
    so the out_dir goes to `sage-rl recipe` (the bug: the script ran `train out_dir=...`)."""
    bench = _bench()
    seen = []

    class Done:
        returncode = 0

    def fake_run(cmd, cwd, env):
        seen.append(cmd)
        assert env["SAGE_RL_STAGE_PEAKS"] == "1"  # each stage measures its own peak
        if "-o" in cmd:
            Path(cmd[cmd.index("-o") + 1]).write_text(TIME_V)
        return Done()

    monkeypatch.setattr(bench.subprocess, "run", fake_run)
    figures, _ = bench.measure(tmp_path / "run", ["recipe.sft.optim.max_steps=2"])
    cmd = seen[0][seen[0].index(str(bench.SAGE_RL)) :]
    assert cmd == [str(bench.SAGE_RL), "recipe", f"out_dir={tmp_path / 'run'}", "recipe.sft.optim.max_steps=2"]
    assert figures["wall_s"] == 3723.5
