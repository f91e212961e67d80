"""Whether bf16 autocast computes the RL gradient of a real rollout batch: its distance to the fp32
gradient, against fp32's own noise floor, and the time each takes.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bf16_grad.py [--model PATH] [--tasks 4] [--group 4]
        [--config configs/laptop_recipe.yaml] [--threads 2] [--seed 0] [--batch-file F] [--data F] [key=value ...]

Why: ``trainer.dtype: bfloat16`` made a GRPO step 2.04x faster on a CPU with AVX512-BF16, but on
``train_bench.py``'s random-token batch its gradient was far from fp32's (|g_bf16 - g_fp32| / |g_fp32|
= 0.93; docs/LOG.md, 2026-11-28), so fp32 stayed the CPU default. That batch is random tokens, whose
logprobs (~ -10) no policy samples. This measures a batch the recipe's RL would train on:

1. G chains of each of the first ``--tasks`` train scenarios' first task (K = 1), sampled by
   ``--model`` (default: the config's, the base SmolLM2; an SFT model's folder for a policy that
   succeeds) with the config's prompt, limits and temperature, in the sandboxed PocketWorld;
   or, with ``--data``, ``--tasks x --group`` examples of an SFT dataset (the expert's text, which an
   SFT model samples nearly as its own) as samples of that shape, ``--group`` at a time;
2. its samples and advantages as the RL step makes them (``rollout.batch.to_samples``). Where every
   chain of a group got the same reward (the base model fails everything) the group has no
   gradient, so ``--advantages random`` (the default when no group has a spread) gives each group
   zero-mean +-1 advantages instead: the same tokens, the same cancelling sum GRPO takes;
3. the gradient of one ``Trainer`` pass over that batch (the recipe's trainer section: chunked head,
   shared prefixes, micro-batches) under: ``fp32`` (reference), ``fp32_split`` (fp32 again with
   ``micro_batch_size`` 1: the same sum in another order, fp32's own noise floor) and ``bf16``.

Prints one JSON object: per variant ``rel_err`` (|g - g_fp32| / |g_fp32|), ``cosine``, ``sign_agree``
(the share of |g_fp32|'s mass whose sign the variant keeps: what Adam's first steps follow), the
same three for the largest parameter (the embedding, tied to the LM head) and the rest, and
``seconds`` (one pass, wall). Figures go to stderr as they come.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import pickle
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu_info, uptime  # noqa: E402

from sage_rl.build import build_policy, build_runner, open_suite
from sage_rl.config import load_config
from sage_rl.eval.runner import scenarios_of
from sage_rl.models import load_model
from sage_rl.rollout.batch import to_samples
from sage_rl.settings import TrainConfig
from sage_rl.skills.library import Library
from sage_rl.train.trainer import Trainer
from sage_rl.types import ExecResult, Outcome, Sample, StopReason, Task, Trajectory, Turn

VARIANTS = {"fp32": {}, "fp32_split": {"micro_batch_size": 1}, "bf16": {"dtype": "bfloat16"}}


def log(**kw: Any) -> None:
    print(json.dumps(kw), file=sys.stderr, flush=True)


async def sample_groups(cfg: TrainConfig, model: Any, tok: Any, tasks: int, group: int) -> list[list[Any]]:
    """``group`` chains of each of the first ``tasks`` train scenarios' first task."""
    policy = build_policy(cfg, model=model, tokenizer=tok)
    async with open_suite(cfg, "train") as suite:
        runner = build_runner(cfg, policy, suite)
        firsts = [s[:1] for s in scenarios_of(suite.split("train", tasks))]
        runs = [
            runner.run(task, Library(), group_index=i, chain_index=c, step=0)
            for i, task in enumerate(firsts)
            for c in range(group)
        ]
        chains = await asyncio.gather(*runs)
    return [list(chains[i * group : (i + 1) * group]) for i in range(tasks)]


def data_samples(path: Path, tok: Any, count: int, group: int, seed: int, max_length: int) -> list[Sample]:
    """``count`` examples of an SFT dataset (``collect``'s ``sage_expert.jsonl``), evenly spaced, as
    RL samples: the text before the first assistant message is the prompt, each assistant message a
    turn's generated tokens, what follows it the turn's observation; cut at ``max_length`` tokens.
    Each run of ``group`` examples gets zero-mean +-1 advantages."""
    from sage_rl.agent.render import ChatRenderer
    from sage_rl.data.records import read_jsonl
    from sage_rl.train.sft_data import mask_runs

    examples = read_jsonl(path)
    conversation, rng, out = ChatRenderer(tok).conversation, random.Random(seed), []
    for i, ex in enumerate(examples[:: max(1, len(examples) // count)][:count]):
        ids, mask = conversation(ex.chat())
        ids, mask = ids[:max_length], mask[:max_length]
        runs = mask_runs(mask)
        if not runs:
            continue
        ends = [s for s, _ in runs[1:]] + [len(ids)]
        turns = tuple(
            Turn(tuple(ids[s:e]), (0.0,) * (e - s), "", "x", ExecResult("", True), obs_ids=tuple(ids[e:nxt]))
            for (s, e), nxt in zip(runs, ends, strict=True)
        )
        task = Task(f"d_{i}", "d", 1, "", "train")
        traj = Trajectory(task, tuple(ids[: runs[0][0]]), turns, Outcome(0.0, False), StopReason.COMPLETED)
        out.append(Sample(((task.task_id,), 0), traj, 0.0, 0.0))
    for k in range(0, len(out), group):
        part = out[k : k + group]
        signs = zero_mean_signs(len(part), rng)
        out[k : k + group] = [dataclasses.replace(x, advantage=a) for x, a in zip(part, signs, strict=True)]
    return out


def zero_mean_signs(n: int, rng: random.Random) -> list[float]:
    """``n`` advantages of +-1 (and one 0 when ``n`` is odd) summing to 0, shuffled."""
    signs = [1.0, -1.0] * (n // 2) + [0.0] * (n % 2)
    rng.shuffle(signs)
    return signs


def random_advantages(groups: list[list[Any]], cfg: TrainConfig, seed: int) -> list[Sample]:
    """Every sample of the batch, each group's advantages a zero-mean draw of +-1."""
    rng, out = random.Random(seed), []
    for chains in groups:
        for sign, chain in zip(zero_mean_signs(len(chains), rng), chains, strict=True):
            s = to_samples([[chain]], cfg.rollout.model_copy(update={"drop_below": None}))
            out += [dataclasses.replace(x, advantage=sign) for x in s]
    return out


def gradient(model: Any, tok: Any, cfg: TrainConfig, samples: list[Sample], num_chains: int, **over: Any):
    """The flat gradient of one pass over ``samples`` by a trainer over ``model``, and its seconds."""
    trainer = Trainer(
        model,
        tok,
        cfg.trainer.model_copy(update={"log_kl_ref": False, **over}),
        temperature=cfg.sampling.temperature,
    )
    trainer.optimizer.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    trainer.accumulate_gradients(samples, num_chains)
    seconds = time.perf_counter() - t0
    grads = {n: p.grad.detach().flatten().clone() for n, p in model.named_parameters() if p.grad is not None}
    trainer.optimizer.zero_grad(set_to_none=True)
    return grads, seconds


def compare(ref: torch.Tensor, g: torch.Tensor) -> dict[str, float]:
    """rel_err, cosine, and the share of |ref|'s mass whose sign ``g`` keeps (in float64: float32's
    sums over 135M entries read a cosine of 1.03)."""
    ref, g = ref.double(), g.double()
    agree = (torch.sign(ref) == torch.sign(g)).to(ref.dtype)
    return {
        "rel_err": float((g - ref).norm() / ref.norm()),
        "cosine": float(torch.nn.functional.cosine_similarity(ref, g, dim=0)),
        "sign_agree": float((agree * ref.abs()).sum() / ref.abs().sum()),
    }


def batch(a: argparse.Namespace, cfg: TrainConfig, model: Any, tok: Any) -> tuple[list[Sample], str, list]:
    """(the samples, how their advantages were made, the sampled groups: none with ``--data``)."""
    if a.data is not None:
        return (
            data_samples(a.data, tok, a.tasks * a.group, a.group, a.seed, a.max_length),
            "random (SFT data)",
            [],
        )
    if a.batch_file is not None and a.batch_file.is_file():
        groups = pickle.loads(a.batch_file.read_bytes())
    else:
        groups = asyncio.run(sample_groups(cfg, model, tok, a.tasks, a.group))
        if a.batch_file is not None:
            a.batch_file.write_bytes(pickle.dumps(groups))
    samples = to_samples(groups, cfg.rollout)
    if samples and a.advantages != "random":
        return samples, "real", groups
    if a.advantages == "real":
        raise SystemExit(
            "no group has a spread of rewards: no real gradient (try --advantages random or an SFT model)"
        )
    return random_advantages(groups, cfg, a.seed), "random", groups


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/laptop_recipe.yaml")
    ap.add_argument("--model", default=None, help="a model folder (default: the config's policy.model)")
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--advantages", choices=["auto", "real", "random"], default="auto")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--data", type=Path, default=None, help="samples from this SFT dataset instead of sampling"
    )
    ap.add_argument("--max-length", type=int, default=2048, help="--data: tokens per sample at most")
    ap.add_argument(
        "--batch-file",
        type=Path,
        default=None,
        help="sampled chains kept here (pickle) and reused when present",
    )
    ap.add_argument("overrides", nargs="*", help="key.sub=value overrides of the config (agent.max_steps=3)")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    over = [f"policy.threads={a.threads}", f"sampling.seed={a.seed}"]
    over += [f"policy.model={a.model}"] if a.model else []
    cfg = load_config(TrainConfig, Path(a.config), over + a.overrides)
    model, tok = load_model(cfg.policy.model)
    model.float()
    t0 = time.perf_counter()
    samples, kind, groups = batch(a, cfg, model, tok)
    if not samples:
        raise SystemExit("no sample has a generated token (with --data: none within --max-length)")
    rewards = [[c.trajectories[0].outcome.score for c in g] for g in groups]
    tokens = sum(
        len(s.trajectory.prompt_ids) + sum(len(t.gen_ids) + len(t.obs_ids) for t in s.trajectory.turns)
        for s in samples
    )
    gen = sum(len(t.gen_ids) for s in samples for t in s.trajectory.turns)
    log(
        sampled_s=round(time.perf_counter() - t0, 1),
        samples=len(samples),
        tokens=tokens,
        generated=gen,
        rewards=rewards,
    )
    state = {k: v.clone() for k, v in model.state_dict().items()}
    grads, out = {}, {}
    for name, over_kw in VARIANTS.items():
        model.load_state_dict(state)
        grads[name], seconds = gradient(model, tok, cfg, samples, len(samples), **over_kw)
        out[name] = {"seconds": round(seconds, 1)}
        log(variant=name, seconds=round(seconds, 1))
    ref = grads["fp32"]
    biggest = max(ref, key=lambda n: ref[n].numel())
    for name in ("fp32_split", "bf16"):
        flat = lambda gs, keep: torch.cat([gs[n] for n in ref if keep(n)])  # noqa: E731
        out[name] |= compare(flat(ref, lambda n: True), flat(grads[name], lambda n: True))
        out[name]["largest"] = compare(ref[biggest], grads[name][biggest])
        out[name]["rest"] = compare(
            flat(ref, lambda n: n != biggest), flat(grads[name], lambda n: n != biggest)
        )
        log(variant=name, **{k: v for k, v in out[name].items() if not isinstance(v, dict)})
    result = {
        "model": cfg.policy.model or "smollm2",
        "advantages": kind,
        "samples": len(samples),
        "tokens": tokens,
        "generated_tokens": gen,
        "largest_param": biggest,
        "bf16_speedup": round(out["fp32"]["seconds"] / out["bf16"]["seconds"], 2),
        "variants": out,
        "cpu": cpu_info(),
        "load": uptime(),
    }
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
