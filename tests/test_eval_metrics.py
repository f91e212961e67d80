import pytest

from sage_rl.eval.metrics import compute_metrics
from sage_rl.types import Chain, CheckResult, ExecResult, Outcome, StopReason, Task, Trajectory, Turn


def _t(scn, pos, success, used=(), saved=(), code=True, difficulty=1, ntok=10, steps=2, lib_in=()):
    task = Task(f"{scn}_{pos}", scn, pos, "x", "dev", difficulty=difficulty)
    turns = tuple(
        Turn(
            tuple(range(ntok // steps)),
            (0.0,) * (ntok // steps),
            "t",
            "c" if code else None,
            ExecResult("o", True),
        )
        for _ in range(steps)
    )
    checks = (CheckResult("a", True), CheckResult("b", success))
    stop = StopReason.COMPLETED if success else StopReason.STEP_LIMIT
    return Trajectory(
        task,
        (),
        turns,
        Outcome.from_checks(checks),
        stop,
        library_in=lib_in,
        skills_saved=saved,
        skills_used=used,
    )


def test_hand_worked_metrics():
    # Scenario A: all 3 succeed, tasks 2 and 3 use skill f made by task 1.
    a = Chain(
        0,
        0,
        (
            _t("A", 1, True, saved=("f",)),
            _t("A", 2, True, used=("f",), lib_in=("f",)),
            _t("A", 3, True, used=("f",), lib_in=("f",), saved=("g",)),
        ),
    )
    # Scenario B: task 2 fails, no code at all in task 3, difficulty 2.
    b = Chain(
        1,
        0,
        (
            _t("B", 1, True, difficulty=2),
            _t("B", 2, False, difficulty=2, ntok=20),
            _t("B", 3, False, code=False, difficulty=2),
        ),
    )
    m = compute_metrics([a, b])
    assert m.tasks == 6 and m.scenarios == 2
    assert m.tgc == pytest.approx(100 * 4 / 6)
    assert m.sgc == 50.0
    assert m.avg_score == pytest.approx((1 + 1 + 1 + 1 + 0.5 + 0.5) / 6)
    assert m.avg_steps == 2.0
    assert m.avg_tokens == pytest.approx((10 * 5 + 20) / 6)
    assert m.no_code_turn_rate == pytest.approx(2 / 12)
    assert m.no_code_task_rate == pytest.approx(1 / 6)
    assert m.completed_rate == pytest.approx(4 / 6)
    assert m.library_size == pytest.approx((2 + 0) / 2)  # A ends with {f, g}; B with nothing
    assert m.skills_generated == 2 and m.skills_used == 1
    assert m.usage_rate == pytest.approx(2 / 4)  # positions >= 2: A2, A3 used; B2, B3 did not
    assert m.success_when_used == 1.0 and m.success_when_not_used == pytest.approx(2 / 4)
    assert m.tgc_by_position == {1: 100.0, 2: 50.0, 3: 50.0}
    assert m.usage_rate_by_position == {1: 0.0, 2: 0.5, 3: 0.5}
    assert m.tgc_by_difficulty == {1: 100.0, 2: pytest.approx(100 / 3)}
    assert m.stop_reasons == {"completed": 4, "step_limit": 2}


def test_empty_is_zero_not_nan():
    m = compute_metrics([])
    assert (m.tgc, m.sgc, m.usage_rate, m.avg_tokens) == (0.0, 0.0, 0.0, 0.0)
