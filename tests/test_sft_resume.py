"""An interrupted SFT run started again continues where it stopped, to the same weights; a resume
point of another run, or a damaged one, is an error that names it and deletes nothing."""

from __future__ import annotations

import copy
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import sage_rl.train.sft as sft
from sage_rl.agent.render import ChatRenderer
from sage_rl.data.records import write_jsonl
from sage_rl.train.sft_config import SFTConfig
from sage_rl.train.sft_resume import ResumeError, SFTStopped
from tests.test_sft import REPO, examples


class Interrupted(Exception):
    pass


def config(run: Path, save_every_s: float | None = 0, **optim) -> SFTConfig:
    return SFTConfig.model_validate(
        {
            "data": {"path": "unused.jsonl", "eval_fraction": 0.25},
            "optim": {"epochs": 6, "lr": 1e-2, "grad_accum": 2, "batch_size": 1, "warmup_steps": 2, **optim},
            "output": {"dir": str(run), "eval_every": 2, "save_every_s": save_every_s},
        }
    )


def train(tiny, cfg: SFTConfig, stop_at: int | None = None, monkeypatch=None):
    """Train a copy of the tiny model; with ``stop_at`` the run dies as that step starts."""
    if stop_at is not None:
        real, calls = sft.sft_step, iter(range(1, 10_000))

        def dying(*args, **kwargs):
            if next(calls) == stop_at:
                raise Interrupted
            return real(*args, **kwargs)

        monkeypatch.setattr(sft, "sft_step", dying)
    model, tok = copy.deepcopy(tiny[0]), tiny[1]
    try:
        return sft.train_sft(
            model, tok, examples(8), cfg, ChatRenderer(tok).conversation, show_progress=False
        )
    finally:
        monkeypatch and monkeypatch.undo()


def rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("freeze", [0, 1])  # 1: the resume point holds the top layer only
def test_a_resumed_run_ends_where_an_unbroken_one_does(tiny, tmp_path, monkeypatch, freeze):
    whole_model, whole = train(tiny, config(tmp_path / "whole", freeze_layers=freeze))
    run = tmp_path / "broken"
    with pytest.raises(Interrupted):
        train(tiny, config(run, freeze_layers=freeze), stop_at=6, monkeypatch=monkeypatch)
    state = json.loads((run / "resume" / "state.json").read_text())
    assert state["step"] == 5 and len(state["losses"]) == 5
    model, resumed = train(tiny, config(run, freeze_layers=freeze))
    assert (resumed.steps, resumed.best_step) == (whole.steps, whole.best_step)
    assert resumed.first_loss == whole.first_loss and resumed.last_loss == pytest.approx(
        whole.last_loss, abs=1e-6
    )
    for (name, a), (_, b) in zip(model.named_parameters(), whole_model.named_parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6), name
    # the metrics read as one run: every step once, in order, the same numbers
    assert [r["step"] for r in rows(run)] == [r["step"] for r in rows(tmp_path / "whole")]
    for a, b in zip(rows(run), rows(tmp_path / "whole"), strict=True):
        assert a.get("loss", 0) == pytest.approx(b.get("loss", 0), abs=1e-6)
    assert not (run / "resume").exists() and not (run / ".best.safetensors").exists()  # cleared at the end


def test_another_runs_resume_point_is_refused(tiny, tmp_path, monkeypatch):
    run = tmp_path / "run"
    with pytest.raises(Interrupted):
        train(tiny, config(run), stop_at=3, monkeypatch=monkeypatch)
    with pytest.raises(ResumeError, match=r"resume is a resume point of another SFT run"):
        train(tiny, config(run, lr=5e-3))
    assert (run / "resume" / "weights.safetensors").exists()  # nothing deleted
    # where the run computes is not part of it: another thread count resumes
    _, result = train(tiny, config(run, threads=1))
    steps = [r["step"] for r in rows(run) if "loss" in r]
    assert result.steps == 18 and steps == list(range(1, 19))  # steps 1-2 kept, 3-18 trained after


@pytest.mark.parametrize("damage", ["state.json", "weights.safetensors", "optimizer.pt"])
def test_a_damaged_resume_point_names_the_file(tiny, tmp_path, monkeypatch, damage):
    run = tmp_path / "run"
    with pytest.raises(Interrupted):
        train(tiny, config(run), stop_at=4, monkeypatch=monkeypatch)
    (run / "resume" / damage).write_bytes(b"\x00garbage{")
    with pytest.raises(ResumeError, match=damage.replace(".", r"\.")) as e:
        train(tiny, config(run))
    assert "\n" not in str(e.value) and "weights_only" not in str(e.value), str(e.value)  # one line
    assert (run / "resume" / damage).read_bytes() == b"\x00garbage{"  # kept for the user to look at


def test_no_resume_points_when_turned_off(tiny, tmp_path, monkeypatch):
    with pytest.raises(Interrupted):
        train(tiny, config(tmp_path / "run", save_every_s=None), stop_at=4, monkeypatch=monkeypatch)
    assert not (tmp_path / "run" / "resume").exists()


def test_the_best_weights_are_those_of_the_resume_points_time(tmp_path):
    """The best weights' file may be replaced after the last resume point (an evaluation, then a
    crash): resuming puts back the copy that the point's bookkeeping names."""
    from sage_rl.train.sft_resume import Reached, ResumePoints
    from sage_rl.train.sft_schedule import BestWeights

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    best = BestWeights(None, spill=tmp_path / ".best.safetensors")
    best.update(model, 2, 1.0)  # the best: step 2's weights
    at_step_2 = model.weight.detach().clone()
    points = ResumePoints(tmp_path / "resume", "fp", every_s=0)
    points.save(model, opt, best, Reached(3, [0.5, 0.4, 0.3], {0: {}, 2: {"eval_loss": 1.0}}, 0))
    with torch.no_grad():
        model.weight.add_(1.0)
    best.update(model, 4, 0.5)  # a better evaluation after the point; then the run dies

    fresh, fresh_best = torch.nn.Linear(3, 2), BestWeights(None, spill=tmp_path / ".best.safetensors")
    done = ResumePoints(tmp_path / "resume", "fp", every_s=0).load(
        fresh, torch.optim.AdamW(fresh.parameters()), fresh_best
    )
    assert done.step == 3 and (fresh_best.best_step, fresh_best.best_loss) == (2, 1.0)
    with torch.no_grad():
        fresh.weight.zero_()
    assert fresh_best.restore(fresh) and torch.equal(fresh.weight, at_step_2)


def test_a_run_resumed_in_another_precision_says_so(tiny, tmp_path, monkeypatch):
    """``optim.dtype: auto`` resolves per CPU and the fingerprint holds "auto": a run started where it
    is bfloat16 and resumed where it is float32 (another machine) goes on, and its result names both
    stretches instead of claiming one precision."""
    from sage_rl.policies import transformers_policy

    run = tmp_path / "run"
    monkeypatch.setattr(transformers_policy, "_cpu_has_bf16", lambda: True)
    with pytest.raises(Interrupted):
        train(tiny, config(run, dtype="auto"), stop_at=4, monkeypatch=monkeypatch)
    state = json.loads((run / "resume" / "state.json").read_text())
    assert state["step"] == 3 and state["dtypes"] == [[1, "bfloat16"]]
    monkeypatch.setattr(transformers_policy, "_cpu_has_bf16", lambda: False)
    _, result = train(tiny, config(run, dtype="auto"))
    assert result.dtype == "mixed" and result.dtype_by_step == {"1": "bfloat16", "4": "float32"}
    _, plain = train(tiny, config(tmp_path / "plain", dtype="auto"))  # one stretch: one name
    assert plain.dtype == "float32" and plain.dtype_by_step is None


def test_a_damaged_precision_record_names_the_file(tiny, tmp_path, monkeypatch):
    """The resume point's ``dtypes`` is read with the rest of ``state.json``: a field that is not
    (step, dtype) pairs is the same one-line error, not a traceback."""
    run = tmp_path / "run"
    with pytest.raises(Interrupted):
        train(tiny, config(run), stop_at=4, monkeypatch=monkeypatch)
    path = run / "resume" / "state.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "dtypes": "float32"}))
    with pytest.raises(ResumeError, match=r"state\.json is damaged"):
        train(tiny, config(run))


def _signalling(sends: dict[int, list[int]]):
    """A ``before_step`` that sends this process the signals ``sends[step]`` as that step starts."""
    return lambda step: [os.kill(os.getpid(), s) for s in sends.get(step, [])]


@pytest.fixture
def usual_handlers():
    """Ctrl-C's and SIGTERM's handlers as in a process started from a terminal (a pytest-xdist
    worker ignores SIGINT, and SFT leaves an ignored signal ignored); put back afterwards."""
    outer = {
        s: signal.signal(s, h)
        for s, h in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL))
    }
    yield
    for s, h in outer.items():
        signal.signal(s, h)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_ends_the_run_after_its_step_with_a_resume_point_there(
    tiny, tmp_path, signum, usual_handlers
):
    whole_model, whole = train(tiny, config(tmp_path / "whole"))
    run = tmp_path / "stopped"
    before = signal.getsignal(signum)
    model = copy.deepcopy(tiny[0])
    # resume points every hour: the one written is the stop's
    cfg, conversation = config(run, save_every_s=3600), ChatRenderer(tiny[1]).conversation
    with pytest.raises(SFTStopped, match="after step 3 of .*it resumes there"):
        sft.train_sft(
            model, tiny[1], examples(8), cfg, conversation, False, before_step=_signalling({3: [signum]})
        )
    assert signal.getsignal(signum) == before  # the handler from before, back in place
    assert json.loads((run / "resume" / "state.json").read_text())["step"] == 3  # the step in progress ended
    resumed_model, resumed = train(tiny, config(run, save_every_s=3600))
    assert (resumed.steps, resumed.last_loss) == (whole.steps, pytest.approx(whole.last_loss, abs=1e-6))
    for (name, a), (_, b) in zip(
        resumed_model.named_parameters(), whole_model.named_parameters(), strict=True
    ):
        assert torch.allclose(a, b, atol=1e-6), name


def test_a_second_signal_stops_at_once_as_without_it(tiny, tmp_path, usual_handlers):
    run = tmp_path / "stopped"
    model, conversation = copy.deepcopy(tiny[0]), ChatRenderer(tiny[1]).conversation
    sends = _signalling({3: [signal.SIGINT, signal.SIGINT]})  # the second raises in before_step
    with pytest.raises(KeyboardInterrupt) as stopped:
        sft.train_sft(
            model,
            tiny[1],
            examples(8),
            config(run, save_every_s=3600),
            conversation,
            False,
            before_step=sends,
        )
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert not isinstance(stopped.value, SFTStopped)
    assert not (run / "resume").exists()  # no point was due, and step 3 never ended


def test_sage_rl_sft_stopped_by_sigterm_says_where_it_resumes(tiny, tmp_path):
    """The command as a session's end stops it: SIGTERM mid-run, exit 130, a resume point at the step
    it names, no traceback."""
    tiny[0].save_pretrained(tmp_path / "tiny")
    tiny[1].save_pretrained(tmp_path / "tiny")
    write_jsonl(examples(6), tmp_path / "data.jsonl")
    out = tmp_path / "out"
    cmd = [
        sys.executable, "-c", "from sage_rl.cli import main; main()", "sft", str(REPO / "configs" / "sft.yaml"),
        f"model={tmp_path / 'tiny'}", f"data.path={tmp_path / 'data.jsonl'}", f"output.dir={out}",
        "optim.epochs=100", "optim.max_steps=400", "optim.grad_accum=1", "optim.threads=1", "data.eval_fraction=0.2",
        "output.save_every_s=3600", "output.log_every=1",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 120
        while not any('"loss"' in x for x in _read(out / "metrics.jsonl")) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read()[-2000:]
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr[-2000:]
    assert "Traceback" not in stderr
    said = re.search(
        r"SFT stopped by a signal after step (\d+) of 400; it resumes there \(the same command goes on\)",
        " ".join(stderr.split()),
    )
    assert said, stderr[-2000:]
    assert json.loads((out / "resume" / "state.json").read_text())["step"] == int(said.group(1))


def _read(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except FileNotFoundError:
        return []


def test_a_signal_the_process_ignores_stays_ignored(tiny, tmp_path):
    """A background job ignores SIGINT (the shell set it so): SFT does not start heeding it."""
    outer = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        model, tok = copy.deepcopy(tiny[0]), tiny[1]
        cfg, sends = config(tmp_path / "run", save_every_s=3600), _signalling({3: [signal.SIGINT]})
        _, result = sft.train_sft(
            model, tok, examples(8), cfg, ChatRenderer(tok).conversation, False, before_step=sends
        )
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, outer)
    assert result.steps > 3 and not result.stopped_early
