"""The paper's controls for the laptop experiment (issue 27; SAGE.md sections 6-8; docs/recipe.md).

Each comparison the experiment reports means one thing because each arm differs from another in
one respect:

- ``sft``: the skill-library SFT model, evaluated with its library (the recipe's SFT stage).
- ``sft_nolib``: the same weights evaluated with ``skills.use_skills=false`` (no library section,
  no skill instructions): the format control. ``sft - sft_nolib`` is what the prompt alone does.
- ``sft_inline``: the baseline's own SFT model, trained the same way on the library-free scripted
  expert's trajectories (``ScriptedExpert(inline=True)``, chosen by ``skills.use_skills=false``)
  of the same scenarios, evaluated without a library.
- ``grpo_nolib``: the paper's GRPO baseline: ``sft_inline``, then GRPO with no library, K = 1,
  outcome reward.
- ``grpo_lib``: the ablation: the ``sft`` start, the same prompt and library format as SAGE, K = 1,
  outcome reward. ``sage - grpo_lib`` isolates SAGE's two additions (sequential rollout, skill
  reward).
- ``sage``: the ``sft`` start, K = 2, skill-integrated reward.
- ``sage_nolib``: the final SAGE model evaluated without its library: the skill-value figure.

An evaluation here is the recipe's (``recipe.pipeline.evaluate``: metrics and outcome rows
``[task_id, scenario_id, success]``) with ``per_task``: ``{task_id: [steps, generated tokens]}``.
Every RL arm takes K x B groups of K tasks' worth (the GRPO arms run K x B groups of one task,
SAGE B groups of K), the same G, trainer, seed and ``sampled_token_budget``. Functions here are
pure: configs in, configs out; evaluations in, figures out.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml

from sage_rl.eval.ci import paired_difference, paired_outcomes
from sage_rl.rollout import tracking
from sage_rl.rollout.pool import SCREENS, Screen, replay, screens
from sage_rl.settings import RunConfig, TrainConfig
from sage_rl.train.logging import metrics_row
from sage_rl.types import Chain
from sage_rl.view.read import read_jsonl

log = logging.getLogger(__name__)

#: Every model the experiment evaluates, in table order.
MODELS = ("base", "sft", "sft_nolib", "sft_inline", "grpo_nolib", "grpo_lib", "sage", "sage_nolib")
#: The RL arms, and the SFT model each starts from.
RL_START = {"sage": "sft", "grpo_lib": "sft", "grpo_nolib": "sft_inline"}
#: The evaluation splits: the results' key -> the split evaluated.
SPLITS = {"heldout": "train_heldout", "dev": "dev"}
#: Models evaluated without a library: their skill usage is n/a.
NO_LIBRARY = frozenset({"sft_nolib", "sft_inline", "grpo_nolib", "sage_nolib"})

C = TypeVar("C", bound=RunConfig)
T = TypeVar("T")


def without_library(cfg: C) -> C:
    """``cfg`` with ``skills.use_skills=false``: no library in the prompt, no skill instructions,
    nothing saved; the scripted expert solves inline (docs/collect.md)."""
    data = cfg.model_dump(mode="json")
    data["skills"] = {**data["skills"], "use_skills": False}
    return type(cfg).model_validate(data)


def grpo_config(sage: TrainConfig, init_from: Path, folder: Path, library: bool) -> TrainConfig:
    """A GRPO arm of SAGE's run ``sage``: from ``init_from``, K = 1, outcome reward, K x B groups
    (the same task samples per step), with or without the library; everything else as SAGE's."""
    data = sage.model_dump(mode="json")
    k = sage.rollout.chain_length
    data["skills"] = {**data["skills"], "use_skills": library}
    data["rollout"] = {
        **data["rollout"],
        "chain_length": 1,
        "reward": "outcome",
        "groups_per_step": k * sage.rollout.groups_per_step,
    }
    data |= {"init_from": str(init_from), "out_dir": str(folder)}
    return TrainConfig.model_validate(data)


#: Paired differences reported (first minus second), each on TGC, SGC, steps and tokens.
PAIRS = (
    ("sft", "base"),
    ("sage", "sft"),
    ("sage", "grpo_nolib"),
    ("sage", "grpo_lib"),
    ("sft", "sft_nolib"),  # the format control: what the library prompt alone does
    ("sage", "sage_nolib"),  # the skill value
    ("grpo_nolib", "sft_inline"),  # what RL did for the baseline
    ("grpo_lib", "sft"),  # what K = 1 outcome-reward RL did from the same start
    ("sft", "sft_inline"),  # the two starts' gap: sage - grpo_nolib less it is what RL added
)


def per_task(folder: Path) -> dict[str, list[float]]:
    """{task_id: [steps, generated tokens]} of an evaluation folder's trajectories (the metrics'
    ``avg_steps`` and ``avg_tokens`` per task), for intervals and paired differences.

    A line that is not a chain (a damaged file) is left out with a warning naming it: its tasks'
    steps and tokens are missing (None in ``units``), as where trajectories are gone."""
    out: dict[str, list[float]] = {}
    for path in sorted(folder.glob("trajectories*.jsonl"))[:1]:  # one strategy: the headline
        for chain in readable(path, Chain.from_dict, "chain record"):
            for t in chain.trajectories:
                out[t.task.task_id] = [len(t.turns), t.num_generated_tokens]
    return out


def readable(path: Path, parse: Callable[[Any], T], what: str) -> list[T]:
    """The records of a JSON Lines file that ``parse`` accepts (``view.read.read_jsonl``); each line
    that is not one is left out with a warning naming the file and line; a missing file is empty."""
    problems: list[str] = []
    records = read_jsonl(path, parse, what, problems)
    for problem in problems:
        log.warning(problem)
    return records


def metric_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a run's ``metrics.jsonl`` (``train.logging.metrics_row``: numbers or null), damaged
    lines left out with a warning: what the results' curves and the report plot."""
    return readable(path, metrics_row, "metrics row")


def units(ev: dict[str, Any]) -> list[dict[str, Any]]:
    """Per task of an evaluation: scenario, success, steps, tokens (steps/tokens None when its
    trajectories are gone)."""
    per = ev.get("per_task", {})
    return [
        {"task": t, "scenario": s, "success": 100.0 * ok, "steps": per.get(t, [None])[0], "tokens": per.get(t, [None, None])[1]}
        for t, s, ok, *_ in ev["outcomes"]
    ]  # fmt: skip


def differences(key: str, a: str, b: str, ea: dict[str, Any], eb: dict[str, Any]) -> dict[str, Any]:
    """``<key>_<metric>_<a>_minus_<b>`` and its ``_ci`` for TGC, SGC, steps and tokens, paired:
    TGC with ``paired_outcomes`` (scenarios resampled), SGC over the scenarios both ran (a
    scenario counts 100 when all its tasks succeeded), steps and tokens over the tasks both ran
    (scenarios resampled). None where the two share nothing to compare."""
    name = f"{key}_{{}}_{a}_minus_{b}"
    out = _named(name.format("tgc"), paired_outcomes(eb["outcomes"], ea["outcomes"]))
    ua, ub = ({u["task"]: u for u in units(e)} for e in (ea, eb))
    common = [t for t in ub if t in ua]
    scen = list(dict.fromkeys(ub[t]["scenario"] for t in common))

    def solved(u: dict[str, dict[str, Any]], s: str) -> float:
        return 100.0 * all(u[t]["success"] for t in common if u[t]["scenario"] == s)

    sgc = paired_difference([solved(ub, s) for s in scen], [solved(ua, s) for s in scen]) if scen else None
    out |= _named(name.format("sgc"), sgc)
    for metric in ("steps", "tokens"):
        both = [t for t in common if ua[t][metric] is not None and ub[t][metric] is not None]
        before, after = [ub[t][metric] for t in both], [ua[t][metric] for t in both]
        d = paired_difference(before, after, clusters=[ub[t]["scenario"] for t in both]) if both else None
        out |= _named(name.format(metric), d)
    return out


def on_pool(key: str, arm: str, start: str, ea: dict[str, Any], eb: dict[str, Any], pool: set[str]) -> dict[str, Any]:
    """``<key>_tgc_<arm>_minus_<start>_pool`` and ``..._offpool`` with ``_ci``: the paired TGC
    difference on the tasks of the templates the arm's screens drew from (``pool``), and on the
    others. RL samples only the pool, so this says whether its gain reaches templates it never
    sampled (laptop28 on 630 tasks: +15.5 on the pool, -5.6 off it). A scenario's template is its id less
    ``-s<seed>`` (PocketWorld's held-out ids)."""
    name = f"{key}_tgc_{arm}_minus_{start}"
    out: dict[str, Any] = {}
    for part, keep in (("pool", True), ("offpool", False)):
        ra, rb = ([r for r in e["outcomes"] if (template_of(r[1]) in pool) is keep] for e in (ea, eb))
        out |= _named(f"{name}_{part}", paired_outcomes(rb, ra))
    return out


def by_template(ea: dict[str, Any], eb: dict[str, Any]) -> dict[str, dict[str, int]]:
    """{template: {"tasks", "a", "b", "changed"}} over the tasks both evaluations ran: how many
    tasks each solved and on how many they differ, for the templates where they differ, largest
    loss of a against b first (then the name): where a difference comes from. laptop35's SAGE step
    2 lost 10 of 90 `train_val` tasks, six of them two whole scenarios, one of a template its pool
    never held."""
    solved_b = {r[0]: bool(r[2]) for r in eb["outcomes"]}
    counts: dict[str, dict[str, int]] = {}
    for task, scenario, ok, *_ in ea["outcomes"]:
        if task in solved_b:
            c = counts.setdefault(template_of(scenario), dict.fromkeys(("tasks", "a", "b", "changed"), 0))
            c["tasks"] += 1
            c["a"] += bool(ok)
            c["b"] += solved_b[task]
            c["changed"] += bool(ok) != solved_b[task]
    changed = {t: c for t, c in counts.items() if c["changed"]}
    return dict(sorted(changed.items(), key=lambda kv: (kv[1]["a"] - kv[1]["b"], kv[0])))


#: how a screen saw a template: every sampled task solved, none, or some (the pool)
SCREEN_CLASSES = ("pool", "solved", "hopeless")


def screen_class(success: float) -> str:
    return "solved" if success == 1.0 else "hopeless" if success == 0.0 else "pool"


def by_screen_class(success: dict[str, float], outcomes: list[list[Any]]) -> dict[str, list[int]]:
    """{class: [tasks solved, tasks]} of an evaluation's ``outcomes`` (rows ``[task, scenario, ok,
    ...]``), each task in the class its template had at a screen (``success``: the screen's rates;
    ``screen_class``); templates the screen did not see are left out (pure). Where an arm's greedy
    score moves: laptop35's SAGE extension lost 8 of the 11 `train_val` tasks it solved at the start on
    the 8 templates its screen called hopeless, and never drew them."""
    out = {c: [0, 0] for c in SCREEN_CLASSES}
    for _, scenario, ok, *_ in outcomes:
        rate = success.get(template_of(scenario))
        if rate is not None:
            out[screen_class(rate)][0] += bool(ok)
            out[screen_class(rate)][1] += 1
    return out


def template_of(scenario_id: str) -> str:
    """``email_relationship-s2147483648`` -> ``email_relationship``."""
    return re.sub(r"-s\d+$", "", scenario_id)


def screened_templates(run_dir: Path) -> set[str] | None:
    """Every template any screen of an RL run drew into its pool (``screens.jsonl``, read as the run
    reads it: ``rollout.pool.screens``); None for a run without a screened pool. A line that is not
    a screen row (a damaged file) is left out with a warning naming it: its screen's templates are
    then missing from the pool. A tracked pool (``rollout.pool_memory``, rollout/tracking.py) adds
    every template some step's pool held (replayed from ``pool.jsonl``); a group drawn from outside
    the pool (``rollout.pool_explore``) does not make its template one of the pool's."""
    if not (run_dir / SCREENS).is_file():
        return None
    rows = screens(run_dir)
    pool = {t for row in rows for t in Screen.from_row(row).pool}
    memory = _pool_memory(run_dir)
    if memory and (run_dir / tracking.OBSERVED).is_file():  # a tracked pool: each step's own
        steps = tracking.read_rows(run_dir / tracking.OBSERVED, tracking.check_row, "pool row")
        pool |= {t for drawn in replay(rows, steps, memory)[1].values() for t in drawn}
    return pool


def _pool_memory(run_dir: Path) -> int | None:
    """``rollout.pool_memory`` of the run's saved config (None where it has none or no config)."""
    try:
        saved = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8"))
        return saved["rollout"].get("pool_memory")
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError):
        return None


def _named(name: str, d: tuple[float, tuple[float, float]] | None) -> dict[str, Any]:
    return {name: d[0] if d else None, f"{name}_ci": list(d[1]) if d else None}


def first_scenarios(ev: dict[str, Any], n: int | None) -> set[str]:
    """The first ``n`` scenarios an evaluation lists (split order: what ``eval.scenarios`` takes)."""
    return set(list(dict.fromkeys(s for _, s, *_ in ev["outcomes"]))[:n])


def tgc_on(ev: dict[str, Any], scenarios: set[str]) -> float:
    ok = [100.0 * row[2] for row in ev["outcomes"] if row[1] in scenarios]
    return sum(ok) / max(1, len(ok))


def curve(
    start: dict[str, Any], final: dict[str, Any], rows: list[dict[str, Any]], n: int | None
) -> list[tuple[int, float]]:
    """An RL arm's greedy TGC on the first ``n`` scenarios against sampled tokens: its start
    model's TGC on those scenarios at 0 (from the start model's full evaluation ``start``: the arm's
    own start, never another model's), the loop's ``eval/tgc`` rows (``rows``: the run's
    metrics.jsonl; the loop evaluates the same first ``n`` scenarios), and the final model's TGC on
    them (from ``final``) at the run's last sampled-token total."""
    subset = first_scenarios(start, n)
    steps = [r for r in rows if "sampled_tokens_total" in r]
    points = [(0, tgc_on(start, subset))]
    points += [(r["sampled_tokens_total"], r["eval/tgc"]) for r in steps if "eval/tgc" in r]
    if steps:
        points.append((steps[-1]["sampled_tokens_total"], tgc_on(final, subset)))
    return points


def paired_curve(
    start: dict[str, Any], points: list[tuple[int, dict[str, Any]]], final: tuple[int, dict[str, Any]], n: int | None
) -> list[list[float]]:
    """The curve as paired differences from its start model on the same tasks: ``[sampled tokens,
    TGC - start's TGC, low, high]`` for each point whose per-task outcomes were saved (``points``:
    the loop's ``evals/step_NNNNNN.json``, each with its sampled-token total), then for the final
    model (``final``: the run's total and its full evaluation, taken on the first ``n`` scenarios,
    as ``curve``). Intervals resample scenarios; a point sharing no task with the start is left out."""
    subset = first_scenarios(start, n)
    last = (final[0], {"outcomes": [row for row in final[1]["outcomes"] if row[1] in subset]})
    rows = []
    for tokens, ev in [*points, last]:
        d = paired_outcomes(start["outcomes"], ev["outcomes"])
        if d is not None:
            rows.append([tokens, d[0], *d[1]])
    return rows
