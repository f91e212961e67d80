"""The recipe end to end (``sage-rl recipe``; ``sage-rl train`` without arguments): base evaluation,
scripted-expert collection, SFT, evaluation, SAGE, evaluation, one report; then a refused and a
resumed rerun. Toy size: the tiny model, 3 scenarios, 2 SFT steps, 1 RL step."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from cli_server import run_cli

from sage_rl.config import load_config
from sage_rl.settings import TrainConfig

ROOT = Path(__file__).resolve().parents[1]


def _cli(command: str, *args: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return run_cli([command, *args], cwd, env, timeout=600)


def _train(*args: str) -> subprocess.CompletedProcess:
    return _cli("train", *args)


def test_train_has_one_meaning_a_missing_init_from_is_an_error(tmp_path):
    """``sage-rl train`` with a config or overrides trains one model; an ``init_from`` that does not
    exist is a one-line error pointing at ``sage-rl recipe``, never a silent recipe run."""
    from sage_rl.runs.train import NoStartModel, check_start

    cfg = load_config(TrainConfig, ROOT / "configs/quickstart.yaml", [f"init_from={tmp_path / 'none'}"])
    with pytest.raises(NoStartModel, match="sage-rl recipe"):
        check_start(cfg)
    (tmp_path / "sft").mkdir()
    check_start(cfg.model_copy(update={"init_from": str(tmp_path / "sft")}))
    check_start(cfg.model_copy(update={"init_from": None}))  # policy.model
    r = _train(f"init_from={tmp_path / 'none'}", f"out_dir={tmp_path / 'run'}")
    assert r.returncode == 2 and "sage-rl recipe" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "run").exists()  # nothing ran


def test_train_without_arguments_says_it_runs_the_recipe(tmp_path):
    """The README's main command: ``sage-rl train`` alone runs the recipe of
    configs/quickstart.yaml, and says so in one line (here into a folder that holds a run, so it
    stops at once)."""
    (tmp_path / "configs").mkdir()
    quick = (ROOT / "configs" / "quickstart.yaml").read_text()
    out = tmp_path / "used"
    (tmp_path / "configs" / "quickstart.yaml").write_text(
        quick.replace("out_dir: runs/quickstart", f"out_dir: {out}")
    )
    out.mkdir()
    (out / "something").touch()
    r = _cli("train", cwd=tmp_path)
    assert "runs the main job: the recipe of configs/quickstart.yaml" in r.stderr
    assert r.returncode == 2 and "holds a run already" in r.stderr


def test_recipe_end_to_end_with_the_tiny_model(tiny_dir, tmp_path):
    out = tmp_path / "run"
    args = [
        f"policy.model={tiny_dir}",
        f"init_from={tmp_path / 'no_sft_yet'}",
        f"out_dir={out}",
        "pocketworld.sandbox=false",
        "agent.max_steps=2",
        "agent.max_tokens_per_turn=12",
        "steps=1",
        "rollout.group_size=2",
        "recipe.collect.num_scenarios=3",
        "recipe.sft.optim.max_steps=2",
        "recipe.sft.optim.epochs=4",
        "recipe.sft.optim.freeze_layers=1",  # the main job freezes 10 of 30; the tiny model has 2
        "recipe.sft.eval_every=1",
        "recipe.sft.data.eval_fraction=0.3",
        "recipe.eval.splits=[train_heldout,dev]",
        "recipe.eval.scenarios=1",
        "--json",
    ]
    r = _cli("recipe", *args, env={"SAGE_RL_STAGE_PEAKS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    # every stage left its artefact
    assert (out / "expert" / "sage_expert.jsonl").is_file() and (out / "expert" / "summary.json").is_file()
    assert (out / "sft" / "final" / "config.json").is_file() and (out / "sft" / "result.json").is_file()
    assert (out / "sage" / "checkpoints" / "step_000001" / "model" / "config.json").is_file()
    for stage in ("base", "sft", "sage"):
        for split in ("train_heldout", "dev"):
            saved = json.loads((out / "eval" / f"{stage}_{split}" / "outcomes.json").read_text())
            assert saved["metrics"]["tasks"] == 3 and len(saved["outcomes"]) == 3
    state = json.loads((out / "recipe.json").read_text())
    assert list(state) == ["eval_base", "collect", "sft", "eval_sft", "sage", "eval_sage"]
    assert all(e["peak_rss_gb"] > 0.1 for e in state.values())  # SAGE_RL_STAGE_PEAKS=1: each stage's own peak
    assert state["collect"]["result"]["examples"] == 9  # the expert solves all 3 x 3 tasks
    sft = state["sft"]["result"]
    assert sft["steps"] == 2 and sft["train_examples"] + sft["eval_examples"] == 9 and sft["best_step"]
    assert state["sage"]["result"]["steps"] == 1 and state["sage"]["result"]["sampled_tokens"] > 0
    # the SFT stage trained the run's model on its own expert data, and SAGE started from it
    sft_cfg = (out / "sft" / "config.yaml").read_text()
    assert str(out / "expert" / "sage_expert.jsonl") in sft_cfg and str(tiny_dir) in sft_cfg
    assert f"init_from: {out / 'sft' / 'final'}" in (out / "sage" / "config.yaml").read_text()
    # one report of what each stage changed
    report = (out / "report.md").read_text()
    for text in ("### `train_heldout` (1 scenarios, 3 tasks)", "### `dev`", "| TGC (%) | ", "| SFT |"):
        assert text in report, text
    assert report.count("| base | SFT | SAGE |") == 2 and "TGC change on the same tasks" in report
    assert (out / "report.png").stat().st_size > 10_000
    assert set(summary["tgc"]["dev"]) == {"base", "SFT", "SAGE"}
    # a second run into the same folder is refused; --resume skips every finished stage
    again = _cli("recipe", *args[:-1])
    assert again.returncode == 2 and "--resume" in again.stderr
    resumed = _cli("recipe", *args, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((out / "recipe.json").read_text()) == state
    assert json.loads(resumed.stdout.strip().splitlines()[-1])["tgc"] == summary["tgc"]


def test_training_stops_at_its_sampled_token_budget_and_resumes_with_its_count(tiny_dir, tmp_path):
    """How SAGE and GRPO are compared at equal sampled tokens (benchmarks/laptop_recipe.py)."""
    out = tmp_path / "run"
    common = [f"policy.model={tiny_dir}", "init_from=null", f"out_dir={out}", "pocketworld.sandbox=false",
              "agent.max_steps=1", "agent.max_tokens_per_turn=6", "rollout.group_size=2",
              "eval.before_after=false", "--json"]  # fmt: skip
    r = _train(*common, "steps=5", "sampled_token_budget=1")
    assert r.returncode == 0, r.stderr[-3000:]
    first = json.loads(r.stdout.strip().splitlines()[-1])
    assert first["steps"] == 1 and first["sampled_tokens"] > 0  # one step spends the budget of 1
    assert (out / "checkpoints" / "step_000001").is_dir()
    # the count comes from metrics.jsonl: a row damaged since is a one-line error, never a wrong budget
    damaged = tmp_path / "damaged"
    shutil.copytree(out, damaged)
    row = json.loads((damaged / "metrics.jsonl").read_text())
    (damaged / "metrics.jsonl").write_text(json.dumps({**row, "sampled_tokens": "x"}) + "\n")
    r = _train(*common, f"out_dir={damaged}", "steps=5", "sampled_token_budget=100000", "--resume")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert f"{damaged / 'metrics.jsonl'} line 1 is not a metrics row ('sampled_tokens' holds" in r.stderr
    assert "the sampled tokens of steps 1-1 cannot be counted" in r.stderr
    r = _train(*common, "steps=5", f"sampled_token_budget={first['sampled_tokens'] + 1}", "--resume")
    assert r.returncode == 0, r.stderr[-3000:]
    second = json.loads(r.stdout.strip().splitlines()[-1])
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert second["steps"] == 2 and [row["step"] for row in rows] == [1, 2]
    assert (
        second["sampled_tokens"] == rows[-1]["sampled_tokens_total"] == sum(x["sampled_tokens"] for x in rows)
    )


def test_policy_threads_reach_torch_and_the_recipes_sft():
    """policy.threads sets torch's thread count for the process; the recipe's SFT takes it unless
    recipe.sft.optim.threads says otherwise; null leaves torch alone."""
    import torch

    from sage_rl.build import set_threads
    from sage_rl.recipe.pipeline import sft_config

    cfg = load_config(TrainConfig, ROOT / "configs/quickstart.yaml", ["policy.threads=1"])
    assert sft_config(cfg, cfg.recipe, Path("x.jsonl"), Path("sft")).optim.threads == 1
    own = load_config(
        TrainConfig, ROOT / "configs/quickstart.yaml", ["policy.threads=1", "recipe.sft.optim.threads=2"]
    )
    assert sft_config(own, own.recipe, Path("x.jsonl"), Path("sft")).optim.threads == 2
    before = torch.get_num_threads()
    try:
        set_threads(cfg.policy)
        assert torch.get_num_threads() == 1
        set_threads(cfg.policy.model_copy(update={"threads": None}))
        assert torch.get_num_threads() == 1  # null: unchanged
    finally:
        torch.set_num_threads(before)


def test_the_recipes_sft_trains_where_the_policy_runs(tmp_path):
    """recipe.sft.optim.device "auto" follows policy.device (SFT on the CPU when the run is on the
    CPU, on the GPU when it is there); a device of its own wins; a device name that is none is a
    config error naming the key."""
    import pytest

    from sage_rl.config import ConfigError
    from sage_rl.recipe.pipeline import sft_config
    from sage_rl.train.sft_config import SFTConfig

    def sft_device(*overrides: str) -> str:
        cfg = load_config(TrainConfig, ROOT / "configs/quickstart.yaml", list(overrides))
        return sft_config(cfg, cfg.recipe, Path("x.jsonl"), Path("sft")).optim.device

    assert sft_device() == "auto"
    assert sft_device("policy.device=cpu") == "cpu"
    assert sft_device("policy.device=cpu", "recipe.sft.optim.device=cuda:1") == "cuda:1"
    bad = tmp_path / "sft.yaml"
    bad.write_text("data: {path: x.jsonl}\noptim: {device: gpu}\n")
    with pytest.raises(ConfigError, match="optim.device"):
        load_config(SFTConfig, bad, [])


def test_a_run_stopped_in_its_first_step_is_started_again(tiny_dir, tmp_path):
    """benchmarks/laptop_recipe.py resumes its stages: an RL run killed during its first step (its
    folder holds an empty metrics file and no checkpoint) starts again from step 0, not refused."""
    from sage_rl.recipe.pipeline import train_once

    out = tmp_path / "sage"
    cfg = load_config(
        TrainConfig,
        ROOT / "configs/quickstart.yaml",
        [f"policy.model={tiny_dir}", "init_from=null", f"out_dir={out}", "pocketworld.sandbox=false",
         "agent.max_steps=1", "agent.max_tokens_per_turn=6", "rollout.group_size=2",
         "eval.before_after=false", "steps=1"],
    )  # fmt: skip
    out.mkdir()
    (out / "metrics.jsonl").touch()
    summary = train_once(cfg)
    assert summary["steps"] == 1 and (out / "summary.json").is_file()
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1]


def test_a_recipe_stopped_in_sft_by_a_signal_exits_130_saying_how_to_go_on(monkeypatch):
    """``sage-rl train`` / ``sage-rl recipe``: SFT's stop on Ctrl-C or SIGTERM (after a step and its
    resume point, train/sft_resume.py) is one line and exit 130, not click's bare "Aborted!"."""
    import typer

    from sage_rl import recipe
    from sage_rl.cli.recipe import run_or_exit
    from sage_rl.train.sft_resume import SFTStopped

    def stopped(cfg, resume):
        raise SFTStopped("SFT stopped by a signal after step 7 of 80; it resumes there")

    monkeypatch.setattr(recipe, "run", stopped)
    with pytest.raises(typer.Exit) as ended:
        run_or_exit(load_config(TrainConfig, ROOT / "configs/quickstart.yaml", []), False)
    assert ended.value.exit_code == 130
