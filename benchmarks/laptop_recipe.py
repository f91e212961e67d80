"""The laptop experiment (issues 17 and 27): SFT, SAGE and the paper's controls at equal sampled
RL tokens, evaluated on ``train_heldout`` and ``dev`` in the paper's table shape.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/laptop_recipe.py [--config configs/laptop_recipe.yaml]
        [--out runs/laptop_recipe] [--results docs/results] [--parallel] [key=value ...]
    PYTHONPATH=$PWD .venv/bin/python benchmarks/laptop_recipe.py --quick --out /tmp/lr   # toy size, tiny model
    PYTHONPATH=$PWD .venv/bin/python benchmarks/laptop_recipe.py --status --out runs/laptop27  # where it stands

The models (``sage_rl/recipe/controls.py`` says what each isolates): ``base``; ``sft`` (skill-library
SFT, with its library); ``sft_nolib`` (the same weights, ``skills.use_skills=false``: the format
control); ``sft_inline`` (SFT on as many examples of the library-free expert, from the same
scenarios and a few more, the same SFT settings; evaluated without a library); ``grpo_nolib``
(the paper's baseline: from ``sft_inline``, no library, K = 1, outcome reward); ``grpo_lib`` (from ``sft``, same prompt and
library as SAGE, K = 1, outcome reward); ``sage`` (from ``sft``, K = 2, skill-integrated reward);
``sage_nolib`` (the SAGE model without its library: the skill value).

Stages, each skipped when its output exists in ``--out`` (a stopped run resumes; run folders are
kept), in the order of what each tells per hour: collect (library) -> SFT -> evaluate sft,
sft_nolib; RL sage (each RL arm to the same ``sampled_token_budget``: it stops after the step at
which its generated rollout tokens, screens included, reach it), then evaluate it (also as
sage_nolib), so SAGE - SFT comes first; RL grpo_lib and its evaluation (SAGE's two additions
ablated, the same start); collect (library-free: the same scenarios, then more until it has as
many examples; SFT takes the first that many) -> SFT -> evaluate sft_inline; RL grpo_nolib and its
evaluation; evaluate base last (a reference row near TGC 0 that nothing waits on). ``--until sft``
runs the stages before RL only (base included). ``--until sage`` runs only what SAGE - SFT and the
skill value need (the library expert, its SFT model, then sft, sft_nolib, SAGE, sage_nolib), and
reads back any other stage already done; the same folder run again without it does the rest.
``--sft-from RUN``
links the finished stages before RL of another run folder (``recipe/share.py``): a second RL
setting (``sampling.temperature=1.0``, say; the config's is 0.5) from the very same SFT models.

Every evaluation is greedy and scenario-ordered with the same agent limits, every model on the
same tasks (all of ``recipe.eval.splits``; ``recipe.eval.base_token_budget`` caps the base model).
Intervals (95%, percentile, seed 0; sage_rl/eval/ci.py) resample whole scenarios; every difference
is paired (the same scenarios drawn for both models). An RL arm that kept its start's weights is
not evaluated again: its start's evaluation is read back (``recipe/twins.py``, ``same_as.json``).

Writes ``<results>/laptop_recipe.json`` and ``<results>/laptop_recipe.png`` (reward by position and
a greedy held-out TGC curve on the first ``eval.scenarios`` scenarios against sampled tokens, each
RL arm from its own start model's measured TGC on those scenarios; TGC by model; the paired TGC
differences on ``train_heldout`` against issue 27's gate).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

from sage_rl.config import load_config
from sage_rl.eval.resume import ResumeError
from sage_rl.recipe.controls import (
    SPLITS,
    grpo_config,
    per_task,
    without_library,
)
from sage_rl.recipe.figure import plot
from sage_rl.recipe.pipeline import (
    Layout,
    RecipeError,
    bound_heap,
    collect_at_least,
    collect_config,
    eval_config,
    evaluate,
    final_model,
    release_memory,
    run_once,
    sft_config,
    train_config,
    train_once,
    with_curriculum,
)
from sage_rl.recipe.results import table
from sage_rl.recipe.share import share_sft_stages
from sage_rl.recipe.status import show as show_status
from sage_rl.recipe.twins import read_back
from sage_rl.runs.claim import RunInUse, claim
from sage_rl.runs.collect import run_collect
from sage_rl.runs.sft import run_sft
from sage_rl.settings import TrainConfig
from sage_rl.train.checkpoint import CheckpointError
from sage_rl.train.sft_resume import SFTStopped

ROOT = Path(__file__).resolve().parents[1]
#: --quick: the tiny random model, toy sizes, in-process executor: the pipeline in a few minutes.
QUICK = [
    "pocketworld.sandbox=false",
    "agent.max_steps=2",
    "agent.max_tokens_per_turn=12",
    "agent.token_budget=null",
    "rollout.group_size=2",
    "rollout.groups_per_step=1",
    "rollout.pool=screened",
    "rollout.screen_samples=1",
    "rollout.screen_every=2",
    "steps=3",
    "sampled_token_budget=300",
    "eval.every=1",
    "eval.scenarios=1",
    "recipe.collect.num_scenarios=3",
    "recipe.sft.optim.max_steps=2",
    "recipe.sft.optim.epochs=4",
    "recipe.sft.eval_every=1",
    "recipe.sft.data.eval_fraction=0.3",
    "recipe.eval.scenarios=1",
    "recipe.templates=[notes_count_tag,todo_count_open]",  # the curriculum: screens of 2 templates
]


def run(cfg: TrainConfig, out: Path, until: str = "all", parallel: bool = False) -> dict[str, Any]:
    """Every stage not done yet, up to the SFT models' evaluations (``until="sft"``), the SAGE
    headline's stages only (``until="sage"``: no base, no library-free expert or SFT; ``"sft_lib"``:
    the headline's stages before RL, gpu_recipe's first half), or all;
    returns {"results": {model: {split: evaluation}}, "sft": {...}, "rl": {...}, "times": {...}}.
    ``parallel``: evaluations run two at a time in two processes: on 2 cores this beats one 2-thread
    process after another. Unless ``policy.threads`` is set, each samples on the cores the other
    leaves free, measured each step (``engine/threads.py``): one each while both decode, both once
    the other is done or waits on its sandboxes (9% less wall than one thread each, docs/LOG.md).
    Training stays one run at a time: each RL trainer peaks at 12-17 GB at these sizes, and two side
    by side were OOM-killed on 24 GB (docs/LOG.md). One process at a time in ``out`` (runs/claim.py)."""
    with claim(out):
        return _stages(cfg, out, until, parallel)


def _stages(cfg: TrainConfig, out: Path, until: str, parallel: bool) -> dict[str, Any]:
    cfg = with_curriculum(cfg)
    assert cfg.recipe is not None
    r, lay = cfg.recipe, Layout(out)
    out.mkdir(parents=True, exist_ok=True)
    plain = without_library(cfg)
    collect_lib = collect_config(cfg, r, lay.expert)
    collect_inline = collect_config(plain, r, out / "expert_inline")  # the library-free expert
    sft_lib = sft_config(cfg, r, lay.expert / f"{collect_lib.name}.jsonl", lay.sft)
    sage_cfg = train_config(cfg, lay.sft / "final", lay.sage)
    rl_cfgs = {
        "sage": sage_cfg,
        "grpo_lib": grpo_config(sage_cfg, lay.sft / "final", out / "grpo_lib", library=True),
        "grpo_nolib": grpo_config(
            without_library(sage_cfg), out / "sft_inline" / "final", out / "grpo_nolib", library=False
        ),
    }
    times: dict[str, float] = {}

    bound_heap()  # as the main job: a stage's freed blocks go back to the OS, not the heap's high-water mark

    def timed(name: str, fn):
        t0 = time.perf_counter()
        result = fn()
        release_memory()  # the next stage starts from what it holds (after SFT: 9.5 -> 1.3 GB, LOG)
        times[name] = round(time.perf_counter() - t0, 1)
        print(f"[laptop_recipe] {name}: {times[name]:.0f} s", file=sys.stderr)
        return result

    def evals(models: dict[str, tuple[TrainConfig, str | None]]) -> dict[str, Any]:
        """{model: {split: evaluation}} of ``{name: (run config, weights)}``, every split."""
        jobs = []
        for m, (c, model) in models.items():
            for k, split in SPLITS.items():
                ev = eval_config(
                    c, model, split, r.eval.scenarios, r.eval.concurrency, lay.eval(m, split)
                )
                if m == "base" and r.eval.base_token_budget is not None:  # it writes until its budget
                    agent = ev.agent.model_copy(update={"token_budget": r.eval.base_token_budget})
                    ev = ev.model_copy(update={"agent": agent})
                jobs.append((m, k, ev))
                source = read_back(ev, sorted((out / "eval").glob(f"*_{split}")))  # an arm that kept its start
                if source is not None:
                    print(f"[laptop_recipe] eval {m} {split}: read back from {source} (same weights and "
                          "settings)", file=sys.stderr)  # fmt: skip
        done = _side_by_side(evaluate, [j[2] for j in jobs]) if parallel else [evaluate(j[2]) for j in jobs]
        found: dict[str, Any] = {}
        for (m, k, ev), result in zip(jobs, done, strict=True):
            found.setdefault(m, {})[k] = result | {"per_task": per_task(Path(ev.out_dir))}
        return found

    results: dict[str, Any] = {}
    sft_done: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    rl: dict[str, Any] = {}

    def library_sft() -> None:  # the library expert, its SFT model, evaluated with and without its library
        sft_done["sft"] = (
            timed("collect", lambda: run_once(lay.expert / "summary.json", run_collect, collect_lib)),
            timed("sft", lambda: run_once(lay.sft / "result.json", run_sft, sft_lib)),
        )
        models = {"sft": (cfg, str(lay.sft / "final")), "sft_nolib": (plain, str(lay.sft / "final"))}
        results.update(timed("eval sft", lambda: evals(models)))

    def inline_sft() -> None:  # as many examples of the library-free expert: more scenarios, cut to n
        n = sft_done["sft"][0]["examples"]
        inline = timed("collect inline", lambda: collect_at_least(collect_inline, n))
        data = out / "expert_inline" / f"{collect_inline.name}.jsonl"
        sft_inline = sft_config(plain, r, data, out / "sft_inline", limit=n)
        sft_done["sft_inline"] = (
            inline,
            timed("sft inline", lambda: run_once(out / "sft_inline" / "result.json", run_sft, sft_inline)),
        )
        model = {"sft_inline": (plain, str(out / "sft_inline" / "final"))}
        results.update(timed("eval sft_inline", lambda: evals(model)))

    def arm(name: str) -> None:  # an RL arm, evaluated as soon as it is trained
        c = rl_cfgs[name]
        rl[name] = timed(name, lambda: train_once(c))
        trained = {name: (c, final_model(Path(c.out_dir)))}
        if name == "sage":  # the skill value: the same weights without their library
            trained["sage_nolib"] = (without_library(c), trained["sage"][1])
        results.update(timed(f"eval {name}", lambda: evals(trained)))

    def base() -> None:  # a reference row (TGC ~0): last, as nothing else waits on it
        results.update(timed("eval base", lambda: evals({"base": (cfg, cfg.policy.model)})))

    def done(model: str, *more: Path) -> bool:  # its evaluations (and ``more``) are on disk already
        found = [lay.eval(model, split) / "outcomes.json" for split in SPLITS.values()]
        return all(p.is_file() for p in [*found, *more])

    # The order is by what each stage tells per hour: SAGE - SFT first, then the ablation of SAGE's
    # two additions (grpo_lib, same start), then the paper's baseline with its own SFT model, base last.
    plan = [
        ("sft", library_sft, True),
        ("sage", lambda: arm("sage"), False),
        ("grpo_lib", lambda: arm("grpo_lib"), False),
        ("inline", inline_sft, done("sft_inline", out / "sft_inline" / "result.json")),
        ("grpo_nolib", lambda: arm("grpo_nolib"), False),
        ("base", base, done("base")),
    ]
    needed = {"sft": {"sft", "inline", "base"}, "sage": {"sft", "sage"}, "sft_lib": {"sft"}}.get(
        until, {p[0] for p in plan}
    )
    for key, stage, finished in plan:
        if key in needed or finished:  # a stage not asked for but done already (shared, earlier) is read back
            stage()
    sft = {m: {"collect": c, "sft": s} for m, (c, s) in sft_done.items()}
    return {"results": results, "sft": sft, "rl": rl, "times": times, "cfg": cfg}


def _side_by_side(fn, items: list) -> list:
    """``[fn(x) for x in items]``, two processes at a time (spawned: each loads its own torch)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=2, mp_context=spawn, initializer=bound_heap) as pool:
        return list(pool.map(fn, items))


def stopped(prog: str, e: SFTStopped) -> NoReturn:
    """Ctrl-C or SIGTERM in SFT, after a step and its resume point: one line, exit 130."""
    print(f"{prog}: {e}; the same command goes on from there", file=sys.stderr)
    sys.exit(130)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/laptop_recipe.yaml")
    ap.add_argument("--out", default="runs/laptop_recipe", help="run folder (stages resume from it)")
    ap.add_argument(
        "--results", help="folder for laptop_recipe.json/.png (default: docs/results; --quick: --out)"
    )
    ap.add_argument("--quick", action="store_true", help="toy size with the tiny random model (tests)")
    ap.add_argument(
        "--until",
        choices=("sft", "sage", "all"),
        default="all",
        help="sft: stop after the SFT models' evaluations and report base and the SFT models only; "
        "sage: only what SAGE - SFT and the skill value need (library SFT, sft, sft_nolib, SAGE, "
        "sage_nolib; no base, no library-free SFT, no GRPO arms): a later run without it does the rest",
    )
    ap.add_argument(
        "--sft-from",
        metavar="RUN",
        help="link the finished stages before RL (expert data, both SFT models, their evaluations) of "
        "run folder RUN into --out: its RL arms start from the same models (sage_rl/recipe/share.py)",
    )
    ap.add_argument(
        "--parallel",
        action="store_true",
        help="evaluate two models or splits at a time (two processes, one torch thread each); training "
        "stays one run at a time (an RL trainer peaks at 12-17 GB at these sizes)",
    )
    ap.add_argument("--status", action="store_true", help="print where the run in --out stands; run nothing")
    ap.add_argument("overrides", nargs="*", help="key.sub=value overrides of the config")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if args.status:
        return {"status": [dataclasses.asdict(s) for s in show_status(out)]}
    results = Path(args.results or (out if args.quick else "docs/results"))
    if args.quick and results.resolve() in {
        (ROOT / "docs" / "results").resolve(),
        (ROOT / "docs" / "results" / "gpu").resolve(),
    }:
        ap.error(f"--quick writes toy figures: not into {results}, which holds the measured ones")
    overrides = list(args.overrides)
    if args.quick:
        # one base model for a run and the run it links from (--sft-from): their base evaluations are one
        tiny = _tiny(Path(args.sft_from) if args.sft_from else out)
        overrides = [*QUICK, f"policy.model={tiny}", *overrides]
    cfg = load_config(TrainConfig, args.config, overrides)
    try:
        with claim(out):
            if args.sft_from:
                try:
                    share_sft_stages(Path(args.sft_from), out, SPLITS.values(), args.until)
                except RecipeError as e:
                    ap.error(str(e))
            done = run(cfg, out, args.until, args.parallel)
    except (RecipeError, CheckpointError, ResumeError, RunInUse) as e:  # --out not this run's, or busy
        sys.exit(f"laptop_recipe: {e}")
    except SFTStopped as e:
        stopped("laptop_recipe", e)
    results.mkdir(parents=True, exist_ok=True)
    row = table(done, cfg, out) | {"sft_from": args.sft_from}
    (results / "laptop_recipe.json").write_text(json.dumps(row, indent=1) + "\n")
    plot(done, out, results / "laptop_recipe.png")
    print(
        json.dumps({k: v for k, v in row.items() if k.startswith("heldout_tgc_") and not k.endswith("_ci")})
    )
    return row


def _tiny(out: Path) -> Path:
    """The tiny random model, saved once under ``out``."""
    from sage_rl.models import save_plain, tiny_model

    folder = out / "tiny_model"
    if not (folder / "config.json").is_file():
        model, tok = tiny_model(seed=0)
        save_plain(model, folder)
        tok.save_pretrained(folder)
    return folder


if __name__ == "__main__":
    main()
