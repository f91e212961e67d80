"""The paged engine (the accelerator path) computes what the per-sequence engine (the CPU path)
computes: the runner's logits equal the native runner's, the same requests sample the same tokens
with the same logprobs (one at a time, in groups, over several turns, joining mid-batch), a decode
step reads nothing back to the host, and weights refreshed in place are the new ones. Everything
runs on CPU tensors; the CUDA-only parts (graphs, sync counting) skip without a GPU."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import random

import pytest
import torch

from sage_rl.engine.cuda_step import PagedRunner
from sage_rl.engine.decoder import NativeRunner
from sage_rl.engine.engine import Engine
from sage_rl.engine.paged_engine import PagedEngine, PagedOptions, make_engine
from sage_rl.policies.base import PolicyRequest, SamplingParams
from sage_rl.policies.transformers_policy import TransformersPolicy

torch.set_num_threads(1)
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # eager flex_attention on a CPU


@dataclasses.dataclass
class Req:
    prompt_ids: list[int]
    params: SamplingParams
    seed: int


def _options(attention: str = "gather", **kw) -> PagedOptions:
    return PagedOptions(
        **{"store_bytes": 4 << 20, "page_size": 16, "max_len": 512, "attention": attention, **kw}
    )


def _run(engine, requests) -> list[tuple[list[int], list[float], str]]:
    """Admit ``requests`` and step until every one finished; (ids, logprobs, finish) each."""
    out = {}
    with torch.inference_mode():
        engine.admit(requests)
        while True:
            for row in engine.pop_finished():
                out[id(row.request)] = (row.ids, row.logprobs, row.finish)
            if not engine.rows:
                break
            engine.step()
    return [out[id(r)] for r in requests]


def _same(a, b, atol=1e-5) -> None:
    for (ids_a, lp_a, fin_a), (ids_b, lp_b, fin_b) in zip(a, b, strict=True):
        assert ids_a == ids_b and fin_a == fin_b
        assert max(abs(x - y) for x, y in zip(lp_a, lp_b, strict=True)) < atol


def _requests(n: int, prompt: list[int], stop_early: bool = False) -> list[Req]:
    out = []
    for i in range(n):
        params = SamplingParams(temperature=[1.0, 0.0, 0.8][i % 3], max_tokens=12 + 3 * i, seed=i)
        out.append(Req(prompt + [100 + i], params, 1000 + i))
    return out


@pytest.mark.parametrize("attention", ["gather", "flex"])
def test_the_runner_over_the_store_equals_the_per_row_runner(tiny, attention):
    """Prefill (chunks of several sequences together) and decode steps: the same float32 logits
    as ``NativeRunner``'s per-row path, for rows of different lengths sharing a prompt's pages."""
    model = tiny[0]
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 5000, (n,), generator=g).tolist() for n in (37, 20, 5)]
    prompts[1][:16] = prompts[0][:16]  # shared first page
    with torch.inference_mode():
        native = NativeRunner(model)
        caches = [native.new_cache() for _ in prompts]
        want = native.prefill_many(caches, prompts)
        runner = PagedRunner(model, 4 << 20, rows=4, max_len=256, page_size=16, attention=attention)
        store = runner.store
        seqs = [store.new_seq(), None, store.new_seq()]
        for j in (0, 2):
            store.reserve(seqs[j], len(prompts[j]) + 8)
        got0 = runner.prefill_many([seqs[0], seqs[2]], [prompts[0], prompts[2]])
        seqs[1] = store.fork(seqs[0], 16)  # the shared page, by reference
        store.reserve(seqs[1], len(prompts[1]) - 16 + 8)
        got1 = runner.prefill_many([seqs[1]], [prompts[1][16:]])
        assert torch.allclose(got0, want[[0, 2]], atol=1e-5) and torch.allclose(got1[0], want[1], atol=1e-5)
        b = runner.buf
        b.tokens[:3] = torch.tensor([7, 8, 9])
        b.lengths[:3] = torch.tensor([len(s) for s in seqs])
        b.table[:3, :4] = torch.tensor([s.pages + [0] * (4 - len(s.pages)) for s in seqs])
        runner.set_page_of(3, 4)
        last = [7, 8, 9]
        for _ in range(5):  # greedy steps (the buffers' defaults)
            want = native.decode(caches, last)
            runner.decode_step(4, 4, filtered=False)
            tokens = b.out[:3, 0].long()
            assert torch.equal(tokens, want.argmax(-1))
            last = tokens.tolist()


@pytest.mark.parametrize("attention", ["gather", "flex"])
def test_the_paged_engine_samples_what_the_engine_samples(tiny, attention):
    model, tok = tiny
    prompt = random.Random(0).sample(range(1000, 9000), 40)
    requests = _requests(5, prompt)
    want = _run(Engine(model, stop_ids=[]), requests)
    _same(want, _run(PagedEngine(model, stop_ids=[], max_batch=8, options=_options(attention)), requests))


def test_turns_reuse_their_pages_and_rows_join_a_running_batch(tiny):
    """Three turns of three episodes, with stop ids on, two episodes admitted in a later step:
    the same tokens as the per-sequence engine, and later turns prefill only the new tokens."""
    model, tok = tiny
    rng = random.Random(1)
    first = [rng.sample(range(1000, 9000), 30 + 7 * e) for e in range(3)]
    stop = [tok.eos_token_id, 2000, 3000]

    def play(engine):
        seqs, out = [list(p) for p in first], []
        for turn in range(3):
            reqs = [
                Req(list(s), SamplingParams(temperature=1.0, max_tokens=10, seed=e), 10 * turn + e)
                for e, s in enumerate(seqs)
            ]
            done = {}
            with torch.inference_mode():
                engine.admit(reqs[:1])
                engine.step()
                engine.admit(reqs[1:])  # joins the running batch
                while len(done) < 3:
                    for row in engine.pop_finished():
                        done[id(row.request)] = (row.ids, row.logprobs, row.finish)
                    if engine.rows:
                        engine.step()
            results = [done[id(r)] for r in reqs]
            out += results
            seqs = [s + ids + [50, 51, 52] for s, (ids, _, _) in zip(seqs, results, strict=True)]
        return out

    paged = PagedEngine(model, stop_ids=stop, max_batch=4, options=_options())
    _same(play(Engine(model, stop_ids=stop)), play(paged))
    assert paged.stats.reused_tokens > sum(len(p) for p in first)  # turns 2 and 3 reuse their pages


def test_a_group_shares_its_prompt_pages(tiny):
    model = tiny[0]
    prompt = random.Random(2).sample(range(1000, 9000), 70)
    group = [Req(list(prompt), SamplingParams(temperature=1.0, max_tokens=6, seed=None), s) for s in range(4)]
    engine = PagedEngine(model, stop_ids=[], max_batch=4, options=_options())
    _same(_run(Engine(model, stop_ids=[]), group), _run(engine, group))
    assert engine.stats.prefill_tokens < 2 * len(prompt)  # prefilled once (+ each last token)
    parked = list(engine.store._parked.values())
    shared = set.intersection(*(set(seq.pages) for seq in parked))
    assert len(parked) == 4 and len(shared) == 69 // 16  # its full pages, held once
    assert all(engine.store.refs[p] == 4 for p in shared)


def test_abandoned_rows_leave_and_give_their_pages_back(tiny):
    model = tiny[0]
    engine = PagedEngine(model, stop_ids=[], max_batch=4, options=_options())
    reqs = _requests(3, list(range(2000, 2030)))
    with torch.inference_mode():
        engine.admit(reqs)
        engine.step()
        engine.step()
        gone = engine.pop_finished(abandoned=lambda r: r is reqs[1])
        assert [r.request for r in gone] == [reqs[1]] and len(engine.rows) == 2
        while engine.rows:
            engine.step()
            engine.pop_finished()
        engine.store.clear()
    assert engine.store.free_pages == engine.store.pages - 1


@pytest.mark.parametrize("attention", ["gather", "flex"])
def test_a_decode_step_reads_nothing_back_to_the_host(tiny, monkeypatch, attention):
    """By structure, on a CPU: every way a tensor reaches Python fails inside the step."""
    model = tiny[0]
    engine = PagedEngine(model, stop_ids=[], max_batch=4, options=_options(attention))
    reqs = _requests(3, list(range(3000, 3020)))
    with torch.inference_mode():
        engine.admit(reqs)
        engine.step()  # composes the batch (host work outside the step)
        runner = engine.runner

        def refuse(*a, **k):
            raise AssertionError("a host read inside the decode step")

        with monkeypatch.context() as m:
            for name in ("item", "tolist", "__bool__", "__int__", "__float__", "numpy", "__index__"):
                m.setattr(torch.Tensor, name, refuse)
            runner.decode_step(4, 2, filtered=True)


def test_weights_refreshed_in_place_are_the_new_ones(tiny):
    """After an optimizer step and ``weights_changed()``, the paged engine samples what a fresh
    per-sequence engine on the updated model samples; its weight buffers kept their addresses."""
    model = copy.deepcopy(tiny[0])
    engine = PagedEngine(model, stop_ids=[], max_batch=4, options=_options())
    addresses = [w.data_ptr() for w in engine.runner._weights]
    reqs = _requests(3, list(range(4000, 4030)))
    before = _run(engine, reqs)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model.train()
    out = model(input_ids=torch.tensor([list(range(4000, 4030))]))
    out.logits.logsumexp(-1).mean().backward()
    opt.step()
    model.eval()
    engine.weights_changed()
    after = _run(engine, reqs)
    _same(after, _run(Engine(model, stop_ids=[]), reqs))
    assert after != before and [w.data_ptr() for w in engine.runner._weights] == addresses


def test_the_policy_picks_the_paged_engine_on_cuda_only(tiny):
    model, tok = tiny
    assert isinstance(TransformersPolicy(model, tok).engine, Engine)  # the CPU path is unchanged
    policy = TransformersPolicy(model, tok, stop_ids=(), engine=_options())
    assert isinstance(policy.engine, PagedEngine)
    prompt = tuple(range(5000, 5025))
    params = SamplingParams(temperature=1.0, max_tokens=8, seed=3)
    got = asyncio.run(policy.generate(PolicyRequest((), prompt, params)))
    want = asyncio.run(
        TransformersPolicy(model, tok, stop_ids=()).generate(PolicyRequest((), prompt, params))
    )
    assert got.token_ids == want.token_ids
    with pytest.raises(ValueError, match="engine must be one of"):
        make_engine(model, (), None, 1 << 20, 4, "fast")


def test_a_request_longer_than_the_store_allows_is_refused(tiny):
    engine = PagedEngine(tiny[0], stop_ids=[], max_batch=2, options=_options())
    with pytest.raises(ValueError, match="max_len 512"):
        engine.admit([Req(list(range(500)), SamplingParams(max_tokens=20), 0)])


@cuda
@pytest.mark.parametrize("attention", ["gather", "flex"])
def test_on_cuda_graphs_sample_what_the_cpu_path_samples(tiny, attention):
    """Float32 on the GPU, graphs captured: greedy tokens equal to the per-sequence engine's on
    the CPU; and an eager step makes no host synchronisation (torch's sync debug mode)."""
    model = copy.deepcopy(tiny[0]).cuda()
    requests = _requests(5, list(range(6000, 6040)))
    greedy = [dataclasses.replace(r, params=dataclasses.replace(r.params, temperature=0.0)) for r in requests]
    want = _run(Engine(tiny[0], stop_ids=[]), greedy)
    engine = PagedEngine(model, stop_ids=[], max_batch=8, options=_options(attention))
    got = _run(engine, greedy)
    assert [g[0] for g in got] == [w[0] for w in want] and engine.graphs.captures > 0
    eager = PagedEngine(model, stop_ids=[], max_batch=8, options=_options(attention, graphs=False))
    with torch.inference_mode():
        eager.admit(requests)
        eager.step()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            eager.runner.decode_step(8, 4, filtered=False)
        finally:
            torch.cuda.set_sync_debug_mode("default")
