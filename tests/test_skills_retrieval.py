"""Retrieval strategies: Jaccard numbers worked out by hand, ranking and thresholds, history sync,
BM25, embeddings (a hashing embedder for logic, the packaged MiniLM once per module) and config."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from sage_rl.skills import Library, Provenance, Tier, make_skill
from sage_rl.skills.embed import HashingEmbedder, SentenceEmbedder, minilm_path
from sage_rl.skills.retrieval import (
    BM25,
    STRATEGIES,
    HistoryEntry,
    NgramIndex,
    NoRetrieval,
    QueryEmbedding,
    QueryNgram,
    RetrievalConfig,
    SameScenario,
    SkillEmbedding,
    TaskContext,
    make_retriever,
    ngrams,
)


def _lib() -> Library:
    specs = [
        ("find_song", "Return the first song whose title matches.", "music", Tier.CALLED_OK, 0),
        ("play_song", "Play a song on the speaker by title.", "music", Tier.TASK_SUCCESS, 0),
        ("notify", "Send a text message to a contact, looked up by name.", "phone", Tier.CALLED_OK, 3),
        ("pay_bill", "Pay the oldest unpaid bill from the wallet.", "wallet", Tier.DEFINED, 0),
    ]
    lib = Library()
    for i, (name, doc, scen, tier, uses) in enumerate(specs):
        src = f'def {name}(x):\n    """{doc}"""\n    return {i}'
        lib.add(
            make_skill(
                src, provenance=Provenance(f"{scen}_1", scen, created_at=float(i)), tier=tier, uses=uses
            )
        )
    return lib


HISTORY = (
    HistoryEntry("play the song Blue", "music", ("find_song",)),
    HistoryEntry("send a message to Alice", "phone", ("notify",)),
    HistoryEntry("play the song Blue loudly", "music", ("play_song", "gone_skill", "find_song")),
)


def _names(skills):
    return [s.name for s in skills]


def test_ngrams():
    assert ngrams("Play the SONG, Blue!", 2) == {("play", "the"), ("the", "song"), ("song", "blue")}
    assert ngrams("hi", 3) == {("hi",)}
    assert ngrams("...", 2) == set()


def test_jaccard_by_hand():
    r = NgramIndex(2)
    r.sync(HISTORY)
    # query grams {play the, the song, song red}
    # entry 0 {play the, the song, song blue}: 2 shared, union 4 -> 0.5
    # entry 1: nothing shared -> 0
    # entry 2 {play the, the song, song blue, blue loudly}: 2 shared, union 5 -> 0.4
    assert np.allclose(r.similarities("play the song Red"), [0.5, 0.0, 0.4])
    r1 = NgramIndex(1)
    r1.sync(HISTORY)
    # words {send, a, text, to, alice} vs {send, a, message, to, alice}: 4 / 6
    assert r1.similarities("send a text to Alice")[1] == pytest.approx(4 / 6)


def test_query_ngram_ranks_filters_and_collects_skills():
    lib = _lib()
    ctx = TaskContext("play the song Red", "music", HISTORY)
    # entry 0 (0.5) first: find_song; then entry 2 (0.4): play_song (gone_skill is not in the library)
    assert _names(QueryNgram(5, 2, 0.1, stopwords=False).retrieve(ctx, lib)) == ["find_song", "play_song"]
    assert _names(QueryNgram(1, 2, 0.1, stopwords=False).retrieve(ctx, lib)) == ["find_song"]
    assert _names(QueryNgram(5, 2, 0.1, stopwords=False).retrieve(ctx, lib, k=1)) == ["find_song"]
    assert _names(QueryNgram(5, 2, 0.45, stopwords=False).retrieve(ctx, lib)) == ["find_song"]
    assert QueryNgram(5, 2, 0.6, stopwords=False).retrieve(ctx, lib) == []
    assert (
        QueryNgram(5, 2, 0.1, stopwords=False).retrieve(TaskContext("unrelated words", "x", HISTORY), lib)
        == []
    )


def test_history_as_task_pairs():
    from sage_rl.types import Task

    hist = tuple((Task(f"m_{i}", "m", i, e.instruction, "train"), e.skills) for i, e in enumerate(HISTORY))
    ctx = TaskContext("play the song Red", "music", hist)
    assert _names(QueryNgram(5, 2, 0.1, stopwords=False).retrieve(ctx, _lib())) == ["find_song", "play_song"]


def test_ties_prefer_recent_entries():
    hist = (HistoryEntry("play song", "m", ("find_song",)), HistoryEntry("play song", "m", ("play_song",)))
    assert _names(
        QueryNgram(1, 2, 0.1, stopwords=False).retrieve(TaskContext("play song", "m", hist), _lib())
    ) == ["play_song"]


def test_history_grows_and_is_rebuilt_when_changed():
    lib, r = _lib(), QueryNgram(3, 2, 0.1, stopwords=False)
    assert r.retrieve(TaskContext("send a message to Bob", "phone", HISTORY[:1]), lib) == []
    assert _names(r.retrieve(TaskContext("send a message to Bob", "phone", HISTORY), lib)) == ["notify"]
    assert len(r.index(TaskContext("", "", HISTORY), lib).entries) == 3
    other = (HistoryEntry("pay the bill", "wallet", ("pay_bill",)),)
    assert _names(r.retrieve(TaskContext("pay the bill now", "wallet", other), lib)) == ["pay_bill"]
    assert len(r.index(TaskContext("", "", other), lib).entries) == 1
    fork = lib.copy()  # another chain's library gets its own index
    assert _names(r.retrieve(TaskContext("send a message to Bob", "phone", HISTORY), fork)) == ["notify"]


def test_same_scenario_by_usefulness_and_library_changes():
    lib = _lib()
    r = SameScenario(5)
    assert _names(r.retrieve(TaskContext("x", "music"), lib)) == ["play_song", "find_song"]
    assert _names(r.retrieve(TaskContext("x", "music"), lib, k=1)) == ["play_song"]
    lib.add(
        make_skill("def shuffle():\n    return 1", provenance=Provenance("m", "music"), tier=Tier.VERIFIED)
    )
    assert _names(r.retrieve(TaskContext("x", "music"), lib, k=1)) == ["shuffle"]
    assert r.retrieve(TaskContext("x", "nowhere"), lib) == []


def test_dependencies_come_along():
    lib = _lib()
    lib.add(make_skill('def play_album(a):\n    """Play every song of an album."""\n    return play_song(a)',
                       depends_on=("play_song",), provenance=Provenance("x", "albums"), tier=Tier.VERIFIED))  # fmt: skip
    assert _names(SameScenario(1).retrieve(TaskContext("x", "albums"), lib)) == ["play_album", "play_song"]
    assert _names(BM25(1).retrieve(TaskContext("play the album"), lib)) == ["play_album", "play_song"]


def test_bm25():
    lib = _lib()
    r = BM25(2)
    assert _names(r.retrieve(TaskContext("text a message to Bob"), lib)) == ["notify"]
    assert _names(r.retrieve(TaskContext("pay my bill"), lib, k=1)) == ["pay_bill"]
    assert r.retrieve(TaskContext("zebra quantum"), lib) == []
    assert BM25(3).retrieve(TaskContext("song"), Library()) == []


def test_embedding_strategies_with_hashing_embedder():
    lib, emb = _lib(), HashingEmbedder(dim=512)
    ctx = TaskContext("send a message to Bob", "phone", HISTORY)
    assert _names(QueryEmbedding(emb, 1).retrieve(ctx, lib)) == ["notify"]
    assert _names(SkillEmbedding(emb, 1).retrieve(TaskContext("pay the oldest unpaid bill"), lib)) == [
        "pay_bill"
    ]
    before = emb.cached
    QueryEmbedding(emb, 1).retrieve(ctx, lib)
    assert emb.cached == before  # every text was embedded once


@pytest.fixture(scope="module")
def minilm():
    import torch

    torch.set_num_threads(1)
    return SentenceEmbedder()


def test_minilm_offline(minilm):
    assert (minilm_path() / "model.safetensors").is_file()
    vecs = minilm.embed(["play the song Blue", "play the track Red", "text Alice that I am late"])
    assert vecs.shape == (3, 384)
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    assert vecs[0] @ vecs[1] > vecs[0] @ vecs[2]
    lib = _lib()
    ctx = TaskContext("send Bob a text message", "phone", HISTORY)
    assert _names(QueryEmbedding(minilm, 1).retrieve(ctx, lib)) == ["notify"]
    assert _names(SkillEmbedding(minilm, 1).retrieve(TaskContext("settle the unpaid invoice"), lib)) == [
        "pay_bill"
    ]


def test_config_and_factory():
    emb = HashingEmbedder()
    kinds = {
        "same_scenario": SameScenario,
        "query_ngram": QueryNgram,
        "query_embedding": QueryEmbedding,
        "skill_embedding": SkillEmbedding,
        "bm25": BM25,
        "none": NoRetrieval,
    }
    for strategy, cls in kinds.items():
        assert isinstance(make_retriever(RetrievalConfig(strategy=strategy), emb), cls)
    r = make_retriever(RetrievalConfig(strategy="query_ngram", ngram_n=1, ngram_threshold=0.5, k=7))
    assert (r.n, r.threshold, r.k) == (1, 0.5, 7)
    assert set(STRATEGIES) == set(kinds)
    with pytest.raises(ValidationError, match="strategy"):
        RetrievalConfig(strategy="random")
    with pytest.raises(ValidationError, match="ngram_threshold"):
        RetrievalConfig(ngram_threshold=1.5)


def test_lazy_ranking_equals_a_full_sort():
    from sage_rl.skills.retrieval import NgramIndex

    rng = np.random.default_rng(0)
    for _ in range(30):
        n = int(rng.integers(1, 2000))
        idx = NgramIndex(1)
        idx.sync([HistoryEntry(str(i), "", ()) for i in range(n)])
        scores, keep = rng.integers(0, 5, n) / 4, rng.random(n) < 0.8  # many ties
        got = [int(e.instruction) for e in idx.ranked(scores, keep)]
        ids = np.flatnonzero(keep)
        assert got == list(ids[np.lexsort((-ids, -scores[ids]))])


def test_stopwords_and_main_skills_of_an_entry():
    from sage_rl.skills.retrieval import STOPWORDS

    assert ngrams("Play the song in my list", 1, STOPWORDS) == {("play",), ("song",), ("list",)}
    lib = _lib()
    lib.add(make_skill("def login():\n    return 1"))
    lib.add(make_skill("def rate(x):\n    return login()", depends_on=("login",)))
    hist = (
        HistoryEntry("rate the song", "m", ("login", "rate")),
        HistoryEntry("play a song", "m", ("play_song",)),
    )
    # query {rate, songs, now}: entry 0 {rate, song} -> 1/4, entry 1 {play, song} -> 0 (left out)
    got = QueryNgram(2, 1, 0.0).retrieve(TaskContext("rate songs now", "m", hist), lib)
    assert _names(got) == ["rate", "login"]  # the helper comes as a dependency, taking no slot of k
    # query {rate, song}: entry 0 -> 1, entry 1 -> 1/3
    got = QueryNgram(2, 1, 0.0).retrieve(TaskContext("rate a song", "m", hist), lib)
    assert _names(got) == ["rate", "play_song", "login"]
