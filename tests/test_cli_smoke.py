"""Subprocess smoke tests of the commands a user runs first (STYLE.md, test tier 2), with a tiny
model saved to a folder: two training steps, a small evaluation, and clean config errors."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sage_rl.config import load_config
from sage_rl.settings import EvalRunConfig, RunConfig, TrainConfig

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "sage_rl.cli"]


def _cli(*args, cwd=ROOT, timeout=600):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([*CLI, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


SMALL = ["agent.max_steps=2", "agent.max_tokens_per_turn=12", "agent.context_limit=4096"]


def test_train_two_steps_writes_checkpoints_metrics_and_report(tiny_dir, tmp_path):
    out = tmp_path / "run"
    r = _cli(
        "train",
        "configs/quickstart.yaml",
        f"policy.model={tiny_dir}",
        "steps=2",
        "rollout.group_size=2",
        "eval.scenarios=1",
        f"out_dir={out}",
        "init_from=null",
        *SMALL,
        "--json",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 2 and summary["before"] is not None and summary["after"] is not None
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [0, 1, 2]  # before-eval row, then one row per step
    assert {"reward", "success", "grad_norm", "entropy", "time/rollout_s"} <= set(rows[1])
    assert (out / "checkpoints" / "step_000002" / "model" / "config.json").is_file()
    assert (out / "report.md").is_file() and (out / "rollouts" / "step_000002.jsonl").is_file()
    # a fresh start into a used run folder is refused (no silent mixing of two runs)
    r2 = _cli("train", f"policy.model={tiny_dir}", f"out_dir={out}", "init_from=null", *SMALL)
    assert r2.returncode == 2 and "--resume" in r2.stderr


def test_eval_writes_the_run_folder(tiny_dir, tmp_path):
    out = tmp_path / "eval"
    r = _cli("eval", f"policy.model={tiny_dir}", "limit_scenarios=1", f"out_dir={out}", *SMALL, "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    metrics = json.loads(r.stdout.strip().splitlines()[-1])["same_scenario"]
    assert metrics["tasks"] == 3 and metrics["scenarios"] == 1
    for f in (
        "config.yaml",
        "metrics.json",
        "report.md",
        "by_position.png",
        "trajectories.same_scenario.jsonl",
    ):
        assert (out / f).is_file(), f
    assert "TGC" in (out / "report.md").read_text()


def test_bad_config_fails_at_start_naming_the_field(tmp_path):
    r = _cli("eval", "agent.max_stepz=3")
    assert r.returncode == 2 and "agent.max_stepz" in r.stderr and "unknown key" in r.stderr
    r = _cli("train", "rollout.group_size=many")
    assert r.returncode == 2 and "rollout.group_size" in r.stderr
    r = _cli("eval", "strategies=[telepathy]", "policy.kind=scripted")
    assert r.returncode == 2 and "telepathy" in r.stderr
    r = _cli("train", "--frobnicate")  # was "config file not found: --frobnicate"
    assert r.returncode == 2 and "error: no such option: --frobnicate" in r.stderr
    r = _cli("eval", "policy.kind=scripted", "--limit", "1")
    assert r.returncode == 2 and "error: no such option: --limit" in r.stderr


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        ((c, "no_such_key=1"), "no_such_key: unknown key")
        for c in ("train", "eval", "recipe", "collect", "sft")
    ]
    + [(("choose", "4"), "give STEP=FOLDER")],  # train.best imported the checkpoint code (torch): ~5 s
    ids=lambda v: v[0] if isinstance(v, tuple) else None,
)
def test_an_argument_error_is_found_before_torch_is_imported(argv, error):
    """A misspelt key is reported at once: the command modules import torch and the run's modules
    only once the config is good (torch and transformers took 4-5 s of a 5 s config error)."""
    code = (
        "import sys\nfrom sage_rl.cli import main\n"
        f"sys.argv = ['sage-rl', *{argv!r}]\n"
        "try:\n    main()\nexcept SystemExit as e:\n    print(e.code, 'torch' in sys.modules)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.stdout.split() == ["2", "False"], r.stdout + r.stderr[-2000:]
    assert error in r.stderr


@pytest.mark.parametrize(
    ("policy", "built"),
    [
        ({"kind": "openai", "model": "m", "base_url": "http://127.0.0.1:9/v1"}, "OpenAIPolicy"),
        ({"kind": "scripted"}, "ScriptedExpert"),
    ],
    ids=["openai", "scripted"],
)
def test_a_run_that_trains_no_model_imports_no_torch(policy, built):
    """A model server samples (`policy.kind=openai`), the scripted expert needs only a token count:
    neither run needs torch or transformers. sage_rl.build imported the trainer at its top, and the
    expert's count loaded the tokenizer through transformers (which imports torch): ~5 s a start."""
    code = (
        "import sys\nfrom sage_rl.build import build_policy\nimport sage_rl.runs.eval, sage_rl.collect\n"
        "from sage_rl.settings import EvalRunConfig\n"
        f"cfg = EvalRunConfig.model_validate({{'policy': {policy!r}}})\n"
        "p = build_policy(cfg)\n"
        "print(type(p).__name__, 'torch' in sys.modules, 'transformers' in sys.modules)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.stdout.split() == [built, "False", "False"], r.stdout + r.stderr[-2000:]


def test_a_model_that_cannot_be_loaded_is_a_one_line_error(tmp_path):
    """Before: ModelLoadError escaped `train` and `eval` as a full traceback."""
    (tmp_path / "empty_model").mkdir()
    cases = [
        (("eval", "policy.model=empty_model", "limit_scenarios=1"), "policy.model: cannot load"),
        (("train", "init_from=empty_model", "steps=1"), "init_from: cannot load"),
        (
            ("train", f"policy.model={tmp_path / 'gone'}", "init_from=null", "steps=1"),
            "policy.model: model path",
        ),
    ]
    for args, message in cases:
        r = _cli(*args, f"out_dir={tmp_path / 'out'}", *SMALL, cwd=tmp_path, timeout=300)
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
        assert r.stderr.strip().splitlines()[-1].startswith(f"error: {message}"), r.stderr[-1000:]


@pytest.mark.parametrize("path", sorted((ROOT / "configs").rglob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_validates(path):
    if path.parent.name == "verl":  # SAGE on verl has its own config model (docs/verl.md)
        from sage_rl.integrations.verl.config import VerlRunConfig

        assert isinstance(load_config(VerlRunConfig, path), VerlRunConfig)
        return
    model = {"eval.yaml": EvalRunConfig}.get(path.name, TrainConfig)
    if path.name.startswith(("appworld", "sft", "collect")):
        pytest.skip(f"{path.name} is validated by its own command's tests")
    cfg = load_config(model, path)
    assert isinstance(cfg, RunConfig)


def test_the_verl_command_prepares_data_without_torch():
    """`sage-rl verl prepare-data` reads a config and writes parquet: the config imported the
    trainer's loss module (torch, ~2.5 s of a 5 s command) for one enum."""
    code = (
        "import sys\nimport sage_rl.integrations.verl.main, sage_rl.integrations.verl.data\n"
        "print('torch' in sys.modules, 'transformers' in sys.modules)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.stdout.split() == ["False", "False"], r.stdout + r.stderr[-2000:]
