"""benchmarks/gpu_recipe.py: the RL budget sized from the time left (hand-worked numbers), and the
whole script at toy size on the CPU: the three RL arms run at equal budgets when they fit, skipped
when they do not."""

import json
from pathlib import Path

import pytest
from bench_script import load

from sage_rl.config import load_config
from sage_rl.settings import TrainConfig

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    return load("gpu_recipe")


def _sft_done(eval_s: float) -> dict:
    metrics = {
        "heldout": {"metrics": {"avg_tokens": 400.0, "tasks": 90}},
        "dev": {"metrics": {"avg_tokens": 500.0, "tasks": 24}},
    }
    # "eval sft" times the SFT model with and without its library (the format control)
    return {"times": {"eval sft": eval_s}, "results": {"sft": metrics, "sft_nolib": metrics}}


def test_rl_budget_by_hand(monkeypatch):
    monkeypatch.chdir(ROOT)
    bench = _bench()
    cfg = load_config(TrainConfig, "configs/gpu_recipe.yaml", [])  # G = 8, B = 8, K = 2
    # eval sft (two models): 2 x (90 x 400 + 24 x 500) = 96,000 tokens in 100 s = 960 tok/s,
    # 421.05 tokens a task; one step = 8 x 8 x 2 x 421.05 = 53,894.7 tokens. A task takes 100 / 228 =
    # 0.4386 s, so one of a run's own evaluations (eval.scenarios 30: 90 tasks of train_val) 39.47 s;
    # before and after: 78.95 s.
    assert (cfg.eval.split, cfg.eval.scenarios, cfg.eval.every, cfg.eval.before_after) == ("train_val", 30, 2, True)
    # 1,200 s left: (1200 - 3 x 100) / 3 arms = 300 s a run; 300 - 78.95 = 221.05 s x 0.5 x 960 =
    # 106,105 tokens, 1.97 steps: no evaluation between steps; less one step: 52,210.
    budget, rule = bench.rl_budget(_sft_done(100.0), 1200.0, cfg)
    assert budget == 52210 and rule.endswith("= 52210 tokens") and "79 s of it its own evaluations" in rule
    # 3,000 s left: 900 s a run; 821.05 s buy 394,105 tokens, 7.3 steps: 3 evaluations between steps
    # (118.42 s) more; 900 - 197.37 = 702.63 s x 480 = 337,263 tokens, less one step: 283,368.
    assert bench.rl_budget(_sft_done(100.0), 3000.0, cfg)[0] == 283368
    # 600 s left: 100 s a run, 21.05 s after its evaluations, 10,105 tokens: less than one step, so no RL
    budget, rule = bench.rl_budget(_sft_done(100.0), 600.0, cfg)
    assert budget is None and rule.endswith("RL not run")
    # no time left at all (the SFT evaluation alone overran): no RL either, not a negative budget
    assert bench.rl_budget(_sft_done(100.0), -50.0, cfg)[0] is None
    # --until sage: one arm, whose two evaluations count 1.5 x eval sft: 450 s; 371.05 s buy 3.3 steps:
    # one evaluation between steps more: 450 - 118.42 = 331.58 s x 480 = 159,158 tokens, less one
    # step: 105,263.
    budget, rule = bench.rl_budget(_sft_done(100.0), 600.0, cfg, arms=1)
    assert budget == 105263 and rule.startswith("left 600 s - 1.5 x eval sft 100 s = 450 s for RL")


def test_quick_gpu_recipe_stops_at_its_deadline_and_resumes_into_rl(tmp_path, monkeypatch):
    """No time left after the SFT models: base and the SFT models only. The same folder run again
    with time left reads those stages back (not trained or evaluated again) and runs the three RL
    arms at one budget."""
    monkeypatch.chdir(ROOT)
    bench, out = _bench(), tmp_path / "g"

    def run(deadline: float) -> dict:
        row = bench.main(["--quick", "--deadline-s", str(deadline), "--out", str(out), "--results", str(out)])
        assert json.loads((out / "laptop_recipe.json").read_text()) == json.loads(json.dumps(row))
        assert row["deadline_s"] == deadline and row["device"] == "cpu" and (out / "laptop_recipe.png").is_file()
        return row

    row = run(0.0)  # the deadline passed during SFT's evaluation
    assert row["models"] == ["base", "sft", "sft_nolib", "sft_inline"]
    assert row["budget_rule"].endswith("RL not run")
    assert row["sampled_token_budget"] is None and not (out / "sage").exists()
    made = {p: (out / p).stat().st_mtime_ns for p in ("sft/result.json", "eval/sft_dev/outcomes.json")}

    row = run(3600.0)
    assert {p: (out / p).stat().st_mtime_ns for p in made} == made  # read back
    assert row["models"] == [
        "base",
        "sft",
        "sft_nolib",
        "sft_inline",
        "grpo_nolib",
        "grpo_lib",
        "sage",
        "sage_nolib",
    ]
    budget = row["sampled_token_budget"]
    assert row["budget_rule"].endswith(f"= {budget} tokens") and budget > 0
    for arm in ("sage", "grpo_lib", "grpo_nolib"):
        assert row[f"sampled_tokens_{arm}"] >= budget or row[f"rl_steps_{arm}"] == 3  # the toy step cap


def test_quick_gpu_recipe_headline(tmp_path, monkeypatch):
    """--until sage: the library SFT model, with and without its library, and SAGE alone, with the
    whole time left as its budget; no base, no library-free expert, no GRPO arm."""
    monkeypatch.chdir(ROOT)
    out = tmp_path / "g"
    row = _bench().main(
        ["--quick", "--until", "sage", "--deadline-s", "3600", "--out", str(out), "--results", str(out)]
    )
    assert row["until"] == "sage" and row["models"] == ["sft", "sft_nolib", "sage", "sage_nolib"]
    assert "heldout_tgc_sage_minus_sft" in row and row["heldout_tgc_sage_minus_sft_ci"] is not None
    assert not any((out / d).exists() for d in ("grpo_lib", "grpo_nolib", "sft_inline", "expert_inline"))
    assert not any(p.name.startswith("base_") for p in (out / "eval").iterdir())
    assert row["budget_rule"].startswith("left ") and "1.5 x eval sft" in row["budget_rule"]
    budget = row["sampled_token_budget"]
    assert row["sampled_tokens_sage"] >= budget or row["rl_steps_sage"] == 3  # the toy step cap


def test_a_signal_in_sft_ends_the_run_in_one_line(tmp_path, monkeypatch, capsys):
    from sage_rl.train.sft_resume import SFTStopped

    monkeypatch.chdir(ROOT)
    bench = _bench()

    def stopped(*args, **kwargs):
        raise SFTStopped("SFT stopped by a signal after step 3 of 8; it resumes there")

    monkeypatch.setattr(bench.laptop_recipe, "run", stopped)
    out = str(tmp_path / "g")
    with pytest.raises(SystemExit) as e:
        bench.main(["--quick", "--deadline-s", "60", "--out", out, "--results", out])
    err = capsys.readouterr().err
    assert e.value.code == 130 and "after step 3 of 8" in err and "goes on" in err and "Traceback" not in err
