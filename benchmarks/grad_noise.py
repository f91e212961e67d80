"""How much of an RL step's gradient is the reward's signal: the gradient noise scale of a saved step.

``replay_update.py`` showed (laptop35 ``grpo_lib`` step 1, one seed) that an update with each group's
advantages shuffled moves greedy decoding about as much as the real one. This script asks the same
question of the gradient itself, with the standard measure of large-batch training (McCandlish et
al. 2018, "An Empirical Model of Large-Batch Training"): the step's batch gradient is the mean of its
``n`` trained groups' gradients ``g_i`` (``seq_mean_token_mean``: each group normalised by its own
chains), and from their Gram matrix ``K_ij = g_i . g_j``

    |G|^2     = mean of K_ij over i != j         (unbiased: the squared norm of the expected gradient)
    tr(Sigma) = mean of K_ii - |G|^2             (unbiased: the variance of one group's gradient)
    B_simple  = tr(Sigma) / |G|^2                (groups a step at which signal and noise are equal)

so that the batch gradient's expected squared norm is ``|G|^2 + tr(Sigma) / n``, and the signal's
share of it at ``n`` groups is ``|G|^2 / (|G|^2 + tr(Sigma) / n)``. Intervals: +-1.96 jackknife
standard errors over groups (leave one group out). With ``--advantages shuffled`` each group's
advantages are permuted among its samples (``replay_update.shuffled``): the expected gradient is then
exactly 0, so ``|G|^2``'s interval must hold 0 - the estimator's own null control.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/grad_noise.py --run runs/laptop35/grpo_lib --step 1 \\
        --start runs/laptop35/sft/final --advantages real

``--start`` must be the model that sampled the step (for step 1, the run's start). The groups'
gradients are written to a float32 file beside ``--json`` (n x 540 MB for a 135M model, removed at the
end) and their products summed in float64. The cost is one update's forward and backward, one sample
a micro-batch (laptop35's step 1: ~10 minutes beside the experiment, peak RSS 13.5 GB of which ~8.6 GB
are the file's pages). Prints the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from replay_update import add_step_args, saved_step

from sage_rl.rollout.batch import StepBatch
from sage_rl.runs.console import progress
from sage_rl.settings import TrainConfig
from sage_rl.train.config import LossAgg
from sage_rl.train.noise import noise_from_sums
from sage_rl.train.trainer import Trainer


def noise_scale(gram: np.ndarray) -> dict[str, float]:
    """``|G|^2``, ``tr(Sigma)``, ``B_simple``, the signal's share at the step's ``n`` groups
    (``train/noise.py: noise_from_sums``) and the mean cosine between two groups' gradients, from the
    groups' Gram matrix (n >= 2). ``B_simple`` is inf where ``|G|^2 <= 0`` (no signal resolved)."""
    k = np.asarray(gram, dtype=np.float64)
    n = k.shape[0]
    if k.shape != (n, n) or n < 2:
        raise ValueError(f"noise_scale: a square Gram matrix of at least 2 groups, got shape {k.shape}")
    diag = np.diag(k)
    sums = noise_from_sums(n, float(k.sum()), float(diag.sum()))
    norms = np.sqrt(np.maximum(diag, 0.0))
    outer = np.outer(norms, norms)
    off = ~np.eye(n, dtype=bool) & (outer > 0)
    cos = float((k[off] / outer[off]).mean()) if off.any() else 0.0
    return {
        "signal": sums["signal"],
        "noise": sums["trace"],
        "b_simple": sums["b_simple"],
        "signal_share": sums["signal_share"],
        "mean_cosine": cos,
    }


def jackknife(gram: np.ndarray, key: str) -> float:
    """The jackknife standard error of ``noise_scale(gram)[key]`` over groups (leave one out)."""
    k = np.asarray(gram, dtype=np.float64)
    n = k.shape[0]
    if n < 3:
        return math.nan
    keep = [np.delete(np.arange(n), i) for i in range(n)]
    vals = np.array([noise_scale(k[np.ix_(idx, idx)])[key] for idx in keep])
    return float(math.sqrt((n - 1) / n * ((vals - vals.mean()) ** 2).sum()))


def summary(gram: np.ndarray) -> dict[str, Any]:
    """``noise_scale`` with 95% intervals (+-1.96 jackknife SE) for the signal, the noise and the mean
    cosine, ``B_simple`` over the signal's interval, and the signal's share of the batch gradient's
    expected squared norm at the step's ``n`` groups."""
    n = gram.shape[0]
    out = noise_scale(gram) | {"groups": n}
    for key in ("signal", "noise", "mean_cosine"):
        se = jackknife(gram, key)
        out[f"{key}_ci"] = [out[key] - 1.96 * se, out[key] + 1.96 * se]
    v = out["noise"]
    # B_simple over the signal's interval (noise at its estimate): inf where the interval reaches 0
    lo, hi = out["signal_ci"]
    out["b_simple_ci"] = [v / hi if hi > 0 else math.inf, v / lo if lo > 0 else math.inf]
    return out


def strict(x: Any) -> Any:
    """``x`` with every non-finite float as None (JSON's null: an unbounded ``B_simple``)."""
    if isinstance(x, dict):
        return {k: strict(v) for k, v in x.items()}
    if isinstance(x, list):
        return [strict(v) for v in x]
    return None if isinstance(x, float) and not math.isfinite(x) else x


def group_gradients(trainer: Trainer, batch: StepBatch) -> Iterator[torch.Tensor]:
    """Each trained group's gradient of the step's loss, normalised by its own chains, flattened
    (fp32): their mean is the step's batch gradient."""
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    with progress() as bar:
        for group in bar.track(batch.trained, description="groups' gradients"):
            trainer.optimizer.zero_grad(set_to_none=True)
            trainer.accumulate_gradients(group.samples, len(group.chains))
            yield torch.cat(
                [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]
            )
    trainer.optimizer.zero_grad(set_to_none=True)


def gram_of(vectors: Iterable[torch.Tensor], spill: Path, chunk: int = 1 << 22) -> np.ndarray:
    """The Gram matrix of ``vectors`` in float64 sums. Each vector is written as a float32 row of the
    file ``spill`` (removed after), and the products are summed over column blocks of ``chunk``: memory
    holds one vector and one block of all of them, not n vectors."""
    n, d = 0, 0
    try:
        with open(spill, "wb") as f:
            for v in vectors:
                row = v.detach().float().cpu().numpy()
                if n and row.size != d:
                    raise ValueError(f"gram_of: vector {n} has {row.size} entries, the first {d}")
                row.tofile(f)
                n, d = n + 1, row.size
        rows = np.memmap(spill, np.float32, "r", shape=(n, d))
        k = np.zeros((n, n))
        for s in range(0, d, chunk):
            block = np.asarray(rows[:, s : s + chunk], dtype=np.float64)
            k += block @ block.T
        del rows
    finally:
        spill.unlink(missing_ok=True)
    return k


def check_agg(cfg: TrainConfig, batch: StepBatch) -> None:
    if cfg.trainer.loss_agg is not LossAgg.SEQ_MEAN_TOKEN_MEAN:
        raise SystemExit(
            f"grad_noise: trainer.loss_agg={cfg.trainer.loss_agg.value}: the batch gradient is the mean of "
            "its groups' only under seq_mean_token_mean"
        )
    sizes = {len(g.chains) for g in batch.trained}
    if len(sizes) != 1:
        raise SystemExit(f"grad_noise: the trained groups have different sizes {sorted(sizes)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_step_args(ap)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    a = ap.parse_args()
    cfg, batch = saved_step(a, "grad_noise")
    if len(batch.trained) < 3:
        raise SystemExit(
            f"grad_noise: step {a.step} trained {len(batch.trained)} groups; 3 or more are needed"
        )
    check_agg(cfg, batch)
    if cfg.trainer.lora is not None and a.step != 1:
        raise SystemExit(
            f"grad_noise: a LoRA run's step {a.step} was sampled by its start plus an adapter that --start "
            "cannot name; its step 1 (fresh adapters) is measurable"
        )
    from sage_rl.models import load_model

    model, tok = load_model(str(a.start))
    # one sample a micro-batch: the same gradient as the run's, in less memory beside a running experiment
    tcfg = cfg.trainer.model_copy(update={"log_kl_ref": False, "micro_batch_size": 1})
    trainer = Trainer(model, tok, tcfg, temperature=cfg.sampling.temperature)
    spill = (a.json or Path(f"grad_noise_{os.getpid()}.json")).with_suffix(".grads.f32")
    gram = gram_of(group_gradients(trainer, batch), spill)
    out = {"run": str(a.run), "step": a.step, "advantages": a.advantages, "seed": a.seed} | summary(gram)
    out["batch_grad_norm"] = float(math.sqrt(max(gram.sum(), 0.0)) / gram.shape[0])
    out["gram"] = gram.tolist()
    text = json.dumps(strict(out), allow_nan=False)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(text + "\n")
    print(json.dumps(strict({k: v for k, v in out.items() if k != "gram"}), allow_nan=False))


if __name__ == "__main__":
    main()
