"""``sage-rl sft [CONFIG] [key=value ...] [--json]``: fine-tune on expert chat examples (issue 7)."""

from __future__ import annotations

import json

import typer

from sage_rl.cli.common import err, fail, load_or_exit
from sage_rl.train.sft_config import SFTConfig


def main(
    ctx: typer.Context,
    config: str = typer.Argument(None, help="YAML config (default: configs/sft.yaml)"),
    as_json: bool = typer.Option(False, "--json", help="print the result as one JSON object on stdout"),
) -> None:
    """Causal-LM fine-tuning on the trained assistant turns of a chat JSON Lines dataset.

    Overrides follow the config, e.g. ``data.path=runs/expert/sage_expert.jsonl optim.epochs=1 lora.enabled=true``.
    """
    cfg = load_or_exit(SFTConfig, config, ctx.args, default="configs/sft.yaml")
    try:
        result = run(cfg, show_progress=not as_json)
    except (ValueError, RuntimeError, OSError) as e:  # bad data, unloadable model: one-line errors
        raise fail(str(e)) from None
    if as_json:
        typer.echo(json.dumps(result))
    else:
        for k, v in result.items():
            err.print(f"{k:>26}: {v}", highlight=False)


def run(cfg: SFTConfig, show_progress: bool = True) -> dict:
    """Load the model and the data, train, save; returns the result as a dict."""
    import torch

    from sage_rl.agent.render import ChatRenderer
    from sage_rl.data.records import read_jsonl
    from sage_rl.models import load_model
    from sage_rl.train.sft import train_sft

    if cfg.optim.threads:
        torch.set_num_threads(cfg.optim.threads)
    examples = read_jsonl(cfg.data.path)[: cfg.data.limit]
    model, tokenizer = load_model(cfg.model, device=cfg.optim.device)
    _, result = train_sft(
        model, tokenizer, examples, cfg, ChatRenderer(tokenizer).conversation, show_progress
    )
    return result.to_dict()
