"""Retrieval: which library skills a new task sees (SAGE.md section 8; issue 4, "Retrieval").

One interface, ``Retriever.retrieve(context, library, k=None) -> list[Skill]`` (``k`` defaults to
the config's). Strategies:

- ``same_scenario``: skills made in the task's own scenario (``provenance.scenario_id``), most
  useful first (the paper's ideal default: it uses scenario labels);
- ``query_ngram``: Jaccard similarity between the word n-gram sets of the new instruction and of
  earlier instructions (``context.history``); entries at or above the threshold (and above 0),
  most similar first (ties: most recent first), contribute the skills they made;
- ``query_embedding``: the same, by cosine similarity of sentence embeddings;
- ``skill_embedding``: cosine similarity between the instruction and each skill's text;
- ``bm25``: BM25 (``bm25s``) of the instruction against each skill's name, signature and
  docstring (beyond the paper);
- ``none``: nothing.

The top ``k`` skills are followed by the skills they depend on (``depends_on``, transitively) that
are in the library and not yet chosen, so the list always runs in a fresh interpreter; it can
therefore hold more than ``k`` skills.

A retriever is shared by many chains, each with its own library, so indexes are cached per
library object (weakly) and rebuilt when ``library.revision`` moves; history indexes are extended
when a chain's history grows and rebuilt when it changed. Lexical strategies use inverted indexes,
so a query touches only entries sharing a term with it. Embedding models live in ``embed``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from sage_rl.config import Section
from sage_rl.skills.embed import Embedder
from sage_rl.skills.query import (
    STOPWORDS,
    EmbeddingIndex,
    HistoryIndex,
    NgramIndex,
    QueryEmbedding,
    QueryNgram,
    ngrams,
    skills_of_entries,
    words,
)
from sage_rl.skills.ranking import (
    BM25,
    HistoryEntry,
    NoRetrieval,
    Retriever,
    SameScenario,
    SkillEmbedding,
    TaskContext,
    with_dependencies,
)

__all__ = [
    "BM25",
    "STOPWORDS",
    "STRATEGIES",
    "EmbeddingIndex",
    "HistoryEntry",
    "HistoryIndex",
    "NgramIndex",
    "NoRetrieval",
    "QueryEmbedding",
    "QueryNgram",
    "RetrievalConfig",
    "Retriever",
    "SameScenario",
    "SkillEmbedding",
    "Strategy",
    "TaskContext",
    "make_retriever",
    "ngrams",
    "skills_of_entries",
    "with_dependencies",
    "words",
]

Strategy = Literal["same_scenario", "query_ngram", "query_embedding", "skill_embedding", "bm25", "none"]
STRATEGIES: tuple[str, ...] = (
    "same_scenario",
    "query_ngram",
    "query_embedding",
    "skill_embedding",
    "bm25",
    "none",
)


class RetrievalConfig(Section):
    """The ``retrieval`` config section."""

    strategy: Strategy = "same_scenario"
    k: int = Field(default=5, ge=0, description="skills shown to a task (before their dependencies)")
    ngram_n: int = Field(default=1, ge=1, le=6, description="words per n-gram for query_ngram")
    ngram_threshold: float = Field(default=0.1, ge=0.0, le=1.0, description="least Jaccard similarity")
    ngram_stopwords: bool = Field(default=True, description="drop common function words before n-grams")
    embedding_model: str = Field(
        default="", description="sentence-transformers model path; '' = packaged MiniLM"
    )
    embedding_threshold: float = Field(default=-1.0, ge=-1.0, le=1.0, description="least cosine similarity")


def make_retriever(cfg: RetrievalConfig, embedder: Embedder | None = None) -> Retriever:
    """The retriever ``cfg.strategy`` names. Embedding strategies load the configured model
    lazily, on first use, unless an ``embedder`` is given."""
    if cfg.strategy in ("query_embedding", "skill_embedding") and embedder is None:
        from sage_rl.skills.embed import SentenceEmbedder

        embedder = SentenceEmbedder(cfg.embedding_model or None)
    match cfg.strategy:
        case "same_scenario":
            return SameScenario(cfg.k)
        case "query_ngram":
            return QueryNgram(cfg.k, cfg.ngram_n, cfg.ngram_threshold, cfg.ngram_stopwords)
        case "query_embedding":
            return QueryEmbedding(embedder, cfg.k, cfg.embedding_threshold)  # type: ignore[arg-type]
        case "skill_embedding":
            return SkillEmbedding(embedder, cfg.k, cfg.embedding_threshold)  # type: ignore[arg-type]
        case "bm25":
            return BM25(cfg.k)
        case "none":
            return NoRetrieval()
    raise ValueError(f"unknown retrieval strategy {cfg.strategy!r}")
