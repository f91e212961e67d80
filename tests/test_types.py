import json
from pathlib import Path

from sage_rl.text import dumps
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
)


def _traj() -> Trajectory:
    task = Task("s1_1", "s1", 1, "Do it.", "dev", apps=("music",), spec={"seed": 3})
    turns = (
        Turn(
            (5, 6),
            (-0.1, -0.2),
            "```python\nf()\n```",
            "f()",
            ExecResult("ok", True, calls=(CallRecord("f", "<skill:f>", 1, 0),), defined=()),
            obs_ids=(7, 8, 9),
        ),
        Turn(
            (10,),
            (-0.3,),
            "done",
            None,
            ExecResult("no code", False, calls=None, defined=None),
            obs_ids=(11,),
        ),
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
    assert back.trajectories[0].turns[0].result.calls[0].from_library
    r = ExecResult("x", True, calls=None, defined=("g",))
    assert ExecResult.from_dict(json.loads(dumps(r))) == r


OLD = Path(__file__).parent / "data" / "before_issue12"


def test_run_folders_written_before_turns_held_their_exec_result_still_read():
    """Old layout: a turn's observation, exec_ok, timed_out, calls and defined sat on the turn
    (a training run's rollouts/step_*.jsonl and an eval run's trajectories.*.jsonl)."""
    (line,) = (OLD / "step_000001.jsonl").read_text().splitlines()
    chain = Chain.from_dict(json.loads(line))
    first, no_code = chain.trajectories[0].turns
    assert first.result == ExecResult("done\n", True, calls=(CallRecord("f", "<skill:f>", 1, 0),), defined=())
    assert first.observation == "done\n" and first.obs_ids == (20, 21) and first.completion_tokens == 3
    assert no_code.code is None and no_code.result == ExecResult("no code", False, calls=None, defined=None)
    assert chain.trajectories[0].token_arrays()[0] == [1, 2, 3, 11, 12, 13, 20, 21, 14, 22]
    assert chain.start_library == ()  # not recorded then
    # and it is written back in the new layout, which reads back the same
    assert Chain.from_dict(json.loads(dumps(chain))) == chain
    assert "result" in json.loads(dumps(chain))["trajectories"][0]["turns"][0]
    evals = [
        Chain.from_dict(json.loads(x))
        for x in (OLD / "trajectories.same_scenario.jsonl").read_text().splitlines()
    ]
    assert [t.task.position for t in evals[0].trajectories] == [1, 2, 3]
    assert all(t.outcome.success and t.turns[-1].result.ok for t in evals[0].trajectories)
    assert evals[0].trajectories[1].skills_used and evals[0].trajectories[1].turns[0].result.calls


def test_task_context_round_trips():
    task = Task("a_1", "a", 1, "Do it.", "dev", env="appworld", context={"supervisor": "Ada L"})
    assert Task.from_dict(json.loads(dumps(task))) == task
    assert Task.from_dict({k: v for k, v in json.loads(dumps(task)).items() if k != "context"}).context == {}
