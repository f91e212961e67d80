"""``sage-rl sft [CONFIG] [key=value ...] [--json]``: fine-tune on expert chat examples (issue 7)."""

from __future__ import annotations

import json

import typer

from sage_rl.memory import bound_heap
from sage_rl.runs.console import err, fail, load_or_exit
from sage_rl.train.sft_config import SFTConfig


def main(
    ctx: typer.Context,
    config: str = typer.Argument(None, help="YAML config (default: configs/sft.yaml)"),
    as_json: bool = typer.Option(False, "--json", help="print the result as one JSON object on stdout"),
) -> None:
    """Causal-LM fine-tuning on the trained assistant turns of a chat JSON Lines dataset.

    Overrides follow the config, e.g. ``data.path=runs/expert/sage_expert.jsonl optim.epochs=1 lora.enabled=true``.
    """
    bound_heap()  # SFT's freed activations leave the process (sage_rl/memory.py)
    cfg = load_or_exit(SFTConfig, config, ctx.args, default="configs/sft.yaml")
    from sage_rl.runs.sft import run_sft  # torch and the run's modules, once the config is good
    from sage_rl.train.sft_resume import SFTStopped

    try:
        result = run_sft(cfg, show_progress=not as_json)
    except (ValueError, RuntimeError, OSError) as e:  # bad data, unloadable model: one-line errors
        raise fail(str(e)) from None
    except SFTStopped as e:  # Ctrl-C or SIGTERM, after a step and its resume point
        raise fail(f"{e} (the same command goes on)", 130) from None
    if as_json:
        typer.echo(json.dumps(result))
    else:
        for k, v in result.items():
            err.print(f"{k:>26}: {v}", highlight=False)
