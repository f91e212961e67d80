"""benchmarks/paired.py: two finished evaluations of a run folder, paired as the recipe's table pairs them."""

import json
from pathlib import Path

import pytest
from bench_script import load

from sage_rl.rollout.pool import Screen

ROOT = Path(__file__).resolve().parents[1]
paired = load("paired")


def _eval(run: Path, model: str, rows: list) -> None:
    folder = run / "eval" / f"{model}_train_heldout"
    folder.mkdir(parents=True)
    tgc = 100.0 * sum(r[2] for r in rows) / len(rows)
    metrics = {"tasks": len(rows), "scenarios": len({r[1] for r in rows}), "tgc": tgc, "tgc_ci": [0.0, 100.0],
               "sgc": 0.0, "sgc_ci": [0.0, 0.0], "avg_steps": 1.0, "avg_tokens": 10.0}  # fmt: skip
    (folder / "outcomes.json").write_text(json.dumps({"metrics": metrics, "outcomes": rows}))


def test_a_run_folders_pair_by_hand(tmp_path, capsys):
    (tmp_path / "sage").mkdir()
    screen = Screen(0, {"mail_a": 0.5, "note_c": 0.0}, 90, 1.0)  # mail_a in the pool
    (tmp_path / "sage" / "screens.jsonl").write_text(json.dumps(screen.row()) + "\n")
    scen = ["mail_a-s1", "mail_a-s2", "note_c-s1", "note_c-s2"]
    _eval(tmp_path, "sft", [[f"{s}_1", s, s == "note_c-s1"] for s in scen])
    _eval(tmp_path, "sage", [[f"{s}_1", s, s.startswith("mail_a")] for s in scen])
    row = paired.main([str(tmp_path), "sage", "sft", "--json", str(tmp_path / "out.json")])
    assert row["heldout_tgc_sage_minus_sft"] == pytest.approx(25.0)  # (2 - 1) of 4 tasks
    assert row["heldout_tgc_sage_minus_sft_pool"] == pytest.approx(100.0)  # mail_a: 2 of 2 against 0
    assert row["heldout_tgc_sage_minus_sft_offpool"] == pytest.approx(-50.0)  # note_c: 0 against 1 of 2
    assert row["heldout_steps_sage_minus_sft"] is None  # no trajectories: n/a, not 0
    assert json.loads((tmp_path / "out.json").read_text())["pool_templates_sage"] == ["mail_a"]
    out = capsys.readouterr().out
    assert "heldout_tgc_sage_minus_sft: +25.00" in out and "heldout_steps_sage_minus_sft: n/a" in out
    with pytest.raises(SystemExit, match="grpo_lib has no finished evaluation"):
        paired.main([str(tmp_path), "grpo_lib", "sft"])


def test_an_arms_in_run_evaluations_pair_on_its_loops_split(tmp_path, capsys):
    """``arm@N``: the arm's greedy evaluation at step N during its run, paired with another on the
    split its loop evaluated (from its config), with the templates where they differ listed."""
    evals = tmp_path / "sage" / "evals"
    evals.mkdir(parents=True)
    (tmp_path / "sage" / "config.yaml").write_text("eval:\n  split: train_val\n  every: 2\n")
    scen = ["mail_a-s1", "note_c-s1"]
    for step, solved in ((0, {"mail_a-s1", "note_c-s1"}), (2, {"note_c-s1"})):
        rows = [[f"{s}_{n}", s, s in solved] for s in scen for n in (1, 2)]
        metrics = {"tasks": 4, "scenarios": 2, "tgc": 50.0 * len(solved), "tgc_ci": [0.0, 100.0],
                   "sgc": 50.0 * len(solved), "sgc_ci": [0.0, 100.0], "avg_steps": 1.0, "avg_tokens": 10.0}  # fmt: skip
        (evals / f"step_{step:06d}.json").write_text(json.dumps({"metrics": metrics, "outcomes": rows, "wall_s": 1.0}))
    row = paired.main([str(tmp_path), "sage@2", "sage@0"])
    assert row["split"] == "train_val"
    assert row["train_val_tgc_sage@2_minus_sage@0"] == pytest.approx(-50.0)  # mail_a's 2 tasks of 4 lost
    assert row["templates_changed"] == {"mail_a": {"tasks": 2, "a": 0, "b": 2, "changed": 2}}
    assert "  mail_a: 0 against 2 of 2 (2 changed)" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="sage has no evaluation at step 4"):
        paired.main([str(tmp_path), "sage@4", "sage@0"])
    with pytest.raises(SystemExit, match="sft has no finished evaluation of train_val"):
        paired.main([str(tmp_path), "sage@2", "sft"])  # a named model: read on the loop's split


def test_an_evaluation_folder_pairs_with_an_in_run_evaluation(tmp_path, capsys):
    """A path names a ``sage-rl eval`` folder (a control evaluated outside the run: a perturbed
    model), read on the split its config names and labelled by the folder's name."""
    (tmp_path / "sage" / "evals").mkdir(parents=True)
    (tmp_path / "sage" / "config.yaml").write_text("eval:\n  split: train_val\n")
    rows = [["mail_a-s1_1", "mail_a-s1", True], ["note_c-s1_1", "note_c-s1", True]]
    metrics = {"tasks": 2, "scenarios": 2, "tgc": 100.0, "tgc_ci": [100.0, 100.0], "sgc": 100.0,
               "sgc_ci": [100.0, 100.0], "avg_steps": 1.0, "avg_tokens": 10.0}  # fmt: skip
    (tmp_path / "sage" / "evals" / "step_000000.json").write_text(json.dumps({"metrics": metrics, "outcomes": rows}))
    ctl = tmp_path / "ctl" / "noise_train_val"
    ctl.mkdir(parents=True)
    (ctl / "config.yaml").write_text("split: train_val\n")
    lost = [rows[0][:2] + [False], rows[1]]
    (ctl / "outcomes.json").write_text(json.dumps({"metrics": metrics | {"tgc": 50.0}, "outcomes": lost}))
    row = paired.main([str(tmp_path), str(ctl), "sage@0"])
    assert row["split"] == "train_val" and row["train_val_tgc_noise_train_val_minus_sage@0"] == pytest.approx(-50.0)
    assert row["templates_changed"] == {"mail_a": {"tasks": 1, "a": 0, "b": 1, "changed": 1}}
    assert "noise_train_val: 2 tasks, 2 scenarios" in capsys.readouterr().out
    (ctl / "config.yaml").write_text("split: dev\n")
    with pytest.raises(SystemExit, match="different splits"):
        paired.main([str(tmp_path), str(ctl), "sage@0"])
    (ctl / "config.yaml").unlink()
    with pytest.raises(SystemExit, match="does not name the split"):
        paired.main([str(tmp_path), str(ctl), "sage@0"])


def test_a_sage_rl_eval_folder_reads_as_the_recipe_saves_it(tmp_path):
    """``sage-rl eval`` writes no ``outcomes.json``: its folder reads as ``EvalResult.record`` from
    its metrics and its headline strategy's trajectories (the scripted expert, 2 scenarios)."""
    from sage_rl.runs.eval import run_evaluation
    from sage_rl.settings import EvalRunConfig

    ev = EvalRunConfig(out_dir=str(tmp_path / "ev"), split="train_val", limit_scenarios=2,
                       policy={"kind": "scripted"}, pocketworld={"sandbox": False})  # fmt: skip
    saved = run_evaluation(ev, title="scripted", resume=False).record()
    assert not (tmp_path / "ev" / "outcomes.json").exists()
    got = paired.folder_record(tmp_path / "ev")
    assert got["outcomes"] == saved["outcomes"] and len(got["outcomes"]) == 6
    assert got["metrics"]["tgc"] == saved["metrics"]["tgc"]
    lines = (tmp_path / "ev" / "trajectories.same_scenario.jsonl").read_text().splitlines()
    (tmp_path / "ev" / "trajectories.same_scenario.jsonl").write_text(lines[0] + "\n")  # a chain lost
    with pytest.raises(SystemExit, match="3 tasks in its trajectories, 6 in its metrics"):
        paired.folder_record(tmp_path / "ev")
    (tmp_path / "ev" / "metrics.json").unlink()
    with pytest.raises(SystemExit, match="holds no finished evaluation"):
        paired.folder_record(tmp_path / "ev")
