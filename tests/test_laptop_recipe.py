"""benchmarks/laptop_recipe.py --quick: every stage at toy size with the tiny model, the results JSON
with the issue's keys, the learning-curve PNG, equal sampled-token budgets, and resuming."""

import importlib.util
import json
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("laptop_recipe", ROOT / "benchmarks" / "laptop_recipe.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_quick_laptop_recipe(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the config's `extends` and default paths are relative to the repository
    bench = _bench()
    # stopped after SFT: base and SFT reported, no RL run yet; the full run below resumes from it
    part = bench.main(["--quick", "--out", str(tmp_path / "lr"), "--until", "sft"])
    assert part["models"] == ["base", "sft"] and "heldout_tgc_sft_minus_base" in part
    assert "heldout_tgc_sage" not in part and part["sampled_tokens_sage"] is None
    assert not (tmp_path / "lr" / "sage").exists()
    row = bench.main(["--quick", "--out", str(tmp_path / "lr")])
    saved = json.loads((tmp_path / "lr" / "laptop_recipe.json").read_text())
    assert saved == json.loads(json.dumps(row))
    for split in ("heldout", "dev"):
        for metric in ("tgc", "sgc", "steps", "tokens"):
            for model in ("base", "sft", "sage", "grpo"):
                assert f"{split}_{metric}_{model}" in row, (split, metric, model)
        lo, hi = row[f"{split}_tgc_sft_ci"]
        assert 0.0 <= lo <= row[f"{split}_tgc_sft"] <= hi <= 100.0
    assert row["heldout_tasks"] == 3 and row["dev_tasks"] == 3  # one scenario of each at toy size
    # equal sampled tokens: both runs stop at the first step that reaches the same budget
    budget = row["sampled_token_budget"]
    assert row["sampled_tokens_sage"] >= budget and row["sampled_tokens_grpo"] >= budget
    for name in ("sage", "grpo"):
        rows = [json.loads(x) for x in (tmp_path / "lr" / name / "metrics.jsonl").read_text().splitlines()]
        totals = [r["sampled_tokens_total"] for r in rows if "sampled_tokens_total" in r]
        assert totals[-1] == row[f"sampled_tokens_{name}"] and all(t < budget for t in totals[:-1])
    grpo_cfg = (tmp_path / "lr" / "grpo" / "config.yaml").read_text()
    assert "use_skills: false" in grpo_cfg and "chain_length: 1" in grpo_cfg and "reward: outcome" in grpo_cfg
    assert (tmp_path / "lr" / "laptop_recipe.png").stat().st_size > 10_000
    # a rerun finds every stage done (nothing is trained or evaluated again) and reports the same
    again = bench.main(["--quick", "--out", str(tmp_path / "lr")])
    volatile = ("machine", "times_s")
    assert {k: v for k, v in again.items() if k not in volatile} == {
        k: v for k, v in row.items() if k not in volatile
    }
    assert all(t < 5 for t in again["times_s"].values())


def test_quick_laptop_recipe_side_by_side(tmp_path, monkeypatch):
    """--parallel: evaluations run two at a time in processes with one torch thread each, while
    SAGE and GRPO still train one after another with all threads (two RL trainers side by side do
    not fit 24 GB); the results have the same shape and equal-budget stops."""
    monkeypatch.chdir(ROOT)
    bench = _bench()
    row = bench.main(["--quick", "--parallel", "--out", str(tmp_path / "lr")])
    assert row["models"] == ["base", "sft", "sage", "grpo"]
    assert {"sage", "grpo", "eval sage + grpo"} <= set(row["times_s"])
    budget = row["sampled_token_budget"]
    assert row["sampled_tokens_sage"] >= budget and row["sampled_tokens_grpo"] >= budget
    for name in ("sage", "grpo"):
        assert _threads(tmp_path / "lr" / name / "config.yaml") is None  # all cores
        for split in ("train_heldout", "dev"):
            folder = tmp_path / "lr" / "eval" / f"{name}_{split}"
            assert (folder / "outcomes.json").is_file()
            assert _threads(folder / "config.yaml") == 1
    assert row["heldout_tasks"] == 3 and 0.0 <= row["heldout_tgc_grpo"] <= 100.0


def _threads(config_yaml: Path) -> int | None:
    """``policy.threads`` of a written run config."""
    return yaml.safe_load(config_yaml.read_text())["policy"]["threads"]
