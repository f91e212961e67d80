"""The sampling engine: its forward pass equals transformers', cache reuse changes nothing, the
sampler draws from the documented distribution, and stale caches are never used."""

from __future__ import annotations

import asyncio
import copy
import random

import numpy as np
import pytest
import torch

from sage_rl.engine import decoder
from sage_rl.engine.decoder import NativeRunner, native_unsupported
from sage_rl.engine.hf_runner import HFRunner
from sage_rl.engine.kv import KVCache, PrefixStore, common_prefix
from sage_rl.engine.sampler import draw
from sage_rl.policies.base import PolicyRequest, SamplingParams
from sage_rl.policies.transformers_policy import TransformersPolicy, resolve_dtype

torch.set_num_threads(1)


def _tiny(kind: str):
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    config_cls, model_cls = {
        "llama": (LlamaConfig, LlamaForCausalLM),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),  # q/k/v biases
        "qwen3": (Qwen3Config, Qwen3ForCausalLM),  # q/k RMS norms
    }[kind]
    config = config_cls(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=256,
        tie_word_embeddings=kind != "qwen2",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = model_cls(config).eval()
        for p in model.parameters():  # random biases and norms too, so that they matter
            p.data.add_(torch.randn_like(p) * 0.05)
    return model


def _reference_logits(model, ids):
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0].float()


@pytest.mark.parametrize("mode", ["pooled", "per-row", "padded"])
@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_native_forward_equals_transformers(kind, mode, monkeypatch):
    """Prefill and decode equal transformers' forward; decode attention over the caches seated in
    one pool (the CPU path), per row over each cache, and over the caches padded into one batch
    (the accelerator path, forced here)."""
    monkeypatch.setattr(decoder, "PREFILL_CHUNK", 4)  # the 11-token prefill runs in 3 chunks
    model = _tiny(kind)
    assert native_unsupported(model) is None
    ids = [int(i) for i in torch.randint(0, 96, (20,), generator=torch.Generator().manual_seed(1))]
    ref = _reference_logits(model, ids)
    with torch.inference_mode():
        runner = NativeRunner(model)
        assert not runner.padded_decode and runner.pool is not None  # on a CPU
        runner.padded_decode = mode == "padded"
        if mode != "pooled":
            runner.pool = None
        a, b = runner.new_cache(), runner.new_cache()
        got = [runner.prefill(a, ids[:11]), runner.prefill(b, ids[:5])]
        assert torch.allclose(got[0], ref[10], atol=1e-5) and torch.allclose(got[1], ref[4], atol=1e-5)
        for t in range(11, 20):  # two sequences of different lengths decoded together
            step = runner.decode([a, b], [ids[t], ids[t - 6]])
            assert torch.allclose(step[0], ref[t], atol=1e-5)
            assert torch.allclose(step[1], ref[t - 6], atol=1e-5)
    assert a.ids == ids and b.ids == ids[:14]


def test_the_transformers_runner_equals_the_native_one(tiny):
    model = tiny[0]
    ids = list(range(300, 340))
    with torch.inference_mode():
        native, hf = NativeRunner(model), HFRunner(model)
        ca, cb = native.new_cache(), hf.new_cache()
        assert torch.allclose(native.prefill(ca, ids[:30]), hf.prefill(cb, ids[:30]), atol=1e-4)
        for t in range(30, 40):
            assert torch.allclose(native.decode([ca], [ids[t]]), hf.decode([cb], [ids[t]]), atol=1e-4)
    assert torch.allclose(ca.kv[:, :, :, :40], cb.kv[:, :, :, :40], atol=1e-5)


def test_unsupported_architectures_are_named():
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50))
    assert "gpt2" in native_unsupported(gpt2)
    with pytest.raises(ValueError, match="gpt2"):
        NativeRunner(gpt2)


def test_a_lora_model_samples_from_its_adapters(tiny):
    # peft wraps the projections; the native runner folds the active adapters into its weights.
    # Non-zero B matrices make the adapters change the logits.
    from peft import LoraConfig, get_peft_model

    model, tok = copy.deepcopy(tiny[0]), tiny[1]
    lora = get_peft_model(model, LoraConfig(r=4, target_modules="all-linear"))
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(0))
    policy = TransformersPolicy(lora, tok, stop_ids=())
    assert isinstance(policy.engine.runner, NativeRunner)
    prompt = tok.encode("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n")
    greedy = PolicyRequest((), tuple(prompt), SamplingParams(temperature=0.0, max_tokens=5))

    def check(out):  # greedy, token by token, through peft's own forward
        seq = list(prompt)
        for token in out.token_ids:
            assert token == int(torch.argmax(_reference_logits(lora, seq)[-1]))
            seq.append(token)

    adapted = asyncio.run(policy.generate(greedy))
    check(adapted)
    with lora.disable_adapter():  # no parameter changes, but the model computes something else
        policy.weights_changed()  # whoever switches the adapters says so
        base = asyncio.run(policy.generate(greedy))
        check(base)
    assert base.token_ids != adapted.token_ids  # so the checks above are sensitive to the adapters
    policy.weights_changed()
    check(asyncio.run(policy.generate(greedy)))  # enabled again


def test_another_architecture_samples_through_its_own_forward_with_caches(tiny):
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = tiny[1]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=len(tok))).eval()
    prompt = tok.encode("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n")
    obs = tok.encode("<|im_end|>\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n")
    greedy = SamplingParams(temperature=0.0, max_tokens=6)
    policy = TransformersPolicy(gpt2, tok, stop_ids=())
    assert isinstance(policy.engine.runner, HFRunner)
    first, second, second_prompt = _turns(policy, prompt, obs, greedy)
    assert policy.stats.reused_tokens == len(prompt) + len(first.token_ids) - 1
    seq = list(second_prompt)
    for token in second.token_ids:  # the cached turn equals greedy decoding from scratch
        assert token == int(torch.argmax(_reference_logits(gpt2, seq)[-1]))
        seq.append(token)


# ------------------------------------------------------------------ caches


def _cache(ids):
    c = KVCache((1, 1, 2), torch.float32, torch.device("cpu"))
    c.reserve(len(ids))
    c.kv[:, :, :, : len(ids)] = torch.arange(len(ids), dtype=torch.float32)[:, None]
    c.ids = list(ids)
    return c


def test_cache_grows_copies_and_truncates():
    c = _cache(range(300))  # past the first capacity (256): doubled, contents kept
    assert c.kv.shape[3] == 512 and c.kv[0, 1, 0, 299, 0].item() == 299
    head = c.copy_prefix(10)
    assert head.ids == list(range(10)) and head.kv[0, 0, 0, 9, 1].item() == 9
    head.kv[0, 0, 0, 0, 0] = -1.0
    assert c.kv[0, 0, 0, 0, 0].item() == 0  # a copy, not a view
    c.truncate(5)
    assert len(c) == 5


def test_store_matches_the_longest_prefix_and_evicts_the_oldest():
    assert common_prefix([1, 2, 3], np.array([1, 2, 4, 5])) == 2
    assert common_prefix([1, 2], np.array([1, 2, 4])) == 2 and common_prefix([], np.array([1])) == 0
    a, b = _cache([1, 2, 3, 4]), _cache([1, 2, 9])
    store = PrefixStore(max_bytes=2 * a.nbytes)
    store.put(a)
    store.put(b)
    assert store.match(np.array([1, 2, 3, 4, 5])) == (a, 4)
    assert store.match(np.array([1, 2, 9, 9])) == (b, 3)
    in_use = _cache([1, 2, 3, 4, 5, 6])
    assert store.match(np.array([1, 2, 3, 4, 5, 6, 7]), [in_use]) == (in_use, 6)
    store.put(_cache([7]))  # over budget: the least recently stored goes
    assert store.match(np.array([1, 2, 3, 4]))[0] is b
    assert store.take(b) and not store.take(b) and len(store) == 1


# ------------------------------------------------------------------ sampler


def test_draw_inverts_the_cdf_with_the_row_stream():
    logits = torch.log(torch.tensor([[0.5, 0.0, 0.25, 0.25]]))  # token 1 has probability 0
    params = [SamplingParams(temperature=1.0)]

    class Fixed(random.Random):
        def __init__(self, u):
            super().__init__(0)
            self.u = u

        def random(self):
            return self.u

    # u = 0.4 -> cdf 0.5 at token 0; u = 0.51 -> token 2 (token 1 adds no mass); u = 0.8 -> token 3.
    for u, expected in ((0.0, 0), (0.4, 0), (0.51, 2), (0.74, 2), (0.8, 3), (0.999999, 3)):
        tokens, logprobs = draw(logits, params, [Fixed(u)])
        assert tokens == [expected]
        assert logprobs[0] == pytest.approx(float(logits[0, expected]), abs=1e-6)


def test_draw_frequencies_follow_the_sampling_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    params = [SamplingParams(temperature=0.5)]
    stream = random.Random(3)
    counts = np.bincount([draw(logits, params, [stream])[0][0] for _ in range(4000)], minlength=4)
    expected = torch.softmax(logits[0] / 0.5, -1).numpy()
    assert np.allclose(counts / 4000, expected, atol=0.02)


def test_draw_mixes_greedy_filtered_and_plain_rows():
    logits = torch.tensor([[0.0, 3.0, 1.0], [0.0, 3.0, 1.0], [0.0, 3.0, 1.0]])
    params = [SamplingParams(temperature=0.0), SamplingParams(top_k=1), SamplingParams(temperature=1.0)]
    streams = [random.Random(0), random.Random(0), random.Random(0)]
    tokens, logprobs = draw(logits, params, streams)
    plain = torch.log_softmax(logits[0], -1)
    assert tokens[:2] == [1, 1]
    assert logprobs[0] == pytest.approx(float(plain[1]), abs=1e-6)  # greedy: the model's own logprob
    assert logprobs[1] == pytest.approx(0.0, abs=1e-6)  # top-1 keeps one token
    assert logprobs[2] == pytest.approx(float(plain[tokens[2]]), abs=1e-6)
    assert streams[0].random() == random.Random(0).random()  # greedy consumed no draw


# ------------------------------------------------------------------ through the policy


def _turns(policy, prompt, obs, params):
    """Two turns of one episode: the second prompt continues the first exactly."""
    first = asyncio.run(policy.generate(PolicyRequest((), tuple(prompt), params)))
    second_prompt = (*prompt, *first.token_ids, *obs)
    second = asyncio.run(policy.generate(PolicyRequest((), second_prompt, params)))
    return first, second, second_prompt


@pytest.mark.parametrize("dtype, atol", [(None, 1e-4), ("bfloat16", 2e-2)], ids=["fp32", "bf16"])
def test_a_cached_turn_equals_an_uncached_one(tiny, dtype, atol):
    model, tok = tiny
    prompt = tok.encode("<|im_start|>user\nsay something<|im_end|>\n<|im_start|>assistant\n")
    obs = tok.encode("<|im_end|>\n<|im_start|>user\nok, more<|im_end|>\n<|im_start|>assistant\n")
    params = SamplingParams(temperature=1.0, max_tokens=16, seed=5)
    cached = TransformersPolicy(model, tok, stop_ids=(), dtype=dtype)
    first, second, second_prompt = _turns(cached, prompt, obs, params)
    # Only the last sampled token and the observation were computed for the second turn.
    assert cached.stats.reused_tokens == len(prompt) + len(first.token_ids) - 1
    assert cached.stats.prefill_tokens == len(prompt) + 1 + len(obs)
    fresh = TransformersPolicy(model, tok, stop_ids=(), dtype=dtype)
    fresh._child_seed(params.seed)  # the second request of the seed's stream, as in ``cached``
    alone = asyncio.run(fresh.generate(PolicyRequest((), second_prompt, params)))
    assert fresh.stats.reused_tokens == 0
    assert alone.token_ids == second.token_ids
    assert alone.logprobs == pytest.approx(second.logprobs, abs=atol)


def test_a_group_prefills_its_shared_prompt_once(tiny):
    model, tok, G = *tiny, 4
    prompt = tok.encode("<|im_start|>user\n" + "word " * 40 + "<|im_end|>\n<|im_start|>assistant\n")
    policy = TransformersPolicy(model, tok, stop_ids=())

    async def go():
        requests = [PolicyRequest((), tuple(prompt), SamplingParams(max_tokens=6, seed=1))] * G
        return await asyncio.gather(*[policy.generate(r) for r in requests])

    outs = asyncio.run(go())
    assert policy.stats.prefill_tokens == len(prompt) + (G - 1)  # the last token each
    assert len({o.token_ids for o in outs}) == G  # still G different samples
    alone = TransformersPolicy(model, tok, stop_ids=(), max_batch=1)
    for o in outs:  # each equals its request sampled alone, from scratch
        again = asyncio.run(
            alone.generate(PolicyRequest((), tuple(prompt), SamplingParams(max_tokens=6, seed=1)))
        )
        assert again.token_ids == o.token_ids
        assert again.logprobs == pytest.approx(o.logprobs, abs=1e-4)
        alone.engine.reset()


def test_new_weights_drop_every_cache(tiny):
    model, tok = copy.deepcopy(tiny[0]), tiny[1]
    prompt = tok.encode("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n")
    for dtype in (None, "bfloat16"):
        policy = TransformersPolicy(model, tok, stop_ids=(), dtype=dtype)
        params = SamplingParams(temperature=0.0, max_tokens=4)
        asyncio.run(policy.generate(PolicyRequest((), tuple(prompt), params)))
        with torch.no_grad():
            model.model.norm.weight.mul_(-1.0)  # an in-place "optimizer step"
        policy.weights_changed()  # ... announced, as the training loop's sync does
        out = asyncio.run(policy.generate(PolicyRequest((), tuple(prompt), params)))
        assert policy.stats.reused_tokens == 0 and len(policy.engine.store) == 1
        with torch.inference_mode():
            expected = int(torch.argmax(_reference_logits(model, prompt)[-1]))
        assert out.token_ids[0] == expected


def test_dtype_names():
    model = _tiny("llama")
    assert resolve_dtype(None, model) is None and resolve_dtype("model", model) is None
    assert resolve_dtype("bfloat16", model) is torch.bfloat16
    assert resolve_dtype("auto", model) in (None, torch.bfloat16)
    with pytest.raises(ValueError, match="dtype"):
        resolve_dtype("int8", model)
    with pytest.raises(ValueError, match="dtype"):
        resolve_dtype("fp17", model)
