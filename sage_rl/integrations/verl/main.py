"""``python -m sage_rl.integrations.verl.main COMMAND [CONFIG] [key=value ...]``: SAGE at scale on verl.

    prepare-data  write the run's verl dataset files (train.parquet, val.parquet) into data_dir
    show-config   print the verl config the run would use (composed and checked by verl)
    train         train with verl (Ray, vLLM rollouts, FSDP): one optimizer step per batch

``CONFIG`` is a run file (``configs/verl/*.yaml``); overrides are ``key.sub=value`` for sage-rl's
sections and ``verl.<verl key>=value`` for verl's own keys. docs/verl.md has the launch steps.
"""

from __future__ import annotations

import os
from pathlib import Path

import typer

from sage_rl.config import ConfigError, dump_config
from sage_rl.integrations.verl import VerlMissingError, require_verl
from sage_rl.integrations.verl.config import VerlRunConfig
from sage_rl.runs.console import err, fail, load_or_exit

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__.split("\n\n")[0])
_EXTRA = {"allow_extra_args": True, "ignore_unknown_options": True}


@app.command("prepare-data", context_settings=_EXTRA)
def prepare_data(
    ctx: typer.Context,
    config: str = typer.Argument(None, help="run file (configs/verl/*.yaml)"),
    out: Path = typer.Option(None, "--out", help="folder for the parquet files (default: data_dir)"),
) -> None:
    """Write train.parquet / val.parquet: one row per task sequence (needs no verl, no GPU)."""
    from sage_rl.integrations.verl.data import prepare

    cfg = load_or_exit(VerlRunConfig, config, ctx.args)
    try:
        counts = prepare(cfg, out)
    except ValueError as e:
        raise fail(str(e), 2) from None
    err.print(f"wrote {counts['train']} train and {counts['val']} val rows to {out or cfg.data_dir}")


def _composed(cfg: VerlRunConfig):
    try:
        require_verl()  # before compose's imports: without verl, one line saying how to install it
        from sage_rl.integrations.verl.compose import compose_config, validate

        config = compose_config(cfg)
        validate(config)
    except (ConfigError, VerlMissingError) as e:
        raise fail(str(e), 2) from None
    return config


@app.command("show-config", context_settings=_EXTRA)
def show_config(ctx: typer.Context, config: str = typer.Argument(None, help="run file")) -> None:
    """Print the composed verl config (YAML) on stdout."""
    composed = _composed(load_or_exit(VerlRunConfig, config, ctx.args))
    from omegaconf import OmegaConf

    typer.echo(OmegaConf.to_yaml(composed))


@app.command("train", context_settings=_EXTRA)
def train(
    ctx: typer.Context,
    config: str = typer.Argument(None, help="run file"),
    address: str = typer.Option(None, "--address", help="Ray cluster to join ('auto' on a head node)"),
) -> None:
    """Train with verl's V1 trainer and sage-rl's chain agent loop."""
    cfg = load_or_exit(VerlRunConfig, config, ctx.args)
    composed = _composed(cfg)
    from omegaconf import OmegaConf

    missing = [f for f in (composed.data.train_files, composed.data.val_files) if not Path(f).is_file()]
    if missing:
        raise fail(f"dataset file(s) {missing} not found: run prepare-data with this config first", 2)
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sage.yaml").write_text(dump_config(cfg))
    (out / "verl.yaml").write_text(OmegaConf.to_yaml(composed))
    if address:
        os.environ["RAY_ADDRESS"] = address
    from verl.trainer.main_ppo import run_ppo
    from verl.utils.device import auto_set_device

    from sage_rl.integrations.verl.trainer import SageTaskRunner

    auto_set_device(composed)
    err.print(
        f"SAGE on verl: {cfg.model}, K={cfg.rollout.chain_length} G={cfg.rollout.group_size} "
        f"B={cfg.rollout.groups_per_step}, {cfg.cluster.nnodes}x{cfg.cluster.gpus_per_node} GPUs; run folder {out}"
    )
    run_ppo(composed, task_runner_class=SageTaskRunner)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
