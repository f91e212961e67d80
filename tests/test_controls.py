"""The laptop experiment's controls (issue 27, sage_rl/recipe/controls.py): each arm's config differs
from SAGE's in what it claims and nothing else; paired differences and learning curves computed
from evaluations by hand."""

import json
from pathlib import Path

import pytest

from sage_rl.config import load_config
from sage_rl.recipe.controls import (
    by_template,
    curve,
    differences,
    grpo_config,
    on_pool,
    paired_curve,
    screened_templates,
    template_of,
    units,
    without_library,
)
from sage_rl.recipe.pipeline import train_config
from sage_rl.rollout.pool import Screen
from sage_rl.settings import EvalRunConfig, TrainConfig

ROOT = Path(__file__).resolve().parents[1]


def _sage(tmp_path) -> TrainConfig:
    cfg = load_config(TrainConfig, ROOT / "configs/laptop_recipe.yaml", ["pocketworld.sandbox=false"])
    return train_config(cfg, tmp_path / "sft" / "final", tmp_path / "sage")


def _without(data: dict, *paths: str) -> dict:
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()}
    for path in paths:
        section, _, key = path.partition(".")
        if key:
            data[section].pop(key)
        else:
            data.pop(section)
    return data


def test_the_laptop_config_asks_for_the_issues_sizes(tmp_path):
    sage = _sage(tmp_path)
    r = sage.rollout
    assert r.groups_per_step >= 8 and r.group_size >= 4 and r.chain_length == 2
    assert r.reward == "skill_integrated" and r.pool == "screened" and sage.trainer.warmup_steps > 0
    assert sage.eval.every > 0 and sage.eval.scenarios and sage.eval.before_after
    # each arm ends with its best model by validation scenarios that no result reports
    assert sage.eval.keep == "best" and sage.eval.split == "train_val"
    assert sage.recipe is None and sage.init_from == str(tmp_path / "sft" / "final")
    gpu = load_config(TrainConfig, ROOT / "configs/gpu_recipe.yaml", [])
    assert gpu.rollout.groups_per_step >= 8 and gpu.rollout.group_size >= 8
    laptop = load_config(TrainConfig, ROOT / "configs/laptop_recipe.yaml", [])
    for full in (laptop, gpu):  # every SFT arm trains every layer (the main job's SFT freezes 10)
        assert full.recipe.sft.optim.freeze_layers == 0


def test_without_library_changes_only_the_library_switch(tmp_path):
    sage = _sage(tmp_path)
    plain = without_library(sage)
    assert sage.skills.use_skills and not plain.skills.use_skills
    a, b = sage.model_dump(mode="json"), plain.model_dump(mode="json")
    assert _without(a, "skills.use_skills") == _without(b, "skills.use_skills")
    ev = load_config(EvalRunConfig, None, [])
    assert type(without_library(ev)) is EvalRunConfig and not without_library(ev).skills.use_skills


@pytest.mark.parametrize("library", [True, False], ids=["grpo_lib", "grpo_nolib"])
def test_a_grpo_arm_is_k1_outcome_reward_with_the_same_task_samples(tmp_path, library):
    sage = _sage(tmp_path)
    start = tmp_path / ("sft" if library else "sft_inline") / "final"
    arm = grpo_config(sage if library else without_library(sage), start, tmp_path / "arm", library)
    r = arm.rollout
    assert r.chain_length == 1 and r.reward == "outcome" and arm.skills.use_skills is library
    assert r.groups_per_step * r.chain_length == sage.rollout.groups_per_step * sage.rollout.chain_length
    assert arm.init_from == str(start) and arm.out_dir == str(tmp_path / "arm")
    changed = ("rollout.chain_length", "rollout.reward", "rollout.groups_per_step", "skills.use_skills")
    a = _without(sage.model_dump(mode="json"), *changed, "init_from", "out_dir")
    b = _without(arm.model_dump(mode="json"), *changed, "init_from", "out_dir")
    assert a == b  # G, trainer, seed, budget, pool, evaluation: all SAGE's


def _ev(rows, per_task=None) -> dict:
    """An evaluation: outcome rows (task, scenario, success) and per-task [steps, tokens]."""
    return {"outcomes": [list(r) for r in rows], "per_task": per_task or {}}


def test_paired_differences_by_hand():
    # two scenarios of two tasks; b solves s1 fully, a solves s1 and s2's first task
    rows_a = [("s1_1", "s1", True), ("s1_2", "s1", True), ("s2_1", "s2", True), ("s2_2", "s2", False)]
    rows_b = [("s1_1", "s1", True), ("s1_2", "s1", True), ("s2_1", "s2", False), ("s2_2", "s2", False)]
    per_a = {"s1_1": [1, 100], "s1_2": [1, 100], "s2_1": [2, 200], "s2_2": [3, 300]}
    per_b = {"s1_1": [2, 150], "s1_2": [2, 150], "s2_1": [2, 200], "s2_2": [3, 300]}
    d = differences("heldout", "x", "y", _ev(rows_a, per_a), _ev(rows_b, per_b))
    assert d["heldout_tgc_x_minus_y"] == pytest.approx(25.0)  # 75% - 50%
    assert d["heldout_sgc_x_minus_y"] == pytest.approx(0.0)  # s1 solved by both, s2 by neither
    assert d["heldout_steps_x_minus_y"] == pytest.approx(-0.5)  # (1+1+2+3 - (2+2+2+3)) / 4
    assert d["heldout_tokens_x_minus_y"] == pytest.approx(-25.0)
    lo, hi = d["heldout_tgc_x_minus_y_ci"]
    assert 0.0 <= lo <= 25.0 <= hi <= 50.0  # resampling scenarios: s1 adds 0, s2 adds 50
    # no per-task figures (trajectories gone): steps and tokens are None, not 0
    d = differences("heldout", "x", "y", _ev(rows_a), _ev(rows_b))
    assert d["heldout_steps_x_minus_y"] is None and d["heldout_tokens_x_minus_y_ci"] is None
    assert [u["steps"] for u in units(_ev(rows_a, per_a))] == [1, 1, 2, 3]


def test_the_figures_paired_gaps_by_hand():
    """The figure's last panel: each pair of PAIRS both evaluated, a - b paired, in PAIRS' order,
    without sft - base; a pair with a model missing, or on the other split only, is left out."""
    from sage_rl.recipe.figure import gaps

    two = [("s1_1", "s1"), ("s1_2", "s1"), ("s2_1", "s2"), ("s2_2", "s2")]

    def ev(*solved):
        return {"heldout": _ev([(t, s, ok) for (t, s), ok in zip(two, solved, strict=True)])}

    res = {
        "base": ev(False, False, False, False),
        "sft": ev(True, True, False, False),  # 50%
        "sage": ev(True, True, True, False),  # 75%: +25, s1 adds 0 and s2 +50
        "sft_nolib": ev(True, False, False, False),  # 25%: sft - sft_nolib +25, s1 +50 and s2 0
        "grpo_lib": {"dev": _ev([])},  # another split only
    }
    found = gaps({"results": res})
    assert [g[0] for g in found] == ["sage - sft", "sft - sft_nolib"]
    for _, d, lo, hi in found:
        assert d == pytest.approx(25.0) and lo == pytest.approx(0.0) and hi == pytest.approx(50.0)
    assert gaps({"results": {"sage": res["sft"], "sft": res["sft"]}}) == [("sage - sft", 0.0, 0.0, 0.0)]


def test_the_gain_on_and_off_the_screened_pool_by_hand(tmp_path):
    """Where RL's gain lies: the templates its screens drew (``screens.jsonl``, every screen's pool)
    against the others, each paired over its own scenarios."""
    rows = [
        Screen(0, {"mail_a": 0.5, "todo_b": 0.0, "note_c": 1.0}, 90, 1.0).row(),
        Screen(4, {"mail_a": 0.25, "todo_b": 0.75, "note_c": 1.0}, 90, 1.0).row(),
        # damaged (a rate that is text): left out, as the run that resumes leaves it out
        {"step": 6, "pool": ["note_c"], "success": {"note_c": "0.5"}, "tokens": 9, "seconds": 1.0},
    ]
    (tmp_path / "screens.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pool = screened_templates(tmp_path)
    assert pool == {"mail_a", "todo_b"} and screened_templates(tmp_path / "none") is None
    assert template_of("todo_b-s2147483650") == "todo_b" and template_of("mail_a") == "mail_a"
    sc = {"mail_a-s1": "mail_a", "todo_b-s1": "todo_b", "note_c-s1": "note_c", "note_c-s2": "note_c"}
    rows_b = [(f"{s}_{n}", s, False) for s in sc for n in (1, 2)]
    # the arm solves both tasks of mail_a, one of todo_b's, and loses nothing off the pool
    rows_a = [(f"{s}_{n}", s, s == "mail_a-s1" or (s == "todo_b-s1" and n == 1)) for s in sc for n in (1, 2)]
    rows_b[-1] = ("note_c-s2_2", "note_c-s2", True)  # the start solved one off-pool task the arm fails
    d = on_pool("heldout", "sage", "sft", _ev(rows_a), _ev(rows_b), pool)
    assert d["heldout_tgc_sage_minus_sft_pool"] == pytest.approx(75.0)  # (2 + 1) / 4 tasks
    assert d["heldout_tgc_sage_minus_sft_offpool"] == pytest.approx(-25.0)  # (0 - 1) / 4 tasks
    lo, hi = d["heldout_tgc_sage_minus_sft_offpool_ci"]
    assert -50.0 <= lo <= -25.0 <= hi <= 0.0  # resampling note_c's two scenarios: 0 or -50
    assert on_pool("heldout", "sage", "sft", _ev(rows_a), _ev(rows_b), set())["heldout_tgc_sage_minus_sft_pool"] is None


def test_the_templates_two_evaluations_differ_on_by_hand():
    """Where a difference comes from: per template, the tasks both ran, how many each solved and on
    how many they differ; a template whose gain and loss cancel still shows; one where nothing
    changed, and a task only one evaluation ran, do not."""
    b = _ev([("m-s1_1", "m-s1", True), ("m-s2_1", "m-s2", True), ("t-s1_1", "t-s1", False),
             ("t-s1_2", "t-s1", True), ("n-s1_1", "n-s1", False), ("q-s1_1", "q-s1", True)])  # fmt: skip
    a = _ev([("m-s1_1", "m-s1", False), ("m-s2_1", "m-s2", False), ("t-s1_1", "t-s1", True),
             ("t-s1_2", "t-s1", False), ("n-s1_1", "n-s1", True), ("q-s1_1", "q-s1", True),
             ("x-s1_1", "x-s1", True)])  # fmt: skip
    assert by_template(a, b) == {
        "m": {"tasks": 2, "a": 0, "b": 2, "changed": 2},  # the largest loss first
        "t": {"tasks": 2, "a": 1, "b": 1, "changed": 2},  # one gained, one lost: 0 net
        "n": {"tasks": 1, "a": 1, "b": 0, "changed": 1},
    }
    assert list(by_template(a, b)) == ["m", "t", "n"] and by_template(a, a) == {}


def test_a_curve_starts_from_its_own_start_on_the_loops_scenarios():
    start = _ev([("s1_1", "s1", True), ("s1_2", "s1", False), ("s2_1", "s2", False), ("s2_2", "s2", False)])
    final = _ev([("s1_1", "s1", True), ("s1_2", "s1", True), ("s2_1", "s2", True), ("s2_2", "s2", True)])
    rows = [
        {"step": 1, "sampled_tokens_total": 100},
        {"step": 2, "sampled_tokens_total": 220, "eval/tgc": 100.0},
        {"step": 3, "sampled_tokens_total": 300},
    ]
    # the loop evaluates the first scenario: the start's TGC there is 50, the final model's 100
    assert curve(start, final, rows, 1) == [(0, 50.0), (220, 100.0), (300, 100.0)]
    assert curve(start, final, [], None) == [(0, 25.0)]  # not trained yet: the start alone


def test_a_paired_curve_is_each_points_difference_from_the_start_on_the_same_tasks():
    start = _ev([("s1_1", "s1", True), ("s1_2", "s1", False), ("s2_1", "s2", False), ("s2_2", "s2", False)])
    final = _ev([("s1_1", "s1", True), ("s1_2", "s1", True), ("s2_1", "s2", True), ("s2_2", "s2", True)])
    mid = _ev([("s1_1", "s1", True), ("s1_2", "s1", True), ("s2_1", "s2", True), ("s2_2", "s2", False)])
    other = _ev([("x_1", "x", True)])  # shares no task with the start: left out
    # by hand: mid - start is 0, +100, +100, 0 over the tasks, +50 in each scenario, so every
    # resample of scenarios gives +50; final - start is 0, +100, +100, +100: +50 in s1, +100 in s2,
    # resamples of two scenarios give 50, 75 or 100 (a quarter each at the ends): [50, 100]
    rows = paired_curve(start, [(220, mid), (250, other)], (300, final), None)
    assert rows == [[220, 50.0, 50.0, 50.0], [300, 75.0, 50.0, 100.0]]
    # the loop's first scenario only: the final model is taken on it too
    s1 = _ev([("s1_1", "s1", True), ("s1_2", "s1", True)])
    assert paired_curve(start, [(220, s1)], (300, final), 1) == [[220, 50.0, 50.0, 50.0], [300, 50.0, 50.0, 50.0]]



def test_the_library_free_expert_collects_until_it_has_as_many_examples(tmp_path):
    """``collect_at_least`` resumes the collection with more scenarios (the plan's prefix kept) until
    its dataset reaches the count; called again with the count reached, it collects nothing."""
    from sage_rl.data.records import read_jsonl
    from sage_rl.recipe.pipeline import collect_at_least
    from sage_rl.runs.collect import run_collect
    from sage_rl.settings import CollectConfig

    cfg = CollectConfig.model_validate(
        {
            "out_dir": str(tmp_path / "inline"),
            "num_scenarios": 4,
            "concurrency": 1,
            "pocketworld": {"sandbox": False},
            "skills": {"use_skills": False},
        }
    )
    first = run_collect(cfg)
    data = Path(cfg.out_dir) / f"{cfg.name}.jsonl"
    before, want = read_jsonl(data), first["examples"] + 5
    asked: list[int] = []

    def counted(c: CollectConfig) -> dict:
        asked.append(c.num_scenarios)
        return run_collect(c)

    got = collect_at_least(cfg, want, counted)
    after = read_jsonl(data)
    assert got["examples"] == len(after) >= want
    assert asked and all(n > 4 for n in asked)  # never the finished first plan again: only more
    assert after[: len(before)] == before  # the first scenarios' examples stay first
    n = len(asked)
    assert collect_at_least(cfg, want, counted) == got and len(asked) == n  # done: nothing runs


def test_a_damaged_saved_evaluation_is_named_and_its_point_left_out(tmp_path, capsys):
    from sage_rl.recipe.figure import _saved_eval
    from sage_rl.train.layout import RunFolder

    run = RunFolder.of(tmp_path)
    run.evals.mkdir()
    run.eval_file(2).write_text(json.dumps({"metrics": {"tgc": 50.0}, "outcomes": [["t", "s", True]]}))
    run.eval_file(4).write_text('{"metrics": {"tgc": 5')  # torn
    assert _saved_eval(run, 2)["outcomes"] == [["t", "s", True]]
    assert _saved_eval(run, 3) is None and _saved_eval(run, None) is None  # none saved: no point, no noise
    assert capsys.readouterr().err == ""
    assert _saved_eval(run, 4) is None
    assert "step_000004.json: not a saved evaluation" in capsys.readouterr().err.replace("\n", "")


def test_a_runs_own_curve_ends_are_its_step0_and_last_saved_evaluations(tmp_path):
    """On a split the recipe does not report (train_val), an arm's curve runs from its own step-0
    evaluation to its last; a file in evals/ that is not a step's is left alone."""
    from sage_rl.recipe.figure import _own_ends
    from sage_rl.train.layout import RunFolder

    run = RunFolder.of(tmp_path)
    assert _own_ends(run) is None  # no evaluations yet
    run.evals.mkdir()
    for step, tgc in ((0, 40.0), (2, 50.0), (10, 60.0)):
        run.eval_file(step).write_text(json.dumps({"metrics": {"tgc": tgc}, "outcomes": [["t", "s", True]]}))
    (run.evals / "step_old.json").write_text("{}")
    first, last = _own_ends(run)
    assert (first["metrics"]["tgc"], last["metrics"]["tgc"]) == (40.0, 60.0)
    run.eval_file(0).unlink()
    assert _own_ends(run) is None  # no start point: no curve
