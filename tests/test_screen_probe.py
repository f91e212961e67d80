"""benchmarks/screen_probe.py: one template the screen's way, greedy and sampled on the same scenarios."""

from pathlib import Path

import pytest
from bench_script import load

ROOT = Path(__file__).resolve().parents[1]
screen_probe = load("screen_probe")


def test_summary_counts_successes_by_split_mode_and_scenario():
    rows = [
        {"split": "train", "mode": "greedy", "scenario": "a-s1", "success": True},
        {"split": "train", "mode": "greedy", "scenario": "a-s1", "success": False},
        {"split": "train", "mode": "greedy", "scenario": "a-s2", "success": False},
        {"split": "train", "mode": "T=0.5", "scenario": "a-s1", "success": True},
        {"split": "train", "mode": "T=0.5", "scenario": "a-s2", "success": True},
        {"split": "train_heldout", "mode": "T=0.5", "scenario": "a-s9", "success": False},
    ]
    s = screen_probe.summary(rows)
    assert s["train greedy"] == {"success": 1, "tasks": 3, "by_scenario": {"a-s1": "1/2", "a-s2": "0/1"}}
    assert s["train T=0.5"]["success"] == 2 and s["train T=0.5"]["tasks"] == 2
    assert s["train_heldout T=0.5"] == {"success": 0, "tasks": 1, "by_scenario": {"a-s9": "0/1"}}
    assert set(s) == {"train greedy", "train T=0.5", "train_heldout T=0.5"}


def test_the_same_scenarios_run_greedy_once_and_sampled_n_times(tmp_path):
    from sage_rl.models import save_plain, tiny_model

    model, tok = tiny_model(seed=0)
    save_plain(model, tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    small = [
        "pocketworld.sandbox=false",
        "agent.max_steps=1",
        "agent.max_tokens_per_turn=6",
        "agent.token_budget=null",
    ]
    out = screen_probe.main(
        [str(tmp_path / "tiny"), "notes_count_tag", "--scenarios", "2", "--samples", "3", "--json",
         str(tmp_path / "p.json"), *small]
    )  # fmt: skip
    rows = out["rows"]
    k = 2  # rollout.chain_length of configs/laptop_recipe.yaml
    for split in ("train", "train_heldout"):
        greedy = [r for r in rows if r["split"] == split and r["mode"] == "greedy"]
        sampled = [r for r in rows if r["split"] == split and r["mode"] == "T=0.5"]
        assert len(greedy) == 2 * k and len(sampled) == 2 * 3 * k
        assert {r["scenario"] for r in greedy} == {r["scenario"] for r in sampled}  # the same scenarios
        assert len({r["scenario"] for r in greedy}) == 2
        assert all(r["task"].startswith("notes_count_tag") for r in greedy + sampled)
    heldout = {r["scenario"] for r in rows if r["split"] == "train_heldout"}
    train = {r["scenario"] for r in rows if r["split"] == "train"}
    assert not heldout & train
    assert (tmp_path / "p.json").is_file()
    with pytest.raises(SystemExit):
        screen_probe.main([str(tmp_path / "tiny"), "no_such_template", *small])
