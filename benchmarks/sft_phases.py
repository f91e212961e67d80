"""Where a whole SFT run's time goes: the recipe's SFT through ``train_sft`` for a few steps, then
with each of its costs switched (one variant each), on this machine's CPU or GPU: setup, steps,
held-out evaluations, the end. (``sft_bench.py`` times the optimizer step alone, by row layout.)
For the GPU SFT that took 229 s for 80 steps on an H200 (docs/LOG.md, 2026-12-04: 50 s before
packing, held-out evaluations with ``keep: best`` and ``dtype: auto``; which cost it was is not known).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/sft_phases.py DATA.jsonl [--model DIR] [--steps 12]
        [--variants recipe,fp32,dense,unpacked,no_eval,no_lean] [--config configs/laptop_recipe.yaml]
        [--device auto|cpu|cuda] [--json FILE]

DATA.jsonl: examples from ``sage-rl collect`` (e.g. ``runs/laptop30/expert/sage_expert.jsonl``).
Each variant trains a fresh copy of the model for ``--steps`` optimizer steps with the recipe's SFT
settings (``recipe.sft`` of ``--config``) and the variant's overrides (``VARIANTS``), and reports:

- ``setup_s``: from the call to the first step (data preparation, the step-0 held-out loss);
- ``step_s``: the median optimizer step without a held-out evaluation;
- ``eval_s``: the median extra time of a step that ends in a held-out evaluation (``eval_every``);
- ``end_s``: after the last step (the final held-out loss, restoring the best weights, saving);
- ``trained_tokens_per_s``: trained tokens over the steps' time.

Prints a table and one JSON object (``--json``: also to a file).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from sage_rl.agent.render import ChatRenderer
from sage_rl.config import load_config
from sage_rl.data.records import read_jsonl
from sage_rl.models import load_model
from sage_rl.recipe.pipeline import sft_config
from sage_rl.settings import TrainConfig
from sage_rl.train.sft import train_sft
from sage_rl.train.sft_config import SFTConfig

#: variant -> overrides of the SFT config (dotted keys)
VARIANTS: dict[str, dict[str, Any]] = {
    "recipe": {},
    "fp32": {"optim.dtype": "float32"},
    "bf16": {"optim.dtype": "bfloat16"},
    "dense": {"optim.attention": "dense"},
    "unpacked": {"optim.packing": False},
    "no_eval": {"output.eval_every": 0},
    "no_lean": {"optim.lean_activations": False},
}


def variant_config(base: SFTConfig, overrides: dict[str, Any], steps: int, out: Path) -> SFTConfig:
    """``base`` with ``overrides`` (dotted keys), exactly ``steps`` optimizer steps (as many epochs as
    that takes), no resume points, into ``out``."""
    data = base.model_dump(mode="json")
    run = {"optim.max_steps": steps, "optim.epochs": 1e6, "output.dir": str(out), "output.save_every_s": None}
    for key, value in {**overrides, **run}.items():
        *path, last = key.split(".")
        node = data
        for part in path:
            node = node[part]
        if last not in node:
            raise SystemExit(f"sft_phases: no SFT setting {key!r}")
        node[last] = value
    return SFTConfig.model_validate(data)


def timeline(marks: list[float], end: float, eval_every: int) -> dict[str, float | None]:
    """Phase times from the start of each step (``marks[0]`` = step 1) and the end of the run; a
    step k (1-based) with ``k % eval_every == 0`` ends in a held-out evaluation (the last one's
    is counted in ``end_s``, as the loop runs it after the steps)."""
    n = len(marks)
    spans = [marks[i + 1] - marks[i] for i in range(n - 1)]  # steps 1 .. n-1
    with_eval = {k for k in range(1, n) if eval_every and k % eval_every == 0}
    plain = [s for k, s in enumerate(spans, start=1) if k not in with_eval]
    step = statistics.median(plain) if plain else None
    extra = [spans[k - 1] - step for k in sorted(with_eval)] if step is not None else []
    return {"step_s": step, "eval_s": statistics.median(extra) if extra else None, "end_s": end - marks[-1]}


def run_variant(name: str, base: SFTConfig, examples: list, steps: int, device: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"sft_phases_{name}_") as tmp:
        cfg = variant_config(base, VARIANTS[name], steps, Path(tmp))
        model, tok = load_model(cfg.model, device=device)
        marks: list[float] = []
        t0 = time.perf_counter()
        _, result = train_sft(model, tok, examples, cfg, ChatRenderer(tok).conversation, False,
                              lambda step: marks.append(time.perf_counter()))  # fmt: skip
        end = time.perf_counter()
        rows = [json.loads(line) for line in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]
    phases = timeline(marks, end, cfg.output.eval_every)
    tokens = sum(r.get("tokens", 0) for r in rows if r.get("step", 0) >= 1)
    steps_time = marks[-1] - marks[0] + (phases["step_s"] or 0.0) if marks else None
    return {
        "variant": name, "overrides": VARIANTS[name], "steps": result.steps, "dtype": result.dtype,
        "setup_s": (marks[0] - t0) if marks else None, **phases, "total_s": end - t0,
        "trained_tokens_per_s": tokens / steps_time if steps_time else None,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("data", type=Path, help="examples from sage-rl collect (JSON Lines)")
    ap.add_argument("--model", default=None, help="model folder (default: the config's policy.model, the embedded SmolLM2)")
    ap.add_argument("--config", default="configs/laptop_recipe.yaml", help="the recipe whose SFT settings are timed")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--variants", default="recipe,fp32,dense,unpacked,no_eval,no_lean")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    names = [v for v in args.variants.split(",") if v]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown or not names:
        raise SystemExit(f"sft_phases: unknown variants {unknown}: choose from {', '.join(VARIANTS)}")
    cfg = load_config(TrainConfig, args.config, [f"policy.model={args.model}"] if args.model else [])
    if cfg.recipe is None:
        raise SystemExit(f"sft_phases: {args.config} has no recipe section (its SFT settings are what is timed)")
    base = sft_config(cfg, cfg.recipe, args.data, Path("unused"))
    examples = read_jsonl(args.data)
    device = args.device if args.device != "auto" else base.optim.device
    rows = [run_variant(name, base, examples, args.steps, device) for name in names]
    table = Table(title=f"SFT, {args.steps} steps of {args.config}'s recipe.sft, {len(examples)} examples")
    for col in ("variant", "dtype", "setup s", "step s", "eval s", "end s", "trained tok/s"):
        table.add_column(col)
    f = lambda v, spec=".2f": "-" if v is None else format(v, spec)  # noqa: E731
    for r in rows:
        table.add_row(r["variant"], str(r["dtype"]), f(r["setup_s"]), f(r["step_s"]), f(r["eval_s"]), f(r["end_s"]),
                      f(r["trained_tokens_per_s"], ",.0f"))  # fmt: skip
    Console(stderr=True).print(table)
    out = {"config": args.config, "data": str(args.data), "examples": len(examples), "device": device, "variants": rows}
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
