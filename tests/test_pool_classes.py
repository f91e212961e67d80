"""Where an arm's greedy score moves, by its first screen's class of each template (worked by hand)."""

import json

import pytest
from bench_script import load

from sage_rl.recipe.controls import by_screen_class, screen_class

SUCCESS = {"a": 0.5, "b": 1.0, "c": 0.0}


def _row(template, seed, n, ok):
    return [f"{template}-s{seed}_{n}", f"{template}-s{seed}", ok]


def test_tasks_are_counted_by_their_templates_screen_class():
    outcomes = [
        _row("a", 1, 1, True),
        _row("a", 1, 2, False),
        _row("b", 7, 1, True),
        _row("c", 3, 1, True),
        _row("c", 3, 2, False),
        _row("c", 4, 1, False),
        _row("d", 1, 1, True),  # the screen never saw d: left out
    ]
    assert by_screen_class(SUCCESS, outcomes) == {"pool": [1, 2], "solved": [1, 1], "hopeless": [1, 3]}
    assert [screen_class(r) for r in (0.0, 1e-9, 0.5, 1.0)] == ["hopeless", "pool", "pool", "solved"]


def test_the_script_reads_an_arms_screen_and_evaluations(tmp_path, capsys):
    arm = tmp_path / "sage"
    (arm / "evals").mkdir(parents=True)
    screen = {"step": 0, "pool": ["a"], "success": SUCCESS, "tokens": 1, "seconds": 1.0}
    later_screen = screen | {"step": 40, "pool": ["a", "b", "c"], "success": dict.fromkeys(SUCCESS, 0.5)}
    (arm / "screens.jsonl").write_text(
        json.dumps(screen) + "\n" + json.dumps(later_screen) + "\n"
    )  # the first counts
    start = [_row("a", 1, 1, True), _row("b", 2, 1, True), _row("c", 3, 1, True), _row("c", 3, 2, True)]
    later = [_row("a", 1, 1, True), _row("b", 2, 1, True), _row("c", 3, 1, False), _row("c", 3, 2, False)]
    for step, outcomes in ((0, start), (2, later)):
        (arm / "evals" / f"step_{step:06d}.json").write_text(json.dumps({"outcomes": outcomes}))
    heldout = tmp_path / "sage_train_heldout"
    heldout.mkdir()
    (heldout / "outcomes.json").write_text(json.dumps({"outcomes": [_row("c", 9, 1, True)]}))
    rows = load("pool_classes").rows(arm, [heldout])
    assert [r["eval"] for r in rows] == ["step 0", "step 2", "sage_train_heldout"]
    assert [(r["pool"], r["solved"], r["hopeless"], r["tgc"]) for r in rows] == [
        ([1, 1], [1, 1], [2, 2], 100.0),
        ([1, 1], [1, 1], [0, 2], 50.0),
        ([0, 0], [0, 0], [1, 1], 100.0),
    ]
    with pytest.raises(SystemExit, match="holds no screen"):
        load("pool_classes").rows(tmp_path, [])
    with pytest.raises(SystemExit, match="not a finished evaluation"):
        load("pool_classes").rows(arm, [tmp_path / "missing"])
