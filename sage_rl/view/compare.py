"""The Compare tab: two runs side by side, task by task (e.g. SAGE against GRPO, before against after).

Tasks are matched by ``task_id``. A task that ran several times in a run (a training run samples
the same task in many chains and steps) is summarised over all its runs: the share that
succeeded, mean score, steps and tokens. An evaluation run is compared on its headline strategy
(the first), so each task counts once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sage_rl.view.model import SectionView, TrajView


@dataclass(frozen=True)
class Side:
    runs: int
    success: float  # share of the task's runs that succeeded
    score: float
    steps: float
    tokens: float | None
    used: float  # share of the task's runs that used a library skill
    href: str  # the first of its trajectories


@dataclass(frozen=True)
class CompareRow:
    task_id: str
    a: Side | None
    b: Side | None
    verdict: str  # "a", "b", "same", "only a", "only b" (see ``_rank``)


@dataclass(frozen=True)
class CompareView:
    labels: tuple[str, str]
    scope: tuple[str, str]  # which trajectories of each run were compared
    rows: tuple[CompareRow, ...]

    def count(self, verdict: str) -> int:
        return sum(r.verdict == verdict for r in self.rows)


def compared_sections(kind: str, sections: Sequence[SectionView]) -> tuple[list[SectionView], str]:
    if kind == "eval" and sections:
        return [sections[0]], f"strategy {sections[0].label}"
    return list(sections), f"all {len(sections)} sections"


def compare(
    labels: tuple[str, str], a: Sequence[SectionView], b: Sequence[SectionView], scope: tuple[str, str]
) -> CompareView:
    sa, sb = _sides(a), _sides(b)
    order = list(sa) + [t for t in sb if t not in sa]
    rows = tuple(CompareRow(t, sa.get(t), sb.get(t), _verdict(sa.get(t), sb.get(t))) for t in order)
    return CompareView(labels, scope, rows)


def _sides(sections: Sequence[SectionView]) -> dict[str, Side]:
    trajs: dict[str, list[TrajView]] = {}
    for s in sections:
        for g in s.groups:
            for c in g.chains:
                for t in c.trajectories:
                    trajs.setdefault(t.task_id, []).append(t)
    return {task: _side(ts) for task, ts in trajs.items()}


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def _side(ts: Sequence[TrajView]) -> Side:
    tokens = [t.tokens for t in ts if t.tokens is not None]
    return Side(
        runs=len(ts),
        success=_mean([t.success for t in ts]),
        score=_mean([t.score for t in ts]),
        steps=_mean([t.steps for t in ts]),
        tokens=_mean(tokens) if tokens else None,
        used=_mean([bool(t.used) for t in ts]),
        href=f"#{ts[0].id}",
    )


def _rank(s: Side) -> tuple[float, ...]:
    """Higher is better: success, then score; on a tie, fewer steps, then fewer tokens."""
    return (s.success, s.score, -s.steps, -(s.tokens or 0.0))


def _verdict(a: Side | None, b: Side | None) -> str:
    if a is None or b is None:
        return "only a" if b is None else "only b"
    key_a, key_b = _rank(a), _rank(b)
    if key_a == key_b:
        return "same"
    return "a" if key_a > key_b else "b"
