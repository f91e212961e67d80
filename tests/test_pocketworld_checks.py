"""Checks: answer normalisation, state diffs, allow-lists, scoring."""

from __future__ import annotations

from sage_rl.envs.pocketworld.checks import Allow, Expect, Require, answers_match, diff, evaluate, normalize


def test_normalize_numbers_strings_and_lists():
    assert normalize("12.50") == 12.5 == normalize(12.5) == normalize("$12.5") == normalize(" 12.50 dollars")
    assert normalize("  Hello   World. ") == "hello world"
    assert normalize(3) == 3.0
    assert normalize(["A", "2"]) == ["a", 2.0]


def test_answers_match_rules():
    assert answers_match("3", 3)
    assert answers_match(12.499, "12.50") and not answers_match(12.48, 12.5)
    assert answers_match(["b", "A"], ["a", "B"])
    assert not answers_match(["b", "a"], ["a", "b"], ordered=True)
    assert answers_match("a, b", ["b", "a"])
    assert not answers_match(None, 0)
    assert not answers_match("wrong", "Marco Vell")


def test_diff_reports_added_removed_changed_rows():
    before = {"x": {"t": {1: {"v": 1}, 2: {"v": 2}}}, "y": {"t": {}}}
    after = {"x": {"t": {1: {"v": 9}, 3: {"v": 3}}}, "y": {"t": {}}}
    changes = diff(before, after)
    assert [(c.key, c.before, c.after) for c in changes] == [
        (1, {"v": 1}, {"v": 9}),
        (2, {"v": 2}, None),
        (3, None, {"v": 3}),
    ]


def test_evaluate_scores_task_checks_and_counts_collateral_only_once_they_pass():
    before = {"a": {"t": {1: {"v": 1}, 2: {"v": 2}}}}
    expect = Expect(answer=5, requires=(Require("row 1 is 9", lambda f: f["a"]["t"][1]["v"] == 9),),
                    allow=(Allow("a", "t", lambda r: r["v"] == 9),))  # fmt: skip
    good = {"a": {"t": {1: {"v": 9}, 2: {"v": 2}}}}
    o = evaluate(expect, before, good, "5")
    assert (o.score, o.success) == (1.0, True)
    collateral = {"a": {"t": {1: {"v": 9}, 2: {"v": 3}}}}
    o = evaluate(expect, before, collateral, 5)
    # the requirement holds, but beside a change the task does not allow: only the answer counts
    assert [c.passed for c in o.checks] == [True, True, False] and (o.score, o.success) == (1 / 3, False)
    assert "a.t[2] changed" in o.checks[-1].detail
    # half the task done, nothing collateral: the untouched rows earn nothing until the task is done
    o = evaluate(expect, before, good, 4)
    assert [c.passed for c in o.checks] == [True, False, True] and (o.score, o.success) == (1 / 3, False)
    # no-op: requirement and answer fail, nothing collateral; it scored 1/3 when every check counted
    o = evaluate(expect, before, before, None)
    assert [c.passed for c in o.checks] == [False, False, True] and (o.score, o.success) == (0.0, False)
    answer_only = Expect(answer=5)
    assert evaluate(answer_only, before, before, None).score == 0.0  # was 0.5
    assert evaluate(answer_only, before, collateral, 5).score == 0.5  # right answer, a stray change


def test_acting_on_every_item_earns_nothing_for_the_requirement_it_meets():
    """A blanket action ("set every row to 9") meets "the targets are 9" as the careful one does;
    with its collateral changes it scores 0, below a careful attempt that did one of two targets,
    not 1/2 above it (it did before the requirements were gated on the guard)."""
    def rows(*values: int) -> dict:
        return {"a": {"t": {k: {"id": k, "v": v} for k, v in enumerate(values, start=1)}}}

    before, targets = rows(1, 2, 3), (1, 2)
    expect = Expect(
        requires=tuple(Require(f"row {k} is 9", lambda f, k=k: f["a"]["t"][k]["v"] == 9) for k in targets),
        allow=(Allow("a", "t", lambda r: r["id"] in targets),),
    )
    o = evaluate(expect, before, rows(9, 9, 9), None)  # every row, the targets among them
    assert [c.passed for c in o.checks] == [True, True, False] and (o.score, o.success) == (0.0, False)
    assert "a.t[3] changed" in o.checks[-1].detail
    o = evaluate(expect, before, rows(9, 2, 3), None)  # one target of two, nothing else
    assert [c.passed for c in o.checks] == [True, False, True] and (o.score, o.success) == (1 / 3, False)
    o = evaluate(expect, before, rows(9, 9, 3), None)
    assert (o.score, o.success) == (1.0, True)


def test_requirement_that_crashes_on_a_broken_state_fails_instead_of_raising():
    expect = Expect(requires=(Require("row exists", lambda f: f["a"]["t"][1]["v"] == 1),))
    o = evaluate(expect, {"a": {"t": {1: {"v": 1}}}}, {"a": {"t": {}}}, None)
    assert not o.checks[0].passed
