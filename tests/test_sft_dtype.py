"""SFT in bfloat16 mixed precision (``optim.dtype``): what it resolves to on each CPU, that the
forward really runs in bf16 while weights, gradients and the loss stay float32, and that a tiny
run learns and says which precision it used."""

from __future__ import annotations

import copy

import pytest
import torch
from test_sft import REPO, config, examples

from sage_rl.agent.render import ChatRenderer
from sage_rl.config import ConfigError, load_config
from sage_rl.policies import transformers_policy
from sage_rl.train.sft import autocast_dtype, forward_loss_sum, train_sft
from sage_rl.train.sft_config import SFTConfig
from sage_rl.train.sft_data import Encoded, collate


def test_precision_resolves_by_device(tiny, monkeypatch):
    model = tiny[0]
    assert autocast_dtype("float32", model) is None
    assert autocast_dtype("bfloat16", model) is torch.bfloat16
    monkeypatch.setattr(transformers_policy, "_cpu_has_bf16", lambda: True)
    assert autocast_dtype("auto", model) is torch.bfloat16
    monkeypatch.setattr(transformers_policy, "_cpu_has_bf16", lambda: False)  # emulated bf16: slower
    assert autocast_dtype("auto", model) is None


def test_a_bad_precision_names_the_field():
    with pytest.raises(ConfigError, match=r"optim\.dtype: Input should be 'float32', 'bfloat16' or 'auto'"):
        load_config(SFTConfig, REPO / "configs" / "sft.yaml", ["optim.dtype=fp16"])


def _batch() -> object:
    g = torch.Generator().manual_seed(0)
    ids = lambda n: tuple(int(x) for x in torch.randint(5, 4000, (n,), generator=g))  # noqa: E731
    head = ids(24)
    rows = [[Encoded((*head, *ids(n)), (0,) * 25 + (1,) * (n - 1)) for n in (12, 9, 15)]]
    return collate(rows, pad_id=0, share=True)


@pytest.mark.parametrize("attention", ["segments", "dense"])
def test_bf16_forward_is_close_to_float32_and_keeps_float32_state(tiny, attention):
    batch = _batch()
    out = {}
    for amp in (None, torch.bfloat16):
        model = copy.deepcopy(tiny[0])
        loss = forward_loss_sum(model, batch, attention, autocast=amp)
        loss.backward()
        out[amp] = (loss, {n: p.grad for n, p in model.named_parameters()})
        assert all(p.dtype == torch.float32 for p in model.parameters())
    (l32, g32), (l16, g16) = out[None], out[torch.bfloat16]
    assert l16.dtype == torch.float32 and all(g.dtype == torch.float32 for g in g16.values())
    assert l16.item() != l32.item()  # the products really ran in bf16 (8 mantissa bits)
    assert l16.item() == pytest.approx(l32.item(), rel=2e-2)
    flat32 = torch.cat([g.flatten() for g in g32.values()])
    flat16 = torch.cat([g16[n].flatten() for n in g32])
    assert torch.nn.functional.cosine_similarity(flat32, flat16, dim=0) > 0.99


def test_a_bf16_run_learns_and_reports_its_precision(tiny, tmp_path):
    model, tok = copy.deepcopy(tiny[0]), tiny[1]
    cfg = config(
        tmp_path, optim={"epochs": 12, "lr": 1e-2, "grad_accum": 1, "batch_size": 4, "dtype": "bfloat16"}
    )
    trained, result = train_sft(
        model, tok, examples(), cfg, ChatRenderer(tok).conversation, show_progress=False
    )
    assert result.dtype == "bfloat16" and result.steps == 12
    assert result.last_loss < 0.5 * result.first_loss
    assert all(p.dtype == torch.float32 for p in trained.parameters())  # the master weights
    _, plain = train_sft(
        copy.deepcopy(tiny[0]), tok, examples(), config(tmp_path / "b", optim={"max_steps": 1}),
        ChatRenderer(tok).conversation, show_progress=False,
    )  # fmt: skip
    assert plain.dtype == "float32"
