"""A local transformers model as a ``Policy``: continuous batching, exact token ids and logprobs.

Concurrent ``generate`` calls are queued. A sampling task on the event loop keeps a batch of up to
``max_batch`` sequences in flight (``sage_rl.engine``): between two decode steps it admits queued
requests, and each sequence leaves as soon as it stops on a stop id or on its ``max_tokens``; after
each step it yields to the other coroutines (agents, sandboxes, environments), whose processes run
meanwhile; an admission (a prefill, which can take seconds) runs on a short-lived thread so that the
loop keeps reading the sandboxes' replies through it. When the task starts from idle it first waits
``batch_wait_s`` so that requests made together start together.

KV caches are kept between turns. A request reuses the cached sequence sharing the longest prefix
with its ``prompt_ids``: the next turn of an episode prefills only its new observation tokens, and
the G chains of a group prefill their common opening once. The keys of a prefix depend only on its
tokens and the weights, so reuse is exact (up to float rounding: a prefix computed token by token
and one computed in a single pass round differently); every cache is dropped when the weights change.

The model object is used as it is, never copied: a trainer may update it between calls, and then
calls :meth:`weights_changed` (the training loop's ``sync``, after every optimizer step), so that
samples come from the current weights (on-policy). At the next admission the engine re-reads them
(a ``dtype`` other than the model's keeps a converted copy, refreshed then) and drops its caches.
Nothing watches the parameters: a caller that changes them and does not say so samples from stale
caches. ``torch.inference_mode``
wraps only the scheduler steps, and the model's train/eval mode is restored when sampling goes idle.

Precision: ``dtype`` is the compute dtype of sampling (None = the model's own, e.g. float32;
``"bfloat16"``; ``"auto"`` = bfloat16 where the hardware computes it natively, i.e. a CPU with
AVX512-BF16 or AMX, or a CUDA GPU with bf16, else the model's own). Logits are taken to float32
before sampling, but in bfloat16 they are those of a bfloat16 forward pass: the logprobs differ
from a float32 trainer's by the rounding of the whole network (``logprob_mismatch``), so a trainer
must compute its old logprobs itself rather than trust the sampler's.

Logprobs (contract): each returned logprob is ``log p(token)`` under the distribution the token
was actually sampled from: ``log_softmax(logits / temperature)`` after top-k and top-p filtering,
renormalised over the kept tokens. With ``temperature == 0`` (greedy) it is the model's plain
``log_softmax(logits)`` at temperature 1. A trainer that recomputes logprobs for the importance
ratio must apply the same temperature (top-k/top-p are off by default).

Seeds (contract): ``SamplingParams.seed`` seeds a stream, not a single draw. The n-th request
arriving with seed s samples with the n-th child seed drawn from s, independently of which other
sequences share its batch and of what is cached. So G identical requests (a GRPO group) get G
different samples, and a rerun that submits the same requests in the same order reproduces them.
``seed=None`` is not reproducible.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import functools
import os
import random
import threading
from collections.abc import Sequence
from typing import Any

import torch

from sage_rl.engine.engine import EngineStats, Row
from sage_rl.engine.paged_engine import make_engine
from sage_rl.engine.sampler import sampling_logprobs
from sage_rl.engine.threads import ThreadPolicy
from sage_rl.policies.base import Completion, PolicyRequest, SamplingParams

__all__ = ["EngineStats", "TransformersPolicy", "resolve_dtype", "sampling_logprobs"]


@dataclasses.dataclass
class _Pending:
    prompt_ids: list[int]
    params: SamplingParams
    seed: int
    future: asyncio.Future[Completion]


def resolve_dtype(dtype: torch.dtype | str | None, model: Any) -> torch.dtype | None:
    """``"model"`` -> None (the model's own), a name or dtype -> that dtype, ``"auto"`` ->
    bfloat16 where the hardware computes it natively, else None; ``None`` -> bfloat16 for a model
    on a CUDA GPU with bf16 (sampling there is bound by memory traffic), else the model's own."""
    if dtype == "model":
        return None
    if dtype is None:
        device = next(model.parameters()).device
        return torch.bfloat16 if device.type == "cuda" and torch.cuda.is_bf16_supported() else None
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        device = next(model.parameters()).device
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else None
        return torch.bfloat16 if device.type == "cpu" and _cpu_has_bf16() else None
    resolved = getattr(torch, str(dtype), None)
    if not isinstance(resolved, torch.dtype) or not resolved.is_floating_point:
        raise ValueError(f"dtype must be None, 'auto', 'model' or a float dtype name, got {dtype!r}")
    return resolved


def _cpu_has_bf16() -> bool:
    """Whether this CPU computes bfloat16 products natively *as torch will run them here*: the
    AVX512-BF16 or AMX flag, and neither torch's kernels (``ATEN_CPU_CAPABILITY``) nor oneDNN's
    (``ONEDNN_MAX_CPU_ISA``, which runs the bfloat16 matrix products) held below AVX-512. Elsewhere
    bfloat16 is emulated and slower than float32 (docs/LOG.md, 2026-11-27)."""
    return bf16_native(
        _cpu_flags(), torch.backends.cpu.get_cpu_capability(), os.environ.get("ONEDNN_MAX_CPU_ISA", "")
    )


@functools.cache
def _cpu_flags() -> frozenset[str]:
    """The CPU's flags, read once a process (SFT resolves ``dtype: auto`` every step)."""
    try:
        with open("/proc/cpuinfo") as f:
            return frozenset(next((line for line in f if line.startswith("flags")), "").split())
    except OSError:
        return frozenset()


def bf16_native(flags: set[str] | frozenset[str], capability: str, onednn_isa: str) -> bool:
    """See :func:`_cpu_has_bf16`; ``capability`` is ``torch.backends.cpu.get_cpu_capability()``."""
    if not flags & {"avx512_bf16", "amx_bf16"} or not capability.upper().startswith(("AVX512", "AMX")):
        return False
    isa = onednn_isa.strip().upper()
    return isa in ("", "ALL", "DEFAULT") or any(k in isa for k in ("BF16", "AMX", "FP16", "AVX10"))


class TransformersPolicy:
    """``Policy`` over a causal LM in this process (see the module docstring for the contracts).

    ``params`` are the defaults of :meth:`complete`; :meth:`generate` follows ``request.params``
    (the agent loop sets each turn's ``max_tokens`` there). ``stop_ids`` default to the chat
    template's end-of-turn token and the eos token (``ChatRenderer.stop_ids``). ``renderer`` is
    the ``ChatRenderer`` of the tokenizer. ``dtype``: see "Precision" above; ``cache_bytes``: memory
    for the KV caches kept between turns. ``threads``: torch threads while sampling, an int, None
    (the process's setting) or "auto" (the process's setting less the cores other processes are
    using, measured at each step; ``sage_rl/engine/threads.py``); the process's count is restored
    when sampling goes idle. ``engine``: ``"auto"`` (the paged engine, ``engine/paged_engine.py``,
    for a model on CUDA; else the per-sequence one), ``"per_sequence"``, ``"paged"`` or a
    ``PagedOptions``. ``column_blocks``, ``decode_pool``: the per-sequence engine's few-row
    products (``engine/packed.py``) and CPU decode pool (``engine/pool.py``); None = where they pay,
    False = off (the same tokens up to float rounding; slower where they pay).
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
        dtype: torch.dtype | str | None = None,
        cache_bytes: int = 2 << 30,
        threads: int | str | None = "auto",
        engine: str | Any = "auto",
        column_blocks: bool | None = None,
        decode_pool: bool | None = None,
    ) -> None:
        from sage_rl.agent.render import ChatRenderer

        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.model, self.tokenizer, self.params = model, tokenizer, params
        self.max_batch, self.batch_wait_s = max_batch, batch_wait_s
        self.renderer = ChatRenderer(tokenizer)  # Policy.renderer: the agent loop renders with this one
        self.stop_ids = tuple(stop_ids) if stop_ids is not None else self.renderer.stop_ids
        self.name = name or f"transformers:{getattr(model.config, 'name_or_path', '') or 'model'}"
        self.dtype = resolve_dtype(dtype, model)
        self.vocab = model.get_input_embeddings().num_embeddings  # the ids a prompt may hold
        self.threads = ThreadPolicy(threads)
        with torch.inference_mode():
            # "auto": the paged engine (device-resident store, CUDA graphs) on CUDA, else Engine
            self.engine = make_engine(
                model, self.stop_ids, self.dtype, cache_bytes, max_batch, engine, column_blocks, decode_pool
            )
        self._streams: dict[int | None, random.Random] = {}
        self._pending: list[_Pending] = []
        self._lock = threading.Lock()  # guards _pending and _running (callers on other event loops)
        self._running = False
        self._server: asyncio.Task | None = None  # the sampling task (held: a task is weakly referenced)

    @property
    def stats(self) -> EngineStats:
        return self.engine.stats

    def weights_changed(self) -> None:
        """The model was updated in place (``Policy``): the engine re-reads its weights and drops
        its caches before its next admission (``Engine.weights_changed``)."""
        self.engine.weights_changed()

    async def generate(self, request: PolicyRequest) -> Completion:
        """Sample one turn for ``request.prompt_ids`` (or, if None, its rendered ``messages``)."""
        if request.prompt_ids is not None:
            ids = list(request.prompt_ids)
        else:
            ids = self.renderer.prompt_ids(request.messages)
        if not ids:
            raise ValueError("empty prompt: a request needs prompt_ids or messages")
        if min(ids) < 0 or max(ids) >= self.vocab:  # checked here: in a batch it would fail every row
            bad = next(t for t in ids if not 0 <= t < self.vocab)
            raise ValueError(
                f"prompt token id {bad} (at {ids.index(bad)}) is outside the model's {self.vocab} embeddings "
                "(a tokenizer with more ids than the model?); nothing was sampled"
            )
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
            finally:  # even if this caller is cancelled meanwhile: the others need the server
                self._server = asyncio.get_running_loop().create_task(self._serve())
        return await future

    async def complete(self, prompt_ids: Sequence[int], params: SamplingParams | None = None) -> Completion:
        """``generate`` for bare prompt ids with this policy's default ``params``."""
        return await self.generate(PolicyRequest((), tuple(prompt_ids), params or self.params))

    def _child_seed(self, seed: int | None) -> int:
        stream = self._streams.get(seed)
        if stream is None:
            stream = self._streams[seed] = random.Random(seed)
        return stream.getrandbits(63)

    # ---------------------------------------------------------------- the sampling task
    async def _serve(self) -> None:
        """Scheduler steps on the event loop's thread, yielding to the other coroutines (the
        agents: parsing, sandboxes) after each. Not on a thread of its own: with GNU OpenMP (torch's
        CPU build) a second thread that runs parallel regions gets its own team of workers, and once
        the process's workers outnumber the cores, every worker stops spinning between regions and
        sleeps, so each of a decode step's ~1,500 regions pays a wake-up: a step of 8 rows took
        1.3x as long on a sampling thread as on the main thread (docs/LOG.md, seventh session)."""
        was_training = self.model.training
        self.model.eval()
        self.threads.start()
        try:
            stopped = False
            while not stopped:
                count = self.threads.step()
                steps = self.engine.stats.thread_steps
                steps[count] = steps.get(count, 0) + 1
                new = self._take(self.max_batch - len(self.engine.rows))
                if new:  # a prefill (seconds): off the loop, whose timers must not wait for it
                    results = await self._off_loop(new, count)
                else:
                    with torch.inference_mode():  # only around the step: others run in between
                        results = self._advance(new)
                # Stop (restoring the model's mode) *before* handing out the last results, so
                # that nothing touches the model once its callers have their answers.
                stopped = not self.engine.rows and self._stop_if_idle(was_training)
                for future, outcome in results:
                    _resolve(future, outcome)
                await asyncio.sleep(0)
        except BaseException:
            with self._lock:
                self.threads.stop()
                self.model.train(was_training)
                self._running = False
            raise

    async def _off_loop(self, new: list[_Pending], threads: int) -> list[tuple[asyncio.Future, Any]]:
        """``_advance(new)`` on a thread that ends with it. An admission prefills whole prompts
        (seconds at 1 thread for 16 rows of ~900 tokens), and a loop blocked that long would read a
        sandbox's reply after its timer ran out (a spurious timeout, a killed worker). The thread
        ends, and its OpenMP team with it, so the decode steps after it run at full speed."""
        done: concurrent.futures.Future = concurrent.futures.Future()

        def run() -> None:
            torch.set_num_threads(threads)
            try:
                with torch.inference_mode():
                    done.set_result(self._advance(new))
            except BaseException as e:  # noqa: BLE001 - handed to the loop, raised there
                done.set_exception(e)

        worker = threading.Thread(target=run, name="sage-rl-prefill", daemon=True)
        worker.start()
        try:
            return await asyncio.shield(asyncio.wrap_future(done))
        except asyncio.CancelledError:
            worker.join()  # the engine is never used by two threads at once
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
            self.threads.stop()
            self.model.train(was_training)
            self._running = False  # from here on, a new request starts a new thread
            return True

    def _advance(self, new: list[_Pending]) -> list[tuple[asyncio.Future, Any]]:
        """One scheduler step (admitting ``new``, else a decode step). Returns the finished
        requests' futures with their ``Completion`` (or the exception that failed them)."""
        results: list[tuple[asyncio.Future, Any]] = [
            (p.future, Completion("", (), (), "length", len(p.prompt_ids), 0))
            for p in new
            if p.params.max_tokens <= 0
        ]
        new = [p for p in new if p.params.max_tokens > 0]
        engine = self.engine
        in_flight = [r.request for r in engine.rows] + new
        try:
            if new:
                engine.stats.admitted_at.append(engine.stats.steps)
                engine.admit(new)
            elif engine.rows:
                engine.step()
            else:
                return results
            engine.stats.steps += 1
        except Exception as e:  # fail the requests in flight, keep serving the queue
            engine.reset()
            return results + [(p.future, e) for p in in_flight]
        finished = engine.pop_finished(abandoned=lambda p: p.future.done())
        return results + [(row.request.future, self._completion(row)) for row in finished]

    def _completion(self, row: Row) -> Completion:
        ids = tuple(row.ids)
        body = ids[:-1] if row.finish == "stop" else ids
        return Completion(
            text=self.tokenizer.decode(list(body), skip_special_tokens=False),
            token_ids=ids,
            logprobs=tuple(row.logprobs),
            finish_reason=row.finish or "length",
            prompt_tokens=len(row.request.prompt_ids),
            completion_tokens=len(ids),
        )


def _resolve(future: asyncio.Future[Completion], outcome: Completion | BaseException) -> None:
    """Settle a future on its own event loop's thread (a caller may run another loop)."""

    def settle() -> None:
        if future.done():  # its caller was cancelled
            return
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)

    with contextlib.suppress(RuntimeError):  # its event loop has closed: nobody is waiting any more
        future.get_loop().call_soon_threadsafe(settle)
