"""Training memory by sample length: the peak of one ``Trainer.step`` on long multi-turn samples.

    .venv/bin/python benchmarks/train_memory.py [--model smollm2|tiny] [--lengths 2730,2600 ...]
        [--variants padding,causal,causal_cap] [--micro-batch 2] [--cap 6144] [--no-kl] [--limit-gb G]

Why: an RL step's memory grows faster than its samples' length, and the longest sample of a run
decides whether the run lives (laptop30 was killed at step 12 by a 4,184-token sample; docs/LOG.md,
sessions 34-35). This measures that step, one fresh process per (lengths, variant), so each peak is
its own:
- ``padding``: transformers' own attention path (``causal_attention: false``): a boolean padding
  mask that torch's CPU attention converts to float in every layer and keeps for backward;
- ``causal``: ``causal_attention: true`` (sage_rl/train/causal.py: one float causal mask per forward);
- ``causal_cap``: that and ``micro_batch_tokens: --cap`` (a long sample no longer pads its partner).

The samples are shaped like a SAGE group's chains: a ``--prompt`` (900) token opening that they share,
then three turns each, two thirds generated and one third observation (no loss), up to each length.
The trainer is built as the laptop recipe's RL builds it (lr 1e-5, grad clip 1, T = 0.5, the
initial model kept for ``log_kl_ref`` unless ``--no-kl``).

Per run: ``peak_gb`` (the child's peak resident memory, Linux ``VmHWM``), ``step_gb`` (the peak less
what the process held just before the step: the model and its reference copy; Adam's state, made
in a first step, is in it),
``seconds``, and ``ratio_to_padding`` (step_gb / padding's, same lengths). A child whose resident
memory passes ``--limit-gb`` (default: 80% of the memory available at the start) is stopped and
reported as ``over_limit`` rather than left to the kernel's OOM killer. Figures go to stderr as they
come and one JSON object to stdout at the end.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu_info, uptime  # noqa: E402

VARIANTS = ("padding", "causal", "causal_cap")


def rows_for(lengths: list[int], prompt_len: int, vocab: int, seed: int = 0) -> list[dict[str, Any]]:
    """One row per length: the shared opening, then three (generated, observation) turns up to it."""
    rng = random.Random(seed)

    def span(n: int) -> list[int]:
        return [rng.randrange(3, vocab) for _ in range(n)]

    prompt = span(prompt_len)
    rows = []
    for i, total in enumerate(lengths):
        if total <= prompt_len + 3:
            raise SystemExit(f"--lengths: {total} is not longer than the {prompt_len}-token opening")
        per = (total - prompt_len) // 3
        turns = [(span(per * 2 // 3), span(per - per * 2 // 3)) for _ in range(3)]
        rows.append({"prompt": prompt, "turns": turns, "adv": 1.0 if i % 2 else -1.0})
    return rows


def child(a: argparse.Namespace) -> None:
    """Run one step in this process and print its figures as one JSON line."""
    import torch
    from train_bench import as_samples, load

    from sage_rl.memory import bound_heap, peak_rss_bytes, reset_peak
    from sage_rl.train.trainer import Trainer, TrainerConfig

    bound_heap()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model, tok = load(a.model)
    cfg = TrainerConfig(
        lr=1e-5,
        warmup_steps=2,
        micro_batch_size=a.micro_batch,
        grad_clip=1.0,
        log_kl_ref=not a.no_kl,
        causal_attention=a.child != "padding",
        micro_batch_tokens=a.cap if a.child == "causal_cap" else None,
    )
    trainer = Trainer(model, tok, cfg, temperature=0.5)
    samples = as_samples(rows_for(a.lengths[0], a.prompt, len(tok)))
    reset_peak()
    before = peak_rss_bytes() or 0
    t0 = time.perf_counter()
    trainer.step(samples, num_chains=len(samples))
    seconds = time.perf_counter() - t0
    peak = peak_rss_bytes() or 0
    out = {"peak_gb": peak / 1e9, "step_gb": (peak - before) / 1e9, "seconds": seconds}
    out["causal_used"] = bool(trainer.causal)
    sys.stdout.write(json.dumps(out) + "\n")


def rss_bytes(pid: int) -> int:
    """A process's resident memory now (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def available_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise SystemExit("/proc/meminfo has no MemAvailable: this benchmark needs Linux")


def run_one(lengths: list[int], variant: str, a: argparse.Namespace, limit: int) -> dict[str, Any]:
    """One child, watched: its figures, or why it has none."""
    cmd = [sys.executable, __file__, "--child", variant, "--lengths", ",".join(map(str, lengths))]
    cmd += ["--model", a.model, "--micro-batch", str(a.micro_batch), "--cap", str(a.cap)]
    cmd += ["--prompt", str(a.prompt), "--threads", str(a.threads)] + (["--no-kl"] if a.no_kl else [])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    high = 0
    while proc.poll() is None:
        high = max(high, rss_bytes(proc.pid))
        if high > limit:
            proc.kill()
            proc.wait()
            return {"over_limit": True, "limit_gb": limit / 1e9}
        time.sleep(0.05)
    out, err = proc.communicate()
    if proc.returncode != 0:
        tail = err.strip().splitlines()[-3:]
        return {"error": f"exit {proc.returncode}", "stderr_tail": tail}
    return json.loads(out.strip().splitlines()[-1])


def parse_lengths(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not comma-separated token counts: {text!r}") from None
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"not positive token counts: {text!r}")
    return values


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=["tiny", "smollm2"], default="smollm2")
    p.add_argument("--lengths", type=parse_lengths, action="append",
                   help="a batch's sample lengths in tokens, comma-separated; repeatable "
                   "(default: 1365,1300 and 2730,2600 and 4184,2730)")  # fmt: skip
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {VARIANTS}")
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--cap", type=int, default=6144, help="micro_batch_tokens of causal_cap")
    p.add_argument("--prompt", type=int, default=900, help="tokens of the opening the samples share")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-kl", action="store_true", help="no reference model (log_kl_ref off)")
    p.add_argument("--limit-gb", type=float, default=None, help="stop a child above this resident memory")
    p.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.lengths = a.lengths or [[1365, 1300], [2730, 2600], [4184, 2730]]
    if a.child:
        child(a)
        return None
    variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or not variants:
        p.error(f"--variants: unknown {unknown} (choose from {', '.join(VARIANTS)})")
    limit = int(a.limit_gb * 1e9) if a.limit_gb else int(0.8 * available_bytes())
    runs = []
    for lengths in a.lengths:
        base = None
        for variant in variants:
            r = {"lengths": lengths, "variant": variant, **run_one(lengths, variant, a, limit)}
            if variant == "padding" and "step_gb" in r:
                base = r["step_gb"]
            if base and "step_gb" in r:
                r["ratio_to_padding"] = r["step_gb"] / base
            runs.append(r)
            print(json.dumps(r), file=sys.stderr, flush=True)
    result = {
        "model": a.model,
        "micro_batch": a.micro_batch,
        "cap": a.cap,
        "prompt": a.prompt,
        "log_kl_ref": not a.no_kl,
        "threads": a.threads,
        "limit_gb": limit / 1e9,
        "cpu": cpu_info(),
        "load": uptime(),
        "runs": runs,
    }
    sys.stdout.write(json.dumps(result) + "\n")
    return result


if __name__ == "__main__":
    main()
