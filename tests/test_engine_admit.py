"""Admissions: the requests admitted together share forward passes, and sample what they would alone."""

from __future__ import annotations

import dataclasses

import torch

from sage_rl.engine.engine import Engine
from sage_rl.policies.base import SamplingParams


@dataclasses.dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    seed: int


def _engine(model):
    engine = Engine(model, stop_ids=())
    forward, engine.forwards = engine.runner._forward, []

    def counted(ids, *args, **kwargs):
        engine.forwards.append(len(ids))
        return forward(ids, *args, **kwargs)

    engine.runner._forward = counted
    return engine


def test_requests_admitted_together_share_forward_passes_and_sample_as_alone(tiny):
    model, _ = tiny
    params = SamplingParams(temperature=1.0, max_tokens=4)
    system = [(7 * k) % 900 + 5 for k in range(40)]
    prompts = [system + [11, 12, 13], [3, 4, 5, 6, 7], [9] * 30, system + [21, 22]]
    requests = [_Request(p, params, seed=s) for s, p in enumerate(prompts)]
    with torch.inference_mode():
        together = _engine(model)
        together.admit(requests)
        # Wave 1: the three prompts with nothing in common, in one pass; wave 2: the last one,
        # which waited to copy the 40 system tokens from the first instead of prefilling them.
        assert together.forwards == [43 + 5 + 30, 2]
        assert together.stats.prefill_tokens == 43 + 5 + 30 + 2
        assert together.stats.reused_tokens == 40
        for _ in range(3):
            together.step()
        for request, row in zip(requests, together.rows, strict=True):
            alone = _engine(model)
            alone.admit([request])
            for _ in range(3):
                alone.step()
            assert alone.rows[0].ids == row.ids
            assert torch.allclose(torch.tensor(alone.rows[0].logprobs), torch.tensor(row.logprobs), atol=1e-5)
