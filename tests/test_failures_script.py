"""benchmarks/failures.py: an evaluation's failed tasks by the errors their code raised, counted by hand."""

import json

import pytest
from bench_script import load

from sage_rl.text import dumps
from sage_rl.types import Chain, ExecResult, Outcome, StopReason, Task, Trajectory, Turn

failures = load("failures")
NAME_ERROR = "Traceback (most recent call last):\n  File \"<cell-1>\", line 3\nNameError: name 'answer' is not defined\n"
KEY_ERROR = "Traceback (most recent call last):\n  File \"<cell-1>\", line 1\n    x['a']\nKeyError: 'a'\n"


CUT = "Traceback (most recent call last):\n  File \"<cell-2>\", line 1\nSyntaxError: '(' was never closed\n"


def _task(i: int, success: bool, cells: list[tuple[str, str]], stop=StopReason.COMPLETED) -> Trajectory:
    """Cells as (reply, observation); a reply's code is what its fence holds, closed or not."""
    turns = tuple(
        Turn((5,), (-1.0,), reply, reply.removeprefix("```python\n").removesuffix("\n```"), ExecResult(obs, "Error" not in obs))
        for reply, obs in cells
    )  # fmt: skip
    task = Task(f"t_{i}", "s", i + 1, "do it", "train")
    return Trajectory(task, (1, 2), turns, Outcome(float(success), success), stop)


def _chains() -> list[Chain]:
    trajs = (
        _task(0, True, [("print(1)", "1")]),
        _task(1, False, [("print(answer)", NAME_ERROR), ("f(answer)", NAME_ERROR)]),  # one task, two cells
        _task(2, False, [("def f(x):\n    return x\nf(1)", "")]),  # no cell raised: a wrong answer
        # a KeyError, then a reply the token budget cut mid-line: its SyntaxError is the cut's
        _task(
            3,
            False,
            [("```python\nx = {}\nx['a']\n```", KEY_ERROR), ("```python\nprint( answer", CUT)],
            StopReason.TOKEN_BUDGET,
        ),
    )
    return [Chain(group_index=0, chain_index=0, trajectories=trajs)]


def test_the_profile_by_hand():
    got = failures.failures(_chains())
    assert got["tasks"] == 4 and got["failed"] == 3 and got["with_def"] == 1
    assert got["stops"] == {"completed": 2, "token_budget": 1} and got["cut"] == 1
    assert got["raised"] == {"NameError": 1, "none": 1, "KeyError": 1}  # a task once per type; not the cut's
    assert got["undefined"] == [("answer", 2)]  # once per cell


def test_the_command_on_a_run_folder(tmp_path, capsys):
    folder = tmp_path / "eval" / "sft_train_heldout"
    folder.mkdir(parents=True)
    (folder / "trajectories.same_scenario.jsonl").write_text("".join(dumps(c) + "\n" for c in _chains()))
    out = failures.main([str(tmp_path), "sft", str(folder), "--json", str(tmp_path / "f.json")])
    assert out["sft"] == out["sft_train_heldout"]  # by name and by path
    written = json.loads((tmp_path / "f.json").read_text())
    assert written["models"]["sft"]["raised"]["NameError"] == 1
    printed = capsys.readouterr().out
    assert "sft: 3 of 4 tasks failed (completed 2, token_budget 1); last reply cut 1; with a def 1" in printed
    with pytest.raises(SystemExit, match="no finished evaluation of sage"):
        failures.main([str(tmp_path), "sage"])
