"""The SFT schedule: per-position weights per epoch, held-out loss by position, best weights and
early stopping (train/sft_schedule.py and its use in train_sft)."""

from __future__ import annotations

import copy
import json
from collections import Counter

import pytest
import torch

from sage_rl.agent.render import ChatRenderer
from sage_rl.data.records import ChatExample, Message
from sage_rl.models import load_model
from sage_rl.train.sft import eval_loss, train_sft
from sage_rl.train.sft_config import SFTConfig
from sage_rl.train.sft_data import encode_example, split_by_scenario
from sage_rl.train.sft_schedule import BestWeights, epoch_selection, eval_by_position


def test_epoch_selection_by_hand():
    positions = [1, 1, 2, 2, 2, 2, 3, 3]  # indices 0-1, 2-5, 6-7
    weights = {1: 2.0, 2: 0.5}
    e0, e1 = (Counter(epoch_selection(positions, weights, e, seed=0)) for e in (0, 1))
    for e in (e0, e1):
        assert e[0] == e[1] == 2 and e[6] == e[7] == 1  # position 1 twice, position 3 (no weight) once
        assert sum(e[i] for i in range(2, 6)) == 2 and all(e[i] <= 1 for i in range(2, 6))
    # the half of position 2 rotates: two consecutive epochs see each of its 4 examples once
    assert sorted(i for i in (*e0, *e1) if 2 <= i <= 5) == [2, 3, 4, 5]
    assert epoch_selection(positions, {1: 0, 2: 0, 3: 0}, 0, 0) == []
    assert sorted(epoch_selection(positions, {}, 3, 0)) == list(range(8))
    # 1.5: one whole copy plus half of them
    assert len(epoch_selection(positions, {2: 1.5}, 0, 0)) == 2 + 6 + 2


def test_eval_by_position_is_the_token_weighted_mean():
    items = [("a", 1, 10), ("b", 1, 30), ("c", 2, 20)]  # (name, position, trained tokens)
    group_loss = {("a", "b"): 2.0, ("c",): 5.0}
    out = eval_by_position(
        lambda group: group_loss[tuple(x[0] for x in group)], items, [p for _, p, _ in items], lambda x: x[2]
    )
    # (2.0 * 40 + 5.0 * 20) / 60 = 3.0
    assert out == {"eval_loss/p1": 2.0, "eval_loss/p2": 5.0, "eval_loss": pytest.approx(3.0)}
    assert eval_by_position(lambda g: None, [], [], lambda x: 0) == {}


def test_best_weights_keep_the_lowest_loss_and_stop_on_patience():
    layer = torch.nn.Linear(2, 1)
    best = BestWeights(patience=2)
    seen = []
    for step, loss in enumerate([3.0, 2.0, 2.5, 2.6], start=1):
        with torch.no_grad():
            layer.weight.fill_(float(step))
        seen.append(best.update(layer, step, loss))
    assert seen == [False, False, False, True] and best.best_step == 2 and best.best_loss == 2.0
    assert best.restore(layer) and torch.all(layer.weight == 2.0)
    assert not BestWeights(None).restore(layer)
    assert not any(BestWeights(None).update(layer, s, 1.0 + s) for s in range(10))  # no patience: never stops


def test_spilled_best_weights_live_in_a_file_not_in_memory(tmp_path):
    """With a spill path the best copy is a safetensors file (SFT's 0.5 GB of resident memory on
    the main job), restored exactly and removed by discard()."""
    layer = torch.nn.Linear(3, 2)
    spill = tmp_path / "sft" / ".best.safetensors"
    best = BestWeights(None, spill=spill)
    assert not best.restore(layer)
    for step, loss in enumerate([2.0, 1.0, 1.5], start=1):
        with torch.no_grad():
            layer.weight.fill_(float(step) + 0.25)
            layer.bias.fill_(-float(step))
        best.update(layer, step, loss)
    assert best._state is None and spill.is_file() and best.best_step == 2
    assert best.restore(layer)
    assert torch.all(layer.weight == 2.25) and torch.all(layer.bias == -2.0)
    best.discard()
    assert not spill.exists() and not best.restore(layer)


def _examples() -> list[ChatExample]:
    out = []
    for i in range(8):
        code = "```python\nprint(sum([1, 2, 3]))\n```" if i % 2 == 0 else "```python\nsend(x=1)\n```"
        out.append(
            ChatExample(
                messages=(
                    Message("system", "You write Python."),
                    Message("user", f"Task {i}: do it."),
                    Message("assistant", code),
                ),
                scenario_id=f"s{i // 2}",
                task_id=f"s{i // 2}_{i % 2 + 1}",
                position=i % 2 + 1,
                policy="scripted",
            )
        )
    return out


def test_train_sft_logs_positions_stops_early_and_saves_the_best_weights(tiny, tmp_path):
    model, tok = copy.deepcopy(tiny[0]), tiny[1]
    cfg = SFTConfig.model_validate(
        {
            "data": {"path": "unused.jsonl", "eval_fraction": 0.25, "position_weights": {2: 0}},
            # a learning rate far too high: the held-out loss soon rises, so patience ends the run
            "optim": {"epochs": 40, "lr": 0.3, "grad_accum": 1, "batch_size": 2, "patience": 2},
            "output": {"dir": str(tmp_path / "run"), "eval_every": 1},
        }
    )
    _, result = train_sft(model, tok, _examples(), cfg, ChatRenderer(tok).conversation, show_progress=False)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evals = {r["step"]: r["eval_loss"] for r in rows if "eval_loss" in r}
    assert {"eval_loss/p1", "eval_loss/p2"} <= set(rows[0])
    assert result.stopped_early and result.steps < 40 * 3 / 2
    assert result.best_step == min((s for s in evals if s > 0), key=evals.get)
    assert result.eval_loss_after == pytest.approx(evals[result.best_step])
    # position 2 has weight 0: an epoch trains on the 3 position-1 examples only
    conversation = ChatRenderer(tok).conversation
    one = encode_example(conversation, _examples()[0]).num_trained
    assert result.trained_tokens_per_epoch == 3 * one
    # the saved checkpoint holds the best step's weights: its held-out loss is the one logged then
    saved, _ = load_model(str(tmp_path / "run" / "final"))
    _, held = split_by_scenario(_examples(), 0.25, 0)
    encoded = [encode_example(conversation, x) for x in held]
    assert eval_loss(saved, encoded, cfg, tok.pad_token_id) == pytest.approx(
        evals[result.best_step], rel=1e-4
    )
