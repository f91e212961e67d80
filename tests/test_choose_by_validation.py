"""``benchmarks/choose_by_validation.py``: a run's saved models judged after the fact on
``train_val`` by ``eval.keep: best``'s rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_script import load

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["pocketworld.sandbox=false", "agent.max_steps=1", "agent.max_tokens_per_turn=6", "agent.token_budget=null",
         "recipe.eval.concurrency=1"]  # fmt: skip


def _bench():
    return load("choose_by_validation")


def test_models_are_evaluated_on_train_val_once_and_the_reported_split_is_refused(tiny_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    bench, run = _bench(), tmp_path / "run"
    models = ["--model", f"0={tiny_dir}", "--model", f"3={tiny_dir}"]
    row = bench.main([str(run), *models, "--scenarios", "1", "--json", str(tmp_path / "c.json"), *SMALL])
    assert row["chosen_step"] == 0  # the same weights score the same: a tie keeps the start
    assert json.loads((tmp_path / "c.json").read_text()) == json.loads(json.dumps(row))
    saved = run / "eval" / "sage_val_step3_train_val" / "outcomes.json"
    outcomes = json.loads(saved.read_text())["outcomes"]
    assert len(outcomes) == 3 and all(int(sc.rsplit("-s", 1)[1]) >= 2**32 for _, sc, _ in outcomes)
    stamp = saved.stat().st_mtime_ns
    again = bench.main([str(run), *models, "--scenarios", "1", *SMALL])["scores"]
    assert json.dumps(again) == json.dumps(row["scores"])
    assert saved.stat().st_mtime_ns == stamp  # read back, not run again
    for split in ("train_heldout", "dev"):
        with pytest.raises(SystemExit, match="choosing on it fits them"):
            bench.main([str(run), *models, "--split", split, *SMALL])
    with pytest.raises(SystemExit, match="STEP=FOLDER"):
        bench.main([str(run), "--model", f"x={tiny_dir}", "--model", f"3={tiny_dir}", *SMALL])
