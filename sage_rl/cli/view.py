"""``sage-rl view RUN_DIR [OTHER_RUN] [--out FILE]``: one self-contained HTML page of a run (issue 15)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from sage_rl.runs.console import err, fail


def main(
    ctx: typer.Context,
    run_dir: Path = typer.Argument(..., help="a run folder of sage-rl train, eval or collect"),
    other: Path = typer.Argument(None, help="a second run folder: both side by side, with a Compare tab"),
    out: Path = typer.Option(
        None,
        "--out",
        "-o",
        help="HTML file to write (default: RUN_DIR/view.html; with OTHER_RUN: RUN_DIR/compare-OTHER.html)",
    ),
    page_size: int = typer.Option(
        100, "--page-size", min=1, help="at most this many trajectories per page (a group is never split)"
    ),
    max_chars: int = typer.Option(
        4000, "--max-chars", min=0, help="longest observation or reply shown in full; 0 = no limit"
    ),
    as_json: bool = typer.Option(False, "--json", help="print what was written as one JSON object on stdout"),
) -> None:
    """Turn a run folder into one HTML file that works offline: overview, chains, skills, compare."""
    # The command table lets unknown options through (cli/__init__.py), so they are refused here.
    extra = [*ctx.args, *(str(a) for a in (run_dir, other) if a is not None and str(a).startswith("-"))]
    if extra:
        raise fail(
            f"unexpected argument {extra[0]!r} (usage: sage-rl view RUN_DIR [OTHER_RUN] [--out FILE])", 2
        )
    from sage_rl.view import ViewError, build_html

    try:
        with err.status("building the view"):
            page, runs = build_html(run_dir, other, page_size=page_size, max_chars=max_chars)
    except ViewError as e:
        raise fail(str(e), 2) from None
    target = out or (run_dir / ("view.html" if other is None else f"compare-{other.resolve().name}.html"))
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(page, encoding="utf-8")
    size = target.stat().st_size
    for r in runs:
        for p in r.problems:
            err.print(f"[yellow]warning:[/yellow] {p}", markup=True, highlight=False)
    trajectories = sum(r.run.num_trajectories for r in runs)
    err.print(f"wrote {target} ({size / 1e6:.2f} MB, {trajectories} trajectories)")
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "out": str(target),
                    "bytes": size,
                    "trajectories": trajectories,
                    "runs": [
                        {"path": str(r.run.path), "kind": r.run.kind, "pages": len(r.pages)} for r in runs
                    ],
                    "problems": [p for r in runs for p in r.problems],
                }
            )
        )
