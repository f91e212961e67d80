"""``sage-rl collect [CONFIG] [key=value ...]``: expert trajectories by rejection sampling (issue 7)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from sage_rl.runs.console import fail, load_or_exit
from sage_rl.settings import CollectConfig


def main(
    ctx: typer.Context,
    config: str = typer.Argument(None, help="YAML config (default: configs/collect.yaml)"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as one JSON object on stdout"),
) -> None:
    """Run an expert over a split, scenario by scenario, and keep what passes (overrides: key.sub=value)."""
    cfg = load_or_exit(CollectConfig, config, ctx.args, default="configs/collect.yaml")
    from sage_rl.build import BuildError  # torch and the run's modules, once the config is good
    from sage_rl.collect_store import CollectStore, StoreError
    from sage_rl.data.export import ExportError
    from sage_rl.runs.claim import RunInUse
    from sage_rl.runs.collect import run_collect, saved_jobs

    out = Path(cfg.out_dir)
    opened: list[CollectStore] = []  # the store, once the suite and the plan are known to be good
    try:
        summary = run_collect(cfg, opened)
    except (BuildError, StoreError, RunInUse) as e:  # a missing split, too few scenarios, another config
        raise fail(str(e), 1 if isinstance(e, BuildError) else 2) from None
    except ExportError as e:
        raise fail(
            f"{e} (the JSON Lines dataset is complete: rerun with sharegpt_mode=last, nothing is collected again)"
        ) from None
    except Exception as e:  # an environment or backend failure: what is committed stays committed
        raise fail(
            f"collection stopped by {type(e).__name__}: {e}; {saved_jobs(opened)} jobs are saved in {out}; "
            "run the same command again to resume"
        ) from None
    except KeyboardInterrupt:
        raise fail(
            f"interrupted: {saved_jobs(opened)} jobs are saved in {out}; run the same command again to resume",
            130,
        ) from None
    if as_json:
        typer.echo(json.dumps(summary))
