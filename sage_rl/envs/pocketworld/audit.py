"""How much a policy can score without doing a task: constant answers and no-ops (issue 30, items 6-7).

Two shortcuts a policy under RL finds before it finds the skill:

- a *constant answer*: ``complete_task(answer=1)`` on every task of a template. Its share is the
  fraction of the template's answer-returning tasks whose expected answer it matches
  (``checks.answers_match``); a template is sound when no constant reaches ``MAX_GUESS_SHARE``.
- a *no-op*: do nothing, or only ``complete_task()`` with no answer. Its score must stay at most
  ``MAX_NOOP_SCORE`` (checks.py says why collateral checks count only once the task's own pass).

Both read the oracle on an untouched world (no APIs, no executor), so one task costs one world
build. Pure functions; ``benchmarks/world_guess.py`` prints them per template, the tests assert
the bounds on every template of every split.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sage_rl.envs.pocketworld.checks import NO_ANSWER, answers_match, evaluate
from sage_rl.envs.pocketworld.scenarios.base import TASKS_PER_SCENARIO, Template, sample_task
from sage_rl.envs.pocketworld.tasks import template_of, world_for
from sage_rl.types import Task

#: The most a constant answer may solve, as a share of one template's answer-returning tasks.
MAX_GUESS_SHARE = 0.10
#: The most a no-op (no action; no answer) may score on any task.
MAX_NOOP_SCORE = 0.10


@dataclass(frozen=True)
class TemplateAudit:
    """One template over a sample of its tasks.

    ``answer_tasks``: how many of them return an answer; ``guess``/``guess_share``: the constant
    answer that matches the most of them and the share it matches (None/0.0 without answer tasks);
    ``noop_score``: the highest score a no-op gets on any of them.
    """

    template: str
    split: str
    tasks: int
    answer_tasks: int
    guess: Any
    guess_share: float
    noop_score: float


def best_constant(expected: Sequence[Any]) -> tuple[Any, float]:
    """The constant answer that matches the most of ``expected`` and the share it matches.

    Candidates are the expected answers themselves: a constant that matches none of them scores
    0, and one that matches some is as good as one of those it matches. ``(None, 0.0)`` when
    ``expected`` is empty."""
    best, share = None, 0.0
    distinct: list[Any] = []
    for e in expected:
        if not any(answers_match(e, d) and answers_match(d, e) for d in distinct):
            distinct.append(e)
    for candidate in distinct:
        hits = sum(answers_match(candidate, e) for e in expected) / len(expected)
        if hits > share:
            best, share = candidate, hits
    return best, share


def noop_score(task: Task) -> float:
    """The score of a no-op on ``task``: the world untouched, the answer ``None`` (what both doing
    nothing and ``complete_task()`` leave)."""
    world = world_for(task)
    expect = template_of(task).expect(world.db, task.spec["params"])
    return evaluate(expect, world.db, world.db, None).score


def audit_template(template: Template, seeds: Iterable[int]) -> TemplateAudit:
    """Constant-answer share and the worst no-op score over ``template``'s tasks at ``seeds``
    (3 per scenario: the worlds and params ``make_task`` gives them, each world built once)."""
    expected, worst_noop, n = [], 0.0, 0
    for seed in seeds:
        for position in range(1, TASKS_PER_SCENARIO + 1):
            world, params = sample_task(template, seed, position)
            expect = template.expect(world.db, params)
            if expect.answer is not NO_ANSWER:
                expected.append(expect.answer)
            worst_noop = max(worst_noop, evaluate(expect, world.db, world.db, None).score)
            n += 1
    guess, share = best_constant(expected)
    return TemplateAudit(template.name, template.split, n, len(expected), guess, share, worst_noop)
