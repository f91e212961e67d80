"""``sage-rl train [CONFIG] [key=value ...] [--resume]``: SAGE (or GRPO baseline) training of one
model, from ``init_from`` when set, else ``policy.model``.

Without a config and without overrides it runs the main job instead, and says so: the recipe of
``configs/quickstart.yaml`` (``sage-rl recipe``), which makes the SFT model that SAGE starts from.
"""

from __future__ import annotations

import json

import typer

from sage_rl.cli import recipe as recipe_cmd
from sage_rl.memory import bound_heap
from sage_rl.runs.console import err, fail, load_or_exit
from sage_rl.settings import TrainConfig

DEFAULT = "configs/quickstart.yaml"


def main(
    ctx: typer.Context,
    config: str = typer.Argument(None, help=f"YAML config (default: {DEFAULT})"),
    resume: bool = typer.Option(
        False, "--resume", help="continue the run in out_dir from its last checkpoint"
    ),
    as_json: bool = typer.Option(False, "--json", help="print the before/after summary as JSON on stdout"),
) -> None:
    """Train with sequential rollout + skill-integrated reward + GRPO (overrides: key.sub=value).
    Without arguments: the main job, `sage-rl recipe` on configs/quickstart.yaml."""
    bound_heap()  # a night's training keeps its live memory, not its biggest step's (sage_rl/memory.py)
    main_job = config is None and not ctx.args
    cfg = load_or_exit(TrainConfig, config, ctx.args, default=DEFAULT)
    if main_job:
        err.print(
            f"sage-rl train without arguments runs the main job: the recipe of {DEFAULT} "
            "(= sage-rl recipe); give a config or key=value overrides to train one model"
        )
        summary = recipe_cmd.run_or_exit(cfg, resume)
    else:
        summary = _train_or_exit(cfg, resume)
    if as_json:
        typer.echo(json.dumps(summary))


def _train_or_exit(cfg: TrainConfig, resume: bool) -> dict:
    from sage_rl.build import BuildError  # torch and the run's modules, once the config is good
    from sage_rl.runs.claim import RunInUse
    from sage_rl.runs.train import NoStartModel, run_train
    from sage_rl.train.checkpoint import CheckpointError

    if cfg.policy.kind != "transformers":
        raise fail("the local trainer trains a transformers policy (policy.kind=transformers)", 2)
    try:
        return run_train(cfg, resume)
    except FileExistsError as e:
        raise fail(f"{e} (pass --resume, or out_dir=...)", 2) from None
    except (CheckpointError, NoStartModel, RunInUse) as e:
        raise fail(str(e), 2) from None
    except BuildError as e:
        raise fail(str(e)) from None
