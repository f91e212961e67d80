"""The verl run configs, their composition into verl's Hydra config, and the entry point (issue 13)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl", reason="verl runs in .venv-verl (bash scripts/setup_verl.sh)")

from omegaconf import OmegaConf  # noqa: E402

from sage_rl.config import ConfigError, load_config  # noqa: E402
from sage_rl.integrations.verl.compose import compose_config, validate  # noqa: E402
from sage_rl.integrations.verl.config import AGENT_LOOPS_YAML, VerlRunConfig  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs" / "verl").glob("*.yaml"))
MAIN = [sys.executable, "-m", "sage_rl.integrations.verl.main"]


@pytest.fixture(scope="module")
def composed():
    return {
        p.name: (load_config(VerlRunConfig, p), compose_config(load_config(VerlRunConfig, p)))
        for p in CONFIGS
    }


def test_three_shipped_configs():
    assert {p.name for p in CONFIGS} == {"paper_32b_2x8.yaml", "node_7b_1x8.yaml", "smoke_1gpu.yaml"}


@pytest.mark.parametrize("name", [p.name for p in CONFIGS])
def test_each_config_composes_and_passes_verls_own_checks(composed, name):
    cfg, config = composed[name]
    validate(config)
    r = cfg.rollout
    assert config.data.train_batch_size == r.groups_per_step
    assert config.actor_rollout_ref.rollout.n == r.group_size
    assert config.actor_rollout_ref.actor.ppo_mini_batch_size == r.chain_length * r.groups_per_step
    assert (
        config.actor_rollout_ref.actor.use_dynamic_bsz
        and config.actor_rollout_ref.rollout.log_prob_use_dynamic_bsz
    )
    assert config.actor_rollout_ref.actor.ppo_epochs == 1 and not config.actor_rollout_ref.actor.use_kl_loss
    assert config.trainer.v1.trainer_mode == "sage" and config.trainer.use_v1
    assert Path(config.actor_rollout_ref.rollout.agent.agent_loop_config_path) == AGENT_LOOPS_YAML
    assert OmegaConf.to_container(config.sage) == json.loads(json.dumps(cfg.sage_section()))
    assert (r.groups_per_step * r.group_size) % (cfg.cluster.nnodes * cfg.cluster.gpus_per_node) == 0


def test_the_paper_config_is_the_papers_setting(composed):
    cfg, config = composed["paper_32b_2x8.yaml"]
    r = cfg.rollout
    assert (
        r.groups_per_step * r.chain_length * r.group_size == 576 and r.group_size == 8 and r.chain_length == 2
    )
    assert (
        "32B" in cfg.model and cfg.env == "appworld" and cfg.cluster.nnodes * cfg.cluster.gpus_per_node == 16
    )
    actor = config.actor_rollout_ref.actor
    assert (
        actor.optim.lr == 1e-6
        and actor.optim.lr_scheduler_type == "constant"
        and actor.optim.clip_grad == 1.0
    )
    assert actor.loss_agg_mode == "seq-mean-token-mean" and cfg.trainer.loss_scale == "paper"
    assert (cfg.agent.max_steps, cfg.agent.max_tokens_per_turn, cfg.agent.context_limit) == (40, 1500, 28000)
    assert not config.algorithm.use_kl_in_reward and config.critic.enable is False


def test_verl_keys_that_sage_decides_cannot_be_overridden():
    with pytest.raises(ConfigError, match="actor_rollout_ref.rollout.n is set by sage-rl"):
        compose_config(VerlRunConfig(model="m", verl={"actor_rollout_ref": {"rollout": {"n": 4}}}))
    with pytest.raises(ConfigError, match="does not exist"):
        compose_config(
            VerlRunConfig(model="m", verl={"actor_rollout_ref.rollout.tensor_model_paralel_size": 2})
        )
    with pytest.raises(ConfigError, match="model: set"):
        compose_config(VerlRunConfig())
    with pytest.raises(ConfigError, match="rollout.dynamic_sampling"):  # the local trainer's only
        compose_config(VerlRunConfig(model="m", rollout={"dynamic_sampling": True}))
    with pytest.raises(ConfigError, match="at least agent.context_limit=28000"):
        compose_config(
            VerlRunConfig(model="m", verl={"actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 8192})
        )


def test_verl_keys_nested_or_dotted_and_new_keys_with_plus():
    dotted = compose_config(
        VerlRunConfig(model="m", verl={"actor_rollout_ref.rollout.gpu_memory_utilization": 0.3})
    )
    nested = compose_config(
        VerlRunConfig(model="m", verl={"actor_rollout_ref": {"rollout": {"gpu_memory_utilization": 0.3}}})
    )
    assert (
        dotted.actor_rollout_ref.rollout.gpu_memory_utilization
        == nested.actor_rollout_ref.rollout.gpu_memory_utilization
        == 0.3
    )
    added = compose_config(
        VerlRunConfig(model="m", verl={"+actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space": 8})
    )
    assert added.actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space == 8


def run_main(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    return subprocess.run([*MAIN, *args], cwd=cwd, capture_output=True, text=True, timeout=600, env=env)


def test_prepare_data_writes_one_row_per_task_sequence(tmp_path):
    import pyarrow.parquet as pq

    smoke = ROOT / "configs/verl/smoke_1gpu.yaml"
    done = run_main("prepare-data", str(smoke), "steps=4", "--out", str(tmp_path / "d"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    train = pq.read_table(tmp_path / "d/train.parquet").to_pylist()
    val = pq.read_table(tmp_path / "d/val.parquet").to_pylist()
    assert len(train) == 4 * 2 and len(val) == 2  # steps * groups_per_step; data.val_rows
    for row in train + val:
        tasks = json.loads(row["sage_tasks"])
        assert len(tasks) == 2 and len({t["scenario_id"] for t in tasks}) == 1
        assert [t["position"] for t in tasks] == sorted(t["position"] for t in tasks)
        assert row["agent_name"] == "sage_chain" and row["prompt"][0]["content"] == tasks[0]["instruction"]
    assert {row["extra_info"]["split"] for row in val} == {"dev"}
    from sage_rl.integrations.verl.data import prepare

    prepare(load_config(VerlRunConfig, smoke, ["steps=4"]), tmp_path / "e")
    assert pq.read_table(tmp_path / "e/train.parquet").to_pylist() == train  # seeded: the same rows again


def test_entry_point_errors_are_clear_and_nothing_starts(tmp_path):
    smoke = str(ROOT / "configs/verl/smoke_1gpu.yaml")
    bad = run_main("show-config", smoke, "rollout.chain_lenght=3", cwd=tmp_path)
    assert bad.returncode == 2 and "rollout.chain_lenght" in bad.stderr and "unknown key" in bad.stderr
    no_data = run_main("train", smoke, f"data_dir={tmp_path}/none", cwd=tmp_path)
    assert no_data.returncode == 2 and "prepare-data" in no_data.stderr
    shown = run_main("show-config", smoke, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert OmegaConf.create(shown.stdout).actor_rollout_ref.rollout.n == 4
