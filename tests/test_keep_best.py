"""``eval.keep: best`` (train/best.py): an RL run ends with the weights its evaluations on a
validation split scored highest, the start model's included; ``train_val`` is that split.

The loop runs for real on the tiny model (its rollouts, updates and checkpoints); only the greedy
evaluation is scripted, so the scores, and hence the model that must be kept, are known."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from cli_server import run_cli
from safetensors.torch import load_file
from test_train_loop import _runner

from sage_rl.config import ConfigError, load_config
from sage_rl.envs.pocketworld import tasks
from sage_rl.eval.metrics import EvalMetrics
from sage_rl.policies.transformers_policy import TransformersPolicy
from sage_rl.recipe.pipeline import final_model
from sage_rl.rollout.batch import RolloutConfig
from sage_rl.settings import CollectConfig, TrainConfig
from sage_rl.train.best import Best, KeepBest, read_best, replaces
from sage_rl.train.checkpoint import CheckpointError
from sage_rl.train.config import LoopConfig, TrainEvalConfig
from sage_rl.train.trainer import Trainer, TrainerConfig

torch.set_num_threads(1)


def test_the_higher_tgc_then_the_higher_sgc_replaces_and_a_tie_keeps_the_earlier():
    kept = Best(step=2, tgc=60.0, sgc=30.0)
    assert replaces(Best(4, 63.3, 0.0), kept)  # TGC decides first
    assert not replaces(Best(4, 56.7, 90.0), kept)
    assert replaces(Best(4, 60.0, 40.0), kept)  # equal TGC: SGC decides
    assert not replaces(Best(4, 60.0, 20.0), kept)
    assert not replaces(Best(4, 60.0, 30.0), kept)  # a full tie keeps the earlier (fewer updates)
    assert not replaces(Best(0, 60.0, 30.0), kept) and replaces(Best(0, 60.1, 30.0), kept)
    assert replaces(Best(2, 10.0, 0.0), kept)  # the same step again: a resumed run redid it
    assert replaces(Best(0, 0.0, 0.0), None)


def _metrics(tgc: float, sgc: float) -> SimpleNamespace:
    return SimpleNamespace(tgc=tgc, sgc=sgc, avg_score=0.0, avg_steps=1.0, avg_tokens=8.0, usage_rate=0.0,
                           no_code_turn_rate=0.0)  # fmt: skip


def _run(tiny, run: Path, monkeypatch, scores: dict[int, tuple[float, float]], steps: int, resume=False):
    """The real loop for ``steps`` steps, evaluating after every one, with ``scores[step]`` as
    each evaluation's (TGC, SGC) (a step missing from ``scores`` must not be evaluated). Returns
    the result and the start model's weights."""
    from sage_rl.train import loop
    from sage_rl.train.checkpoint import open_run

    async def scripted(runner, protocol, step, progress, label=""):
        assert runner.params.temperature == 0.0 and protocol.split == "train_val"
        m = _metrics(*scores[step])
        no_default = dataclasses.MISSING
        required = [
            f.name for f in dataclasses.fields(EvalMetrics) if f.default is no_default and f.default_factory is no_default
        ]
        full = EvalMetrics(**{name: getattr(m, name, 0) for name in required})
        full = dataclasses.replace(full, tgc_by_position={1: m.tgc}, tgc_ci=(m.tgc - 1, m.tgc + 1))
        return SimpleNamespace(headline=m, record=lambda: {"metrics": dataclasses.asdict(full)})

    monkeypatch.setattr(loop, "run_eval", scripted)
    trainer = Trainer(copy.deepcopy(tiny[0]), tiny[1], TrainerConfig(lr=1e-2), temperature=1.0)
    start = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    policy = TransformersPolicy(trainer.model, tiny[1])
    cfg = LoopConfig(
        rollout=RolloutConfig(chain_length=1, group_size=2, groups_per_step=1, no_code_reward=None),
        eval=TrainEvalConfig(split="train_val", every=1, keep="best"),
        steps=steps,
        keep_last=None,
        out_dir=str(run),
    )
    logger, first = open_run(trainer, run, resume=resume, tensorboard=False)
    try:
        result = asyncio.run(
            loop.train(_runner(policy, 1.0), trainer, logger, cfg, 0, first, sync=policy.weights_changed)
        )
    finally:
        logger.close()
    return result, start


def _weights(model_dir: str | Path) -> dict[str, torch.Tensor]:
    return load_file(str(Path(model_dir) / "model.safetensors"))


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a if k in b) and bool(set(a) & set(b))


def test_the_run_ends_with_the_weights_of_its_best_evaluation(tiny, tmp_path, monkeypatch):
    """Steps 1-3 are judged after their update, step 4 (the last) by the after-run evaluation.
    Step 1 scores 60/30, step 2 less TGC and more SGC, step 3 ties step 1 (kept: the earlier);
    step 4 beats them all."""
    from sage_rl.train.logging import read_metrics

    scores = {0: (40.0, 20.0), 1: (60.0, 30.0), 2: (55.0, 50.0), 3: (60.0, 30.0), 4: (65.0, 0.0)}
    result, _ = _run(tiny, tmp_path / "run", monkeypatch, scores, steps=4)
    rows = read_metrics(tmp_path / "run")  # the logged choice after each periodic evaluation
    assert [r["eval/best_step"] for r in rows if "eval/best_step" in r] == [0.0, 1.0, 1.0, 1.0]
    assert result.best == Best(4, 65.0, 0.0)
    best, model_dir = read_best(tmp_path / "run")
    assert best == Best(4, 65.0, 0.0)
    kept, ckpts = _weights(model_dir), tmp_path / "run" / "checkpoints"
    assert _same(kept, _weights(ckpts / "step_000004" / "model"))
    assert not _same(kept, _weights(ckpts / "step_000001" / "model"))  # the weights did move
    assert [p.name.split(".")[0] for p in (tmp_path / "run" / "best").iterdir() if p.is_dir()] == ["step_000004"]
    record = json.loads((tmp_path / "run" / "best" / "best.json").read_text())
    assert record["split"] == "train_val" and record["step"] == 4
    assert final_model(tmp_path / "run") == str(model_dir)  # what the recipe evaluates


def test_a_run_that_never_beats_its_start_ends_with_the_start_weights(tiny, tmp_path, monkeypatch):
    scores = {0: (50.0, 40.0), 1: (50.0, 40.0), 2: (30.0, 60.0)}
    result, start = _run(tiny, tmp_path / "run", monkeypatch, scores, steps=2)
    assert result.best == Best(0, 50.0, 40.0)
    kept = _weights(read_best(tmp_path / "run")[1])
    assert _same(kept, {k: v for k, v in start.items() if k in kept})
    assert not _same(kept, _weights(tmp_path / "run" / "checkpoints" / "step_000002" / "model"))


def test_a_run_killed_in_its_first_step_resumes_without_redoing_the_start_evaluation(tiny, tmp_path, monkeypatch):
    """The start model's evaluation is logged (step 0) before the first checkpoint (step 1): a
    run killed between them resumes at step 0 from the trainer as built, reading that evaluation
    back (not redone: scores has no step 0 the second time), and a half-written row is cut."""
    from sage_rl.train.logging import read_metrics

    run = tmp_path / "run"

    def killed(self, *a, **k):
        raise KeyboardInterrupt("killed during step 1")

    with monkeypatch.context() as m:
        m.setattr(Trainer, "step", killed)
        with pytest.raises(KeyboardInterrupt):
            _run(tiny, run, monkeypatch, {0: (40.0, 20.0)}, steps=2)
    assert [r["step"] for r in read_metrics(run)] == [0] and not (run / "checkpoints").exists()
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 1, "loss"')  # the kill cut a row
    result, _ = _run(tiny, run, monkeypatch, {1: (30.0, 10.0), 2: (45.0, 0.0)}, steps=2, resume=True)
    assert result.before.tgc == 40.0 and result.before.tgc_by_position == {1: 40.0}
    assert result.before.tgc_ci == (39.0, 41.0) and result.steps_done == 2
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [0, 1, 2]  # step 2 is judged by the after-run evaluation
    assert rows[0]["eval/tgc"] == 40.0 and rows[1]["eval/best_step"] == 0.0
    assert result.best == Best(2, 45.0, 0.0)


def test_a_finished_run_copied_and_extended_keeps_the_best_of_both_parts(tiny, tmp_path, monkeypatch):
    """How an arm is given a larger budget without losing the one it finished under: its folder is
    copied and the copy resumed with more steps. The copy goes on from its last checkpoint, keeps
    the start evaluation and the finished run's last one (not redone: the second ``scores`` has
    neither), and keeps its best over both parts; the original is left as it was."""
    import shutil

    from sage_rl.train.logging import read_metrics

    first = {0: (50.0, 40.0), 1: (45.0, 40.0), 2: (40.0, 10.0)}
    _, start = _run(tiny, tmp_path / "run", monkeypatch, first, steps=2)
    assert read_best(tmp_path / "run")[0] == Best(0, 50.0, 40.0)
    shutil.copytree(tmp_path / "run", tmp_path / "longer")
    result, _ = _run(tiny, tmp_path / "longer", monkeypatch, {3: (55.0, 20.0), 4: (52.0, 60.0)}, steps=4, resume=True)
    assert result.steps_done == 4 and result.best == Best(3, 55.0, 20.0)
    rows = read_metrics(tmp_path / "longer")
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    assert [r["eval/best_step"] for r in rows if "eval/best_step" in r] == [0.0, 0.0, 3.0]
    ckpts = tmp_path / "longer" / "checkpoints"
    assert _same(_weights(read_best(tmp_path / "longer")[1]), _weights(ckpts / "step_000003" / "model"))
    assert not _same(_weights(ckpts / "step_000003" / "model"), _weights(ckpts / "step_000002" / "model"))
    kept = _weights(read_best(tmp_path / "run")[1])  # the finished run still ends with its start
    assert read_best(tmp_path / "run")[0] == Best(0, 50.0, 40.0)
    assert _same(kept, {k: v for k, v in start.items() if k in kept})
    assert not (tmp_path / "run" / "checkpoints" / "step_000003").exists()


def test_rows_past_the_start_evaluation_without_a_checkpoint_still_refuse_to_resume(tiny, tmp_path):
    from sage_rl.train.checkpoint import open_run

    trainer = Trainer(copy.deepcopy(tiny[0]), tiny[1], TrainerConfig(lr=1e-2), temperature=1.0)
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 0, "eval/tgc": 1}\n{"step": 1, "loss": 0.5}\n')
    with pytest.raises(CheckpointError, match="no checkpoint to resume"):
        open_run(trainer, run, resume=True, tensorboard=False)
    (run / "metrics.jsonl").write_text('{"step": 0, "eval/tgc": 1}\nnot json\n')
    with pytest.raises(CheckpointError, match="no checkpoint to resume"):
        open_run(trainer, run, resume=True, tensorboard=False)
    assert (run / "metrics.jsonl").read_text().endswith("not json\n")  # nothing cut


def test_a_redone_step_replaces_its_own_record_and_a_damaged_record_is_named(tiny, tmp_path):
    trainer = Trainer(copy.deepcopy(tiny[0]), tiny[1], TrainerConfig(lr=1e-2), temperature=1.0)
    keep = KeepBest(tmp_path, "train_val")
    assert keep.judge(trainer, 3, _metrics(70.0, 50.0)) == {"eval/best_step": 3.0, "eval/best_tgc": 70.0}
    again = KeepBest(tmp_path, "train_val")  # a resumed run reads what was kept
    assert again.kept == Best(3, 70.0, 50.0)
    assert again.judge(trainer, 3, _metrics(10.0, 0.0))["eval/best_tgc"] == 10.0  # step 3 redone
    assert read_best(tmp_path)[0] == Best(3, 10.0, 0.0)
    pointer = tmp_path / "best" / "best.json"
    pointer.write_text('{"folder": "step_000003.gone", "step": 3, "tgc": 1, "sgc": 1}')
    with pytest.raises(CheckpointError, match="holds no model"):
        read_best(tmp_path)
    pointer.write_text("{not json")
    with pytest.raises(CheckpointError, match="best.json cannot be read"):
        final_model(tmp_path)
    pointer.write_text('{"folder": "x", "step": 3, "tgc": NaN, "sgc": 1}')
    with pytest.raises(CheckpointError, match="not a finite number"):
        read_best(tmp_path)


def test_choosing_is_refused_on_a_reported_split_and_without_the_start():
    cfg = load_config(TrainConfig, None, ["eval.split=train_val", "eval.keep=best"])
    assert cfg.eval.keep == "best"
    for split in ("train_heldout", "dev"):
        recipe = ["recipe.eval.splits=[train_heldout,dev]"]
        with pytest.raises(ConfigError, match="a split whose results are reported"):
            load_config(TrainConfig, None, [f"eval.split={split}", "eval.keep=best", *recipe])
    with pytest.raises(ConfigError, match="before_after=true"):
        load_config(TrainConfig, None, ["eval.split=train_val", "eval.keep=best", "eval.before_after=false"])
    for load, key in ((TrainConfig, "rollout.split"), (CollectConfig, "split")):
        with pytest.raises(ConfigError, match="held out for evaluation"):
            load_config(load, None, [f"{key}=train_val"])


def test_train_val_is_three_fixed_scenarios_per_train_template_that_nothing_else_draws():
    from collections import Counter

    val = tasks.scenarios_of_split("train_val")
    per_template = Counter(s.rsplit("-s", 1)[0] for s in val)
    assert set(per_template) == {t.name for t in tasks.templates("train")} and set(per_template.values()) == {3}
    seeds = {int(s.rsplit("-s", 1)[1]) for s in val}
    assert seeds == set(tasks.VALIDATION_SEEDS) and not seeds & set(tasks.HELDOUT_SEEDS)
    assert tasks.TRAIN_SEEDS.stop <= min(seeds) and 0 not in seeds
    assert not set(val) & set(tasks.scenarios_of_split("train_heldout"))
    listed = tasks.split_tasks("train_val")
    assert all(t.split == "train_val" and tasks.task_by_id(t.task_id) == t for t in listed[:30])
    first = [s.rsplit("-s", 1)[0] for s in val[:30]]  # the first 30: one per template, in an order of its own
    assert len(set(first)) == 30 and first != [s.rsplit("-s", 1)[0] for s in tasks.scenarios_of_split("train_heldout")[:30]]
    rng = random.Random(0)
    assert [t.task_id for t in tasks.sample_chain(rng, 3, "train_val")] in [
        [t.task_id for t in listed[i : i + 3]] for i in range(0, len(listed), 3)
    ]
    assert not {tasks.sample_chain(rng, 1)[0].scenario_id for _ in range(100)} & set(val)



def test_the_command_reports_the_model_it_kept(tiny_dir, tmp_path):
    """``sage-rl train`` with ``eval.keep=best``: the summary and report name the kept step, and
    its weights are in ``best/``; the run is refused on the held-out split before anything loads."""
    import os
    import subprocess

    out = tmp_path / "run"
    args = [f"policy.model={tiny_dir}", "init_from=null", f"out_dir={out}", "pocketworld.sandbox=false",
            "agent.max_steps=1", "agent.max_tokens_per_turn=6", "rollout.group_size=2", "steps=1",
            "eval.split=train_val", "eval.scenarios=1", "eval.keep=best", "--json"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def train(*more: str) -> subprocess.CompletedProcess:
        return run_cli(["train", *args, *more], Path.cwd(), env, timeout=600)

    refused = train("eval.split=train_heldout", f"out_dir={tmp_path / 'no'}")
    assert refused.returncode == 2 and "a split whose results are reported" in refused.stderr
    assert not (tmp_path / "no").exists()
    r = train()
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    best, model_dir = read_best(out)
    assert summary["kept"] == {"step": best.step, "tgc": best.tgc, "sgc": best.sgc} and best.step in (0, 1)
    assert f"step {best.step} of 1" in (out / "report.md").read_text()
    assert (model_dir / "model.safetensors").is_file() and final_model(out) == str(model_dir)
