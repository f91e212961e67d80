"""What every command shares, the ``sage-rl`` commands and verl's entry point alike: the stderr
console, progress bars, loading a command's config (or exiting 2 with the one-line error), and a
one-line error to exit with. Run functions print progress here; results go to stdout only as a
command's ``--json``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from sage_rl.config import ConfigError, load_config

M = TypeVar("M", bound=BaseModel)
err = Console(stderr=True, soft_wrap=True)


def split_args(config: str | None, extra: Sequence[str]) -> tuple[str | None, list[str]]:
    """``sage-rl cmd [CONFIG] [key=value ...]``: a first argument with ``=`` is an override."""
    overrides = list(extra)
    if config is not None and "=" in config and not Path(config).exists():
        overrides.insert(0, config)
        config = None
    return config, overrides


def load_or_exit(model: type[M], config: str | None, extra: Sequence[str], default: str | None = None) -> M:
    """Load the command's config; on a bad config print the message and exit 2 (nothing runs)."""
    path, overrides = split_args(config, extra)
    unknown = [a for a in (path, *overrides) if a and a.startswith("-") and not Path(a).exists()]
    if unknown:  # the commands pass unknown options through as arguments: say so, not "file not found"
        err.print(
            f"[red]error:[/red] no such option: {unknown[0]} (see --help; settings are key=value)",
            markup=True,
            highlight=False,
        )
        raise typer.Exit(2)
    if path is None and default and Path(default).is_file():
        path = default
    try:
        return load_config(model, path, overrides)
    except ConfigError as e:
        err.print(f"[red]error:[/red] {e}", markup=True, highlight=False)
        raise typer.Exit(2) from None


def progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err,
    )


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print a one-line error and return the Exit to raise."""
    err.print(f"[red]error:[/red] {message}", markup=True, highlight=False)
    return typer.Exit(code)
