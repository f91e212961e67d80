"""The rollout metrics a training step logs (``train/logging.py``): success, skill use and saves by
chain position, the skill credits whose work reached nothing, and the metrics file itself."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from test_trainer import make_sample

from sage_rl.types import CallRecord, ExecResult, Outcome, Sample, StopReason, Trajectory, Turn


def test_batch_metrics_by_position():
    from sage_rl.train.logging import batch_metrics

    def s(pos, score, code=True, used=(), saved=(), reward=None):
        base = make_sample([1, 2], [([3, 4], [])], 0.0, position=pos)
        t = base.trajectory
        turns = t.turns if code else (Turn((3, 4), (-1.0, -1.0), "", None, ExecResult("", False)),)
        traj = Trajectory(
            t.task,
            t.prompt_ids,
            turns,
            Outcome(score, score == 1.0),
            t.stop,
            skills_used=used,
            skills_saved=saved,
        )
        return Sample(base.group, traj, score if reward is None else reward, 0.0)

    m = batch_metrics(
        [
            s(0, 1.0, saved=("f",)),
            s(0, 0.5, saved=("f", "g")),
            s(1, 1.0, used=("f",), reward=2.0),
            s(1, 0.0, code=False, used=("g",), reward=-1.0),
        ]
    )
    assert m["reward"] == pytest.approx((1.0 + 0.5 + 2.0 - 1.0) / 4)
    assert m["success/k0"] == 0.5 and m["success/k1"] == 0.5
    assert m["no_code_rate"] == 0.25 and m["no_code_rate/k1"] == 0.5
    assert m["skill_use_rate/k1"] == 1.0 and m["skill_use_success/k1"] == 0.5
    assert m["skill_save_rate/k0"] == 1.0 and m["skills_saved/k0"] == 1.5
    assert math.isnan(m["skill_use_success/k0"])
    assert m["gen_tokens_per_task"] == 2.0 and m["turns"] == 1.0
    assert m["env_error_rate"] == 0.0
    assert m["skill_use_without_effect"] == 1.0  # the credited tasks' records show no effect
    env_failed = s(0, 0.0)
    env_failed = Sample(env_failed.group, replace(env_failed.trajectory, stop=StopReason.ENV_ERROR), 0.0, 0.0)
    assert batch_metrics([s(0, 1.0), env_failed])["env_error_rate"] == 0.5


def test_skill_use_without_effect_counts_credits_whose_work_reached_nothing():
    """The door ``skills.credit: api`` leaves open, as a rollout metric: of the tasks credited with
    skills (and with call records), those none of whose credited skills has an effect."""
    from sage_rl.train.logging import batch_metrics, without_effect

    def traj(used, calls):
        base = make_sample([1, 2], [([3, 4], [])], 0.0).trajectory
        turn = replace(base.turns[0], result=ExecResult("", True, calls=calls))
        return replace(base, turns=(turn,), skills_used=used)

    reached = (CallRecord("f", "<skill:f>", 1, 0, 1, 1), CallRecord("g", "<skill:g>", 1, 0, 1, 0))
    idle = (CallRecord("f", "<skill:f>", 1, 0, 1, 0),)
    assert without_effect(traj(("f",), reached)) is False
    assert without_effect(traj(("g", "f"), reached)) is False  # one credited skill reached the world
    assert without_effect(traj(("g",), reached)) is True
    assert without_effect(traj(("f",), idle)) is True
    unasked = traj(("f",), reached)  # f's one effect is the answer, on a task that asks for none
    assert without_effect(replace(unasked, outcome=replace(unasked.outcome, answer_scored=False))) is True
    assert without_effect(replace(unasked, outcome=replace(unasked.outcome, answer_scored=True))) is False
    assert without_effect(traj(("f",), None)) is None  # no call records (AppWorld)
    assert without_effect(traj((), reached)) is None  # nothing credited
    samples = [Sample(((t.task.task_id,), 1), t, 0.0, 0.0) for t in
               (traj(("f",), reached), traj(("f",), idle), traj(("f",), None), traj((), idle))]  # fmt: skip
    assert batch_metrics(samples)["skill_use_without_effect"] == 0.5


def test_metrics_logger_rows_offsets_and_truncation(tmp_path):
    from sage_rl.train.logging import MetricsLogger, read_metrics

    log = MetricsLogger(tmp_path)
    log.log(1, {"loss": 0.5, "x": float("nan")})
    mark = log.offset()
    log.log(2, {"loss": 0.25})
    log.close()
    assert read_metrics(tmp_path) == [{"step": 1, "loss": 0.5, "x": None}, {"step": 2, "loss": 0.25}]
    assert any((tmp_path / "tb").iterdir())
    MetricsLogger(tmp_path, resume_offset=mark, tensorboard=False).close()
    assert [r["step"] for r in read_metrics(tmp_path)] == [1]
    with pytest.raises(ValueError, match="fewer than"):
        MetricsLogger(tmp_path, resume_offset=10_000, tensorboard=False)
