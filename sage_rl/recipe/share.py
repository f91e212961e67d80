"""One SFT start for several RL settings: the laptop experiment's stages before RL, shared.

The stages before RL (the expert data of both experts, the two SFT models, and the evaluations of
base, ``sft``, ``sft_nolib`` and ``sft_inline``) take about half of the experiment's hours and do
not depend on any RL setting. ``benchmarks/laptop_recipe.py --sft-from RUN`` links them from a
finished run into a new run folder, whose RL arms then start from the very same models: a second
RL setting (another rollout temperature, another budget) is compared against the first from one
start, and its SFT figures are the first run's, read back, not re-measured.

The links are symlinks to the source's folders, so the source must be kept while the new run lives.
Only finished stages are linked; anything else in the way is an error, never overwritten. A new run
with ``--until sage`` needs only the headline's stages (the library expert, its SFT model and the
evaluations of ``sft`` and ``sft_nolib``), so a source that ran ``--until sage`` itself serves it;
its other finished stages are linked too.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from sage_rl.recipe.pipeline import RecipeError

#: The stage folders before RL and the file each writes when done.
SFT_STAGES = {
    "expert": "summary.json",
    "sft": "result.json",
    "expert_inline": "summary.json",
    "sft_inline": "result.json",
}
#: The models evaluated before RL.
SFT_MODELS = ("base", "sft", "sft_nolib", "sft_inline")
#: What ``--until sage`` needs of them: the library expert, its SFT model, both its evaluations.
HEADLINE_STAGES = ("expert", "sft")
HEADLINE_MODELS = ("sft", "sft_nolib")


def shared_stages(splits: Iterable[str], headline_only: bool = False) -> dict[str, str]:
    """Every folder (relative to a run folder) of the stages before RL, with its done-file; with
    ``headline_only``, those of ``--until sage`` only."""
    stages, models = (HEADLINE_STAGES, HEADLINE_MODELS) if headline_only else (SFT_STAGES, SFT_MODELS)
    evals = {f"eval/{m}_{s}": "outcomes.json" for m in models for s in splits}
    return {name: SFT_STAGES[name] for name in stages} | evals


def share_sft_stages(src: Path, out: Path, splits: Iterable[str], until: str = "all") -> list[Path]:
    """Symlink the finished stages before RL of run folder ``src`` into ``out``; returns the links
    made (none when ``out`` already links them all). ``until``: the new run's ``--until``; with
    ``"sage"`` only the headline's stages must be done in ``src`` (the others are linked where done).
    ``RecipeError`` names what ``src`` lacks, or the path of ``out`` that holds something other than
    the link."""
    splits = list(splits)
    needed = shared_stages(splits, headline_only=until == "sage")
    missing = [f"{name}/{done}" for name, done in needed.items() if not (src / name / done).is_file()]
    if missing:
        hint = "run it with --until sage first" if until == "sage" else "run it with --until sft first"
        raise RecipeError(
            f"--sft-from {src}: its stages before RL are not all done (missing {', '.join(missing)}); {hint}"
        )
    stages = [name for name, done in shared_stages(splits).items() if (src / name / done).is_file()]
    links = {out / name: (src / name).resolve() for name in stages}
    todo = {link: target for link, target in links.items() if not (link.is_symlink() and link.resolve() == target)}
    for link, target in todo.items():  # every conflict found before anything is linked
        if link.exists() or link.is_symlink():
            raise RecipeError(f"--sft-from {src}: {link} already exists and is not a link to {target}")
    for link, target in todo.items():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(target, target_is_directory=True)
    return list(todo)
