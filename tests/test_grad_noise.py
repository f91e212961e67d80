"""benchmarks/grad_noise.py: the gradient noise scale of a saved step, against numbers worked by hand,
its estimator on vectors of known signal and noise, and the groups' gradients, whose mean is the
trainer's batch gradient."""

import copy
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from bench_script import load
from test_trainer import small_model

from sage_rl.settings import TrainConfig
from sage_rl.train.trainer import Trainer
from sage_rl.types import Chain, ExecResult, Outcome, StopReason, Task, Trajectory, Turn

noise = load("grad_noise")
replay = load("replay_update")


def test_the_noise_scale_by_hand():
    # g = (1, 0), (0, 1), (1, 1): K off-diagonal 0, 1, 1 (mean 2/3), diagonal 1, 1, 2 (mean 4/3)
    gram = np.array([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0], [1.0, 1.0, 2.0]])
    got = noise.noise_scale(gram)
    assert got["signal"] == pytest.approx(2 / 3)  # |G|^2
    # tr(Sigma): the deviations from the mean (2/3, 2/3) square to 5/9 + 5/9 + 2/9, over n - 1
    assert got["noise"] == pytest.approx(4 / 3 - 2 / 3)
    assert got["b_simple"] == pytest.approx(1.0)
    assert got["mean_cosine"] == pytest.approx((0 + 2 / math.sqrt(2)) / 3)
    # |mean g|^2 = 8/9 = |G|^2 + tr(Sigma) / n
    assert gram.sum() / 9 == pytest.approx(got["signal"] + got["noise"] / 3)
    # leave-one-out signals 1, 1, 0: SE = sqrt(2/3 * (1/9 + 1/9 + 4/9)) = 2/3
    assert noise.jackknife(gram, "signal") == pytest.approx(2 / 3)
    s = noise.summary(gram)
    assert s["signal_ci"] == pytest.approx([2 / 3 - 1.96 * 2 / 3, 2 / 3 + 1.96 * 2 / 3])
    assert s["signal_share"] == pytest.approx((2 / 3) / (8 / 9))
    # the signal's interval reaches 0: B_simple is at least noise / its upper end, with no upper bound
    assert s["b_simple_ci"] == pytest.approx([(2 / 3) / (2 / 3 + 1.96 * 2 / 3), math.inf])
    with pytest.raises(ValueError, match="at least 2 groups"):
        noise.noise_scale(np.ones((1, 1)))


def test_the_estimator_recovers_a_known_signal_and_finds_none_in_pure_noise():
    rng = np.random.default_rng(0)
    d, n = 40_000, 16
    mu = rng.standard_normal(d) / math.sqrt(d)  # |mu|^2 ~ 1
    eps = rng.standard_normal((n, d)) * math.sqrt(4.0 / d)  # tr(Sigma) ~ 4
    with_signal = noise.summary((mu + eps) @ (mu + eps).T)
    assert with_signal["signal"] == pytest.approx(mu @ mu, rel=0.1)
    assert with_signal["noise"] == pytest.approx(4.0, rel=0.1)
    assert with_signal["signal_ci"][0] > 0
    assert with_signal["b_simple"] == pytest.approx(4 / (mu @ mu), rel=0.15)
    lo, hi = with_signal["b_simple_ci"]
    assert lo < with_signal["b_simple"] < hi < 8
    pure = noise.summary(eps @ eps.T)
    assert pure["signal_ci"][0] < 0 < pure["signal_ci"][1]
    assert abs(pure["mean_cosine"]) < 0.02 and with_signal["mean_cosine"] > 0.15


def _chain(group: int, index: int, success: bool) -> Chain:
    task = Task(f"t{group}", f"s{group}", 1, "do it", "train")
    gen = (5 + group, 6 + index, 7 + group + index)
    turn = Turn(gen, (-1.0,) * 3, "x", "print(1)", ExecResult("1", True), obs_ids=(9,))
    traj = Trajectory(task, (1, 2 + group), (turn,), Outcome(float(success), success), StopReason.COMPLETED)
    return Chain(group_index=group, chain_index=index, trajectories=(traj,))


def test_the_groups_gradients_average_to_the_batch_gradient(tmp_path):
    cfg = TrainConfig.model_validate(
        {"rollout": {"chain_length": 1, "group_size": 4, "reward": "outcome", "dynamic_sampling": True}}
    )
    chains = [_chain(g, i, i <= g % 3) for g in range(4) for i in range(4)]
    chains += [_chain(4, i, False) for i in range(4)]
    batch = replay.batch_of(chains, cfg)
    assert len(batch.trained) == 4 and batch.num_chains == 16  # group 4 failed everywhere: not trained
    noise.check_agg(cfg, batch)
    model = small_model()
    tr = Trainer(copy.deepcopy(model), None, cfg.trainer.model_copy(update={"log_kl_ref": False}))
    gs = list(noise.group_gradients(tr, batch))
    assert all(p.grad is None for p in tr.model.parameters())  # left as it found them
    full = Trainer(copy.deepcopy(model), None, cfg.trainer.model_copy(update={"log_kl_ref": False}))
    full.accumulate_gradients(batch.samples, batch.num_chains)
    want = torch.cat([p.grad.reshape(-1) for p in full.model.parameters()])
    assert torch.allclose(torch.stack(gs).mean(0), want, atol=1e-7, rtol=1e-5)
    assert all(g.norm() > 0 for g in gs) and not torch.allclose(gs[0], gs[1])
    exact = torch.stack(gs).double() @ torch.stack(gs).double().T
    spill = tmp_path / "g.f32"
    gram = noise.gram_of(iter(gs), spill, chunk=7)  # column blocks of 7 entries
    assert np.allclose(gram, exact.numpy(), rtol=1e-12, atol=0) and not spill.exists()
    with pytest.raises(ValueError, match="vector 1 has 3 entries"):
        noise.gram_of(iter([torch.ones(4), torch.ones(3)]), spill)
    assert not spill.exists()
    # the batch gradient's norm from the Gram matrix
    assert math.sqrt(gram.sum()) / 4 == pytest.approx(float(want.norm()), rel=1e-2)


def test_it_refuses_a_token_mean_batch():
    cfg = TrainConfig.model_validate({"rollout": {"chain_length": 1, "group_size": 4, "reward": "outcome"},
                                      "trainer": {"loss_agg": "token_mean"}})  # fmt: skip
    batch = replay.batch_of([_chain(0, i, i == 0) for i in range(4)], cfg)
    with pytest.raises(SystemExit, match="token_mean"):
        noise.check_agg(cfg, batch)
    # groups of other sizes: their mean would not be the batch gradient
    mixed = replay.batch_of(
        [_chain(0, i, i == 0) for i in range(4)] + [_chain(1, i, i == 0) for i in range(3)], cfg
    )
    with pytest.raises(SystemExit, match=r"different sizes \[3, 4\]"):
        noise.check_agg(TrainConfig.model_validate({}), mixed)


def _run(tmp_path, cfg: TrainConfig, step: int) -> tuple[Path, list[Chain]]:
    """A run folder as the loop leaves it: its config and one step's rollouts (3 groups of 4)."""
    from sage_rl.config import dump_config
    from sage_rl.text import dumps

    run = tmp_path / "run"
    (run / "rollouts").mkdir(parents=True)
    (run / "config.yaml").write_text(dump_config(cfg))
    chains = [_chain(g, i, i <= g % 3) for g in range(3) for i in range(4)]
    (run / "rollouts" / f"step_{step:06d}.jsonl").write_text("".join(dumps(c) + "\n" for c in chains))
    return run, chains


def test_the_script_on_a_saved_step_of_the_tiny_model(tiny_dir, tmp_path, monkeypatch, capsys):
    """The command as a user runs it: a run folder's config and step file, the model that sampled it."""
    from sage_rl.models import load_model

    cfg = TrainConfig.model_validate(
        {"rollout": {"chain_length": 1, "group_size": 4, "reward": "outcome", "dynamic_sampling": True}}
    )
    run, chains = _run(tmp_path, cfg, 1)
    out = tmp_path / "gn.json"
    argv = f"grad_noise.py --run {run} --start {tiny_dir} --advantages real --json {out}".split()
    monkeypatch.setattr("sys.argv", argv)
    noise.main()
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    written = json.loads(out.read_text())
    assert printed["groups"] == 3 and written["signal"] == printed["signal"] and len(written["gram"]) == 3
    assert not list(tmp_path.glob("*.f32"))  # the spilled gradients are gone
    # strict JSON: an unbounded figure is null
    assert noise.strict({"a": [math.inf, 1.0], "b": -math.inf}) == {"a": [None, 1.0], "b": None}
    # the batch gradient's norm is the trainer's, on the same batch from the same weights
    model, tok = load_model(str(tiny_dir))
    tcfg = cfg.trainer.model_copy(update={"log_kl_ref": False})
    tr = Trainer(model, tok, tcfg, temperature=cfg.sampling.temperature)
    batch = replay.batch_of(chains, cfg)
    tr.accumulate_gradients(batch.samples, batch.num_chains)
    grads = [p.grad.double() for p in tr.model.parameters() if p.grad is not None]
    assert printed["batch_grad_norm"] == pytest.approx(
        math.sqrt(sum(float(g.pow(2).sum()) for g in grads)), rel=1e-4
    )
    monkeypatch.setattr("sys.argv", [*argv[:2], str(run), "--step", "2", *argv[3:]])
    with pytest.raises(SystemExit, match="step_000002.jsonl does not exist"):
        noise.main()


def test_it_refuses_a_later_step_of_a_lora_run(tmp_path, monkeypatch):
    cfg = TrainConfig.model_validate(
        {"rollout": {"chain_length": 1, "group_size": 4, "reward": "outcome"}, "trainer": {"lora": {"r": 4}}}
    )
    run, _ = _run(tmp_path, cfg, 2)
    argv = f"grad_noise.py --run {run} --step 2 --start {tmp_path / 'nowhere'} --advantages real".split()
    monkeypatch.setattr("sys.argv", argv)
    with pytest.raises(SystemExit, match="LoRA run's step 2"):
        noise.main()
