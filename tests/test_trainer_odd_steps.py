"""Steps with nothing, or nothing finite, to train on (a fuzz of the trainer in session 26:
docs/LOG.md): the run goes on and the weights stay as they were."""

from __future__ import annotations

import torch
from test_trainer import batch, make_sample, small_model

from sage_rl.train.trainer import Trainer, TrainerConfig


def _weights(model) -> list:
    return [p.detach().clone() for p in model.parameters()]


def test_a_step_with_nothing_to_train_on_updates_nothing_and_goes_on():
    """No samples (every group dropped under ``drop_below``, or every task failed before its first
    turn) raised "Trainer.step: no samples" out of the loop; the step's journal made every resume
    raise again. Samples with an advantage but no generated token stepped Adam on its momentum."""
    from sage_rl.train.optim import updates_made

    tr = Trainer(small_model(), None, TrainerConfig(lr=1e-2))
    tr.step(batch(), 5)  # Adam has moments: a step on a zero gradient would still move the weights
    before = _weights(tr.model)
    for samples, chains in (([], 0), ([], 3), ([make_sample([1, 5], [([], [6, 7])], 1.0)], 1)):
        stats = tr.step(samples, chains)
        assert stats["updated"] == 0.0 and stats["nonfinite_grad"] == 0.0
        assert all(torch.equal(a, b) for a, b in zip(before, tr.model.parameters(), strict=True))
    assert updates_made(tr.optimizer) == 1


def test_a_gradient_that_is_not_finite_is_not_applied():
    """A NaN anywhere in the gradient (a numeric blow-up; forced here by a NaN advantage) made every
    weight NaN, then every checkpoint: the run went on sampling from NaN logits."""
    from sage_rl.train.optim import updates_made

    tr = Trainer(small_model(), None, TrainerConfig(lr=1e-2))
    before = _weights(tr.model)
    stats = tr.step([make_sample([1, 5], [([7, 8], [])], float("nan")), *batch()], 6)
    assert stats["nonfinite_grad"] == 1.0 and stats["updated"] == 0.0 and stats["grad_norm"] == -1.0
    assert all(torch.equal(a, b) for a, b in zip(before, tr.model.parameters(), strict=True))
    assert updates_made(tr.optimizer) == 0
    assert tr.step(batch(), 5)["updated"] == 1.0  # the next, finite step trains as usual
    assert all(torch.isfinite(p).all() for p in tr.model.parameters())


def test_a_run_whose_steps_have_nothing_to_train_on_finishes(tmp_path):
    """The loop over such steps (``rollout.drop_below`` and a template every chain fails: every
    group flat, every sample dropped) stopped at its first step, and at every resume after it."""
    import asyncio

    from test_screened_pool import TemplateSuite, _runner

    from sage_rl.rollout.batch import RolloutConfig
    from sage_rl.train import loop as loop_module
    from sage_rl.train.config import LoopConfig, TrainEvalConfig
    from sage_rl.train.logging import MetricsLogger, read_metrics

    rollout = RolloutConfig(chain_length=1, group_size=2, groups_per_step=2, concurrency=4, drop_below=0.01)
    evals = TrainEvalConfig(before_after=False)
    cfg = LoopConfig(rollout=rollout, eval=evals, steps=2, out_dir=str(tmp_path))
    tr = Trainer(small_model(), None, TrainerConfig(lr=1e-2))
    before = _weights(tr.model)
    logger = MetricsLogger(tmp_path, tensorboard=False)
    try:
        runner = _runner(TemplateSuite(("never",)))
        asyncio.run(loop_module.train(runner, tr, logger, cfg, 0, 0, sync=lambda: None))
    finally:
        logger.close()
    rows = read_metrics(tmp_path)
    assert [(r["step"], r["updated"], r["samples"]) for r in rows] == [(1, 0.0, 0.0), (2, 0.0, 0.0)]
    assert all(torch.equal(a, b) for a, b in zip(before, tr.model.parameters(), strict=True))
