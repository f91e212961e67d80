"""The ``sage-rl`` command. Each command group lives in its own module and is imported lazily,
so ``sage-rl world ...`` does not pay for importing torch. The modules here are shells: they parse
arguments, load the config, call a run function (``sage_rl/runs/``, or the recipe) and map its
errors to exit codes; no module outside ``cli/`` imports them."""

from __future__ import annotations

import importlib
import sys

import typer

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="SAGE: RL for self-improving agents with a skill library.",
)


@app.callback()
def _root() -> None:
    """SAGE: RL for self-improving agents with a skill library."""


#: command group -> module exposing ``app`` (a typer.Typer)
_GROUPS = {
    "world": ("sage_rl.cli.world", "PocketWorld: list, show, run and verify tasks."),
    "skills": ("sage_rl.cli.skills", "Skill stores: list, show, search, stats, export, import."),
    "appworld": ("sage_rl.cli.appworld", "AppWorld: set up its separate environment and data."),
    "verl": ("sage_rl.integrations.verl.main", "SAGE at scale on verl: prepare-data, show-config, train."),
}
#: single commands -> module exposing ``main`` (a typer command function)
_COMMANDS = {
    "eval": ("sage_rl.cli.eval", "Scenario-ordered evaluation (TGC, SGC, steps, tokens)."),
    "train": (
        "sage_rl.cli.train",
        "SAGE / GRPO training of one model (no arguments: the main job, the recipe).",
    ),
    "recipe": ("sage_rl.cli.recipe", "The paper's recipe as one run: eval, collect, SFT, eval, SAGE, eval."),
    "collect": ("sage_rl.cli.collect", "Collect expert trajectories by rejection sampling."),
    "sft": ("sage_rl.cli.sft", "Supervised fine-tuning on expert trajectories."),
    "choose": ("sage_rl.cli.choose", "Choose a run's model from evaluations of its saved ones (keep-best, after the fact)."),
    "view": ("sage_rl.cli.view", "One offline HTML page of a run folder (or two, compared)."),
}


def _register(only: str | None = None) -> None:
    """Import and add the command groups (all of them, or just ``only``)."""
    for name, (mod, help_) in _GROUPS.items():
        if only and name != only:
            continue
        try:
            sub = importlib.import_module(mod).app
        except ModuleNotFoundError as e:
            if e.name != mod:
                raise
            continue
        app.add_typer(sub, name=name, help=help_)
    for name, (mod, help_) in _COMMANDS.items():
        if only and name != only:
            continue
        try:
            fn = importlib.import_module(mod).main
        except ModuleNotFoundError as e:
            if e.name != mod:
                raise
            continue
        app.command(
            name, help=help_, context_settings={"allow_extra_args": True, "ignore_unknown_options": True}
        )(fn)


def main() -> None:
    # Import only the module of the command being run: `sage-rl world ...` must not pay for torch.
    first = next((a for a in sys.argv[1:] if not a.startswith("-")), None)
    _register(first if first in _GROUPS or first in _COMMANDS else None)
    app()
