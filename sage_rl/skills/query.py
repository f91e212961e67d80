"""Query strategies (``query_ngram``, ``query_embedding``): rank earlier instructions by their
similarity to the new one, then bring in the skills those tasks made."""

from __future__ import annotations

import re
import weakref
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from sage_rl.skills.embed import Embedder
from sage_rl.skills.library import Library
from sage_rl.skills.ranking import HistoryEntry, TaskContext, with_dependencies
from sage_rl.skills.record import Skill


def skills_of_entries(library: Library, entries: Iterable[HistoryEntry], k: int) -> list[Skill]:
    """The first ``k`` distinct skills still in the library, taken from ranked entries in order
    (from each entry, its main skills only)."""
    out: dict[str, Skill] = {}
    for e in entries:
        for s in _roots_first([library.get(n) for n in e.skills]):
            if s.name not in out:
                out[s.name] = s
                if len(out) == k:
                    return list(out.values())
    return list(out.values())


def _roots_first(skills: Sequence[Skill | None]) -> list[Skill]:
    """An entry's main skills: those no other skill of the entry depends on (all of them if a
    cycle leaves none). Its helpers are left to ``with_dependencies``, so they take no slot of k."""
    present = [s for s in skills if s is not None]
    helpers = {d for s in present for d in s.depends_on}
    return [s for s in present if s.name not in helpers] or present


#: Function words dropped by ``query_ngram`` when ``ngram_stopwords`` is on (the default): they
#: make unrelated instructions look alike ("... in my ... to the ...").
STOPWORDS = frozenset(
    [
        "a",
        "an",
        "the",
        "my",
        "me",
        "i",
        "to",
        "of",
        "in",
        "for",
        "on",
        "and",
        "or",
        "with",
        "from",
        "that",
        "this",
        "these",
        "those",
        "is",
        "are",
        "be",
        "been",
        "it",
        "its",
        "all",
        "each",
        "every",
        "any",
        "have",
        "has",
        "had",
        "do",
        "does",
        "did",
        "was",
        "were",
        "by",
        "at",
        "as",
        "so",
        "your",
        "you",
        "our",
        "we",
        "us",
    ]
)


def words(text: str, stopwords: frozenset[str] = frozenset()) -> list[str]:
    return [w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in stopwords]


def ngrams(text: str, n: int, stopwords: frozenset[str] = frozenset()) -> set[tuple[str, ...]]:
    """Word n-grams of ``text``; a text shorter than n words is one gram of all its words."""
    w = words(text, stopwords)
    if len(w) < n:
        return {tuple(w)} if w else set()
    return {tuple(w[i : i + n]) for i in range(len(w) - n + 1)}


class HistoryIndex:
    """Features of an append-only history; ``sync`` adds new entries, or rebuilds if it changed."""

    def __init__(self) -> None:
        self.entries: list[HistoryEntry] = []
        self._last: Any = None

    def sync(self, history: Sequence[Any]) -> None:
        n = len(self.entries)
        if len(history) < n or (n and history[n - 1] is not self._last and history[n - 1] != self._last):
            self.entries, n = [], 0
            self.reset()
        new = TaskContext("", "", tuple(history[n:])).entries()
        if new:
            self.entries.extend(new)
            self.extend(n, new)
            self._last = history[-1]

    def ranked(self, scores: np.ndarray, keep: np.ndarray) -> Iterator[HistoryEntry]:
        """Entries with ``keep``, by score (descending), ties most recent first. Lazy: sorts the
        best 32, then 4x more each time the consumer wants more (a full sort of 100k entries
        would dominate the query time)."""
        idx = np.flatnonzero(keep)
        done, m = 0, 32
        while done < len(idx):
            if m >= len(idx):
                top = idx
            else:  # every entry scoring at least the m-th best: ties at the cut stay together
                cut = np.partition(scores[idx], len(idx) - m)[len(idx) - m]
                top = idx[scores[idx] >= cut]
            order = top[np.lexsort((-top, -scores[top]))]
            for i in order[done:]:
                yield self.entries[i]
            done, m = len(order), m * 4

    def reset(self) -> None:
        raise NotImplementedError

    def extend(self, start: int, entries: list[HistoryEntry]) -> None:
        raise NotImplementedError


class NgramIndex(HistoryIndex):
    """Word n-gram sets of the instructions, with an inverted index from gram to entries."""

    def __init__(self, n: int, stopwords: frozenset[str] = frozenset()) -> None:
        super().__init__()
        self.n, self.stopwords = n, stopwords
        self.reset()

    def reset(self) -> None:
        self._gram_ids: dict[tuple[str, ...], int] = {}
        self._postings: list[list[int]] = []
        self._arrays: dict[int, np.ndarray] = {}
        self._sizes = np.zeros(0)

    def extend(self, start: int, entries: list[HistoryEntry]) -> None:
        sizes = []
        for i, entry in enumerate(entries, start):
            grams = ngrams(entry.instruction, self.n, self.stopwords)
            sizes.append(len(grams))
            for g in grams:
                gid = self._gram_ids.setdefault(g, len(self._gram_ids))
                if gid == len(self._postings):
                    self._postings.append([])
                self._postings[gid].append(i)
                self._arrays.pop(gid, None)
        self._sizes = np.concatenate([self._sizes, np.asarray(sizes, dtype=np.float64)])

    def similarities(self, instruction: str) -> np.ndarray:
        """Jaccard similarity of ``instruction`` with every entry (0 where nothing is shared)."""
        grams = ngrams(instruction, self.n, self.stopwords)
        q = [self._gram_ids[g] for g in grams if g in self._gram_ids]
        n = len(self.entries)
        if not q:
            return np.zeros(n)
        inter = np.bincount(np.concatenate([self._posting(g) for g in q]), minlength=n).astype(np.float64)
        union = len(grams) + self._sizes - inter
        return np.divide(inter, union, out=np.zeros(n), where=inter > 0)

    def _posting(self, gid: int) -> np.ndarray:
        arr = self._arrays.get(gid)
        if arr is None:
            arr = self._arrays[gid] = np.asarray(self._postings[gid], dtype=np.int64)
        return arr


class QueryNgram:
    """Jaccard over word n-grams of the instruction and earlier instructions."""

    def __init__(self, k: int = 5, n: int = 1, threshold: float = 0.1, stopwords: bool = True) -> None:
        self.k, self.n, self.threshold = k, n, threshold
        self.stopwords = STOPWORDS if stopwords else frozenset()
        self._indexes: weakref.WeakKeyDictionary[Library, NgramIndex] = weakref.WeakKeyDictionary()

    def index(self, context: TaskContext, library: Library) -> NgramIndex:
        idx = self._indexes.get(library)
        if idx is None:
            idx = self._indexes[library] = NgramIndex(self.n, self.stopwords)
        idx.sync(context.history)
        return idx

    def retrieve(self, context: TaskContext, library: Library, k: int | None = None) -> list[Skill]:
        k = self.k if k is None else k
        idx = self.index(context, library)
        if not idx.entries or k <= 0:
            return []
        sim = idx.similarities(context.instruction)
        keep = (sim > 0) & (sim >= self.threshold)
        return with_dependencies(skills_of_entries(library, idx.ranked(sim, keep), k), library)


class EmbeddingIndex(HistoryIndex):
    def __init__(self, embedder: Embedder) -> None:
        super().__init__()
        self.embedder = embedder
        self.matrix: np.ndarray | None = None

    def reset(self) -> None:
        self.matrix = None

    def extend(self, start: int, entries: list[HistoryEntry]) -> None:
        rows = self.embedder.embed([e.instruction for e in entries])
        self.matrix = rows if self.matrix is None else np.vstack([self.matrix, rows])


class QueryEmbedding:
    """Cosine similarity between the instruction and earlier instructions."""

    def __init__(self, embedder: Embedder, k: int = 5, threshold: float = -1.0) -> None:
        self.embedder, self.k, self.threshold = embedder, k, threshold
        self._indexes: weakref.WeakKeyDictionary[Library, EmbeddingIndex] = weakref.WeakKeyDictionary()

    def retrieve(self, context: TaskContext, library: Library, k: int | None = None) -> list[Skill]:
        k = self.k if k is None else k
        idx = self._indexes.get(library)
        if idx is None:
            idx = self._indexes[library] = EmbeddingIndex(self.embedder)
        idx.sync(context.history)
        if idx.matrix is None or k <= 0:
            return []
        sim = idx.matrix @ self.embedder.embed([context.instruction])[0]
        return with_dependencies(
            skills_of_entries(library, idx.ranked(sim, sim >= self.threshold), k), library
        )
