import json

from sage_rl.types import (
    CallRecord,
    Chain,
    CheckResult,
    ExecResult,
    Outcome,
    StopReason,
    Task,
    Trajectory,
    Turn,
    dumps,
)


def _traj() -> Trajectory:
    task = Task("s1_1", "s1", 1, "Do it.", "dev", apps=("music",), spec={"seed": 3})
    turns = (
        Turn(
            (5, 6),
            (-0.1, -0.2),
            "```python\nf()\n```",
            "f()",
            "ok",
            obs_ids=(7, 8, 9),
            calls=(CallRecord("f", "<skill:f>", 1, 0),),
            defined=(),
        ),
        Turn((10,), (-0.3,), "done", None, "no code", obs_ids=(11,), exec_ok=False, calls=None, defined=None),
    )
    outcome = Outcome.from_checks((CheckResult("a", True), CheckResult("b", False)))
    return Trajectory(task, (1, 2, 3), turns, outcome, StopReason.STEP_LIMIT, library_in=("f",))


def test_outcome_from_checks():
    o = Outcome.from_checks((CheckResult("a", True), CheckResult("b", True), CheckResult("c", False)))
    assert o.score == 2 / 3 and not o.success
    assert Outcome.from_checks((CheckResult("a", True),)).success
    assert Outcome.from_checks(()) == Outcome(0.0, False, ())


def test_token_arrays_mask_only_generated_tokens():
    ids, mask, lps = _traj().token_arrays()
    assert ids == [1, 2, 3, 5, 6, 7, 8, 9, 10, 11]
    assert mask == [0, 0, 0, 1, 1, 0, 0, 0, 1, 0]
    assert lps == [0, 0, 0, -0.1, -0.2, 0, 0, 0, -0.3, 0]


def test_json_round_trip_of_chain_and_exec_result():
    chain = Chain(0, 1, (_traj(), _traj()), used_from=((), (0,)))
    back = Chain.from_dict(json.loads(dumps(chain)))
    assert back == chain
    assert back.task_ids == ("s1_1", "s1_1")
    assert back.trajectories[0].turns[0].calls[0].from_library
    r = ExecResult("x", True, calls=None, defined=("g",))
    assert ExecResult.from_dict(json.loads(dumps(r))) == r
