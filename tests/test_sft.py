"""SFT training: loss goes down, packing equals padding, checkpoints reload, LoRA, the CLI."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sage_rl.agent.render import ChatRenderer
from sage_rl.config import ConfigError, load_config
from sage_rl.data.records import ChatExample, Message, write_jsonl
from sage_rl.train.sft import train_sft
from sage_rl.train.sft_config import SFTConfig

REPO = Path(__file__).resolve().parents[1]


def examples(n: int = 4) -> list[ChatExample]:
    out = []
    for i in range(n):
        msgs = (
            Message("system", "You write Python."),
            Message("user", f"Task {i % 2}: print the total."),
            Message("assistant", "```python\nprint(sum([1, 2, 3]))\n```"),
            Message("user", "6"),
            Message("assistant", "```python\napis.supervisor.complete_task()\n```"),
        )
        out.append(ChatExample(messages=msgs, scenario_id=f"s{i}", task_id=f"s{i}_1", policy="scripted"))
    return out


def config(tmp_path: Path, **sections) -> SFTConfig:
    data = {"data": {"path": "unused.jsonl", "eval_fraction": 0.0}, "output": {"dir": str(tmp_path / "run")}}
    for k, v in sections.items():
        data[k] = {**data.get(k, {}), **v}
    return SFTConfig.model_validate(data)


def logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits


def test_loss_decreases_on_a_repeated_dataset(tiny, tmp_path):
    model, tok = copy.deepcopy(tiny[0]), tiny[1]
    cfg = config(
        tmp_path,
        data={"eval_fraction": 0.25},
        optim={"epochs": 12, "lr": 1e-2, "grad_accum": 1, "batch_size": 3},
    )
    _, result = train_sft(model, tok, examples(), cfg, ChatRenderer(tok).conversation, show_progress=False)
    assert (result.train_examples, result.eval_examples, result.steps) == (3, 1, 12)
    # the held-out example has the same assistant turns, so its loss falls too
    assert result.eval_loss_after < 0.5 * result.eval_loss_before
    assert result.last_loss < 0.5 * result.first_loss
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, *range(1, 13), 12]
    assert lines[1]["loss"] == pytest.approx(result.first_loss) and "grad_norm" in lines[1]
    assert list((tmp_path / "run" / "tb").glob("events.out.tfevents.*"))


def test_packing_and_padding_take_the_same_step(tiny, tmp_path):
    tok = tiny[1]
    outs = []
    for packing, bs, accum in ((False, 1, 4), (True, 1, 1)):
        cfg = config(
            tmp_path / str(packing),
            optim={"packing": packing, "batch_size": bs, "grad_accum": accum, "max_steps": 1, "lr": 1e-3},
        )
        model, result = train_sft(
            copy.deepcopy(tiny[0]), tok, examples(), cfg, ChatRenderer(tok).conversation, show_progress=False
        )
        outs.append((result, model.model.embed_tokens.weight.detach().clone()))
    (pad_res, pad_w), (pack_res, pack_w) = outs
    assert pack_res.first_loss == pytest.approx(pad_res.first_loss, rel=1e-5)
    assert torch.allclose(pack_w, pad_w, atol=1e-6)
    assert not torch.allclose(pack_w, tiny[0].model.embed_tokens.weight, atol=1e-6)  # it did move


def test_checkpoint_reloads_with_the_same_logits(tiny, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = tiny[1]
    cfg = config(tmp_path, optim={"max_steps": 2, "lr": 1e-3, "grad_accum": 2})
    model, result = train_sft(
        copy.deepcopy(tiny[0]), tok, examples(), cfg, ChatRenderer(tok).conversation, show_progress=False
    )
    reloaded = AutoModelForCausalLM.from_pretrained(result.checkpoint)
    ids = ChatRenderer(tok).conversation(examples(1)[0].chat())[0]
    assert torch.allclose(logits(reloaded, ids), logits(model.eval(), ids), atol=1e-5)
    assert not torch.allclose(logits(tiny[0], ids), logits(model, ids), atol=1e-4)
    tok2 = AutoTokenizer.from_pretrained(result.checkpoint)
    assert tok2.chat_template == tok.chat_template and tok2.encode("def f(x):") == tok.encode("def f(x):")


def test_lora_saves_an_adapter_and_a_merged_checkpoint(tiny, tmp_path):
    from transformers import AutoModelForCausalLM

    tok = tiny[1]
    cfg = config(
        tmp_path,
        optim={"max_steps": 2, "lr": 1e-2, "grad_accum": 2},
        lora={"enabled": True, "r": 4, "dropout": 0.0},
    )
    model, result = train_sft(
        copy.deepcopy(tiny[0]), tok, examples(), cfg, ChatRenderer(tok).conversation, show_progress=False
    )
    assert result.checkpoint.endswith("final")
    assert (tmp_path / "run" / "adapter" / "adapter_config.json").is_file()
    reloaded = AutoModelForCausalLM.from_pretrained(result.checkpoint)
    assert not any("lora" in k for k in reloaded.state_dict())
    ids = ChatRenderer(tok).conversation(examples(1)[0].chat())[0]
    assert torch.allclose(logits(reloaded, ids), logits(model.eval(), ids), atol=1e-5)
    assert not torch.allclose(logits(tiny[0], ids), logits(reloaded, ids), atol=1e-4)


def test_bad_config_names_the_field(tmp_path):
    with pytest.raises(ConfigError, match=r"optim\.lr: Input should be greater than 0"):
        load_config(SFTConfig, REPO / "configs" / "sft.yaml", ["optim.lr=-1"])
    with pytest.raises(ConfigError, match=r"lora\.rank: unknown key"):
        load_config(SFTConfig, REPO / "configs" / "sft.yaml", ["lora.rank=4"])
    with pytest.raises(ConfigError, match=r"data: Field required"):
        load_config(SFTConfig, None, [])


def test_cli_two_step_smoke_run(tiny, tmp_path):
    model, tok = tiny
    model.save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    write_jsonl(examples(6), tmp_path / "data.jsonl")
    cmd = [
        sys.executable, "-c", "from sage_rl.cli import main; main()", "sft", str(REPO / "configs" / "sft.yaml"),
        f"model={tmp_path / 'tiny'}", f"data.path={tmp_path / 'data.jsonl'}", f"output.dir={tmp_path / 'out'}",
        "optim.max_steps=2", "optim.grad_accum=2", "optim.threads=1", "data.eval_fraction=0.2", "--json",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout)  # exactly one JSON object on stdout
    assert result["steps"] == 2 and result["eval_examples"] == 1 and result["train_examples"] == 5
    assert Path(result["checkpoint"], "config.json").is_file()
    assert Path(result["checkpoint"], "tokenizer_config.json").is_file()
    steps = [json.loads(x)["step"] for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 2]


def test_cli_bad_data_line_is_a_one_line_error(tmp_path):
    import typer
    from typer.testing import CliRunner

    from sage_rl.cli.sft import main

    app = typer.Typer()
    app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(main)
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps(examples(1)[0].to_dict()) + "\n{oops\n")
    out = CliRunner().invoke(app, [str(REPO / "configs" / "sft.yaml"), f"data.path={path}"])
    assert out.exit_code == 1
    assert "data.jsonl:2:" in out.output
    out = CliRunner().invoke(app, [f"data.path={path}", "optim.epochs=0"])
    assert out.exit_code == 2 and "optim.epochs" in out.output
    # a file that is not text at all (it was a decode error naming neither file nor line)
    path.write_bytes(json.dumps(examples(1)[0].to_dict()).encode() + b"\n\xf6\x00\xff\n")
    out = CliRunner().invoke(app, [str(REPO / "configs" / "sft.yaml"), f"data.path={path}"])
    assert out.exit_code == 1 and "Traceback" not in out.output
    assert "data.jsonl:2: not UTF-8 text (byte 0xf6 at column 1)" in " ".join(out.output.split())
