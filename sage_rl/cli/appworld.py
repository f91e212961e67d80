"""``sage-rl appworld setup | status | evaluate | bench``: AppWorld's separate environment and data,
and AppWorld's own evaluation report of a sage-rl run."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console

from sage_rl.integrations.appworld.config import AppWorldEnvConfig
from sage_rl.integrations.appworld.paths import (
    DATA_BUNDLE_SHA256,
    SetupError,
    appworld_data_status,
    venv_status,
)

app = typer.Typer(no_args_is_help=True, add_completion=False)
_err = Console(stderr=True, soft_wrap=True)  # one message, one line, even in CI logs


def _paths(venv: Path | None, root: Path | None):
    return AppWorldEnvConfig(venv=str(venv) if venv else None, root=str(root) if root else None).paths()


@app.command()
def setup(
    bundle: Path = typer.Option(None, help="A local data-0.1.0.bundle to verify and unpack."),
    download: bool = typer.Option(
        False, "--download", help="Run `appworld download data` (needs the network)."
    ),
    force: bool = typer.Option(False, "--force", help="Replace data that is already installed."),
    sha256: str = typer.Option(
        DATA_BUNDLE_SHA256, help="Expected sha256 of --bundle (default: AppWorld's data-0.1.0)."
    ),
    require_data: bool = typer.Option(
        False, "--require-data", help="Fail when no data is installed at the end."
    ),
    venv: Path = typer.Option(
        None, help="AppWorld virtualenv (default: .venv-appworld or $SAGE_RL_APPWORLD_VENV)."
    ),
    root: Path = typer.Option(
        None, help="AppWorld root, data under root/data (default: .cache/appworld or $SAGE_RL_APPWORLD_ROOT)."
    ),
) -> None:
    """Create the AppWorld virtualenv, decrypt its code, and install its data. Idempotent."""
    from sage_rl.integrations.appworld.installer import setup as run_setup

    paths = _paths(venv, root)
    try:
        with _err.status("AppWorld setup"):  # a spinner while pip or the unpacking runs
            ok, msg = run_setup(
                paths, _err.print, bundle=bundle, download=download, force=force, expected_sha256=sha256
            )
    except SetupError as e:
        _err.print(f"[red]AppWorld setup failed:[/red] {e}")
        raise typer.Exit(1) from None
    _err.print(("[green]ready:[/green] " if ok else "[yellow]not ready:[/yellow] ") + msg)
    if require_data and not ok:
        raise typer.Exit(1)


@app.command()
def status(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    venv: Path = typer.Option(None, help="AppWorld virtualenv."),
    root: Path = typer.Option(None, help="AppWorld root."),
) -> None:
    """Say whether AppWorld's venv and data are installed (exit 1 when not)."""
    paths = _paths(venv, root)
    ok, msg = appworld_data_status(paths)
    if as_json:
        print(json.dumps({"ok": ok, "message": msg, "venv": str(paths.venv), "root": str(paths.root)}))
    else:
        _err.print(msg)
    if not ok:
        raise typer.Exit(1)


@app.command()
def evaluate(
    run_dir: Path = typer.Argument(
        ..., help="A sage-rl run folder: the out_dir of `sage-rl eval env=appworld`."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON list (one object per experiment)."),
    venv: Path = typer.Option(None, help="AppWorld virtualenv."),
    sandbox: bool = typer.Option(True, help="Evaluate under the sandbox's layers (--no-sandbox to debug)."),
) -> None:
    """AppWorld's own evaluation report of a sage-rl run: `appworld evaluate EXPERIMENT SPLIT` on
    every experiment the run kept under RUN_DIR/appworld (a partial split: its tasks only)."""
    from sage_rl.integrations.appworld.outputs import evaluate_run

    paths = _paths(venv, None)
    ok, msg = venv_status(paths)
    if not ok:
        _err.print(f"[red]{msg}[/red]")
        raise typer.Exit(1)
    try:
        with _err.status("AppWorld evaluation"):
            reports = evaluate_run(run_dir, paths, sandbox=sandbox)
    except SetupError as e:
        _err.print(f"[red]{e}[/red]")
        raise typer.Exit(1) from None
    if as_json:
        print(json.dumps(reports))
        return
    for r in reports:
        folder = Path(run_dir) / "appworld" / "experiments" / "outputs" / r["experiment"] / "evaluations"
        print(f"== AppWorld experiment {r['experiment']} (split {r['split']}) ==")
        print(r["output"].strip())
        print(f"(saved in {folder})\n")


@app.command()
def bench(
    repeats: int = typer.Option(5, min=1, help="Repeats of each timed operation."),
    workdir: Path = typer.Option(None, help="Where to build the synthetic world (default: a temp dir)."),
    venv: Path = typer.Option(None, help="AppWorld virtualenv."),
    root: Path = typer.Option(
        None,
        help="An AppWorld root to measure on (its data is read, nothing written); default: a synthetic world.",
    ),
) -> None:
    """Time reset, cells with 0/10/100 API calls, evaluation, 8 concurrent first resets and the
    restore after a kill, beside AppWorld's own in-process figures on the same world; print JSON,
    and the ratios sage-rl / native as a table on stderr."""
    from sage_rl.integrations.appworld.bench import ratio_table, run_bench

    try:
        result = run_bench(venv=venv, workdir=workdir, repeats=repeats, root=root)
    except SetupError as e:
        _err.print(f"[red]{e}[/red]")
        raise typer.Exit(1) from None
    _err.print(ratio_table(result), markup=False, highlight=False)
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":  # `python -m sage_rl.cli.appworld setup` (used by scripts/setup_appworld.sh)
    app()
