"""The tracked pool (``rollout.pool_memory``, ``rollout.pool_explore``; issue 27): a screened pool
that follows the model between screens, from the outcomes of the steps' own groups.

Why: a screen is expensive (a laptop SAGE screen samples 180 tasks, ~93k tokens, ~3.6 steps'
sampling), so the laptop recipe screens once an arm. In every arm of that experiment RL then gained
on the templates of the pool and lost on the ones it never drew: a template "always solved" at the
screen that degrades under training never re-enters the pool, and nothing trains it back
(docs/LOG.md, 2026-12-07: SAGE +11.8 / -28.2 on train_val, grpo_nolib +17.1 / -4.8 on
train_heldout). The steps' own groups already measure success on the templates they draw, at no
extra cost.

How:
- **Record.** Each template's last ``pool_memory`` sampled task outcomes, oldest first: a screen's
  outcomes, then each step's groups (every drawn chain's tasks, in draw order; a task that ended
  before the policy's first turn says nothing of the policy and is left out). A template's success
  is the share of its record that succeeded; the pool (``informative``) is re-derived after every
  step. A template with no record yet is not in the pool.
- **Explore.** Of each draw of B task sequences, ``pool_explore`` come from the train templates
  outside the pool (uniformly), the others from the pool: a template that left it (solved or
  hopeless) is looked at again, and re-enters when its group is mixed. Such a group is trained like
  any other: one whose chains all succeed (or all fail) has no advantage and gives no gradient.
- **Log.** Each step's outcomes are appended to ``pool.jsonl`` in the run folder (one row: step and
  outcomes by template); screens keep theirs in ``screens.jsonl``. A resumed run rebuilds the record
  from both (rows of steps it will make again dropped), so it draws as one that never stopped.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sage_rl.rollout.rewards import nothing_sampled
from sage_rl.types import Chain, Task

log = logging.getLogger(__name__)

OBSERVED = "pool.jsonl"

#: each template's recent outcomes, oldest first
Record = Mapping[str, tuple[bool, ...]]


def remember(
    record: Record, outcomes: Iterable[tuple[str, bool]], memory: int
) -> dict[str, tuple[bool, ...]]:
    """``record`` with ``outcomes`` (template, success) appended in order, each template keeping
    its last ``memory`` (pure)."""
    out = {k: list(v) for k, v in record.items()}
    for template, success in outcomes:
        out.setdefault(template, []).append(bool(success))
    return {k: tuple(v[-memory:]) for k, v in out.items()}


def success_of(record: Record) -> dict[str, float]:
    """Each recorded template's share of successes (pure)."""
    return {k: sum(v) / len(v) for k, v in record.items() if v}


def chain_outcomes(chains: Iterable[Chain], template_name: Any) -> list[tuple[str, bool]]:
    """(template, success) of every task of ``chains`` the policy took a turn on, in order."""
    return [
        (template_name(t.task), t.outcome.success)
        for c in chains
        for t in c.trajectories
        if not nothing_sampled(t)
    ]


def split_draw(n: int, explore: int, pool: Sequence[str], others: Sequence[str]) -> tuple[int, int]:
    """(from the pool, from outside it) of a draw of ``n`` sequences (pure): ``explore`` from outside
    where there is an outside and a pool; all ``n`` from wherever there is something to draw."""
    if not pool or not others:
        return n, 0
    e = min(explore, n)
    return n - e, e


def draw(
    suite: Any, rng: random.Random, n: int, length: int, split: str, pool: Sequence[str], explore: int
) -> list[tuple[Task, ...]]:
    """``n`` task sequences of ``suite``: from the pool's templates, ``explore`` of them from the
    other train templates (``split_draw``); from every template when the pool is empty."""
    others = [t for t in suite.train_templates if t not in pool]
    inside, outside = split_draw(n, explore, pool, others)
    near = suite.scoped(pool) if pool else suite
    seqs = [near.sample_chain(rng, length, split) for _ in range(inside)]
    if outside:
        far = suite.scoped(others)
        seqs += [far.sample_chain(rng, length, split) for _ in range(outside)]
    return seqs


def observed(run_dir: Path, first_step: int) -> list[dict[str, Any]]:
    """The step rows of ``pool.jsonl`` before ``first_step``, oldest first; the file is rewritten
    without the others (steps a resumed run makes again, a row a kill cut short)."""
    path = Path(run_dir) / OBSERVED
    if not path.is_file():
        return []
    rows = [r for r in read_rows(path, check_row, "pool row") if r["step"] < first_step]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return rows


def read_rows(path: Path, check: Callable[[dict[str, Any]], object], what: str) -> list[dict[str, Any]]:
    """The JSON rows of ``path`` that ``check`` accepts, in order; any other line (the one a kill cut
    short) is left out with a warning naming it ``what`` it is not."""
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").split("\n"), 1):
        try:
            row = json.loads(line) if line.strip() else None
            if row is not None:
                check(row)
                rows.append(row)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            log.warning("%s:%d: not a %s (%s); left out", path, n, what, type(e).__name__)
    return rows


def check_row(row: Mapping[str, Any]) -> None:
    """A ``ValueError`` (or ``KeyError``, ``TypeError``) where ``row`` is not a step row of outcomes."""
    if not isinstance(row["step"], int) or isinstance(row["step"], bool):
        raise TypeError(f"step is {row['step']!r}")
    check_outcomes(row["outcomes"])


def check_outcomes(outcomes: Mapping[str, Any]) -> None:
    for template, seq in outcomes.items():
        if not isinstance(seq, list) or any(x not in (0, 1) or isinstance(x, float) for x in seq):
            raise ValueError(f"outcomes of {template!r} are {seq!r}, not a list of 0s and 1s")


def grouped(outcomes: Iterable[tuple[str, bool]]) -> dict[str, list[int]]:
    """(template, success) pairs as a row's outcomes: 0s and 1s by template, in order (pure)."""
    out: dict[str, list[int]] = {}
    for template, success in outcomes:
        out.setdefault(template, []).append(int(success))
    return out


def pairs(outcomes: Mapping[str, Sequence[int | bool]]) -> list[tuple[str, bool]]:
    """Outcomes by template (a row's, a screen's) as (template, success) pairs, in order (pure)."""
    return [(t, bool(x)) for t, seq in outcomes.items() for x in seq]


def append(run_dir: Path, step: int, outcomes: Iterable[tuple[str, bool]]) -> None:
    with (Path(run_dir) / OBSERVED).open("a", encoding="utf-8") as f:
        f.write(json.dumps({"step": step, "outcomes": grouped(outcomes)}) + "\n")


__all__ = [
    "OBSERVED",
    "Record",
    "append",
    "chain_outcomes",
    "draw",
    "grouped",
    "observed",
    "pairs",
    "read_rows",
    "remember",
    "split_draw",
    "success_of",
]
