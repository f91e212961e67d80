"""``trainer.noise_scale``: each step's gradient noise scale over its groups (train/noise.py), by hand
and against ``benchmarks/grad_noise.py``, which takes each group's gradient in a pass of its own."""

import copy
import json
import math

import numpy as np
import pytest
import torch
from bench_script import load
from test_trainer import small_model

from sage_rl.settings import TrainConfig
from sage_rl.train import prefix
from sage_rl.train.batch import PreparedSample, grouped_micro_batches
from sage_rl.train.config import TrainerConfig
from sage_rl.train.noise import noise_from_sums
from sage_rl.train.trainer import Trainer
from sage_rl.types import Chain, ExecResult, Outcome, StopReason, Task, Trajectory, Turn

grad_noise = load("grad_noise")
replay = load("replay_update")

SYSTEM = tuple(range(1, 21))  # every sample's first 20 tokens: the step's shared prefix


def test_the_figures_from_two_sums_by_hand():
    # g = (1, 0), (0, 1), (1, 1): |sum g|^2 = |(2, 2)|^2 = 8, sum |g|^2 = 1 + 1 + 2 = 4
    got = noise_from_sums(3, 8.0, 4.0)
    assert got["signal"] == pytest.approx(2 / 3)  # mean off-diagonal product: (0 + 1 + 1) / 3
    assert got["trace"] == pytest.approx(4 / 3 - 2 / 3)
    assert got["b_simple"] == pytest.approx(1.0)
    assert got["signal_share"] == pytest.approx((2 / 3) / (2 / 3 + (2 / 3) / 3))  # |mean g|^2 = 8/9
    gram = np.array([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0], [1.0, 1.0, 2.0]])
    assert grad_noise.noise_scale(gram)["noise"] == pytest.approx(got["trace"])  # the benchmark's own
    # opposite gradients: no signal resolved
    none = noise_from_sums(2, 0.0, 2.0)
    assert (
        none["signal"] == pytest.approx(-1.0) and none["b_simple"] == math.inf and none["signal_share"] == 0.0
    )
    with pytest.raises(ValueError, match="at least 2 groups"):
        noise_from_sums(1, 1.0, 1.0)


def test_a_group_is_run_together_in_the_order_groups_first_appear():
    def p(n: int, adv: float = 1.0) -> PreparedSample:
        return PreparedSample([1] * n + [2], [0] * n + [1], [0.0] * (n + 1), adv)

    keyed = [(p(9), "a"), (p(3), "b"), (p(5), "a"), (p(7), "b"), (p(4), "a")]
    chunks, ends = grouped_micro_batches(keyed, size=2)
    assert [[len(s.ids) for s in c] for c in chunks] == [[10, 6], [5], [8, 4]]  # longest first in a group
    assert ends == {1, 2}


def _chain(group: int, index: int, wins: tuple[bool, bool]) -> Chain:
    """A chain of K = 2 tasks of scenario ``group``: each prompt starts with ``SYSTEM``."""
    trajs = []
    for k, win in enumerate(wins):
        task = Task(f"t{group}k{k}", f"s{group}", k + 1, "do it", "train")
        gen = (40 + group, 41 + index, 42 + k, 43 + group + index)
        turn = Turn(gen, (-1.0,) * 4, "x", "print(1)", ExecResult("1", True), obs_ids=(9,))
        outcome = Outcome(float(win), win)
        trajs.append(Trajectory(task, (*SYSTEM, 30 + group, 31 + k), (turn,), outcome, StopReason.COMPLETED))
    return Chain(group_index=group, chain_index=index, trajectories=tuple(trajs))


def test_the_trainers_figures_are_those_of_the_groups_gradients_taken_one_by_one(monkeypatch):
    """Four groups of 4 chains of K = 2 with mixed outcomes and one where every task failed (its
    samples are skipped: a group whose gradient is 0). The step's figures equal the benchmark's
    from its groups' gradients, each taken in a pass of its own; its gradient is the one without
    ``noise_scale``; and each group's share went through the step's shared prefix."""
    cfg = TrainConfig.model_validate({"rollout": {"chain_length": 2, "group_size": 4, "reward": "outcome"}})
    chains = [_chain(g, i, (i <= g % 3, (i + g) % 2 == 0)) for g in range(4) for i in range(4)]
    chains += [_chain(4, i, (False, False)) for i in range(4)]
    batch = replay.batch_of(chains, cfg)
    assert len(batch.trained) == 5 and batch.num_chains == 20
    model = small_model()
    off = cfg.trainer.model_copy(update={"log_kl_ref": False, "micro_batch_size": 3})
    on = off.model_copy(update={"noise_scale": True})

    carried = []
    backward = prefix.StepPrefix.backward

    def spy(self, retain=False):
        carried.append(retain)
        backward(self, retain)

    monkeypatch.setattr(prefix.StepPrefix, "backward", spy)
    tr = Trainer(copy.deepcopy(model), None, on)
    row = tr.step(batch.samples, batch.num_chains)
    assert tr.share_prefix and carried == [True] * 4 + [False]  # one per group that ran, then the step's
    gs = torch.stack(
        list(grad_noise.group_gradients(Trainer(copy.deepcopy(model), None, off), batch))
    ).double()
    want = grad_noise.noise_scale((gs @ gs.T).numpy())
    assert row["noise/groups"] == 5.0
    assert row["noise/signal"] == pytest.approx(want["signal"], rel=1e-3)
    assert row["noise/trace"] == pytest.approx(want["noise"], rel=1e-3)
    assert "noise/b_simple" not in row or row["noise/b_simple"] == pytest.approx(want["b_simple"], rel=1e-2)

    grads = {}
    for name, c in (("off", off), ("on", on)):
        t = Trainer(copy.deepcopy(model), None, c)
        stats = t.accumulate_gradients(batch.samples, batch.num_chains)
        grads[name] = torch.cat([p.grad.reshape(-1) for p in t.model.parameters()])
        assert ("noise/signal" in stats.as_metrics()) == (name == "on")
    assert torch.allclose(grads["on"], grads["off"], atol=1e-7, rtol=1e-5)
    assert row["grad_norm"] == pytest.approx(float(grads["off"].norm()), rel=1e-4)


def test_it_needs_each_chain_normalised_by_itself():
    with pytest.raises(ValueError, match="seq_mean_token_mean"):
        TrainerConfig(noise_scale=True, loss_agg="token_mean")
    assert TrainerConfig(noise_scale=True).noise_scale


def test_the_report_pools_the_runs_steps_and_the_curves_gain_a_panel(tmp_path):
    """``sage-rl train``'s report.md and curves.png for a run measured with ``noise_scale``."""
    from PIL import Image

    from sage_rl.runs.train import _noise_lines, _plot
    from sage_rl.train.layout import RunFolder

    def write(rows):
        (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    base = {"reward": 0.5, "success": 0.5, "skill_use_rate": 0.0}
    noise = [
        {"noise/signal": 0.01, "noise/trace": 1.0, "noise/signal_share": 0.1, "noise/groups": 8.0},
        {},  # a step without an update: nothing measured
        {"noise/signal": 0.03, "noise/trace": 3.0, "noise/signal_share": 0.3, "noise/groups": 8.0},
    ]
    write([{"step": 0, "eval/tgc": 50.0}] + [{"step": i + 1, **base, **n} for i, n in enumerate(noise)])
    (line,) = [x for x in _noise_lines(RunFolder.of(tmp_path)) if x]
    # mean share (0.1 + 0.3) / 2; B_simple = mean trace 2.0 / mean signal 0.02 = 100; 16 groups = 0.16 of it
    assert "2 steps" in line and "on average 0.20 of a step's gradient" in line
    assert "B_simple = mean trace / mean signal = 100 groups" in line and "16 groups: 0.2 B_simple" in line
    _plot(RunFolder.of(tmp_path))
    assert Image.open(tmp_path / "curves.png").size[0] == round(11 * 4 / 3 * 110)  # four panels
    noise[2]["noise/signal"] = -0.05
    write([{"step": i + 1, **base, **n} for i, n in enumerate(noise)])
    assert "no signal resolved over the run's 16 groups" in _noise_lines(RunFolder.of(tmp_path))[1]
    write([{"step": 1, **base}])
    assert _noise_lines(RunFolder.of(tmp_path)) == []
    _plot(RunFolder.of(tmp_path))
    assert Image.open(tmp_path / "curves.png").size[0] == 11 * 110  # three
