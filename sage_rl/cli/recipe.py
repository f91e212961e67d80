"""``sage-rl recipe [CONFIG] [key=value ...] [--resume]``: the paper's recipe as one run (issue 17;
docs/recipe.md): evaluate the base model -> collect -> SFT -> evaluate -> SAGE -> evaluate."""

from __future__ import annotations

import json

import typer

from sage_rl.runs.console import fail, load_or_exit
from sage_rl.settings import TrainConfig

DEFAULT = "configs/quickstart.yaml"


def main(
    ctx: typer.Context,
    config: str = typer.Argument(None, help=f"YAML config with a `recipe:` section (default: {DEFAULT})"),
    resume: bool = typer.Option(
        False, "--resume", help="continue the run in out_dir: only the stages left run"
    ),
    as_json: bool = typer.Option(False, "--json", help="print the summary as JSON on stdout"),
) -> None:
    """Run the whole recipe in out_dir, one stage after another, and report what each changed."""
    cfg = load_or_exit(TrainConfig, config, ctx.args, default=DEFAULT)
    summary = run_or_exit(cfg, resume)
    if as_json:
        typer.echo(json.dumps(summary))


def run_or_exit(cfg: TrainConfig, resume: bool) -> dict:
    """``recipe.run``, its errors mapped to one-line messages and exit codes (2: the config or the
    run folder; 1: the run could not be composed)."""
    from sage_rl import recipe  # torch and the run's modules, once the config is good
    from sage_rl.build import BuildError
    from sage_rl.eval.resume import ResumeError
    from sage_rl.runs.claim import RunInUse
    from sage_rl.train.checkpoint import CheckpointError
    from sage_rl.train.sft_resume import SFTStopped

    if cfg.policy.kind != "transformers":
        raise fail("the recipe trains a transformers policy (policy.kind=transformers)", 2)
    try:
        return recipe.run(cfg, resume)
    except FileExistsError as e:
        raise fail(f"{e} (pass --resume, or out_dir=...)", 2) from None
    except (CheckpointError, ResumeError, recipe.RecipeError, RunInUse) as e:
        raise fail(str(e), 2) from None
    except BuildError as e:
        raise fail(str(e)) from None
    except SFTStopped as e:  # Ctrl-C or SIGTERM in SFT, after a step and its resume point
        raise fail(f"{e} (pass --resume to go on)", 130) from None
