"""Retrieval benchmark (issue 4): quality on PocketWorld and latency at scale. Prints one JSON object.

Quality. One scenario (seed 1) of every PocketWorld train template. Task 1's reference solution is
extracted into the library (static detection, policy ``defined``, as a successful task), and its
instruction and skills go into the history. Each held-out task 2 and 3 of those scenarios then
asks every strategy for skills. recall@k = the share of held-out tasks for which the first k skills
returned hold one of the template's own skills (``Template.skill_names``; the common helpers
``login_to``/``fetch_all``, made by every scenario, never count).

Latency. Synthetic libraries of N skills and N history entries (entry j made skill j), made by
renaming the PocketWorld skills and appending 3 random filler words to docstrings and
instructions. ``retrieve`` is timed on held-out instructions after a first call that builds the
indexes (build time reported apart). Embedding strategies are timed with ``HashingEmbedder``
(dim 384, MiniLM's width) so that the index scan is measured without encoding 100k texts on CPU;
MiniLM's own query encoding time is reported separately.

    .venv/bin/python benchmarks/retrieval_bench.py [--scales 1000,10000,100000] [--queries 200] [--no-minilm]
"""

from __future__ import annotations

import os

# one BLAS thread: on a shared 2-core machine, BLAS threads spinning against each other made a
# 10k x 384 mat-vec 6x slower (measured: 24.6 ms with 2 threads, 3.8 ms with 1)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import dataclasses
import hashlib
import json
import random
import statistics
import sys
import time
from collections.abc import Callable

from rich.console import Console
from rich.progress import Progress

from sage_rl.envs.pocketworld.scenarios import templates
from sage_rl.envs.pocketworld.tasks import reference_solution, scenario_tasks
from sage_rl.skills import Library, Provenance, SavePolicy, Skill, extract_skills
from sage_rl.skills.embed import HashingEmbedder, SentenceEmbedder
from sage_rl.skills.retrieval import (
    BM25,
    STRATEGIES,
    HistoryEntry,
    QueryEmbedding,
    QueryNgram,
    RetrievalConfig,
    Retriever,
    SameScenario,
    SkillEmbedding,
    TaskContext,
    make_retriever,
)
from sage_rl.types import ExecResult, Task

KS = (1, 3, 5)


def build_pocketworld() -> tuple[Library, list[HistoryEntry], list[tuple[Task, frozenset[str]]]]:
    """Library and history from task 1 of each train scenario; held-out tasks 2-3 with their targets."""
    lib, history, held_out = Library(), [], []
    for i, tpl in enumerate(templates("train")):
        tasks = scenario_tasks(tpl, 1, 3)
        first = tasks[0]
        cell = (reference_solution(first), ExecResult("", ok=True, calls=None, defined=None))
        prov = Provenance(first.task_id, first.scenario_id, "reference", 0, float(i))
        saved = extract_skills([cell], policy=SavePolicy.DEFINED, task_success=True, provenance=prov)
        for s in saved:
            lib.add(s)
        history.append(HistoryEntry(first.instruction, first.scenario_id, tuple(s.name for s in saved)))
        held_out += [(t, frozenset(tpl.skill_names)) for t in tasks[1:]]
    return lib, history, held_out


def recall(retriever: Retriever, lib: Library, history: list[HistoryEntry], held_out) -> dict[str, float]:
    hits = {k: 0 for k in KS}
    for task, targets in held_out:
        got = retriever.retrieve(
            TaskContext(task.instruction, task.scenario_id, tuple(history)), lib, max(KS)
        )
        for k in KS:
            hits[k] += any(s.name in targets for s in got[:k])
    return {f"recall@{k}": round(hits[k] / len(held_out), 3) for k in KS}


def quality(minilm: SentenceEmbedder | None) -> dict:
    lib, history, held_out = build_pocketworld()
    out: dict = {
        "library_skills": len(lib),
        "scenarios": len(history),
        "held_out_tasks": len(held_out),
        "strategies": {},
    }
    for strategy in STRATEGIES:
        if strategy.endswith("embedding") and minilm is None:
            continue
        r = make_retriever(RetrievalConfig(strategy=strategy), minilm)  # type: ignore[arg-type]
        out["strategies"][strategy] = recall(r, lib, history, held_out)
    for n in (1, 3):
        out["strategies"][f"query_ngram(n={n},thr=0)"] = recall(QueryNgram(5, n, 0.0), lib, history, held_out)
    return out


def synthetic(
    n: int, base: list[Skill], instructions: list[str], rng: random.Random
) -> tuple[Library, tuple[HistoryEntry, ...]]:
    filler = [f"w{i}" for i in range(5000)]
    lib, history = Library(), []
    for j in range(n):
        b = base[j % len(base)]
        extra = " ".join(rng.sample(filler, 3))
        s = dataclasses.replace(
            b, name=f"{b.name}_{j}", docstring=f"{b.docstring} {extra}", content_hash=hashlib.sha256(str(j).encode()).hexdigest(),
            provenance=Provenance(f"syn{j // 3}_{j % 3 + 1}", f"syn{j // 3}", created_at=float(j)),
        )  # fmt: skip
        lib.add(s)
        history.append(
            HistoryEntry(f"{instructions[j % len(instructions)]} {extra}", f"syn{j // 3}", (s.name,))
        )
    return lib, tuple(history)


def time_queries(fn: Callable[[TaskContext], object], contexts: list[TaskContext]) -> dict[str, float]:
    t0 = time.perf_counter()
    fn(contexts[0])  # builds the indexes
    build = time.perf_counter() - t0
    times = []
    for ctx in contexts:
        t = time.perf_counter()
        fn(ctx)
        times.append((time.perf_counter() - t) * 1000)
    times.sort()
    p99 = times[min(len(times) - 1, int(0.99 * len(times)))]
    return {"build_s": round(build, 3), "p50_ms": round(statistics.median(times), 3), "p99_ms": round(p99, 3)}


def latency(scales: list[int], n_queries: int, progress: Progress) -> dict:
    lib0, history0, held_out = build_pocketworld()
    base = [s for s in lib0 if s.name not in ("login_to", "fetch_all")]
    instructions = [h.instruction for h in history0]
    rng = random.Random(0)
    out = {}
    for n in scales:
        job = progress.add_task(f"latency at {n} skills", total=6)
        lib, history = synthetic(n, base, instructions, rng)
        progress.advance(job)
        contexts = [
            TaskContext(
                held_out[i % len(held_out)][0].instruction, f"syn{rng.randrange(n // 3 or 1)}", history
            )
            for i in range(n_queries)
        ]
        emb = HashingEmbedder(dim=384)
        strategies: dict[str, Retriever] = {
            "same_scenario": SameScenario(5),
            "query_ngram": QueryNgram(5, 2, 0.1),
            "bm25": BM25(5),
            "query_embedding(hashing-384)": QueryEmbedding(emb, 5),
            "skill_embedding(hashing-384)": SkillEmbedding(emb, 5),
        }
        row = {}
        for name, r in strategies.items():
            row[name] = time_queries(lambda c, r=r, lib=lib: r.retrieve(c, lib), contexts)
            progress.advance(job)
        out[str(n)] = row
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scales", default="1000,10000,100000")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument(
        "--no-minilm", action="store_true", help="skip the embedding strategies' quality (no model load)"
    )
    args = ap.parse_args()
    result: dict = {"bench": "retrieval", "python": sys.version.split()[0]}
    with Progress(console=Console(stderr=True), transient=True) as progress:
        minilm = None
        if not args.no_minilm:
            import torch

            torch.set_num_threads(1)
            minilm = SentenceEmbedder()
            t0 = time.perf_counter()
            minilm.embed(["warm up"])
            result["minilm_load_s"] = round(time.perf_counter() - t0, 2)
            enc = []
            for i in range(20):
                t = time.perf_counter()
                minilm.embed([f"send {i} dollars to my roommate for the groceries"])
                enc.append((time.perf_counter() - t) * 1000)
            result["minilm_query_encode_p50_ms"] = round(statistics.median(enc), 2)
        job = progress.add_task("recall on PocketWorld", total=None)
        result["quality"] = quality(minilm)
        progress.remove_task(job)
        result["latency"] = latency([int(x) for x in args.scales.split(",")], args.queries, progress)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
