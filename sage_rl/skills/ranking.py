"""Retrieval building blocks and the strategies that match skills directly (``same_scenario``,
``skill_embedding``, ``bm25``). The interface and the factory are in ``retrieval``; the strategies
that match earlier instructions are in ``query``."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np

from sage_rl.skills.embed import Embedder, skill_text
from sage_rl.skills.library import Library
from sage_rl.skills.record import Skill


@dataclass(frozen=True)
class HistoryEntry:
    """An earlier task: its instruction and the skills it made."""

    instruction: str
    scenario_id: str
    skills: tuple[str, ...]


@dataclass(frozen=True)
class TaskContext:
    """What a retriever knows about the new task. ``history`` holds the earlier tasks, oldest
    first, as ``HistoryEntry`` or as ``(task, names of the skills it made)`` pairs, where ``task``
    has ``instruction`` and ``scenario_id`` (a ``sage_rl.types.Task``)."""

    instruction: str
    scenario_id: str = ""
    history: tuple[Any, ...] = ()

    def entries(self) -> list[HistoryEntry]:
        return [
            h
            if isinstance(h, HistoryEntry)
            else HistoryEntry(h[0].instruction, h[0].scenario_id, tuple(h[1]))
            for h in self.history
        ]


class Retriever(Protocol):
    def retrieve(self, context: TaskContext, library: Library, k: int | None = None) -> list[Skill]: ...


def with_dependencies(chosen: Sequence[Skill], library: Library) -> list[Skill]:
    """``chosen`` followed by their missing dependencies from ``library`` (transitively)."""
    out = {s.name: s for s in chosen}
    todo = [d for s in chosen for d in s.depends_on]
    while todo:
        dep = library.get(todo.pop(0))
        if dep is not None and dep.name not in out:
            out[dep.name] = dep
            todo.extend(dep.depends_on)
    return list(out.values())


T = TypeVar("T")


class PerLibrary:
    """A cache of one index per library object, rebuilt when the library's revision moves."""

    def __init__(self) -> None:
        self._cache: weakref.WeakKeyDictionary[Library, tuple[int, Any]] = weakref.WeakKeyDictionary()

    def get(self, library: Library, build: Callable[[Library], T]) -> T:
        hit = self._cache.get(library)
        if hit is None or hit[0] != library.revision:
            hit = (library.revision, build(library))
            self._cache[library] = hit
        return hit[1]


class NoRetrieval:
    def retrieve(self, context: TaskContext, library: Library, k: int | None = None) -> list[Skill]:
        return []


class SameScenario:
    def __init__(self, k: int = 5) -> None:
        self.k = k
        self._indexes = PerLibrary()

    @staticmethod
    def _build(library: Library) -> dict[str, list[Skill]]:
        by_scenario: dict[str, list[Skill]] = {}
        for s in library.by_usefulness():
            by_scenario.setdefault(s.provenance.scenario_id, []).append(s)
        return by_scenario

    def retrieve(self, context: TaskContext, library: Library, k: int | None = None) -> list[Skill]:
        k = self.k if k is None else k
        chosen = self._indexes.get(library, self._build).get(context.scenario_id, [])[:k]
        return with_dependencies(chosen, library)


# -- skill strategies: match the instruction against the skills themselves --------------------
class SkillEmbedding:
    """Cosine similarity between the instruction and each skill's text (name, signature, doc, code)."""

    def __init__(self, embedder: Embedder, k: int = 5, threshold: float = -1.0) -> None:
        self.embedder, self.k, self.threshold = embedder, k, threshold
        self._indexes = PerLibrary()

    def _build(self, library: Library) -> tuple[list[Skill], np.ndarray]:
        skills = list(library)
        return skills, self.embedder.embed([skill_text(s, full=True) for s in skills])

    def retrieve(self, context: TaskContext, library: Library, k: int | None = None) -> list[Skill]:
        k = self.k if k is None else k
        skills, matrix = self._indexes.get(library, self._build)
        if not skills or k <= 0:
            return []
        sim = matrix @ self.embedder.embed([context.instruction])[0]
        top = np.argsort(-sim, kind="stable")[:k]
        return with_dependencies([skills[i] for i in top if sim[i] >= self.threshold], library)


class BM25:
    """BM25 over each skill's name words, signature and docstring (``bm25s``)."""

    def __init__(self, k: int = 5) -> None:
        self.k = k
        self._indexes = PerLibrary()

    @staticmethod
    def _build(library: Library) -> tuple[list[Skill], Any]:
        import bm25s

        skills = list(library)
        if not skills:
            return skills, None
        index = bm25s.BM25()
        index.index(
            bm25s.tokenize([skill_text(s) for s in skills], stopwords="en", show_progress=False),
            show_progress=False,
        )
        return skills, index

    def retrieve(self, context: TaskContext, library: Library, k: int | None = None) -> list[Skill]:
        import bm25s

        k = self.k if k is None else k
        skills, index = self._indexes.get(library, self._build)
        if index is None or k <= 0:
            return []
        query = bm25s.tokenize(
            [context.instruction.replace("_", " ")], stopwords="en", return_ids=False, show_progress=False
        )
        terms = [t for t in query[0] if t in index.vocab_dict]
        if not terms:
            return []
        docs, scores = index.retrieve([terms], k=min(k, len(skills)), show_progress=False)
        chosen = [skills[int(d)] for d, sc in zip(docs[0], scores[0], strict=True) if sc > 0]
        return with_dependencies(chosen, library)
