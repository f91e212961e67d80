"""Supervised fine-tuning on expert chat examples: the warm start of SAGE (SAGE.md section 7).

A plain PyTorch loop, read top to bottom in ``train_sft``:

    encode (renderer ids + loss mask) -> hold out whole scenarios -> rows (padded or packed)
    -> for each optimizer step: grad_accum micro-batches, loss = sum of token NLLs / trained tokens
       in the step -> clip -> AdamW -> log (JSON Lines + TensorBoard) -> eval loss now and then
    -> save a Hugging Face checkpoint (merged if LoRA) + tokenizer

Normalising by the trained tokens of the whole optimizer step (not per micro-batch) makes padding
and packing compute the same gradient for the same examples. LoRA wrapping, the optimizer and its
step, the metrics logger and the model's export are the GRPO trainer's own (``train/lora.py``,
``train/optim.py``, ``train/logging.py``, ``train/checkpoint.py``).
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from sage_rl.config import dump_config
from sage_rl.data.records import ChatExample, DatasetError
from sage_rl.files import write_atomic
from sage_rl.train.checkpoint import save_model
from sage_rl.train.freeze import frozen_bottom
from sage_rl.train.lean import lean_activations
from sage_rl.train.logging import MetricsLogger
from sage_rl.train.lora import with_lora
from sage_rl.train.optim import build_optimizer, optimizer_step, warmup_lr
from sage_rl.train.segments import layouts, segmented
from sage_rl.train.sft_config import SFTConfig, SFTLora
from sage_rl.train.sft_data import (
    Batch,
    Conversation,
    Encoded,
    chunked_nll_sum,
    collate,
    encode_example,
    fit_length,
    make_rows,
    nll_sum,
    split_by_scenario,
)
from sage_rl.train.sft_resume import Reached, ResumePoints, StopRequest, fingerprint, stretches
from sage_rl.train.sft_schedule import BestWeights, epoch_selection, eval_by_position


@dataclass(frozen=True)
class SFTResult:
    """What a run did. Losses are mean NLL per trained token."""

    checkpoint: str
    steps: int
    train_examples: int
    eval_examples: int
    trained_tokens_per_epoch: int
    truncated: int
    first_loss: float
    last_loss: float
    eval_loss_before: float | None
    eval_loss_after: float | None  # of the saved weights (the best ones with output.keep=best)
    wall_s: float
    best_step: int | None = None  # the step whose weights were saved, when chosen by held-out loss
    stopped_early: bool = False  # optim.patience ran out before the planned steps
    eval_loss_by_position: dict[str, float] | None = None  # of the saved weights
    dtype: str = "float32"  # the compute dtype optim.dtype resolved to on this device ("mixed": see next)
    dtype_by_step: dict[str, str] | None = None  # first step -> dtype, where a resume changed it

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Prepared:
    """Encoded train and held-out examples, with each one's chain position (0 = unknown)."""

    train: list[Encoded]
    eval: list[Encoded]
    truncated: int
    train_positions: list[int]
    eval_positions: list[int]


def prepare(examples: Sequence[ChatExample], conversation: Conversation, cfg: SFTConfig) -> Prepared:
    """Encode, hold out eval scenarios, truncate to ``data.max_length``."""
    if not examples:
        raise DatasetError(f"no examples in {cfg.data.path}")
    train_ex, eval_ex = split_by_scenario(examples, cfg.data.eval_fraction, cfg.optim.seed)
    train, train_pos, t1 = _encode(train_ex, conversation, cfg.data.max_length)
    evals, eval_pos, t2 = _encode(eval_ex, conversation, cfg.data.max_length)
    if not train:
        raise DatasetError("no training example has a trained token left after truncation")
    return Prepared(train, evals, t1 + t2, train_pos, eval_pos)


def _encode(
    examples: Sequence[ChatExample], conversation: Conversation, max_length: int
) -> tuple[list[Encoded], list[int], int]:
    encoded, positions, truncated = [], [], 0
    for ex in examples:
        kept, n = fit_length([encode_example(conversation, ex)], max_length)
        truncated += n
        if kept:
            encoded += kept
            positions.append(ex.position)
    return encoded, positions, truncated


def epoch_rows(data: Prepared, cfg: SFTConfig) -> Callable[[int], list[list[Encoded]]]:
    """The rows of each epoch: the examples ``epoch_selection`` picks (``data.position_weights``),
    padded one per row or packed."""

    def rows(epoch: int) -> list[list[Encoded]]:
        chosen = epoch_selection(data.train_positions, cfg.data.position_weights, epoch, cfg.optim.seed)
        if not chosen:
            raise DatasetError(f"data.position_weights={cfg.data.position_weights} select no example")
        return make_rows([data.train[i] for i in chosen], *row_options(cfg))

    return rows


def sharing(cfg: SFTConfig) -> bool:
    """Shared openings are laid out once per packed row (``optim.shared_prefix``, with packing)."""
    return cfg.optim.packing and cfg.optim.shared_prefix


def row_options(cfg: SFTConfig) -> tuple[bool, int, bool]:
    return cfg.optim.packing, cfg.data.max_length, sharing(cfg)


def micro_batches(
    rows_of: Callable[[int], list[list[Encoded]]], cfg: SFTConfig, pad_id: int, skip: int = 0
) -> Iterator[tuple[float, Batch]]:
    """Endless (epoch, batch) stream; each epoch's rows are shuffled with seed ``optim.seed + epoch``.
    ``skip``: micro-batches already consumed (a resumed run), passed over without being built."""
    bs = cfg.optim.batch_size
    epoch = 0
    while True:
        rows = rows_of(epoch)
        order = list(range(len(rows)))
        random.Random(cfg.optim.seed + epoch).shuffle(order)
        chunks = [order[i : i + bs] for i in range(0, len(order), bs)]
        for n, chunk in enumerate(chunks):
            if skip:
                skip -= 1
                continue
            yield epoch + (n + 1) / len(chunks), collate([rows[i] for i in chunk], pad_id, sharing(cfg))
        epoch += 1


def num_steps(n_rows: int, cfg: SFTConfig) -> int:
    """Optimizer steps: ``epochs`` passes of ``ceil(rows / batch_size)`` micro-batches, capped by max_steps."""
    per_epoch = math.ceil(n_rows / cfg.optim.batch_size) / cfg.optim.grad_accum
    steps = max(1, math.ceil(per_epoch * cfg.optim.epochs))
    return min(steps, cfg.optim.max_steps) if cfg.optim.max_steps else steps


def autocast_dtype(dtype: str, model: Any) -> torch.dtype | None:
    """``optim.dtype`` on ``model``'s device: the autocast dtype, or None for plain float32."""
    if dtype == "float32":
        return None
    if dtype == "bfloat16":
        return torch.bfloat16
    from sage_rl.policies.transformers_policy import resolve_dtype  # the sampler's own bf16 test

    return resolve_dtype("auto", model)


def forward_loss_sum(
    model: Any,
    batch: Batch,
    attention: str = "segments",
    lean: bool = True,
    autocast: torch.dtype | None = None,
) -> torch.Tensor:
    """Sum of the trained tokens' NLL. Only the logits that predict a trained token are computed,
    ``LOSS_CHUNK`` positions at a time (``chunked_nll_sum``; ``logits_to_keep`` where the model's
    head is not a plain linear layer): with a 49k vocabulary they dominate memory otherwise.
    ``attention``: "segments" attends by the row's examples (``train/segments.py``, the same
    numbers, a fraction of the work), "dense" through the row's full mask. ``lean``: MLPs and
    norms keep only their inputs for backward (``train/lean.py``; not under autocast).
    ``autocast``: run the model under ``torch.autocast`` in that dtype (``optim.dtype``); the
    NLL is summed in float32 either way."""
    device = next(model.parameters()).device
    batch = batch.to(device)
    keep_K = batch.loss_positions_K
    targets_BK = batch.labels_BT[:, keep_K + 1]
    inputs = {
        "input_ids": batch.input_ids_BT,
        "attention_mask": batch.attn_B1TT,
        "position_ids": batch.position_ids_BT,
    }
    by_segment = attention != "dense"
    if by_segment:
        inputs["sage_segments"] = layouts(batch.segment_BT)
    head = plain_head(model)
    amp = torch.autocast(device.type, dtype=autocast) if autocast else contextlib.nullcontext()
    with amp, segmented(model) if by_segment else contextlib.nullcontext(), lean_activations(model, lean):
        if head is None:
            return nll_sum(model(**inputs, logits_to_keep=keep_K).logits, targets_BK)
        hidden_BTD = model.get_decoder()(**inputs).last_hidden_state
        return chunked_nll_sum(hidden_BTD[:, keep_K], head, targets_BK)


def plain_head(model: Any) -> torch.nn.Linear | None:
    """The model's output layer when its logits are just ``head(last hidden state)`` (Llama,
    Qwen2, Mistral); None where the model scales or caps them (its own forward then computes them)."""
    cfg = model.config
    if any(getattr(cfg, k, None) for k in ("final_logit_softcapping", "logit_scale", "logits_scaling")):
        return None
    head = model.get_output_embeddings()
    return head if type(head) is torch.nn.Linear and hasattr(model, "get_decoder") else None


@torch.no_grad()
def eval_loss(model: Any, encoded: Sequence[Encoded], cfg: SFTConfig, pad_id: int) -> float | None:
    """Mean NLL per trained token over ``encoded`` (None when empty)."""
    if not encoded:
        return None
    was_training = model.training
    model.eval()
    rows = make_rows(encoded, *row_options(cfg))
    amp = autocast_dtype(cfg.optim.dtype, model)
    total, tokens = 0.0, 0
    for i in range(0, len(rows), cfg.optim.batch_size):
        batch = collate(rows[i : i + cfg.optim.batch_size], pad_id, sharing(cfg))
        total += float(forward_loss_sum(model, batch, cfg.optim.attention, autocast=amp))
        tokens += batch.num_trained
    model.train(was_training)
    return total / max(tokens, 1)


def lr_at(step: int, total: int, cfg: SFTConfig) -> float:
    """Linear warmup over ``warmup_steps``, then constant or cosine decay to 0 at ``total``."""
    o = cfg.optim
    if step < o.warmup_steps:
        return warmup_lr(o.lr, step + 1, o.warmup_steps)
    if o.schedule == "constant":
        return o.lr
    progress = (step - o.warmup_steps) / max(1, total - o.warmup_steps)
    return o.lr * 0.5 * (1 + math.cos(math.pi * progress))


def save_checkpoint(model: Any, tokenizer: Any, folder: Path, lora: SFTLora) -> tuple[Any, Path]:
    """Save a Hugging Face checkpoint + tokenizer; returns (the model saved, its folder).

    Full fine-tuning: ``<folder>/final``. LoRA: the adapter in ``<folder>/adapter``, and when
    ``lora.merge`` the merged weights in ``<folder>/final`` (what vLLM and ``load_model`` read).
    """
    if lora.enabled:
        save_model(model, tokenizer, adapter_dir=folder / "adapter")
        if not lora.merge:
            return model, folder / "adapter"
        model = model.merge_and_unload()
    save_model(model, tokenizer, model_dir=folder / "final")
    return model, folder / "final"


def progress_bar(enabled: bool) -> Progress:
    """A rich progress bar on stderr, so stdout stays free for ``--json``."""
    from rich.console import Console

    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TimeRemainingColumn(), console=Console(stderr=True), disable=not enabled,
    )  # fmt: skip


def train_sft(
    model: Any,
    tokenizer: Any,
    examples: Sequence[ChatExample],
    cfg: SFTConfig,
    conversation: Conversation,
    show_progress: bool = True,
    before_step: Callable[[int], None] | None = None,
) -> tuple[Any, SFTResult]:
    """Fine-tune ``model`` in place on the trained tokens of ``examples`` and save a checkpoint.
    ``before_step(step)`` runs before each optimizer step (``run_sft``: the thread count).

    Returns the trained model (the merged model when LoRA is merged) and the result.
    """
    t0 = time.perf_counter()
    torch.manual_seed(cfg.optim.seed)
    out_dir = Path(cfg.output.dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.yaml").write_text(dump_config(cfg), encoding="utf-8")
    data = prepare(examples, conversation, cfg)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    model = with_lora(model, cfg.lora.adapters())
    with frozen_bottom(model, cfg.optim.freeze_layers):  # before the optimizer: it takes the trained ones
        opt = build_optimizer(model, cfg.optim.lr, weight_decay=cfg.optim.weight_decay)
        rows_of = epoch_rows(data, cfg)
        total = num_steps(len(rows_of(0)), cfg)
        best = BestWeights(cfg.optim.patience, spill=out_dir / ".best.safetensors")  # not 0.5 GB of RSS
        points = ResumePoints(out_dir / "resume", run_fingerprint(cfg, data), cfg.output.save_every_s)
        done = points.load(model, opt, best)  # None: a new run
        log = MetricsLogger(out_dir, resume_offset=done.metrics_offset if done else 0, tag_prefix="sft/")

        def held_out() -> dict[str, float]:
            loss_of = lambda group: eval_loss(model, group, cfg, pad_id)  # noqa: E731
            return eval_by_position(loss_of, data.eval, data.eval_positions, lambda e: e.num_trained)

        evals = done.evals if done else {0: held_out()}  # step -> held-out losses
        if evals[0] and not done:
            log.log(0, evals[0])
        start = done.step if done else 0
        dtypes = stretches(done.dtypes if done else (), start, autocast_dtype(cfg.optim.dtype, model))
        stream = micro_batches(rows_of, cfg, pad_id, skip=start * cfg.optim.grad_accum)
        model.train()
        losses: list[float] = done.losses if done else []
        step, stop = start, False
        with progress_bar(show_progress) as bar, StopRequest() as request:
            task = bar.add_task("sft", total=total, completed=start)
            for step in range(start + 1, total + 1):
                if before_step is not None:
                    before_step(step)
                metrics = sft_step(model, opt, stream, lr_at(step - 1, total, cfg), cfg)
                losses.append(metrics["loss"])
                if data.eval and cfg.output.eval_every and step % cfg.output.eval_every == 0 and step < total:
                    evals[step] = held_out()
                    metrics.update(evals[step])
                    stop = best.update(model, step, evals[step]["eval_loss"])
                if step % cfg.output.log_every == 0 or step == total or stop:
                    log.log(step, metrics)
                bar.update(task, advance=1, description=f"sft loss {metrics['loss']:.3f}")
                if stop:
                    break
                if step < total and (points.due() or request.signal):
                    points.save(model, opt, best, Reached(step, losses, evals, log.offset(), dtypes))
                    request.stop_after(step, total, resumes=points.every_s is not None)
    model.eval()
    if step not in evals:
        evals[step] = held_out()
        if evals[step]:
            log.log(step, evals[step])
            best.update(model, step, evals[step]["eval_loss"])
    chosen = step
    if cfg.output.keep == "best" and best.best_step not in (None, step) and best.restore(model):
        chosen = best.best_step
    best.discard()
    log.close()
    model, ckpt = save_checkpoint(model, tokenizer, out_dir, cfg.lora)
    picked = epoch_selection(data.train_positions, cfg.data.position_weights, 0, cfg.optim.seed)
    before, after = evals[0], evals[chosen]
    result = SFTResult(
        str(ckpt), step, len(data.train), len(data.eval), sum(data.train[i].num_trained for i in picked),
        data.truncated, losses[0], losses[-1], before.get("eval_loss"), after.get("eval_loss"),
        round(time.perf_counter() - t0, 2), chosen if data.eval else None, stop, after or None,
        dtypes[0][1] if len(dtypes) == 1 else "mixed", {str(a): b for a, b in dtypes} if len(dtypes) > 1 else None,
    )  # fmt: skip
    write_atomic(
        out_dir / "result.json", json.dumps(result.to_dict(), indent=2) + "\n"
    )  # marks the stage done
    points.clear()
    return model, result


def run_fingerprint(cfg: SFTConfig, data: Prepared) -> str:
    """What a resume point must agree with: the config less ``output``, and the encoded examples."""
    return fingerprint(cfg.model_dump(mode="json"), [e.ids for e in (*data.train, *data.eval)])


def sft_step(
    model: Any, opt: torch.optim.Optimizer, stream: Iterator, lr: float, cfg: SFTConfig
) -> dict[str, float]:
    """One optimizer step over ``grad_accum`` micro-batches; loss = NLL sum / trained tokens of the step."""
    window = [next(stream) for _ in range(cfg.optim.grad_accum)]
    n_tokens = max(1, sum(b.num_trained for _, b in window))
    amp, o = autocast_dtype(cfg.optim.dtype, model), cfg.optim
    total = 0.0
    for _, batch in window:
        loss = forward_loss_sum(model, batch, o.attention, o.lean_activations, autocast=amp) / n_tokens
        loss.backward()
        total += loss.item()
    grad_norm = optimizer_step(opt, cfg.optim.grad_clip, lr)
    return {
        "loss": total,
        "lr": lr,
        "grad_norm": grad_norm,
        "tokens": float(n_tokens),
        "epoch": window[-1][0],
    }
