"""The engine's accelerator path: continuous batching over the paged KV store, steps pipelined.

Same interface and the same contracts as :class:`sage_rl.engine.engine.Engine` (admit, step,
pop_finished, reset, weights_changed; rows with ``request``, ``ids``, ``logprobs``, ``finish``;
the same tokens for the same seeds), over ``cuda_step.PagedRunner``:

- **No host sync inside a decode step.** :meth:`PagedEngine.step` draws one uniform a row from
  the row's own stream on the host, sends them with one copy, launches the step (a CUDA graph
  replay), and queues one copy back of the step's tokens and logprobs. Then it reads the
  *previous* step's copy: host bookkeeping runs one step behind. A row that stopped is learned of
  one step late; the step computed for it meanwhile is dropped (its uniform came from its own
  stream, which nothing else reads, so no other row's draw changes).
- **Batch changes** (a row in or out, a new page) are one packed copy (``_compose``): the rows'
  lengths, block tables and sampling parameters; the rows' last tokens stay on the device.
- **Admission** prefills every request of a wave in shared forward passes (``prefill_many``)
  and reads their first tokens back (one sync an admission). Prefixes are shared as in
  ``Engine``: a finished turn's sequence is parked in the store, the next turn takes it over; the
  G chains of a group share its prompt's pages.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from sage_rl.engine.adapters import unwrap
from sage_rl.engine.cuda_step import PagedRunner
from sage_rl.engine.device_sampler import RowParams, draw_tensors
from sage_rl.engine.engine import WAIT_FOR_PREFIX, EngineStats
from sage_rl.engine.graphs import StepGraphs
from sage_rl.engine.kv import common_prefix
from sage_rl.engine.store import PagedSeq, PageStore, block_table

RESERVE = 256  # positions reserved ahead for a row's sampled tokens (a batch change each time)
_COLS = 7  # packed batch columns before the block table: see _compose


@dataclasses.dataclass(frozen=True)
class PagedOptions:
    """``store_bytes``: the KV store (None: ``cache_bytes`` plus ``max_len`` positions for every
    row, at most 60% of the free GPU memory); ``attention``: ``cuda_step.ATTENTION``; ``graphs``:
    capture decode steps as CUDA graphs (None: on CUDA)."""

    store_bytes: int | None = None
    page_size: int = 128
    max_len: int | None = None  # None: the model's max_position_embeddings
    attention: str = "auto"
    graphs: bool | None = None


@dataclasses.dataclass(eq=False)  # rows compare by identity
class PagedRow:
    request: Any
    seq: PagedSeq
    stream: random.Random
    generation: int
    length: int  # positions of seq written, launched steps included
    ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    finish: str | None = None


def _buckets(rows: int) -> list[int]:
    out, b = [], 1
    while b < rows:
        out.append(b)
        b *= 2
    return [*out, rows]


class PagedEngine:
    """Continuous batching over a paged store (see the module docstring)."""

    def __init__(
        self,
        model: Any,
        stop_ids: Sequence[int],
        dtype: torch.dtype | None = None,
        cache_bytes: int = 2 << 30,
        max_batch: int = 8,
        options: PagedOptions = PagedOptions(),
    ) -> None:
        config = getattr(model, "config", None)
        max_len = options.max_len or int(getattr(config, "max_position_embeddings", 8192))
        device = next(model.parameters()).device
        store_bytes = options.store_bytes or _default_store_bytes(
            model, dtype, cache_bytes, max_batch, max_len
        )
        self.runner = PagedRunner(
            model, store_bytes, dtype, max_batch, max_len, options.page_size, options.attention
        )
        self.store, self.buf = self.runner.store, self.runner.buf
        self.cuda = device.type == "cuda"
        self.graphs = StepGraphs(self.cuda if options.graphs is None else options.graphs)
        self.buckets = _buckets(max_batch)
        self.stop_ids = frozenset(stop_ids)
        self.vocab = self.runner.embed.shape[0]
        self.rows: list[PagedRow] = []
        self.generation = 0
        self.stats = EngineStats()
        self._stale = False
        self._done: list[PagedRow] = []
        self._batch: list[PagedRow] = []  # rows in buffer order at the last composition
        self._dirty = True
        self._pending: tuple[Any, torch.Tensor, list[PagedRow]] | None = None
        self._key: tuple = ()
        width = _COLS + self.runner.max_pages
        self._packed = [_host((max_batch, width), torch.float64, self.cuda) for _ in range(2)]
        self._u = [_host((max_batch,), torch.float64, self.cuda) for _ in range(2)]
        self._out = [_host((max_batch, 2), torch.float64, self.cuda) for _ in range(2)]
        self._flip = 0

    # ---------------------------------------------------------------- weights, reset
    def weights_changed(self) -> None:
        """As ``Engine.weights_changed``: re-read the weights (in place) and drop every parked
        sequence before the next admission."""
        self._stale = True

    def reset(self) -> None:
        """Drop every row and parked sequence (after a failure: their state is unknown)."""
        self._pending = None
        for row in [*self.rows, *self._done]:
            self.store.release(row.seq)
        self.rows, self._done, self._batch = [], [], []
        self.store.clear()
        self.generation += 1
        self._dirty = True

    # ---------------------------------------------------------------- admission
    def admit(self, requests: Sequence[Any]) -> None:
        """Prefill ``requests`` in waves (as ``Engine.admit``), draw their first tokens, add them."""
        self._drain()
        if self._stale:
            self._stale = False
            self.runner.refresh()
            self.store.clear()
            self.generation += 1
        waiting = list(requests)
        while waiting:
            wave: list[tuple[Any, PagedSeq]] = []
            later: list[Any] = []
            for request in waiting:
                self._check_length(request)
                prompt = np.asarray(request.prompt_ids, dtype=np.int64)
                current = [r.seq for r in self.rows if r.generation == self.generation]
                source, n = self.store.match(prompt, [*current, *(s for _, s in wave)])
                shared = max((common_prefix(r.prompt_ids, prompt) for r, _ in wave), default=0)
                if min(shared, len(prompt) - 1) > n + WAIT_FOR_PREFIX:
                    later.append(request)
                else:
                    wave.append((request, self._seq_from(source, n, len(prompt))))
            new = [list(r.prompt_ids[len(s) :]) for r, s in wave]
            for (request, seq), ids in zip(wave, new, strict=True):
                self.store.reserve(seq, len(ids) + min(request.params.max_tokens, RESERVE) + 1)
            logits_NV = self.runner.prefill_many([s for _, s in wave], new)
            rows = [PagedRow(r, s, random.Random(r.seed), self.generation, len(s)) for r, s in wave]
            for row, ids in zip(rows, new, strict=True):
                self.stats.prefill_tokens += len(ids)
                self.stats.reused_tokens += len(row.seq) - len(ids)
            tokens_N, logp_N = self._draw_first(rows, logits_NV)
            self.rows.extend(rows)
            for row, token, logprob in zip(rows, tokens_N, logp_N, strict=True):
                self._record(row, token, logprob)
            waiting = later
        self._dirty = True
        self.stats.max_rows = max(self.stats.max_rows, len(self.rows))

    def _check_length(self, request: Any) -> None:
        need = len(request.prompt_ids) + request.params.max_tokens + 1
        if need > self.runner.max_len:
            raise ValueError(
                f"a request needs {need} positions (prompt {len(request.prompt_ids)} + max_tokens "
                f"{request.params.max_tokens} + 1), more than the paged store's max_len {self.runner.max_len}"
            )

    def _seq_from(self, source: PagedSeq | None, n: int, prompt_len: int) -> PagedSeq:
        usable = min(n, prompt_len - 1)
        if source is None or usable <= 0:
            return self.store.new_seq()
        if n == len(source) and self.store.take(source):  # the episode's own sequence: extend it
            self.store.truncate(source, usable)
            return source
        return self.store.fork(source, usable)

    def _draw_first(self, rows: list[PagedRow], logits_NV: torch.Tensor) -> tuple[list[int], list[float]]:
        params = [r.request.params for r in rows]
        u = [r.stream.random() if p.temperature > 0 else 0.0 for r, p in zip(rows, params, strict=True)]
        host = np.array([self._param_row(p) for p in params], dtype=np.float64).reshape(len(rows), 4)
        t = torch.from_numpy(host).to(logits_NV.device)
        rp = RowParams(t[:, 0].float(), t[:, 1] > 0, t[:, 2].long(), t[:, 3].float())
        u_t = torch.tensor(u, dtype=torch.float64, device=logits_NV.device)
        tokens, logp = draw_tensors(logits_NV, rp, u_t, any(self._filters(p) for p in params))
        return tokens.tolist(), logp.tolist()  # admission: one sync, outside any decode step

    def _param_row(self, p: Any) -> tuple[float, float, float, float]:
        """(temperature, greedy, top_k, top_p) as the device sampler takes them."""
        greedy = p.temperature <= 0
        k = p.top_k if 0 < p.top_k < self.vocab else self.vocab
        return (1.0 if greedy else p.temperature, float(greedy), float(k), p.top_p)

    def _filters(self, p: Any) -> bool:
        return p.temperature > 0 and (0 < p.top_k < self.vocab or p.top_p < 1.0)

    def _record(self, row: PagedRow, token: int, logprob: float) -> None:
        row.ids.append(token)
        row.logprobs.append(logprob)
        if token in self.stop_ids:
            row.finish = "stop"
        elif len(row.ids) >= row.request.params.max_tokens:
            row.finish = "length"
        if row.finish is not None:
            self.rows.remove(row)
            self._done.append(row)
            self._dirty = True

    # ---------------------------------------------------------------- decode steps
    def step(self) -> None:
        """Launch a decode step over the rows, then take in the previous step's results."""
        if not self.rows:
            self._drain()
            return
        P = self.store.page_size
        for row in self.rows:  # room for this step's keys and values (and the next RESERVE)
            if len(row.seq.pages) * P < row.length + 1:
                left = row.request.params.max_tokens - len(row.ids) + 1
                self.store.reserve(row.seq, max(1, min(left, RESERVE)), at=row.length)
                self._dirty = True
        if self._dirty:
            self._compose()
        bucket, pages, filtered = self._key
        need = max(r.length for r in self._batch) // P + 1
        if self.runner.attention == "gather" and need > pages:  # a row entered a new page
            pages = min(_pages_bucket(need), self.runner.max_pages)
            self._key = (bucket, pages, filtered)
        B, flip = len(self._batch), self._flip
        u = self._u[flip]
        for b, row in enumerate(self._batch):
            u[b] = row.stream.random() if row.request.params.temperature > 0 else 0.0
        self.buf.u[:B].copy_(u[:B], non_blocking=True)  # the one copy in
        self.graphs.run(self._key, lambda advance: self.runner.decode_step(bucket, pages, filtered, advance))
        out = self.buf.out[:B]
        if self.cuda:
            host = self._out[flip][:B]
            host.copy_(out, non_blocking=True)  # the one copy back, read at the next step
            event = torch.cuda.Event()
            event.record()
        else:
            host, event = out.clone(), None
        self._flip ^= 1
        previous, self._pending = self._pending, (event, host, list(self._batch))
        for row in self._batch:
            row.length += 1
        self.stats.decode_tokens += B
        if previous is not None:
            self._collect(previous)

    def _compose(self) -> None:
        """Lay the rows out in the step buffers with one copy, padded to a captured bucket: each
        row's old buffer index (its last token stays on the device) or its last token, length,
        sampling parameters and block table."""
        old = {id(r): b for b, r in enumerate(self._batch)}
        rows = list(self.rows)
        B = len(rows)
        bucket = next(b for b in self.buckets if b >= B)
        host = np.zeros((bucket, _COLS + self.runner.max_pages), dtype=np.float64)
        host[:, 0] = -1
        host[B:, 3:7] = (1.0, 1.0, self.vocab, 1.0)  # padding rows: greedy, unfiltered
        for b, row in enumerate(rows):
            keep = old.get(id(row), -1)
            host[b, :3] = (keep, row.length, row.ids[-1] if keep < 0 else 0)
            host[b, 3:7] = self._param_row(row.request.params)
        host[:, _COLS:] = block_table([r.seq for r in rows], bucket, self.runner.max_pages)
        packed = self._packed[self._flip][:bucket]
        packed.copy_(torch.from_numpy(host))
        t = packed.to(self.buf.tokens.device, non_blocking=True)
        keep_t = t[:, 0].long()
        self.buf.tokens[:bucket] = torch.where(
            keep_t >= 0, self.buf.tokens[keep_t.clamp(min=0)], t[:, 2].long()
        )
        self.buf.lengths[:bucket] = t[:, 1].long()
        self.buf.temp[:bucket] = t[:, 3].float()
        self.buf.greedy[:bucket] = t[:, 4] > 0
        self.buf.top_k[:bucket] = t[:, 5].long()
        self.buf.top_p[:bucket] = t[:, 6].float()
        self.buf.table[:bucket] = t[:, _COLS:].int()
        self.runner.set_page_of(B, bucket)
        need = max(r.length for r in rows) // self.store.page_size + 1
        pages = min(_pages_bucket(need), self.runner.max_pages)
        filtered = any(self._filters(r.request.params) for r in rows)
        self._key = (bucket, pages if self.runner.attention == "gather" else 0, filtered)
        self._batch = rows
        self._dirty = False

    def _collect(self, pending: tuple[Any, torch.Tensor, list[PagedRow]]) -> None:
        """Take in a launched step's tokens and logprobs (waits for that step only)."""
        event, host, batch = pending
        if event is not None:
            event.synchronize()
        live = {id(r) for r in self.rows}
        for row, (token, logprob) in zip(batch, host.tolist(), strict=True):
            if id(row) in live:
                self._record(row, int(token), logprob)

    def _drain(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self._collect(pending)

    # ---------------------------------------------------------------- leaving
    def pop_finished(self, abandoned: Callable[[Any], bool] = lambda request: False) -> list[PagedRow]:
        """Remove the rows known to have finished (or whose request was ``abandoned``) and return
        them; their sequences are parked for a next turn that continues them."""
        gone = [r for r in self.rows if abandoned(r.request)]
        if gone:
            self.rows = [r for r in self.rows if all(r is not g for g in gone)]
            self._dirty = True
        done, self._done = [*self._done, *gone], []
        for row in done:
            fed = min(row.length - len(row.seq), len(row.ids))  # sampled tokens whose keys are written
            row.seq.ids.extend(row.ids[:fed])
            if row.generation == self.generation:
                self.store.park(row.seq)
            else:
                self.store.release(row.seq)
        return done


def _pages_bucket(n: int) -> int:
    """Pages the gather attention reads a row: ``n`` rounded up to a multiple of 4 (at most 3
    pages read in vain, and a graph for every 4 pages of context)."""
    return n if n <= 4 else -(-n // 4) * 4


def _host(shape: tuple[int, ...], dtype: torch.dtype, pinned: bool) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype, pin_memory=pinned)


def _default_store_bytes(
    model: Any, dtype: torch.dtype | None, cache_bytes: int, rows: int, max_len: int
) -> int:
    hf = unwrap(model)
    config, first = hf.config, hf.model.layers[0].self_attn
    dtype = dtype or hf.model.embed_tokens.weight.dtype
    shape = (len(hf.model.layers), config.num_key_value_heads, first.head_dim)
    want = cache_bytes + rows * max_len * PageStore.bytes_per_page(shape, 1, dtype)
    device = hf.model.embed_tokens.weight.device
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        want = min(want, int(0.6 * free))
    return want


ENGINES = ("auto", "per_sequence", "paged")


def make_engine(
    model: Any,
    stop_ids: Sequence[int],
    dtype: torch.dtype | None,
    cache_bytes: int,
    max_batch: int,
    engine: str | PagedOptions = "auto",
    packed: bool | None = None,
    pooled: bool | None = None,
) -> Any:
    """The engine for ``model``: ``"per_sequence"`` (``engine.Engine``, the CPU path), ``"paged"``
    or a :class:`PagedOptions` (:class:`PagedEngine`), ``"auto"`` = paged for a model on CUDA that
    the paged runner supports, else per-sequence. ``packed``, ``pooled``: the per-sequence
    engine's column blocks and decode pool (None = where they pay; the paged engine has its own
    store and uses neither)."""
    from sage_rl.engine.cuda_step import paged_unsupported
    from sage_rl.engine.engine import Engine

    if isinstance(engine, PagedOptions):
        return PagedEngine(model, stop_ids, dtype, cache_bytes, max_batch, engine)
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES} or a PagedOptions, got {engine!r}")
    on_cuda = next(model.parameters()).device.type == "cuda"
    if engine == "paged" or (engine == "auto" and on_cuda and paged_unsupported(model) is None):
        return PagedEngine(model, stop_ids, dtype, cache_bytes, max_batch)
    return Engine(model, stop_ids, dtype, cache_bytes, packed, pooled)
