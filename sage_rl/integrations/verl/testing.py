"""Fakes of the two verl services the adapter talks to, for CPU tests (and for debugging a config).

- ``FakeServerManager``: verl's LLM server client as an agent loop sees it. It returns scripted
  replies as token ids with made-up logprobs, like a vLLM server with ``calculate_log_probs``.
- ``InMemoryTQ``: TransferQueue's key-value interface, in memory. It returns what the real one
  returns (tensors as jagged nested tensors, everything else as ``NonTensorStack``);
  tests/test_verl_tq.py checks that against a real TransferQueue on a local Ray cluster.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict
from transfer_queue import KVBatchMeta
from verl.workers.rollout.replica import TokenOutput

#: reply(request_id, episode, turn) -> the text the fake model "samples"
Reply = Callable[[str, int, int], str]


class FakeServerManager:
    """``generate(request_id, *, prompt_ids, sampling_params)`` -> ``TokenOutput``.

    A request whose prompt does not extend the previous sequence of the same request id starts a
    new episode (the next task of the chain). The reply text is tokenised alone and followed by
    ``eot_id``, cut at ``max_tokens`` (then without ``eot_id``, as a length stop). Logprob of the
    i-th sampled token: ``-0.01 * (i + 1)``. ``calls`` records every request.
    """

    def __init__(self, tokenizer: Any, reply: Reply, eot_id: int, global_steps: int = 3) -> None:
        self.tokenizer, self.reply, self.eot_id, self.global_steps = tokenizer, reply, eot_id, global_steps
        self.calls: list[dict[str, Any]] = []
        self._state: dict[str, tuple[list[int], int, int]] = {}  # request -> (sequence, episode, turn)

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict, **_: Any):
        seq, episode, turn = self._state.get(request_id, ([], -1, 0))
        if not seq or prompt_ids[: len(seq)] != seq:
            episode, turn = episode + 1, 0
        text = self.reply(request_id, episode, turn)
        ids = list(self.tokenizer.encode(text, add_special_tokens=False)) + [self.eot_id]
        ids = ids[: sampling_params["max_tokens"]]
        self.calls.append(
            {
                "request_id": request_id,
                "prompt_ids": list(prompt_ids),
                "params": dict(sampling_params),
                "token_ids": ids,
            }
        )
        self._state[request_id] = (list(prompt_ids) + ids, episode, turn + 1)
        steps = {"global_steps": self.global_steps, "min_global_steps": self.global_steps}
        return TokenOutput(
            token_ids=ids,
            log_probs=[-0.01 * (i + 1) for i in range(len(ids))],
            stop_reason="completed",
            extra_fields={**steps, "max_global_steps": self.global_steps},
        )


def _rows_of(value: Any, n: int) -> list[Any]:
    if isinstance(value, torch.Tensor):
        return list(value.unbind())
    if isinstance(value, NonTensorData):
        return [value.data] * n
    if isinstance(value, NonTensorStack):
        return value.tolist()
    raise TypeError(f"unsupported field type {type(value).__name__}")


def _stack(values: Sequence[Any]) -> Any:
    if all(isinstance(v, torch.Tensor) for v in values):
        if all(v.dim() == 0 for v in values):
            return torch.stack(list(values))
        return torch.nested.as_nested_tensor(list(values), layout=torch.jagged)
    return NonTensorStack(*values)


class InMemoryTQ:
    """The subset of ``transfer_queue``'s module API that verl's V1 trainer and worker use."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
        self.tags: dict[str, dict[str, dict]] = defaultdict(dict)

    def kv_batch_put(
        self, keys: Sequence[str], partition_id: str, fields: Any = None, tags: Any = None
    ) -> KVBatchMeta:
        """Store ``fields`` row by row and merge ``tags``; returns the keys' metadata, as TransferQueue."""
        for i, key in enumerate(keys):
            self.rows[partition_id].setdefault(key, {})
            if tags is not None:
                self.tags[partition_id].setdefault(key, {}).update(tags[i])
        if fields is not None:
            for name, value in fields.items():
                for key, v in zip(keys, _rows_of(value, len(keys)), strict=True):
                    self.rows[partition_id][key][name] = v
        stored = sorted(set.union(*(set(self.rows[partition_id][k]) for k in keys)))
        tags_now = [dict(self.tags[partition_id].get(k, {})) for k in keys]
        return KVBatchMeta(keys=list(keys), tags=tags_now, partition_id=partition_id, fields=stored)

    def kv_put(self, key: str, partition_id: str, fields: Any = None, tag: dict | None = None) -> KVBatchMeta:
        return self.kv_batch_put([key], partition_id, fields, None if tag is None else [tag])

    def kv_batch_get(self, keys: Sequence[str], partition_id: str, select_fields: Any = None) -> TensorDict:
        store = self.rows[partition_id]
        missing = [k for k in keys if k not in store]
        if missing:
            raise KeyError(f"keys not in partition {partition_id!r}: {missing[:3]}")
        # as TransferQueue: only fields that every requested key has come back (unknown ones are dropped)
        common = set.intersection(*(set(store[k]) for k in keys))
        wanted = [select_fields] if isinstance(select_fields, str) else select_fields
        names = [n for n in (wanted if wanted is not None else sorted(common)) if n in common]
        return TensorDict({n: _stack([store[k][n] for k in keys]) for n in names}, batch_size=[len(keys)])

    def init(self, *_: Any, **__: Any) -> None:
        """TransferQueue's ``init``: nothing to start in memory."""

    def close(self) -> None: ...

    def kv_list(self, partition_id: str | None = None) -> dict[str, dict[str, dict]]:
        parts = [partition_id] if partition_id else list(self.tags)
        return {p: dict(self.tags[p]) for p in parts}

    def kv_clear(self, keys: Sequence[str] | str, partition_id: str) -> None:
        for key in [keys] if isinstance(keys, str) else keys:
            self.rows[partition_id].pop(key, None)
            self.tags[partition_id].pop(key, None)

    async def async_kv_batch_put(self, keys, partition_id, fields=None, tags=None) -> KVBatchMeta:
        return self.kv_batch_put(keys, partition_id, fields, tags)

    async def async_kv_put(self, key, partition_id, fields=None, tag=None) -> KVBatchMeta:
        return self.kv_put(key, partition_id, fields, tag)

    async def async_kv_batch_get(self, keys, partition_id, select_fields=None) -> TensorDict:
        return self.kv_batch_get(keys, partition_id, select_fields)


NO_CODE = "I would rather not write any code for this."
GIVE_UP = "```python\nprint('giving up')\napis.supervisor.complete_task()\n```"


def scripted(tasks_by_uid: dict[str, Sequence[Any]]) -> Reply:
    """Replies for PocketWorld chains, by session (request id ``{uid}-{session}``):

    - session 0: sage-rl's scripted expert; it defines skills in task 1 and only calls them in
      task 2 (so task 2 uses task 1's skill);
    - session 1: never writes code;
    - session 2: the expert on task 1, then completes task 2 without doing it.
    """
    from sage_rl.envs.pocketworld.expert import ScriptedExpert
    from sage_rl.envs.pocketworld.tasks import template_of

    expert = ScriptedExpert(seed=0)

    def reply(request_id: str, episode: int, turn: int) -> str:
        uid, session = request_id.rsplit("-", 1)
        if session == "1" or (session == "2" and episode == 1):
            return NO_CODE if session == "1" else GIVE_UP
        task = tasks_by_uid[uid][episode]
        library = tuple(expert.names(template_of(task), task.scenario_id).values()) if episode else ()
        plan = expert.plan(task, library)
        return f"```python\n{plan[min(turn, len(plan) - 1)]}\n```"

    return reply


# --------------------------------------------------------------------------------------------
# Builders: verl's own worker and trainer objects around the fakes, without Ray or GPUs
# --------------------------------------------------------------------------------------------

#: Modules of verl (and of this adapter) that call TransferQueue through a module-level ``tq``.
TQ_MODULES = (
    "verl.trainer.ppo.v1.trainer_base",
    "verl.trainer.ppo.v1.agent_loop_tq",
    "verl.trainer.ppo.padding_utils",
    "sage_rl.integrations.verl.trainer",
)


def use_tq(fake: InMemoryTQ, monkeypatch: Any) -> InMemoryTQ:
    """Point every ``tq`` user at ``fake`` (``monkeypatch``: pytest's fixture)."""
    import importlib

    for name in TQ_MODULES:
        monkeypatch.setattr(importlib.import_module(name), "tq", fake)
    return fake


def save_tiny_model(folder: Any, seed: int = 0) -> str:
    """sage-rl's tiny random Llama with the SmolLM2 tokenizer, saved as an HF folder verl can load."""
    from sage_rl.models import tiny_model

    model, tok = tiny_model(seed)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def make_worker(config: Any, server: Any) -> Any:
    """verl's V1 agent-loop worker (``AgentLoopWorkerTQ``) as a plain object, Ray left out."""
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

    return AgentLoopWorkerTQ.__ray_actor_class__(config, server)


async def rollout(worker: Any, batch: TensorDict) -> None:
    """``worker.generate_sequences(batch)`` and wait for its fire-and-forget sessions."""
    import asyncio

    await worker.generate_sequences(batch)
    while worker.background_tasks:
        await asyncio.gather(*list(worker.background_tasks))


def make_trainer(config: Any, global_steps: int = 1) -> Any:
    """A ``SageTrainer`` built by its constructor, with its tokenizer and data loaders but no
    workers (verl's ``init()`` would start them on GPUs)."""
    from sage_rl.integrations.verl.trainer import SageTrainer

    trainer = SageTrainer(config)
    trainer.global_steps = global_steps
    trainer._init_tokenizer()
    trainer._init_dataloader()
    return trainer
