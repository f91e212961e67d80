"""A local transformers model as a ``Policy``: continuous batching, exact token ids and logprobs.

Concurrent ``generate`` calls are queued. A sampling thread (so the event loop keeps running
sandboxes and environments meanwhile) keeps a batch of up to ``max_batch`` sequences in flight
with one KV cache: between two decode steps it admits queued requests (a left-padded prefill
whose cache is merged into the batch's), and each sequence leaves as soon as it stops on a stop
id or on its ``max_tokens``. When the thread starts from idle it first waits ``batch_wait_s`` so
that requests made together start together.

The model object is used as it is, never copied: a trainer may update it between calls, so
samples always come from the current weights (on-policy). ``torch.inference_mode`` wraps only
sampling, and the model's train/eval mode is restored when the thread goes idle.

Logprobs (contract): each returned logprob is ``log p(token)`` under the distribution the token
was actually sampled from: ``log_softmax(logits / temperature)`` after top-k and top-p filtering,
renormalised over the kept tokens. With ``temperature == 0`` (greedy) it is the model's plain
``log_softmax(logits)`` at temperature 1. A trainer that recomputes logprobs for the importance
ratio must apply the same temperature (top-k/top-p are off by default).

Seeds (contract): ``SamplingParams.seed`` seeds a stream, not a single draw. The n-th request
arriving with seed s samples with the n-th child seed drawn from s, independently of which other
sequences share its batch. So G identical requests (a GRPO group) get G different samples, and a
rerun that submits the same requests in the same order reproduces them. ``seed=None`` is not
reproducible.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import threading
from collections.abc import Sequence
from typing import Any

import torch

from sage_rl.policies.base import Completion, PolicyRequest, SamplingParams


@dataclasses.dataclass
class _Pending:
    prompt_ids: list[int]
    params: SamplingParams
    seed: int
    future: asyncio.Future[Completion]


@dataclasses.dataclass
class BatchStats:
    """Counters of the sampling thread, for tests and benchmarks."""

    steps: int = 0  # forward passes (prefills and decode steps)
    max_rows: int = 0  # most sequences in flight at once
    admitted_at: list[int] = dataclasses.field(default_factory=list)  # ``steps`` at each admission


class TransformersPolicy:
    """``Policy`` over a causal LM in this process (see the module docstring for the contracts).

    ``params`` are the defaults of :meth:`complete`; :meth:`generate` follows ``request.params``
    (the agent loop sets each turn's ``max_tokens`` there). ``stop_ids`` default to the chat
    template's end-of-turn token and the eos token (``ChatRenderer.stop_ids``).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        params: SamplingParams = SamplingParams(),
        max_batch: int = 8,
        batch_wait_s: float = 0.005,
        stop_ids: Sequence[int] | None = None,
        name: str | None = None,
    ) -> None:
        from sage_rl.agent.render import ChatRenderer

        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.model, self.tokenizer, self.params = model, tokenizer, params
        self.max_batch, self.batch_wait_s = max_batch, batch_wait_s
        self._renderer = ChatRenderer(tokenizer)
        self.renderer = self._renderer  # Policy.renderer: the agent loop renders with this same one
        self.stop_ids = tuple(stop_ids) if stop_ids is not None else self._renderer.stop_ids
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.stop_ids[0]
        self.name = name or f"transformers:{getattr(model.config, 'name_or_path', '') or 'model'}"
        self.stats = BatchStats()
        self._streams: dict[int | None, random.Random] = {}
        self._pending: list[_Pending] = []
        self._lock = threading.Lock()  # guards _pending and _running (event loop vs sampling thread)
        self._running = False

    async def generate(self, request: PolicyRequest) -> Completion:
        """Sample one turn for ``request.prompt_ids`` (or, if None, its rendered ``messages``)."""
        if request.prompt_ids is not None:
            ids = list(request.prompt_ids)
        else:
            ids = self._renderer.prompt_ids(request.messages)
        if not ids:
            raise ValueError("empty prompt: a request needs prompt_ids or messages")
        future: asyncio.Future[Completion] = asyncio.get_running_loop().create_future()
        with self._lock:
            self._pending.append(_Pending(ids, request.params, self._child_seed(request.params.seed), future))
            start, self._running = not self._running, True
        if start:
            try:
                await asyncio.sleep(self.batch_wait_s)  # let requests made concurrently join the first batch
            except asyncio.CancelledError:
                future.cancel()  # so that this request is not sampled
                raise
            finally:  # even if this caller is cancelled meanwhile: the others need the thread
                threading.Thread(target=self._serve, name="sage-rl-sampler", daemon=True).start()
        return await future

    async def complete(self, prompt_ids: Sequence[int], params: SamplingParams | None = None) -> Completion:
        """``generate`` for bare prompt ids with this policy's default ``params``."""
        return await self.generate(PolicyRequest((), tuple(prompt_ids), params or self.params))

    def _child_seed(self, seed: int | None) -> int:
        stream = self._streams.get(seed)
        if stream is None:
            stream = self._streams[seed] = random.Random(seed)
        return stream.getrandbits(63)

    # ---------------------------------------------------------------- sampling thread
    def _serve(self) -> None:
        was_training = self.model.training
        self.model.eval()
        batch = _Batch(self.model, self.pad_id, self.stop_ids)
        try:
            with torch.inference_mode():
                stopped = False
                while not stopped:
                    room = self.max_batch - len(batch.rows) if batch.can_admit or not batch.rows else 0
                    results = self._advance(batch, self._take(room))
                    # Stop (restoring the model's mode) *before* handing out the last results, so
                    # that nothing touches the model once its callers have their answers.
                    stopped = not batch.rows and self._stop_if_idle(was_training)
                    for future, outcome in results:
                        _resolve(future, outcome)
        except BaseException:
            with self._lock:
                self.model.train(was_training)
                self._running = False
            raise

    def _take(self, room: int) -> list[_Pending]:
        """Up to ``room`` queued requests whose callers still wait (cancelled ones are dropped)."""
        with self._lock:
            live = [p for p in self._pending if not p.future.done()]
            taken, self._pending = live[:room], live[room:]
            return taken

    def _stop_if_idle(self, was_training: bool) -> bool:
        with self._lock:
            if any(not p.future.done() for p in self._pending):
                return False
            self._pending.clear()
            self.model.train(was_training)
            self._running = False  # from here on, a new request starts a new thread
            return True

    def _advance(self, batch: _Batch, new: list[_Pending]) -> list[tuple[asyncio.Future, Any]]:
        """One forward pass (a prefill admitting ``new``, else a decode step). Returns the finished
        requests' futures with their ``Completion`` (or the exception that failed them)."""
        results: list[tuple[asyncio.Future, Any]] = [
            (p.future, Completion("", (), (), "length", len(p.prompt_ids), 0))
            for p in new
            if p.params.max_tokens <= 0
        ]
        new = [p for p in new if p.params.max_tokens > 0]
        in_flight = [r.pending for r in batch.rows] + new
        try:
            if new:
                batch.admit(new)
                self.stats.admitted_at.append(self.stats.steps)
            elif batch.rows:
                batch.step()
            else:
                return results
            self.stats.steps += 1
            self.stats.max_rows = max(self.stats.max_rows, len(batch.rows))
        except Exception as e:  # fail the requests in flight, keep serving the queue
            batch.reset()
            return results + [(p.future, e) for p in in_flight]
        return results + [(row.pending.future, self._completion(row)) for row in batch.pop_finished()]

    def _completion(self, row: _Row) -> Completion:
        ids = tuple(row.ids)
        body = ids[:-1] if row.finish == "stop" else ids
        return Completion(
            text=self.tokenizer.decode(list(body), skip_special_tokens=False),
            token_ids=ids,
            logprobs=tuple(row.logprobs),
            finish_reason=row.finish or "length",
            prompt_tokens=len(row.pending.prompt_ids),
            completion_tokens=len(ids),
        )


def _resolve(future: asyncio.Future[Completion], outcome: Completion | BaseException) -> None:
    """Settle a future from the sampling thread, on its own event loop's thread."""

    def settle() -> None:
        if future.done():  # its caller was cancelled
            return
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)

    with contextlib.suppress(RuntimeError):  # its event loop has closed: nobody is waiting any more
        future.get_loop().call_soon_threadsafe(settle)


# -------------------------------------------------------------------- sampling math


def sampling_logprobs(logits_V: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Log-probabilities of the distribution to sample from, over the vocabulary.

    ``logits / temperature``, then top-k (keep the k largest), then top-p (keep the smallest
    prefix of tokens, by decreasing probability, whose mass reaches p), renormalised; removed
    tokens get ``-inf``. ``temperature <= 0`` returns the plain ``log_softmax(logits)``.
    """
    logits = logits_V.float()
    if params.temperature <= 0:
        return torch.log_softmax(logits, dim=-1)
    logits = logits / params.temperature
    if 0 < params.top_k < logits.numel():
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = torch.cumsum(probs, dim=-1) - probs  # the first token is always kept
        drop = order[mass_before >= params.top_p]
        logits = logits.index_fill(0, drop, float("-inf"))
    return torch.log_softmax(logits, dim=-1)


def _draw(logits_V: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> tuple[int, float]:
    logp_V = sampling_logprobs(logits_V, params)
    if params.temperature <= 0:
        token = int(torch.argmax(logp_V))
    else:
        token = int(torch.multinomial(logp_V.exp(), 1, generator=generator))
    return token, float(logp_V[token])


def _left_pad(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids_BT = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask_BT = torch.zeros((len(prompts), width), dtype=torch.long)
    for b, p in enumerate(prompts):
        ids_BT[b, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask_BT[b, width - len(p) :] = 1
    return ids_BT, mask_BT


def _pad_left(x: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """Zero-pad ``x`` on the left of dimension ``dim`` (a negative index) to ``width``."""
    missing = width - x.shape[dim]
    if missing == 0:
        return x
    pad = [0, 0] * (-dim - 1) + [missing, 0]
    return torch.nn.functional.pad(x, pad)


@dataclasses.dataclass
class _Row:
    pending: _Pending
    generator: torch.Generator
    ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    finish: str | None = None  # "stop" | "length" once finished


class _Batch:
    """The sequences in flight and their shared KV cache; used by the sampling thread only.

    Rows are left-padded to a common width (``mask_BT`` = 0 on padding); positions are counted
    per row from its first real token (``pos_B`` = position of its last fed token), so a row
    computes the same thing whatever shares its batch. New rows are prefilled on their own and
    their cache is merged in (padding the shorter side on the left).
    """

    def __init__(self, model: Any, pad_id: int, stop_ids: Sequence[int]) -> None:
        self.model, self.pad_id, self.stop_ids = model, pad_id, frozenset(stop_ids)
        self.device = next(model.parameters()).device
        self.can_admit = True  # False once the cache turns out not to be mergeable
        self.reset()

    def reset(self) -> None:
        self.rows: list[_Row] = []
        self.cache: Any = None
        self.mask_BT = torch.zeros((0, 0), dtype=torch.long)
        self.pos_B = torch.zeros((0,), dtype=torch.long)

    def _forward(self, ids_BT: torch.Tensor, pos_BT: torch.Tensor, cache: Any, mask_BT: torch.Tensor) -> Any:
        return self.model(
            input_ids=ids_BT.to(self.device),
            attention_mask=mask_BT.to(self.device),
            position_ids=pos_BT.to(self.device),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )

    def _sample_into(self, rows: Sequence[_Row], logits_B1V: torch.Tensor) -> None:
        logits_BV = logits_B1V[:, -1, :].float().cpu()
        for row, logits_V in zip(rows, logits_BV, strict=True):
            token, logprob = _draw(logits_V, row.pending.params, row.generator)
            row.ids.append(token)
            row.logprobs.append(logprob)
            if token in self.stop_ids:
                row.finish = "stop"
            elif len(row.ids) >= row.pending.params.max_tokens:
                row.finish = "length"

    def admit(self, new: Sequence[_Pending]) -> None:
        """Prefill ``new`` requests, draw their first tokens and add them to the batch."""
        rows = [_Row(p, torch.Generator().manual_seed(p.seed)) for p in new]
        ids_BT, mask_BT = _left_pad([p.prompt_ids for p in new], self.pad_id)
        pos_BT = (mask_BT.cumsum(-1) - 1).clamp(min=0)
        out = self._forward(ids_BT, pos_BT, None, mask_BT)
        self._sample_into(rows, out.logits)
        layers = getattr(out.past_key_values, "layers", None)
        self.can_admit = layers is not None and all(
            type(layer).__name__ == "DynamicLayer" for layer in layers
        )
        if not self.rows:
            self.rows, self.cache, self.mask_BT, self.pos_B = (
                rows,
                out.past_key_values,
                mask_BT,
                pos_BT[:, -1],
            )
            return
        width = max(self.mask_BT.shape[1], mask_BT.shape[1])
        for mine, theirs in zip(self.cache.layers, out.past_key_values.layers, strict=True):
            mine.keys = torch.cat([_pad_left(mine.keys, width, -2), _pad_left(theirs.keys, width, -2)])
            mine.values = torch.cat([_pad_left(mine.values, width, -2), _pad_left(theirs.values, width, -2)])
        self.mask_BT = torch.cat([_pad_left(self.mask_BT, width, -1), _pad_left(mask_BT, width, -1)])
        self.pos_B = torch.cat([self.pos_B, pos_BT[:, -1]])
        self.rows += rows

    def step(self) -> None:
        """Feed every row its last sampled token and draw the next one."""
        last_B1 = torch.tensor([[row.ids[-1]] for row in self.rows], dtype=torch.long)
        self.mask_BT = torch.cat([self.mask_BT, torch.ones((len(self.rows), 1), dtype=torch.long)], dim=1)
        self.pos_B = self.pos_B + 1
        out = self._forward(last_B1, self.pos_B[:, None], self.cache, self.mask_BT)
        self.cache = out.past_key_values
        self._sample_into(self.rows, out.logits)

    def pop_finished(self) -> list[_Row]:
        """Remove finished rows (and rows whose caller stopped waiting); return them."""
        done = [r.finish is not None or r.pending.future.done() for r in self.rows]
        if not any(done):
            return []
        finished = [r for r, d in zip(self.rows, done, strict=True) if d]
        keep = [i for i, d in enumerate(done) if not d]
        if not keep:
            self.reset()
            return finished
        self.cache.batch_select_indices(torch.tensor(keep, device=self.device))
        self.rows, self.mask_BT, self.pos_B = (
            [self.rows[i] for i in keep],
            self.mask_BT[keep],
            self.pos_B[keep],
        )
        self._trim()
        return finished

    def _trim(self) -> None:
        # Columns that are padding for every remaining row cost compute and mean nothing.
        first = int(self.mask_BT.any(dim=0).nonzero()[0])
        if first > 0 and self.can_admit:
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[..., first:, :], layer.values[..., first:, :]
            self.mask_BT = self.mask_BT[:, first:]
