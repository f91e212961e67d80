"""TransformersPolicy: exact ids and logprobs, batching that changes nothing, stops, on-policy."""

from __future__ import annotations

import asyncio
import copy
import math

import pytest
import torch

from sage_rl.agent.render import ChatRenderer
from sage_rl.policies.base import Policy, PolicyRequest, SamplingParams
from sage_rl.policies.transformers_policy import TransformersPolicy, sampling_logprobs

torch.set_num_threads(1)

SEEDED = SamplingParams(temperature=1.0, max_tokens=12, seed=7)
GREEDY = SamplingParams(temperature=0.0, max_tokens=12)


@pytest.fixture(scope="module")
def prompts(tiny):
    renderer = ChatRenderer(tiny[1])
    # Different lengths, so batching left-pads.
    return [tuple(renderer.prompt_ids([{"role": "user", "content": "word " * n}])) for n in (1, 4, 9, 2, 6)]


def _req(ids, params):
    return PolicyRequest((), tuple(ids), params)


def _run_all(policy, requests):
    async def go():
        return await asyncio.gather(*[policy.generate(r) for r in requests])

    return asyncio.run(go())


def _one_by_one(policy, requests):
    return [asyncio.run(policy.generate(r)) for r in requests]


def test_sampling_logprobs_match_hand_computed_values():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    z = math.exp(2) + math.exp(1) + 1 + math.exp(-1)
    plain = sampling_logprobs(logits, SamplingParams(temperature=1.0))
    assert plain[0].item() == pytest.approx(2 - math.log(z), abs=1e-6)
    # Temperature 0.5 doubles the logits.
    z_half = math.exp(4) + math.exp(2) + 1 + math.exp(-2)
    assert sampling_logprobs(logits, SamplingParams(temperature=0.5))[1].item() == pytest.approx(
        2 - math.log(z_half), abs=1e-6
    )
    # Top-k 2 keeps {0, 1}: p(1) = e / (e^2 + e).
    top2 = sampling_logprobs(logits, SamplingParams(top_k=2))
    assert top2[1].item() == pytest.approx(1 - math.log(math.exp(2) + math.exp(1)), abs=1e-6)
    assert torch.isinf(top2[2:]).all()
    # Probabilities are .644, .237, .087, .032: top-p .6 keeps one token, .7 keeps two.
    assert sampling_logprobs(logits, SamplingParams(top_p=0.6)).tolist()[0] == pytest.approx(0.0, abs=1e-6)
    assert torch.isinf(sampling_logprobs(logits, SamplingParams(top_p=0.6))[1:]).all()
    assert torch.allclose(sampling_logprobs(logits, SamplingParams(top_p=0.7)), top2)
    # Greedy reports the model's own distribution at temperature 1.
    assert torch.allclose(sampling_logprobs(logits, SamplingParams(temperature=0.0)), plain)


def test_is_a_policy_with_the_tokenizer(tiny):
    policy = TransformersPolicy(*tiny)
    assert isinstance(policy, Policy) and policy.tokenizer is tiny[1]


@pytest.mark.parametrize("params", [SEEDED, GREEDY], ids=["seeded", "greedy"])
def test_batched_equals_unbatched(tiny, prompts, params):
    requests = [_req(p, params) for p in prompts]
    batched = _run_all(TransformersPolicy(*tiny, max_batch=8), requests)
    alone = _one_by_one(TransformersPolicy(*tiny, max_batch=1), requests)
    for a, b in zip(batched, alone, strict=True):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
        assert a.finish_reason == b.finish_reason == "length" and len(a.token_ids) == 12


def test_logprobs_match_a_separate_forward_pass(tiny, prompts):
    model, tok = tiny
    params = SamplingParams(temperature=0.7, max_tokens=10, seed=1)
    out = asyncio.run(TransformersPolicy(*tiny).generate(_req(prompts[2], params)))
    seq = torch.tensor([list(prompts[2]) + list(out.token_ids)])
    with torch.no_grad():
        logits = model(seq).logits[0, len(prompts[2]) - 1 : -1]
    expected = torch.log_softmax(logits / 0.7, dim=-1).gather(1, torch.tensor(out.token_ids)[:, None])[:, 0]
    assert torch.allclose(torch.tensor(out.logprobs), expected, atol=1e-4)
    assert out.prompt_tokens == len(prompts[2]) and out.completion_tokens == 10
    assert out.text == tok.decode(list(out.token_ids))


def test_stops_on_a_stop_id_and_on_max_tokens(tiny, prompts):
    free = asyncio.run(TransformersPolicy(*tiny).generate(_req(prompts[0], GREEDY)))
    stop = free.token_ids[3]
    first = free.token_ids.index(stop)
    policy = TransformersPolicy(*tiny, stop_ids=[stop])
    out = asyncio.run(policy.generate(_req(prompts[0], GREEDY)))
    assert out.finish_reason == "stop"
    assert out.token_ids == free.token_ids[: first + 1]  # the stop id is returned, as sampled
    assert out.text == tiny[1].decode(list(free.token_ids[:first]))  # ...but not in the text
    plain = TransformersPolicy(*tiny)
    short = asyncio.run(plain.generate(_req(prompts[0], SamplingParams(temperature=0.0, max_tokens=2))))
    assert short.token_ids == free.token_ids[:2] and short.finish_reason == "length"
    empty = asyncio.run(plain.generate(_req(prompts[1], SamplingParams(max_tokens=0))))
    assert empty.token_ids == () and empty.finish_reason == "length"


def test_many_concurrent_requests_are_batched_up_to_max_batch(tiny, prompts):
    policy = TransformersPolicy(*tiny, max_batch=4)
    requests = [_req(prompts[i % 5], SamplingParams(max_tokens=3 + i % 4, seed=i)) for i in range(18)]
    outs = _run_all(policy, requests)
    assert policy.stats.max_rows == 4
    assert [len(o.token_ids) for o in outs] == [3 + i % 4 for i in range(18)]
    # Each equals the same request sampled alone (seed i, first of its stream).
    alone = _one_by_one(TransformersPolicy(*tiny, max_batch=1), requests)
    assert [o.token_ids for o in outs] == [a.token_ids for a in alone]


@pytest.mark.parametrize("joiner", [3, 2], ids=["shorter-than-batch", "longer-than-batch"])
def test_a_request_joins_a_batch_already_sampling(tiny, prompts, joiner):
    # The joiner's prompt is narrower than the running batch's cache, or (9 words) wider: the
    # merge pads one side or the other on the left.
    policy = TransformersPolicy(*tiny, max_batch=4)
    long, short = _req(prompts[0], SamplingParams(max_tokens=300, seed=1)), _req(prompts[joiner], SEEDED)

    async def go():
        first = asyncio.create_task(policy.generate(long))
        while policy.stats.steps < 2:  # wait (on a condition) until the first one is decoding
            await asyncio.sleep(0.001)
        second = await policy.generate(short)
        return await first, second, first.done()

    first, second, _ = asyncio.run(go())
    assert len(policy.stats.admitted_at) == 2 and policy.stats.admitted_at[1] >= 2
    assert policy.stats.max_rows == 2  # it joined the running batch
    assert policy.stats.steps < 300 + len(second.token_ids)  # ...rather than waiting for it to end
    alone = _one_by_one(TransformersPolicy(*tiny, max_batch=1), [long, short])
    assert (first.token_ids, second.token_ids) == (alone[0].token_ids, alone[1].token_ids)
    assert first.logprobs == pytest.approx(alone[0].logprobs, abs=1e-4)


def test_same_seed_gives_a_group_different_samples_reproducibly(tiny, prompts):
    group = [_req(prompts[0], SEEDED)] * 4
    first = _run_all(TransformersPolicy(*tiny), group)
    again = _run_all(TransformersPolicy(*tiny), group)
    assert len({o.token_ids for o in first}) == 4
    assert [o.token_ids for o in first] == [o.token_ids for o in again]


def test_samples_from_the_current_weights_and_restores_train_mode(tiny, prompts):
    model = copy.deepcopy(tiny[0]).train()
    policy = TransformersPolicy(model, tiny[1])
    before = asyncio.run(policy.generate(_req(prompts[0], GREEDY)))
    assert model.training  # restored after sampling in eval mode
    with torch.no_grad():  # a "training step" on the same object
        model.model.norm.weight.mul_(-1.0)  # negates every logit: argmax becomes argmin
    policy.weights_changed()
    after = asyncio.run(policy.generate(_req(prompts[0], GREEDY)))
    assert after.token_ids[0] != before.token_ids[0]


def test_messages_are_rendered_when_no_prompt_ids(tiny, prompts):
    policy = TransformersPolicy(*tiny)
    messages = ({"role": "user", "content": "word "},)
    by_messages = asyncio.run(policy.generate(PolicyRequest(messages, None, GREEDY)))
    by_ids = asyncio.run(policy.generate(_req(prompts[0], GREEDY)))
    assert by_messages.token_ids == by_ids.token_ids
    assert by_messages.prompt_tokens == len(prompts[0])


def test_a_failing_batch_fails_its_requests_and_the_policy_keeps_serving(tiny, prompts, monkeypatch):
    policy = TransformersPolicy(*tiny)
    admit = policy.engine.admit

    def broken(new):
        monkeypatch.setattr(policy.engine, "admit", admit)  # once
        raise RuntimeError("the engine broke")

    monkeypatch.setattr(policy.engine, "admit", broken)
    with pytest.raises(RuntimeError, match="the engine broke"):
        asyncio.run(policy.generate(_req(prompts[1], GREEDY)))
    assert len(asyncio.run(policy.generate(_req(prompts[0], GREEDY))).token_ids) == 12


@pytest.mark.parametrize("bad", [-1, "vocab"])
def test_a_prompt_id_outside_the_vocabulary_fails_alone_with_a_clear_error(tiny, prompts, bad):
    policy = TransformersPolicy(*tiny)
    bad = policy.vocab if bad == "vocab" else bad
    requests = [_req(prompts[0], GREEDY), _req((*prompts[1][:3], bad), GREEDY), _req(prompts[2], GREEDY)]

    async def go():
        return await asyncio.gather(*[policy.generate(r) for r in requests], return_exceptions=True)

    good, failed, other = asyncio.run(go())
    assert isinstance(failed, ValueError) and f"prompt token id {bad} (at 3)" in str(failed)
    want = _one_by_one(TransformersPolicy(*tiny), [requests[0], requests[2]])
    assert [good.token_ids, other.token_ids] == [w.token_ids for w in want]  # the batch went on without it


def test_cancelled_requests_are_not_sampled(tiny, prompts):
    policy = TransformersPolicy(*tiny, batch_wait_s=0.05)

    async def go():
        tasks = [asyncio.create_task(policy.generate(_req(p, GREEDY))) for p in prompts[:3]]
        await asyncio.sleep(0)  # all three are queued; sampling has not started
        tasks[0].cancel()  # the request whose call starts the sampling thread
        return await asyncio.gather(*tasks, return_exceptions=True)

    cancelled, second, third = asyncio.run(go())
    assert isinstance(cancelled, asyncio.CancelledError)
    assert len(second.token_ids) == len(third.token_ids) == 12
    assert policy.stats.max_rows == 2 and policy.stats.steps == 12  # one prefill + 11 decode steps


def test_decode_steps_run_on_the_loops_thread_and_prefills_leave_the_loop_free(tiny, prompts):
    """Decode steps on the event loop's thread (a second thread's OpenMP team made every step
    1.3x slower); an admission's prefill on a thread of its own, so that the loop (the sandboxes'
    replies and timers) keeps running through it."""
    import threading
    import time

    policy = TransformersPolicy(*tiny)
    engine, seen = policy.engine, {"admit": set(), "step": set()}
    admit, step = engine.admit, engine.step

    def slow_admit(requests):  # a prefill of seconds, as 16 long prompts at one thread take
        seen["admit"].add(threading.get_ident())
        time.sleep(0.5)
        admit(requests)

    def step_here():
        seen["step"].add(threading.get_ident())
        step()

    engine.admit, engine.step = slow_admit, step_here

    async def go():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        beat = asyncio.create_task(ticker())
        out = await policy.generate(_req(prompts[0], GREEDY))
        beat.cancel()
        return out, ticks, threading.get_ident()

    out, ticks, loop_thread = asyncio.run(go())
    assert len(out.token_ids) == 12
    assert seen["step"] == {loop_thread} and loop_thread not in seen["admit"]
    assert ticks >= 10  # the loop ran through the 0.5 s prefill (~50 ticks; blocked: a few at most)
