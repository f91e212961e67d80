"""``benchmarks/sft_phases.py``: a whole SFT run's time by phase, per variant of the recipe's SFT."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_script import load
from test_sft import examples

from sage_rl.data.records import write_jsonl

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    return load("sft_phases")


def test_phases_by_hand():
    # steps start at 0, 1, 2, 5, 6 (5 steps), the run ends at 8; an evaluation ends every 3rd step:
    # steps 1, 2, 4 take 1 s (the median step); step 3 takes 3 s, 2 s of it the evaluation; step 5
    # and the end take 8 - 6 = 2 s
    assert _bench().timeline([0.0, 1.0, 2.0, 5.0, 6.0], 8.0, 3) == {"step_s": 1.0, "eval_s": 2.0, "end_s": 2.0}
    assert _bench().timeline([0.0, 1.0, 3.0], 3.5, 0) == {"step_s": 1.5, "eval_s": None, "end_s": 0.5}


def test_each_variant_trains_the_recipes_sft_with_its_own_change(tiny_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    write_jsonl(examples(8), tmp_path / "data.jsonl")
    bench = _bench()
    out = bench.main([str(tmp_path / "data.jsonl"), "--model", str(tiny_dir), "--steps", "2",
                      "--variants", "recipe,unpacked", "--json", str(tmp_path / "p.json")])  # fmt: skip
    recipe, unpacked = out["variants"]
    assert (recipe["variant"], recipe["steps"], unpacked["overrides"]) == ("recipe", 2, {"optim.packing": False})
    assert unpacked["steps"] == 2  # as many epochs as the steps take
    assert all(r["setup_s"] > 0 and r["step_s"] > 0 and r["end_s"] > 0 for r in out["variants"])
    train_cfg = bench.load_config(bench.TrainConfig, "configs/laptop_recipe.yaml", [])
    base = bench.sft_config(train_cfg, train_cfg.recipe, tmp_path / "data.jsonl", tmp_path)
    cfg = bench.variant_config(base, bench.VARIANTS["dense"], 3, tmp_path / "o")
    assert cfg.optim.epochs >= 1e6
    assert (cfg.optim.attention, cfg.optim.max_steps, cfg.output.save_every_s) == ("dense", 3, None)
    assert cfg.optim.packing == base.optim.packing and cfg.output.eval_every == base.output.eval_every
    with pytest.raises(SystemExit, match="unknown variants"):
        bench.main([str(tmp_path / "data.jsonl"), "--variants", "recipe,fast"])
    with pytest.raises(SystemExit, match="no SFT setting 'optim.nope'"):
        bench.variant_config(base, {"optim.nope": 1}, 3, tmp_path / "o")
