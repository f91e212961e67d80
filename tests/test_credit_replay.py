"""benchmarks/credit_replay.py: recorded chains replayed exactly, the credit rules compared."""

from pathlib import Path

import pytest
from bench_script import load
from test_reward_credit import COMPLETE, chain

from sage_rl.text import dumps

ROOT = Path(__file__).resolve().parents[1]
replay = load("credit_replay")

#: the agent limits of test_reward_credit.chain, as the run's config
CONFIG = "agent: {max_steps: 2, max_tokens_per_turn: 64, context_limit: 4096}\nworked_example: false\n"


def test_a_recorded_chain_replays_faithfully_and_only_the_credit_differs(tmp_path):
    """Task 2 prints what a skill returned and submits inline: ``api`` pays the bonus (2, 2),
    ``flow`` does not (1, 1); a chain that submits the skill's value is paid under both."""
    ignored, _ = chain("print(get_email())" + COMPLETE)
    record = tmp_path / "rollouts.jsonl"
    record.write_text(dumps(ignored) + "\n")
    (tmp_path / "config.yaml").write_text(CONFIG)
    report = replay.main(
        [str(record), "--config", str(tmp_path / "config.yaml"), "--json", str(tmp_path / "r.json")]
    )
    assert report["mismatches"] == 0 and report["chains"] == 1
    assert report["rules"]["api"] == {"later_tasks": 1, "credited": 1, "bonus_paid": 1}
    assert report["rules"]["flow"] == {"later_tasks": 1, "credited": 0, "bonus_paid": 0}
    (differ,) = report["differ"]
    assert differ["rewards"] == {"api": [2.0, 2.0], "flow": [1.0, 1.0]}
    assert differ["skills_used"] == [[], []]  # under flow


def test_a_record_the_replay_does_not_reproduce_is_counted(tmp_path):
    c, _ = chain("print(get_email())" + COMPLETE)
    text = dumps(c).replace("print(get_email())", "print(get_email()")  # a syntax error now: the task differs
    record = tmp_path / "rollouts.jsonl"
    record.write_text(text + "\n")
    (tmp_path / "config.yaml").write_text(CONFIG)
    report = replay.main([str(record), "--config", str(tmp_path / "config.yaml"), "--rules", "paper,api"])
    assert report["mismatches"] >= 1


def test_bad_arguments_are_named(tmp_path):
    record = tmp_path / "bad.jsonl"
    record.write_text("{oops\n")
    with pytest.raises(SystemExit, match=r"bad.jsonl:1: not a JSON line"):
        replay.main([str(record)])
    record.write_text("")
    with pytest.raises(SystemExit, match=r"--rules: name at least two"):
        replay.main([str(record), "--rules", "api"])


def test_a_chain_that_started_from_a_library_is_refused(tmp_path):
    c, _ = chain("print(get_email())" + COMPLETE)
    record = tmp_path / "rollouts.jsonl"
    record.write_text(dumps(c).replace('"start_library": []', '"start_library": [["get_email", "abc"]]') + "\n")
    with pytest.raises(SystemExit, match=r"1 chain\(s\) started from a non-empty library"):
        replay.main([str(record)])


def test_a_steps_journal_is_read_as_its_groups_chains(tmp_path):
    c, _ = chain("print(get_email())" + COMPLETE)
    record = tmp_path / "step_000001.partial.jsonl"
    record.write_text('{"key": "settings"}\n' + dumps({"group": 7, "chains": [c, c]}) + "\n")
    (tmp_path / "config.yaml").write_text(CONFIG)
    report = replay.main([str(record), "--config", str(tmp_path / "config.yaml")])
    assert report["chains"] == 2 and report["mismatches"] == 0
    assert report["rules"]["api"]["bonus_paid"] == 2 and report["rules"]["flow"]["bonus_paid"] == 0
