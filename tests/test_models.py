"""Model and tokenizer loading: tiny models are deterministic, caches round-trip exactly."""

from __future__ import annotations

import pytest
import torch

from sage_rl.models import ModelLoadError, load_model, save_plain, tiny_model

torch.set_num_threads(1)


def _params_equal(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(
        torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )


def test_tiny_model_is_deterministic_per_seed_and_leaves_global_rng_alone(tiny):
    model0, _ = tiny
    state = torch.random.get_rng_state()
    again, _ = tiny_model(seed=0)
    other, _ = tiny_model(seed=1)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert _params_equal(model0, again)
    assert not torch.equal(model0.lm_head.weight, other.lm_head.weight)


def test_tiny_model_is_small_and_uses_smollm2_vocab_and_chat_template(tiny):
    model, tok = tiny
    assert model.config.num_hidden_layers == 2 and model.config.hidden_size == 64
    assert model.config.vocab_size == len(tok) == 49152
    assert sum(p.numel() for p in model.parameters()) < 5_000_000
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert tok.convert_ids_to_tokens([tok.eos_token_id]) == ["<|im_end|>"]


def test_save_plain_then_load_model_gives_identical_logits(tiny, tmp_path):
    model, tok = tiny
    save_plain(model, tmp_path)
    tok.save_pretrained(tmp_path)
    loaded, loaded_tok = load_model(tmp_path)
    ids = torch.tensor([tok.encode("def add(a, b):\n    return a + b")])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)
    assert loaded_tok.encode("hello world") == tok.encode("hello world")
    assert not loaded.training


def _loaded_as_vllm_does(model_cls, config, folder):
    """A model built from ``folder`` the way vLLM's and SGLang's Llama loaders read a checkpoint:
    every tensor by its own name, ``lm_head.weight`` skipped when the config ties the embeddings
    (the head is then the embedding), and every parameter must have been read."""
    from safetensors.torch import load_file

    torch.manual_seed(123)  # whatever the file does not supply stays random
    fresh = model_cls(config)
    params = dict(fresh.named_parameters())  # a tied head is listed once, as the embedding
    read = set()
    for name, tensor in load_file(str(folder / "model.safetensors")).items():
        if config.tie_word_embeddings and name == "lm_head.weight":
            continue
        with torch.no_grad():
            params[name].copy_(tensor)
        read.add(name)
    assert read == set(params), f"never read from the file: {sorted(set(params) - read)}"
    return fresh


def test_a_tied_model_is_saved_under_the_embeddings_name_so_vllm_style_loaders_read_it(tiny, tmp_path):
    from safetensors.torch import load_file

    model, tok = tiny
    assert model.config.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight
    save_plain(model, tmp_path)
    stored = load_file(str(tmp_path / "model.safetensors"))
    assert "model.embed_tokens.weight" in stored and "lm_head.weight" not in stored  # once, as the source
    assert len(stored) == len(model.state_dict()) - 1
    served = _loaded_as_vllm_does(type(model), model.config, tmp_path)
    ids = torch.tensor([tok.encode("def add(a, b):")])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, served(ids).logits)


def test_an_untied_model_keeps_its_head_and_its_embedding(tmp_path):
    from safetensors.torch import load_file
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False)  # fmt: skip
    model = LlamaForCausalLM(config)
    assert not torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)
    save_plain(model, tmp_path)
    stored = load_file(str(tmp_path / "model.safetensors"))
    assert torch.equal(stored["lm_head.weight"], model.lm_head.weight)
    assert torch.equal(stored["model.embed_tokens.weight"], model.model.embed_tokens.weight)
    served = _loaded_as_vllm_does(LlamaForCausalLM, config, tmp_path)
    ids = torch.tensor([[1, 5, 9, 3]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, served(ids).logits)


def test_empty_tensors_are_each_kept_under_their_own_name():
    """Two empty parameters have the same (null) storage pointer but share nothing: both are saved."""
    from sage_rl.models import untied_state

    m = torch.nn.Module()
    m.a, m.b = torch.nn.Parameter(torch.empty(0)), torch.nn.Parameter(torch.empty(0, 3))
    m.c = torch.nn.Parameter(torch.empty(0))
    assert sorted(untied_state(m)) == ["a", "b", "c"]


def test_load_model_names_a_missing_path(tmp_path):
    with pytest.raises(ModelLoadError, match="nope"):
        load_model(tmp_path / "nope")
    with pytest.raises(ModelLoadError, match=r"missing\.gguf"):
        load_model(tmp_path / "missing.gguf")


@pytest.mark.slow
def test_embedded_smollm2_cache_matches_the_gguf_exactly():
    from transformers import AutoModelForCausalLM

    from sage_rl.models import smollm2_gguf_path

    model, tok = load_model()  # cached safetensors (built on first use)
    gguf = smollm2_gguf_path()
    direct = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    ids = torch.tensor([tok.encode("print('hello')")])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, direct.eval()(ids).logits)
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(134.5e6, rel=0.01)


def test_the_token_counter_counts_as_the_tokenizer_does(tiny, tmp_path):
    """`token_counter` (the `tokenizers` library alone, on the embedded GGUF's cached tokenizer)
    against the tokenizer's own `encode`; a model folder counts with its tokenizer."""
    from sage_rl.models import load_tokenizer, token_counter

    texts = ["", " ", "  two leading", "trailing  ", "\n\n\tx = 1", "ünïcödé ✓ 日本語", "<|im_start|>user\nhi",
             "def f(a):\n    return apis.notes.search(query=a)['results']", "x" * 3000]  # fmt: skip
    tok = load_tokenizer()
    count = token_counter()
    assert [count(t) for t in texts] == [len(tok.encode(t, add_special_tokens=False)) for t in texts]
    assert count("<|im_start|>user\nhi") > 1 and count("") == 0
    save_plain(tiny[0], tmp_path / "m")
    tiny[1].save_pretrained(tmp_path / "m")
    assert [token_counter(tmp_path / "m")(t) for t in texts] == [count(t) for t in texts]
    with pytest.raises(ModelLoadError, match="does not exist"):  # no tokenizer.json: the tokenizer's own path
        token_counter(tmp_path / "missing")
