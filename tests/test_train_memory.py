"""``benchmarks/train_memory.py``: one training step's peak memory by sample length, per attention path."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_script import load

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    return load("train_memory")


def test_rows_share_the_opening_and_reach_each_length_by_hand():
    # 20 tokens after a 5-token opening: 15 in three turns of 5, each 3 generated + 2 observed;
    # 14: three turns of 3, each 2 + 1
    a, b = _bench().rows_for([20, 14], 5, vocab=50)
    assert a["prompt"] == b["prompt"] and len(a["prompt"]) == 5
    assert [(len(g), len(o)) for g, o in a["turns"]] == [(3, 2)] * 3
    assert [(len(g), len(o)) for g, o in b["turns"]] == [(2, 1)] * 3
    assert (a["adv"], b["adv"]) == (-1.0, 1.0)
    assert all(3 <= t < 50 for g, o in a["turns"] for t in g + o)


def test_a_length_within_the_opening_is_refused():
    with pytest.raises(SystemExit, match="not longer than the 5-token opening"):
        _bench().rows_for([8], 5, vocab=50)


def test_each_variant_runs_its_own_attention_path_in_its_own_process(capsys):
    out = _bench().main(["--model", "tiny", "--lengths", "90,70", "--prompt", "30",
                         "--variants", "padding,causal_cap", "--cap", "100"])  # fmt: skip
    padding, capped = out["runs"]
    assert (padding["variant"], padding["causal_used"], capped["causal_used"]) == ("padding", False, True)
    assert padding["lengths"] == capped["lengths"] == [90, 70]
    assert all(r["step_gb"] > 0 and r["peak_gb"] > r["step_gb"] and r["seconds"] > 0 for r in out["runs"])
    assert padding["ratio_to_padding"] == 1.0
    assert capped["ratio_to_padding"] == pytest.approx(capped["step_gb"] / padding["step_gb"])


def test_a_child_past_the_limit_is_stopped_and_reported():
    out = _bench().main(["--model", "tiny", "--lengths", "90,70", "--prompt", "30",
                         "--variants", "causal", "--limit-gb", "0.05"])  # fmt: skip
    (run,) = out["runs"]
    assert run["over_limit"] is True and run["limit_gb"] == pytest.approx(0.05)
    assert "step_gb" not in run and "ratio_to_padding" not in run


def test_an_unknown_variant_is_refused():
    with pytest.raises(SystemExit):
        _bench().main(["--model", "tiny", "--variants", "causal,flash"])
