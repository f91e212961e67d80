"""Evaluation metrics (SAGE.md section 8), as pure functions of finished chains.

Every metric is defined in ``docs/metrics.md``. Percentages are in [0, 100] like the paper's
tables; rates are in [0, 1].
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sage_rl.eval.ci import bootstrap_ci
from sage_rl.types import Chain, Trajectory


@dataclass(frozen=True)
class EvalMetrics:
    tasks: int
    scenarios: int
    tgc: float  # % of tasks whose checks all pass
    sgc: float  # % of scenarios whose tasks all pass
    avg_score: float  # mean fraction of checks passed
    avg_steps: float  # mean interaction steps (policy turns) per task
    avg_tokens: float  # mean generated tokens per task
    no_code_turn_rate: float  # share of turns without a code cell
    no_code_task_rate: float  # share of tasks that produced no code at all
    completed_rate: float  # share of tasks that ended by calling complete_task
    library_size: float  # mean size of a scenario's library after its last task
    skills_generated: int  # skills saved over all scenarios
    skills_used: int  # distinct (scenario, skill) pairs used by a later task
    usage_rate: float  # share of tasks at position >= 2 that used a library skill
    success_when_used: float  # TGC/100 among tasks that used a skill (nan-free: 0 when none)
    success_when_not_used: float
    tgc_by_position: dict[int, float] = field(default_factory=dict)
    usage_rate_by_position: dict[int, float] = field(default_factory=dict)
    tgc_by_difficulty: dict[int, float] = field(default_factory=dict)
    stop_reasons: dict[str, int] = field(default_factory=dict)
    #: 95% percentile-bootstrap intervals (eval/ci.py): TGC over tasks, SGC over scenarios
    tgc_ci: tuple[float, float] = (0.0, 0.0)
    sgc_ci: tuple[float, float] = (0.0, 0.0)

    @classmethod
    def from_record(cls, d: Mapping[str, Any]) -> EvalMetrics:
        """Back from ``dataclasses.asdict`` through JSON (an eval record's ``metrics``): the
        per-position and per-difficulty keys return to ints, the intervals to tuples.
        ``TypeError`` / ``ValueError`` / ``AttributeError`` on a record that does not hold these fields."""
        fields = dict(d)
        for k in ("tgc_by_position", "usage_rate_by_position", "tgc_by_difficulty"):
            fields[k] = {int(key): value for key, value in fields.get(k, {}).items()}
        for k in ("tgc_ci", "sgc_ci"):
            low, high = fields.get(k, (0.0, 0.0))
            fields[k] = (low, high)
        return cls(**fields)


def _pct(num: float, den: float) -> float:
    return 100.0 * num / den if den else 0.0


def _rate(num: float, den: float) -> float:
    return num / den if den else 0.0


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def compute_metrics(chains: Sequence[Chain]) -> EvalMetrics:
    """Metrics over scenario-ordered chains (one chain per scenario in evaluation)."""
    trajs = [t for c in chains for t in c.trajectories]
    turns = [turn for t in trajs for turn in t.turns]
    later = [t for t in trajs if t.task.position >= 2]
    used = [t for t in trajs if t.skills_used]
    not_used = [t for t in trajs if not t.skills_used]
    stops: dict[str, int] = defaultdict(int)
    for t in trajs:
        stops[t.stop.value] += 1
    task_pct = [100.0 * t.outcome.success for t in trajs]
    scenario_pct = [100.0 * all(t.outcome.success for t in c.trajectories) for c in chains]
    return EvalMetrics(
        tasks=len(trajs),
        scenarios=len(chains),
        tgc=_mean(task_pct),
        sgc=_mean(scenario_pct),
        avg_score=_mean([t.outcome.score for t in trajs]),
        avg_steps=_mean([len(t.turns) for t in trajs]),
        avg_tokens=_mean([t.num_generated_tokens for t in trajs]),
        no_code_turn_rate=_rate(sum(turn.code is None for turn in turns), len(turns)),
        no_code_task_rate=_rate(sum(not t.produced_code for t in trajs), len(trajs)),
        completed_rate=_rate(stops.get("completed", 0), len(trajs)),
        library_size=_mean([_library_size(c) for c in chains]),
        skills_generated=sum(len(t.skills_saved) for t in trajs),
        skills_used=len(
            {
                (c.trajectories[0].task.scenario_id, s)
                for c in chains
                for t in c.trajectories
                for s in t.skills_used
            }
        ),
        usage_rate=_rate(sum(bool(t.skills_used) for t in later), len(later)),
        success_when_used=_rate(sum(t.outcome.success for t in used), len(used)),
        success_when_not_used=_rate(sum(t.outcome.success for t in not_used), len(not_used)),
        tgc_by_position=_by(
            trajs, lambda t: t.task.position, lambda ts: _pct(sum(t.outcome.success for t in ts), len(ts))
        ),
        usage_rate_by_position=_by(
            trajs, lambda t: t.task.position, lambda ts: _rate(sum(bool(t.skills_used) for t in ts), len(ts))
        ),
        tgc_by_difficulty=_by(
            trajs, lambda t: t.task.difficulty, lambda ts: _pct(sum(t.outcome.success for t in ts), len(ts))
        ),
        stop_reasons=dict(sorted(stops.items())),
        tgc_ci=bootstrap_ci(task_pct, clusters=[t.task.scenario_id for t in trajs]),
        sgc_ci=bootstrap_ci(scenario_pct),
    )


def _library_size(chain: Chain) -> int:
    last = chain.trajectories[-1] if chain.trajectories else None
    if last is None:
        return 0
    return len(set(last.library_in) | set(last.skills_saved))


def _by(trajs: Sequence[Trajectory], key, agg) -> dict[int, float]:
    groups: dict[int, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        groups[key(t)].append(t)
    return {k: agg(v) for k, v in sorted(groups.items())}
