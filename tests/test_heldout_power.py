"""benchmarks/heldout_power.py: the held-out split's sizing, checked against numbers by hand."""

import json
from pathlib import Path

import pytest
from bench_script import load

ROOT = Path(__file__).resolve().parents[1]
power = load("heldout_power")


def test_per_scenario_differences_over_the_shared_tasks():
    a = [["t1", "s1", True], ["t2", "s1", False], ["t3", "s2", True], ["t9", "s9", True]]
    b = [["t1", "s1", False], ["t2", "s1", False], ["t3", "s2", True]]
    assert power.scenario_differences(a, b) == [50.0, 0.0]  # s1: (1 + 0) / 2 tasks; t9 unpaired


def test_gate_chance_by_hand():
    # se 1: the gate is the +5 floor; a true +5 is measured above it half the time
    assert power.gate_chance(5.0, 1.0) == pytest.approx(0.5)
    # se 5: the interval's 9.8 is the bar; P(Z > (9.8 - 5) / 5 = 0.96) = 0.1685
    assert power.gate_chance(5.0, 5.0) == pytest.approx(0.1685, abs=1e-4)


def test_the_script_sizes_from_two_evaluations(tmp_path, capsys):
    rows_a = [[f"t{i}_{j}", f"s{i}", (i + j) % 2 == 0] for i in range(6) for j in range(3)]
    rows_b = [[f"t{i}_{j}", f"s{i}", j == 0] for i in range(6) for j in range(3)]
    for name, rows in (("a", rows_a), ("b", rows_b)):
        (tmp_path / f"{name}.json").write_text(json.dumps({"outcomes": rows}))
    got = power.main([str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--sizes", "6,24", "--effects", "5"])
    # per scenario: even i -> a solves j = 0, 2 against b's j = 0: +33.3; odd i -> a solves j = 1 only: 0
    assert got["scenarios"] == 6 and got["sd"] == pytest.approx(18.257, abs=1e-3)
    assert [r["half_width"] for r in got["rows"]] == [pytest.approx(1.96 * 18.257 / 6**0.5, abs=0.01),
                                                      pytest.approx(1.96 * 18.257 / 24**0.5, abs=0.01)]  # fmt: skip
    assert "6 scenarios; difference +16.67" in capsys.readouterr().out
