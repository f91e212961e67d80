"""The paper's recipe end to end: what ``sage-rl recipe`` runs (and ``sage-rl train`` without
arguments, the main job; issue 17; SAGE.md sections 3-8; docs/recipe.md).

    evaluate the base model -> collect expert trajectories -> SFT -> evaluate the SFT model
    -> SAGE from the SFT model -> evaluate the SAGE model -> one report of what each stage changed

Each stage is the work of the command that does it, its run function called with a config derived
from the one ``TrainConfig``: ``sage-rl collect`` (``runs.collect.run_collect``), ``sage-rl sft``
(``runs.sft.run_sft``), ``sage-rl train`` (``runs.train.run_train``) and ``sage-rl eval``
(``runs.eval.run_evaluation``). The stages
share the run's environment, agent limits, prompt and skill settings, so the expert's examples, the
SFT data, the RL rollouts and every evaluation see the same prompt. Evaluations are greedy and
scenario-ordered. A stage whose output exists is skipped, so ``--resume`` continues a stopped run.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sage_rl.config import dump_config
from sage_rl.eval.resume import same_settings
from sage_rl.files import write_atomic
from sage_rl.memory import bound_heap, peak_rss_bytes, release_memory, reset_peak, stage_peaks_wanted
from sage_rl.recipe.report import write_report
from sage_rl.recipe.twins import read_back
from sage_rl.runs.claim import OWNER, claim
from sage_rl.runs.collect import run_collect
from sage_rl.runs.console import err
from sage_rl.runs.eval import run_evaluation
from sage_rl.runs.sft import run_sft
from sage_rl.runs.train import run_train
from sage_rl.settings import CollectConfig, EvalRunConfig, RecipeSettings, RunConfig, TrainConfig
from sage_rl.train.best import read_best
from sage_rl.train.checkpoint import latest_checkpoint
from sage_rl.train.same_run import check_same_run
from sage_rl.train.sft_config import SFTConfig

STATE = "recipe.json"  # per-stage results and times, rewritten after every stage


class RecipeError(RuntimeError):
    """The recipe cannot run as configured (one line for the user)."""


@dataclasses.dataclass(frozen=True)
class Layout:
    """The folders of one recipe run under ``root`` (the train config's ``out_dir``)."""

    root: Path

    @property
    def expert(self) -> Path:
        return self.root / "expert"

    @property
    def sft(self) -> Path:
        return self.root / "sft"

    @property
    def sage(self) -> Path:
        return self.root / "sage"

    def eval(self, stage: str, split: str) -> Path:
        return self.root / "eval" / f"{stage}_{split}"


def shared(cfg: RunConfig) -> dict[str, Any]:
    """The sections every stage shares (``RunConfig``'s), as plain data."""
    return {k: v for k, v in cfg.model_dump(mode="json").items() if k in RunConfig.model_fields}


def collect_config(cfg: TrainConfig, r: RecipeSettings, folder: Path) -> CollectConfig:
    """``sage-rl collect`` with the scripted expert on the train split, in the run's prompt format."""
    c = r.collect
    return CollectConfig.model_validate(
        {
            **shared(cfg),
            "policy": {"kind": "scripted", "expert_seed": c.expert_seed},
            "split": "train",
            "num_scenarios": c.num_scenarios,
            "tasks_per_scenario": c.tasks_per_scenario,
            "keep_first_n": c.keep_first_n,
            "concurrency": c.concurrency,
            "out_dir": str(folder),
            "formats": ["jsonl"],
        }
    )


def sft_config(
    cfg: TrainConfig, r: RecipeSettings, data: Path, folder: Path, limit: int | None = None
) -> SFTConfig:
    """``sage-rl sft`` of the run's base model on the collected examples (the first ``limit``, when
    given, or the SFT section's ``data.limit``)."""
    s = r.sft
    cut = {"limit": limit} if limit else {}
    return SFTConfig.model_validate(
        {
            "model": cfg.policy.model,
            "data": {**s.data.model_dump(mode="json"), "path": str(data), **cut},
            "optim": s.optim.model_dump(mode="json")
            | {  # the run's threads and device, unless the SFT section names its own
                "threads": s.optim.threads or cfg.policy.threads,
                "device": cfg.policy.device if s.optim.device == "auto" else s.optim.device,
            },
            "lora": s.lora.model_dump(mode="json"),
            "output": {
                "dir": str(folder),
                "eval_every": s.eval_every,
                "keep": s.keep,
                "save_every_s": s.save_every_s,
            },
        }
    )


def train_config(cfg: TrainConfig, init_from: Path, folder: Path) -> TrainConfig:
    """``sage-rl train`` from the SFT model, without its own before/after evaluation (the recipe's
    evaluations replace it), unless it keeps its best model (``eval.keep: best``): then the start's
    and the last model's evaluations on its validation split are two of those it chooses from."""
    data = cfg.model_dump(mode="json")
    data |= {"recipe": None, "init_from": str(init_from), "out_dir": str(folder)}
    data["eval"] = {**data["eval"], "before_after": cfg.eval.keep == "best"}
    return TrainConfig.model_validate(data)


def eval_config(
    cfg: RunConfig, model: str | None, split: str, scenarios: int | None, concurrency: int, folder: Path
) -> EvalRunConfig:
    """``sage-rl eval`` of ``model`` on ``split``: greedy, the run's own retrieval strategy."""
    base = shared(cfg)
    return EvalRunConfig.model_validate(
        {
            **base,
            "policy": {**base["policy"], "model": model},
            "sampling": {**base["sampling"], "temperature": 0.0},
            "split": split,
            "strategies": [cfg.skills.retrieval.strategy],
            "limit_scenarios": scenarios,
            "concurrency": concurrency,
            "out_dir": str(folder),
        }
    )


def evaluate(ev: EvalRunConfig) -> dict[str, Any]:
    """Run (or, when its folder holds one, read back) an evaluation; returns
    ``{"metrics": <EvalMetrics as a dict>, "outcomes": [[task_id, scenario_id, success], ...]}``.
    One is read back only when it evaluated this model under these settings (else ``ResumeError``)
    and holds every scenario the split lists now: a split that grew since (``train_heldout`` only
    ever appends seeds) is evaluated further, on its new scenarios only."""
    folder = Path(ev.out_dir)
    saved = folder / "outcomes.json"
    if saved.is_file():
        same_settings(folder, ev)
        done = read_summary(saved)
        missing = missing_scenarios(listed_scenarios(ev) or [], done["outcomes"])
        if not missing:
            return done
        err.print(f"{folder}: {len(missing)} scenarios of {ev.split} were added since it was evaluated; running them")
    result = run_evaluation(ev, title=f"{ev.split}: {ev.policy.model or 'base model'}", resume=True)
    out = result.record()
    write_atomic(saved, json.dumps(out))
    return out


def listed_scenarios(ev: EvalRunConfig) -> list[str] | None:
    """The scenario ids ``ev`` evaluates, in order, where they can be listed without opening its
    suite (PocketWorld's splits are generated); None elsewhere."""
    if ev.env != "pocketworld":
        return None
    from sage_rl.envs.pocketworld.env import PocketWorldSuite

    return list(PocketWorldSuite(templates=ev.pocketworld.templates).scenario_ids(ev.split, ev.limit_scenarios))


def missing_scenarios(listed: list[str], outcomes: Any) -> list[str]:
    """The scenarios of ``listed`` (``listed_scenarios``) that an evaluation's ``outcomes`` rows
    (``[task_id, scenario_id, success]``) do not hold: what a resumed evaluation still runs. Rows of
    another shape count for nothing."""
    rows = outcomes if isinstance(outcomes, list) else []
    have = {row[1] for row in rows if isinstance(row, list) and len(row) == 3}
    return [s for s in listed if s not in have]


def run(cfg: TrainConfig, resume: bool) -> dict[str, Any]:
    """Run every stage not done yet; write ``recipe.json``, ``report.md`` and ``report.png`` in
    ``cfg.out_dir``. Returns the summary. A used ``out_dir`` without ``resume`` is a
    ``FileExistsError``."""
    if cfg.recipe is None:
        raise RecipeError("the recipe needs a `recipe:` section (configs/quickstart.yaml has one)")
    cfg = with_curriculum(cfg)
    bound_heap()
    r, lay = cfg.recipe, Layout(Path(cfg.out_dir))
    if lay.root.is_dir() and any(p.name != OWNER for p in lay.root.iterdir()) and not resume:
        raise FileExistsError(f"{lay.root} holds a run already")
    with claim(lay.root):  # one process at a time in it (runs/claim.py)
        return _run(cfg, r, lay)


def _run(cfg: TrainConfig, r: RecipeSettings, lay: Layout) -> dict[str, Any]:
    lay.root.mkdir(parents=True, exist_ok=True)
    (lay.root / "config.yaml").write_text(dump_config(cfg))
    # every stage's config is derived and checked before anything runs
    collect_cfg = collect_config(cfg, r, lay.expert)
    sft_cfg = sft_config(cfg, r, lay.expert / f"{collect_cfg.name}.jsonl", lay.sft)
    sage_cfg = train_config(cfg, lay.sft / "final", lay.sage)
    state = _load_state(lay.root)
    stages: list[tuple[str, str, Callable[[], Any]]] = [
        ("eval_base", "evaluate the base model", lambda: _evaluate_all(cfg, r, lay, "base", cfg.policy.model)),
        ("collect", "collect expert trajectories", lambda: run_once(lay.expert / "summary.json", run_collect, collect_cfg)),
        ("sft", "SFT", lambda: run_once(lay.sft / "result.json", run_sft, sft_cfg)),
        ("eval_sft", "evaluate the SFT model", lambda: _evaluate_all(cfg, r, lay, "sft", str(lay.sft / "final"))),
        ("sage", "SAGE from the SFT model", lambda: train_once(sage_cfg)),
        ("eval_sage", "evaluate the SAGE model", lambda: _evaluate_all(cfg, r, lay, "sage", final_model(lay.sage))),
    ]  # fmt: skip
    for i, (key, title, stage) in enumerate(stages, start=1):
        err.rule(f"[bold]recipe {i}/{len(stages)}: {title}")
        t0, peaks = time.perf_counter(), stage_peaks_wanted() and reset_peak()
        result = stage()
        entry = state.setdefault(key, {"title": title})
        entry["result"] = result
        if "wall_s" not in entry:  # a skipped stage keeps its time and peak
            entry["wall_s"] = round(time.perf_counter() - t0, 1)
            peak = peak_rss_bytes() if peaks else None  # the process's peak during the stage
            entry["peak_rss_gb"] = round(peak / 1e9, 2) if peak else None
        _save_state(lay.root, state)
        release_memory()  # the next stage loads its own model
    summary = write_report(lay.root, cfg, state)
    err.print(f"recipe done; report: {lay.root / 'report.md'}")
    return summary


def with_curriculum(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` with ``recipe.templates`` (the curriculum) as every stage's ``pocketworld.templates``:
    collection, SFT data, SAGE's rollouts and the ``train_heldout`` evaluations draw only them."""
    if cfg.recipe is None or cfg.recipe.templates is None:
        return cfg
    data = cfg.model_dump(mode="json")
    data["pocketworld"] = {**data["pocketworld"], "templates": list(cfg.recipe.templates)}
    return TrainConfig.model_validate(data)


def _evaluate_all(cfg: TrainConfig, r: RecipeSettings, lay: Layout, stage: str, model: str | None) -> dict:
    out = {}
    for split in r.eval.splits:
        ev = eval_config(cfg, model, split, r.eval.scenarios, r.eval.concurrency, lay.eval(stage, split))
        if stage == "base" and r.eval.base_token_budget is not None:  # it writes until its budget
            ev = ev.model_copy(
                update={"agent": ev.agent.model_copy(update={"token_budget": r.eval.base_token_budget})}
            )
        source = read_back(ev, sorted(lay.root.glob(f"eval/*_{split}")))  # SAGE kept the SFT weights
        if source is not None:
            err.print(f"{stage} on {split}: the same weights and settings as {source.name}; its results read back")
        out[split] = evaluate(ev)
    return out


def run_once(done: Path, command: Callable[..., dict], stage_cfg: Any) -> dict:
    """Run ``command(stage_cfg)`` unless ``done`` (its summary file) exists; returns the summary."""
    if done.is_file():
        return read_summary(done)
    return command(stage_cfg)


def read_summary(path: Path) -> dict:
    """A finished stage's summary; one that is not a whole JSON object (damaged after the fact:
    stages write theirs atomically) is a ``RecipeError`` naming it, never a traceback."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise RecipeError(
            f"{path}: the stage's summary cannot be read ({e}); delete it to run the stage again"
        ) from None
    if not isinstance(data, dict):
        raise RecipeError(
            f"{path}: the stage's summary is not a JSON object; delete it to run the stage again"
        )
    return data


def collect_at_least(cfg: CollectConfig, examples: int, collect: Callable[..., dict] = run_collect) -> dict:
    """``collect(cfg)`` (unless its summary exists), then resumed with more train scenarios until the
    dataset holds at least ``examples`` examples; returns the last summary.

    For an expert whose examples deduplicate differently (the library-free one repeats itself more
    often), so two SFT datasets can be cut to the same size (issue 27). The plan is prefix-stable
    (``collect.plan_scenarios``): the first scenarios are the same as in ``cfg``, and each resume
    only adds. Each round asks for the missing examples at the rate seen so far, plus a tenth.
    """
    folder = Path(cfg.out_dir)
    summary = run_once(folder / "summary.json", collect, cfg)
    while summary["examples"] < examples:
        done = cfg.num_scenarios or summary["scenarios"]["run"]
        if summary["examples"] == 0:
            raise RecipeError(f"{folder}: {done} scenarios gave no examples; cannot reach {examples}")
        rate = summary["examples"] / done
        more = math.ceil(1.1 * (examples - summary["examples"]) / rate)
        cfg = cfg.model_copy(update={"num_scenarios": done + more})
        err.print(f"{folder}: {summary['examples']} examples of {examples}; {more} more scenarios")
        summary = collect(cfg)
    return summary


def train_once(cfg: TrainConfig) -> dict:
    """``sage-rl train`` of ``cfg``, unless its summary exists. A folder left by a stopped run is
    resumed: from its last checkpoint, or from step 0 when it stopped before its first step was
    logged (a folder with logged steps and no checkpoint is a ``CheckpointError`` naming it).
    Either way the folder's run must have ``cfg``'s settings (``train/same_run.py``:
    ``SettingsChanged``, a ``CheckpointError``); a finished one its length too (``steps``,
    ``sampled_token_budget``), or arms compared at one budget would not be (``RecipeError``)."""
    out = Path(cfg.out_dir)
    saved = check_same_run(out / "config.yaml", cfg)
    if saved is not None and (out / "summary.json").is_file():
        longer = [f"{k}: {saved[k]!r} -> {getattr(cfg, k)!r}" for k in ("steps", "sampled_token_budget")
                  if k in saved and saved[k] != getattr(cfg, k)]
        if longer:
            raise RecipeError(
                f"{out} finished under other lengths ({'; '.join(longer)}), and its evaluations are of "
                "the model it finished with: give the run's own lengths, or run the new ones into "
                "another folder"
            )
    return run_once(out / "summary.json", lambda c: run_train(c, resume=out.is_dir()), cfg)


def final_model(run_dir: Path) -> str:
    """The model folder a training run ends with: the one it kept by its evaluations
    (``eval.keep: best``, ``train/best.py``), else its last checkpoint's."""
    kept = read_best(run_dir)
    if kept is not None:
        return str(kept[1])
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        raise RecipeError(f"{run_dir} has no checkpoint to evaluate")
    return str(ckpt / "model")


def _load_state(root: Path) -> dict[str, Any]:
    path = root / STATE
    return json.loads(path.read_text()) if path.is_file() else {}


def _save_state(root: Path, state: dict[str, Any]) -> None:
    tmp = root / f".{STATE}.tmp"
    tmp.write_text(json.dumps(state, indent=1))
    tmp.replace(root / STATE)
