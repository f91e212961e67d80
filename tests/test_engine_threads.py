"""The sampling thread's torch thread count: fixed, or "auto" (the cores other processes leave free)."""

from __future__ import annotations

import asyncio
import copy
import json

import pytest
import torch

from sage_rl.engine import threads as threads_mod
from sage_rl.engine.threads import ThreadPolicy, auto_threads, others_running, threads_setting
from sage_rl.policies.base import PolicyRequest, SamplingParams
from sage_rl.policies.transformers_policy import TransformersPolicy, bf16_native, resolve_dtype


def test_auto_uses_the_cores_other_processes_leave_free():
    assert auto_threads(0.0, cores=2, ceiling=2) == 2
    assert auto_threads(0.2, cores=2, ceiling=2) == 2  # a sliver of a core: still ours
    assert auto_threads(0.3, cores=2, ceiling=2) == 1
    assert auto_threads(1.0, cores=2, ceiling=2) == 1
    assert auto_threads(7.0, cores=2, ceiling=2) == 1  # never below one
    assert auto_threads(1.0, cores=8, ceiling=4) == 4  # never above the process's count
    assert auto_threads(5.0, cores=8, ceiling=8) == 3


def test_bad_thread_settings_are_refused_by_name():
    for bad in (0, -2, "many", True, 1.5):
        with pytest.raises(ValueError, match="threads must be"):
            threads_setting(bad)
    assert [threads_setting(v) for v in (None, "auto", 3)] == [None, "auto", 3]


def test_others_running_counts_runnable_threads_not_ours(tmp_path):
    (tmp_path / "loadavg").write_text("3.10 2.00 1.50 5/211 4242\n")
    for tid, name, state in ((1, "python", "R"), (2, "a (weird) name", "R"), (3, "omp", "S")):
        (tmp_path / "self" / "task" / str(tid)).mkdir(parents=True)
        (tmp_path / "self" / "task" / str(tid) / "stat").write_text(f"{tid} ({name}) {state} 1 2 3\n")
    assert others_running(tmp_path) == 3.0  # 5 runnable, 2 of them ours
    assert others_running(tmp_path / "missing") is None


def test_policy_sets_threads_while_stepping_and_restores_them():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        policy = ThreadPolicy("auto", probe=lambda: 1.0)
        policy.cores = 2
        policy.start()
        assert policy.step() == 1 and torch.get_num_threads() == 1  # one core taken by others
        policy.stop()
        assert torch.get_num_threads() == 2
        quiet = ThreadPolicy("auto", probe=lambda: 0.0)
        quiet.cores = 2
        quiet.start()
        assert quiet.step() == 2
        quiet.stop()
        blind = ThreadPolicy("auto", probe=lambda: None)  # no /proc: the process's count
        blind.start()
        assert blind.step() == 2
        blind.stop()
        fixed = ThreadPolicy(1)
        fixed.start()
        assert fixed.step() == 1
        fixed.stop()
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_transformers_policy_samples_with_auto_threads_and_restores(tiny, monkeypatch):
    model, tok = tiny
    before = torch.get_num_threads()
    monkeypatch.setattr(threads_mod, "others_running", lambda: 9.0)  # a busy machine
    monkeypatch.setattr(threads_mod, "usable_cores", lambda: 2)
    try:
        torch.set_num_threads(2)
        policy = TransformersPolicy(model, tok, stop_ids=())
        assert policy.threads.setting == "auto"  # the default
        params = SamplingParams(temperature=1.0, max_tokens=5, seed=1)
        out = asyncio.run(policy.generate(PolicyRequest((), (1, 2, 3), params)))
        assert len(out.token_ids) == 5
        assert set(policy.stats.thread_steps) == {1} and sum(policy.stats.thread_steps.values()) >= 5
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_auto_dtype_is_float32_where_bfloat16_is_emulated(tiny, monkeypatch):
    bf16_cpu = {"avx2", "avx512f", "avx512_bf16"}
    assert bf16_native(bf16_cpu, "AVX512", "")
    assert not bf16_native({"avx2", "fma"}, "AVX2", "")  # AMD EPYC Zen 3: no bf16 instructions
    assert not bf16_native(bf16_cpu, "AVX2", "")  # ATEN_CPU_CAPABILITY=avx2
    assert not bf16_native(bf16_cpu, "AVX512", "AVX2")  # ONEDNN_MAX_CPU_ISA=AVX2: emulated products
    assert not bf16_native(bf16_cpu, "AVX512", "avx512_core")
    assert bf16_native({"amx_bf16", "avx512_bf16"}, "AVX512", "AVX512_CORE_AMX")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert resolve_dtype("auto", tiny[0]) is None  # the model's own float32, on any CPU


def test_pick_threads_averages_the_probe_and_falls_back_to_every_core(monkeypatch):
    """SFT's `threads: null`: one choice at its start, from the average of several probes."""
    monkeypatch.setattr(threads_mod, "usable_cores", lambda: 4)
    samples = iter([2.0, 3.0, 1.0, 2.0])  # mean 2.0 other threads: 2 of 4 cores left
    assert threads_mod.pick_threads(samples=4, interval_s=0.0, probe=lambda: next(samples)) == 2
    assert threads_mod.pick_threads(samples=3, interval_s=0.0, probe=lambda: 9.0) == 1  # never 0
    assert threads_mod.pick_threads(samples=3, interval_s=0.0, probe=lambda: None) == 4  # no /proc
    assert threads_mod.pick_threads(samples=2, interval_s=0.0, probe=lambda: 0.2) == 4  # idle noise


def test_run_sft_restores_the_process_thread_count(tiny, monkeypatch, tmp_path):
    """run_sft picks its own threads (null: the free cores) and gives the process's count back even
    when training fails, so the recipe's next stage is not left on SFT's choice."""
    from sage_rl import models
    from sage_rl.data import records
    from sage_rl.runs import sft as run_mod
    from sage_rl.train import sft as train_mod
    from sage_rl.train.sft_config import SFTConfig

    before = torch.get_num_threads()
    picked = max(1, before - 1) if before > 1 else 2  # differs from the process's count
    seen = []

    def fail(*args, **kwargs):
        seen.append(torch.get_num_threads())  # training started on SFT's own choice
        raise RuntimeError("training failed")

    monkeypatch.setattr(threads_mod, "pick_threads", lambda **k: picked)
    # a copy: SFT trains the model it loads, and the session's shared tiny model must stay as made
    monkeypatch.setattr(models, "load_model", lambda *a, **k: (copy.deepcopy(tiny[0]), tiny[1]))
    monkeypatch.setattr(records, "read_jsonl", lambda path: [])
    monkeypatch.setattr(train_mod, "train_sft", fail)
    cfg = SFTConfig.model_validate(
        {"data": {"path": str(tmp_path / "data.jsonl")}, "optim": {"device": "cpu"}}
    )
    with pytest.raises(RuntimeError, match="training failed"):
        run_mod.run_sft(cfg, show_progress=False)
    assert seen == [picked]
    assert torch.get_num_threads() == before


def test_sft_takes_back_a_core_its_neighbour_frees(tiny, monkeypatch, tmp_path):
    """optim.threads: null measures the free cores before every step, not only at the start: SFT
    that started beside a 1-thread job on 2 cores runs on 1 thread, and on 2 once the job has been
    gone at two checks in a row (one busy or idle moment is not a change: the main job's SFT went
    from 2 threads to 1 for single steps, 2026-12-05)."""
    from sage_rl import models
    from sage_rl.runs import sft as run_mod
    from sage_rl.train import sft as train_mod
    from sage_rl.train.sft_config import SFTConfig

    before = torch.get_num_threads()
    # the start's 10 probes and 2 steps' 3 busy, then idle, but for one busy check (step 5)
    others = iter([1.0] * (10 + 3 * 2) + [0.0] * 3 * 2 + [1.0] * 3 + [0.0] * 100)
    monkeypatch.setattr(threads_mod, "usable_cores", lambda: 2)
    monkeypatch.setattr(threads_mod, "others_running", lambda: next(others))
    monkeypatch.setattr(threads_mod.time, "sleep", lambda s: None)
    # a copy: SFT trains the model it loads, and the session's shared tiny model must stay as made
    monkeypatch.setattr(models, "load_model", lambda *a, **k: (copy.deepcopy(tiny[0]), tiny[1]))
    real_step, seen = train_mod.sft_step, []

    def step(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return real_step(*args, **kwargs)

    monkeypatch.setattr(train_mod, "sft_step", step)
    data = tmp_path / "data.jsonl"
    row = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}]}
    data.write_text("\n".join(json.dumps(row) for _ in range(4)) + "\n")
    cfg = SFTConfig.model_validate(
        {
            "data": {"path": str(data), "eval_fraction": 0.0},
            "optim": {"device": "cpu", "max_steps": 6, "batch_size": 1, "grad_accum": 1},
            "output": {"dir": str(tmp_path / "out"), "eval_every": 0},
        }
    )
    run_mod.run_sft(cfg, show_progress=False)
    assert seen == [1, 1, 1, 2, 2, 2]  # 2 once idle twice (steps 3, 4); the blip at step 5 changes nothing
    assert torch.get_num_threads() == before
