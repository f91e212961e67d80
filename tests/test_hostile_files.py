"""Corrupt, crafted and foreign files (issue 11): training checkpoints and ``--resume``, skill
imports and stores, YAML configs. Each gives an error that names the file and what is wrong, runs
no code from it, and loses nothing (the metrics file is not cut, a foreign database not touched,
the good records of an import still land).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from sage_rl.train.checkpoint import CheckpointError, latest_checkpoint, open_run, save_checkpoint
from sage_rl.train.trainer import Trainer, TrainerConfig

sys.path.insert(0, str(Path(__file__).parent))
from test_trainer import make_sample, small_model  # noqa: E402

CFG = TrainerConfig(lr=1e-2, micro_batch_size=2, seed=3)


# -- checkpoints and --resume ------------------------------------------------------------------------


@pytest.fixture
def run_dir(tmp_path):
    """A run of two steps with a checkpoint after each (the metrics file has two rows)."""
    torch.set_num_threads(1)
    trainer = Trainer(small_model(), None, CFG)
    logger, _ = open_run(trainer, tmp_path, resume=False, tensorboard=False)
    for step in (1, 2):
        logger.log(step, trainer.step([make_sample([1, 2, 3], [([4, 5], [])], 1.0)], 1))
        save_checkpoint(trainer, tmp_path, logger.offset())
    logger.close()
    return tmp_path


def _resume(run_dir):
    return open_run(Trainer(small_model(seed=9), None, CFG), run_dir, resume=True, tensorboard=False)


def _refused(run_dir, names: str) -> str:
    """Resuming raises a CheckpointError naming ``names``; the metrics file is left as it was."""
    metrics = run_dir / "metrics.jsonl"
    before = metrics.read_bytes()
    with pytest.raises(CheckpointError) as e:
        _resume(run_dir)
    assert names in str(e.value), str(e.value)
    assert metrics.read_bytes() == before
    return str(e.value)


def test_resume_works_and_an_empty_folder_starts_at_zero(run_dir, tmp_path_factory):
    logger, start = _resume(run_dir)
    logger.close()
    assert start == 2
    logger, start = _resume(tmp_path_factory.mktemp("empty"))
    logger.close()
    assert start == 0


def test_metrics_without_a_checkpoint_is_an_error_not_a_restart(run_dir):
    (run_dir / "checkpoints" / "latest").unlink()
    msg = _refused(run_dir, str(run_dir / "checkpoints" / "latest"))
    assert "step_000002" in msg  # it says which folder to resume from
    import shutil

    shutil.rmtree(run_dir / "checkpoints")
    assert "another out_dir" in _refused(run_dir, "metrics.jsonl")


@pytest.mark.parametrize("content", [b"\xff\xfe garbage \x00", b"step_999999", b"../../etc"])
def test_a_garbage_latest_pointer(run_dir, content):
    (run_dir / "checkpoints" / "latest").write_bytes(content)
    _refused(run_dir, "latest")


@pytest.mark.parametrize(
    "content",
    [b"{not json", b"[]", b'{"step": -1, "metrics_offset": 0}', b'{"step": "2", "metrics_offset": 1}'],
)
def test_a_corrupt_state_file(run_dir, content):
    (latest_checkpoint(run_dir) / "state.json").write_bytes(content)
    _refused(run_dir, "state.json")


@pytest.mark.parametrize("name", ["model/model.safetensors", "optimizer.pt", "rng.pt"])
@pytest.mark.parametrize("damage", ["garbage", "truncated", "missing"])
def test_a_corrupt_weight_file(run_dir, name, damage):
    path = latest_checkpoint(run_dir) / name
    if damage == "garbage":
        path.write_bytes(os.urandom(2048))
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    else:
        path.unlink()
    _refused(run_dir, name)


class _RunsCode:
    """Unpickling this runs ``os.system``: what a crafted rng.pt would do with weights_only=False."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_crafted_rng_file_runs_no_code(run_dir, tmp_path_factory):
    marker = tmp_path_factory.mktemp("pwned") / "ran"
    torch.save({"python": _RunsCode(marker)}, latest_checkpoint(run_dir) / "rng.pt")
    _refused(run_dir, "rng.pt")
    assert not marker.exists()


def test_rng_states_of_the_wrong_shape(run_dir):
    torch.save(
        {"python": [3, [1, 2], None], "numpy": [], "torch": torch.zeros(3)},
        latest_checkpoint(run_dir) / "rng.pt",
    )
    _refused(run_dir, "rng.pt")


def test_a_metrics_file_shorter_than_the_checkpoint_says(run_dir):
    metrics = run_dir / "metrics.jsonl"
    metrics.write_bytes(metrics.read_bytes()[:10])
    _refused(run_dir, "metrics.jsonl")


def test_train_cli_reports_a_broken_resume_without_a_traceback(run_dir, tiny):
    """``sage-rl train --resume`` turns the error into one line naming the file, exit code 2."""
    import subprocess

    from sage_rl.models import save_plain

    model_dir = run_dir / "tiny_model"
    save_plain(tiny[0], model_dir)
    tiny[1].save_pretrained(model_dir)
    (run_dir / "checkpoints" / "latest").write_text("nonsense")
    before = (run_dir / "metrics.jsonl").read_bytes()
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run(
        [sys.executable, "-m", "sage_rl.cli", "train", f"policy.model={model_dir}", f"out_dir={run_dir}",
         "init_from=null", "--resume"],
        cwd=root, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert r.returncode == 2, r.stderr[-2000:]
    assert "checkpoints/latest should name a checkpoint folder" in r.stderr and "Traceback" not in r.stderr
    assert (run_dir / "metrics.jsonl").read_bytes() == before
