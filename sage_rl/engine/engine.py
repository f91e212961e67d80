"""The sampling engine: a continuous batch of sequences over per-sequence KV caches.

Used by one thread at a time (the policy's sampling task). Each call is one scheduler step:
:meth:`Engine.admit` prefills new requests (each reusing the longest cached prefix of its prompt,
see ``kv.py``) and draws their first tokens; :meth:`Engine.step` feeds every row its last token
and draws the next; :meth:`Engine.pop_finished` removes the rows that stopped and keeps their
caches for the next turn.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
import torch

from sage_rl.engine.decoder import make_runner
from sage_rl.engine.kv import KVCache, PrefixStore, common_prefix
from sage_rl.engine.sampler import draw
from sage_rl.types import SamplingParams

WAIT_FOR_PREFIX = 16  # tokens: prefilling more than this twice costs more than one more forward pass


class Request(Protocol):
    prompt_ids: list[int]
    params: SamplingParams
    seed: int


@dataclasses.dataclass(eq=False)  # rows compare by identity
class Row:
    request: Any  # a Request
    cache: KVCache
    stream: random.Random
    generation: int  # weights generation the cache was computed with
    ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    finish: str | None = None  # "stop" | "length" once finished


@dataclasses.dataclass
class EngineStats:
    """Counters, for tests and benchmarks."""

    steps: int = 0  # scheduler steps: admissions and decode steps
    max_rows: int = 0  # most sequences in flight at once
    admitted_at: list[int] = dataclasses.field(default_factory=list)  # ``steps`` at each admission
    prefill_tokens: int = 0  # prompt tokens computed
    reused_tokens: int = 0  # prompt tokens whose keys and values came from a cache
    decode_tokens: int = 0  # tokens fed by decode steps
    thread_steps: dict[int, int] = dataclasses.field(default_factory=dict)  # torch threads: steps run


class Engine:
    """Continuous batching over a causal LM (see the module docstring).

    ``dtype``: the compute dtype (None = the model's own); ``cache_bytes``: memory for the
    caches kept between turns (least recently used dropped first); ``packed``, ``pooled``: the
    native runner's few-row column blocks and CPU decode pool (None = where they pay).
    """

    def __init__(
        self,
        model: Any,
        stop_ids: Sequence[int],
        dtype: torch.dtype | None = None,
        cache_bytes: int = 2 << 30,
        packed: bool | None = None,
        pooled: bool | None = None,
    ) -> None:
        self.runner = make_runner(model, dtype, packed, pooled)
        self.stop_ids = frozenset(stop_ids)
        self.store = PrefixStore(cache_bytes)
        self.rows: list[Row] = []
        self.generation = 0
        self.stats = EngineStats()
        self._stale = False  # set by weights_changed (any thread), acted on at the next admission

    def weights_changed(self) -> None:
        """The model's weights (or its adapters' state) changed: before its next admission the
        engine re-reads them and drops every cache. Cheap; safe to call from another thread than
        the sampling one. The engine does not detect changes itself: whoever changes the weights
        says so (the training loop's ``sync``, after every optimizer step)."""
        self._stale = True

    def reset(self) -> None:
        """Drop every row and cache (after a failure: their state is unknown)."""
        self.rows = []
        self.store.clear()
        self.generation += 1

    def admit(self, requests: Sequence[Any]) -> None:
        """Prefill ``requests``, draw their first tokens and add them to the batch.

        Requests are prefilled together, in waves: a request that shares a longer prefix with an
        earlier request of the wave (by more than :data:`WAIT_FOR_PREFIX` tokens) than with any
        cache waits for the next wave and copies that prefix then (the G chains of a group, or
        tasks sharing a system prompt, prefill the shared part once)."""
        if self._stale:  # new weights: every cache is stale
            self._stale = False  # first, so that a change announced meanwhile is not lost
            self.runner.refresh()
            self.store.clear()
            self.generation += 1
        waiting = list(requests)
        while waiting:
            wave: list[tuple[Any, KVCache]] = []
            later: list[Any] = []
            for request in waiting:
                prompt = np.asarray(request.prompt_ids, dtype=np.int64)
                source, n = self._match(prompt, [c for _, c in wave])
                shared = max((common_prefix(r.prompt_ids, prompt) for r, _ in wave), default=0)
                if min(shared, len(prompt) - 1) > n + WAIT_FOR_PREFIX:
                    later.append(request)
                else:
                    wave.append((request, self._cache_from(source, n, len(prompt))))
            new = [list(r.prompt_ids[len(c) :]) for r, c in wave]
            logits_NV = self.runner.prefill_many([c for _, c in wave], new)
            rows = []
            for (request, cache), ids in zip(wave, new, strict=True):
                self.stats.prefill_tokens += len(ids)
                self.stats.reused_tokens += len(cache) - len(ids)
                rows.append(Row(request, cache, random.Random(request.seed), self.generation))
            self._record(rows, logits_NV)
            self.rows.extend(rows)
            waiting = later
        self.stats.max_rows = max(self.stats.max_rows, len(self.rows))

    def _match(self, prompt: np.ndarray, others: Sequence[KVCache] = ()) -> tuple[KVCache | None, int]:
        """The cache sharing the longest prefix with ``prompt`` among stored caches, those of the
        rows in flight and ``others``, and that length."""
        current = [r.cache for r in self.rows if r.generation == self.generation]
        return self.store.match(prompt, [*current, *others])

    def _cache_from(self, source: KVCache | None, n: int, prompt_len: int) -> KVCache:
        """A cache holding the first ``n`` positions of ``source`` (short of the prompt's last
        token, whose logits are needed)."""
        usable = min(n, prompt_len - 1)
        if source is None or usable <= 0:
            return self.runner.new_cache()
        if n == len(source) and self.store.take(source):  # the episode's own cache: extend it
            source.truncate(usable)
            return source
        return source.copy_prefix(usable)

    def step(self) -> None:
        """Feed every row its last sampled token and draw the next one."""
        logits_BV = self.runner.decode([r.cache for r in self.rows], [r.ids[-1] for r in self.rows])
        self.stats.decode_tokens += len(self.rows)
        self._record(self.rows, logits_BV)

    def _record(self, rows: Sequence[Row], logits_BV: torch.Tensor) -> None:
        tokens, logprobs = draw(logits_BV, [r.request.params for r in rows], [r.stream for r in rows])
        for row, token, logprob in zip(rows, tokens, logprobs, strict=True):
            row.ids.append(token)
            row.logprobs.append(logprob)
            if token in self.stop_ids:
                row.finish = "stop"
            elif len(row.ids) >= row.request.params.max_tokens:
                row.finish = "length"

    def pop_finished(self, abandoned: Callable[[Any], bool] = lambda request: False) -> list[Row]:
        """Remove the rows that finished (or whose request was ``abandoned``) and return them;
        their caches are kept for a next turn that continues them."""
        done = [r for r in self.rows if r.finish is not None or abandoned(r.request)]
        if done:
            gone = {id(r) for r in done}
            self.rows = [r for r in self.rows if id(r) not in gone]
            for row in done:
                if row.generation == self.generation:
                    self.store.put(row.cache)
        return done
