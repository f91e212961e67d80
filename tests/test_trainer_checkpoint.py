"""Checkpoints: Hugging Face format, exact resume, and --resume after kill -9 (issue 6).

Run as a script, this file is the small training driver the kill -9 test starts:
    python tests/test_trainer_checkpoint.py RUN_DIR TOTAL_STEPS [--resume] [--pause S]
"""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from sage_rl.train.checkpoint import latest_checkpoint, load_checkpoint, open_run, save_checkpoint
from sage_rl.train.logging import read_metrics
from sage_rl.train.trainer import LoraConfig, Trainer, TrainerConfig

sys.path.insert(0, str(Path(__file__).parent))
from test_trainer import make_sample, small_model  # noqa: E402

torch.set_num_threads(1)
CFG = TrainerConfig(lr=1e-2, micro_batch_size=2, seed=3)
EVERY = 2


def random_batch():
    """Samples drawn from the GLOBAL torch RNG, so an inexact RNG restore changes the data."""
    out = []
    for i in range(4):
        n_prompt, n_gen = (int(x) for x in torch.randint(1, 6, (2,)))
        prompt = torch.randint(1, 64, (n_prompt,)).tolist()
        gen = torch.randint(1, 64, (n_gen,)).tolist()
        out.append(make_sample(prompt, [(gen, [])], float(torch.randn(()).item()), position=i % 2))
    return out


def train(run_dir, total, resume, pause=0.0, trainer=None):
    trainer = trainer or Trainer(small_model(), None, CFG)
    logger, start = open_run(trainer, run_dir, resume=resume, tensorboard=True)
    for step in range(start + 1, total + 1):
        logger.log(step, trainer.step(random_batch(), num_chains=2))
        if step % EVERY == 0 or step == total:
            save_checkpoint(trainer, run_dir, logger.offset(), keep_last=2)
        if step >= 2 * EVERY:  # a wide window to kill in, once the checkpoint to resume from exists
            time.sleep(pause)
    logger.close()
    return trainer


def flat(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_resume_is_exact(tmp_path):
    straight = train(tmp_path / "a", 4, resume=False)
    train(tmp_path / "b", 2, resume=False)
    # a fresh process would start from other weights and another RNG state: simulate both
    torch.manual_seed(123)
    other = Trainer(small_model(seed=9), None, CFG)
    resumed = train(tmp_path / "b", 4, resume=True, trainer=other)
    assert resumed.global_step == 4
    assert torch.equal(flat(straight.model), flat(resumed.model))
    a, b = read_metrics(tmp_path / "a"), read_metrics(tmp_path / "b")
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    assert [r["loss"] for r in a] == [r["loss"] for r in b]
    assert sorted(p.name for p in (tmp_path / "b" / "checkpoints").glob("step_*")) == [
        "step_000002",
        "step_000004",
    ]


def test_checkpoint_is_a_hugging_face_model(tmp_path, tiny):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tok = copy.deepcopy(tiny[0]), tiny[1]
    tr = Trainer(model, tok, CFG)
    tr.step([make_sample([1, 2, 3], [([4, 5], [])], 1.0)], 1)
    ckpt = save_checkpoint(tr, tmp_path, metrics_offset=0)
    loaded = AutoModelForCausalLM.from_pretrained(ckpt / "model", local_files_only=True).eval()
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=ids).logits, tr.model(input_ids=ids).logits, atol=1e-5)
    assert AutoTokenizer.from_pretrained(ckpt / "model").encode("hello") == tok.encode("hello")


def test_lora_checkpoint_has_merged_weights_and_resumes(tmp_path):
    from transformers import AutoModelForCausalLM

    cfg = TrainerConfig(lr=1e-1, lora=LoraConfig(r=4, alpha=8))
    tr = Trainer(small_model(), None, cfg)
    tr.step([make_sample([1, 2, 3], [([4, 5], [])], 1.0)], 1)
    ckpt = save_checkpoint(tr, tmp_path, metrics_offset=0)
    merged = AutoModelForCausalLM.from_pretrained(ckpt / "model", local_files_only=True).eval()
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        want = tr.model(input_ids=ids).logits
        assert torch.allclose(merged(input_ids=ids).logits, want, atol=1e-5)
        base = small_model()(input_ids=ids).logits
        assert not torch.allclose(base, want, atol=1e-4)  # the adapter did move the model
    fresh = Trainer(small_model(), None, cfg)
    assert load_checkpoint(fresh, ckpt).step == 1
    with torch.no_grad():
        assert torch.allclose(fresh.model(input_ids=ids).logits, want, atol=1e-6)


def test_resume_after_kill_9(tmp_path):
    run_dir, total = tmp_path / "run", 10
    cmd = [sys.executable, __file__, str(run_dir), str(total)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([*cmd, "--pause", "2.0"], env=env)
    metrics = run_dir / "metrics.jsonl"

    def rows_written():
        return metrics.read_text().count("\n") if metrics.exists() else 0

    try:
        deadline = time.monotonic() + 240
        # kill after row 5 is written: the last checkpoint (step 4) is older than the metrics file
        while rows_written() < 5 and proc.poll() is None:
            assert time.monotonic() < deadline, "the driver wrote no 5 metric rows in 240 s"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL  # killed mid-run, not finished
    assert latest_checkpoint(run_dir).name == "step_000004"
    assert rows_written() == 5  # one row past the checkpoint, to be cut on resume
    subprocess.run([*cmd, "--resume"], env=env, check=True, timeout=300)
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(1, total + 1))  # each step once, in order
    assert latest_checkpoint(run_dir).name == "step_000010"
    # the interrupted run ends where an uninterrupted one does, metric for metric
    straight = train(tmp_path / "straight", total, resume=False)
    assert [r["loss"] for r in rows] == [r["loss"] for r in read_metrics(tmp_path / "straight")]
    resumed = Trainer(small_model(), None, CFG)
    load_checkpoint(resumed, latest_checkpoint(run_dir))
    assert torch.equal(flat(resumed.model), flat(straight.model))


if __name__ == "__main__":
    args = sys.argv[1:]
    pause = float(args[args.index("--pause") + 1]) if "--pause" in args else 0.0
    train(Path(args[0]), int(args[1]), resume="--resume" in args, pause=pause)
