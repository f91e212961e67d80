"""The screened task pool (``rollout.pool: screened``; issue 27): RL draws its task sequences from
the templates on which the current model's sampled success lies strictly between 0 and 1.

Why: a GRPO group whose G chains all succeed or all fail has no advantage and gives no gradient.
On the laptop experiment, whole templates failed for every chain of the SFT model at temperature 1,
so steps drew nothing to learn from (docs/recipe.md). Dynamic sampling (``rollout.dynamic_sampling``)
redraws after the fact; the pool avoids the hopeless and the solved templates before drawing.

How:
- **Screen.** For every train template of the suite, ``screen_scenarios`` fresh scenarios (new
  train seeds) and ``screen_samples`` chains of ``chain_length`` tasks on each, sampled with the
  run's own sampling parameters (the rollouts' temperature) from the model as it is at that step.
  A template's success is the share of its screened tasks that succeeded. One scenario is a noisy
  screen: a template's success varies by scenario as much as by sample, and on the laptop
  experiment one scenario x 2 chains x 2 tasks kept 6 of 30 templates, holding 8 of the start
  model's 109 greedy held-out failures (docs/LOG.md, 2026-12-02, nineteenth session).
- **Confirm.** With ``screen_confirm`` N, each template the first pass found all solved or all
  failed gets N more scenarios, pooled with its first ones: a second look where one look decides
  the most (on the laptop experiment, 9 templates scored 0 of 6 sampled tasks while greedy solved
  some of their held-out tasks, one of them 9 of 9: docs/LOG.md, 2026-12-03).
- **Pool.** The templates with ``0 < success < 1`` (:func:`informative`). The step's task
  sequences are drawn as without a pool (uniform template, fresh train seed), from those templates
  only. An empty pool (every template solved or hopeless) draws from every template, as without one.
- **Refresh.** Step 0 screens, and then every ``screen_every``-th step, so the pool follows the
  model as it changes. A resumed run takes back the screen in force from ``screens.jsonl`` (the
  last one at or before the step it resumes at) instead of screening again: a run stopped and
  resumed N times samples, and counts, the same screens as one that never stopped (a run that
  screened again at each resume would spend its token budget on screens by how often it was
  stopped). It screens at its first step only when no screen it can use is on record.
- **Cost.** A screen samples ``templates x screen_scenarios x screen_samples x chain_length`` tasks
  (30 x 3 x 1 x 2 = 180 on the laptop experiment), and ``extremes x screen_confirm x screen_samples
  x chain_length`` more when it confirms (15 x 2 x 1 x 2 = 60 in its first use there: 27,602 tokens). Its generated tokens count as sampled
  tokens of the step that screened (``sampled_tokens``, and so ``sampled_token_budget``): runs
  compared at equal sampled tokens pay for their screens. They are not trained on.

The suite must know its train templates and narrow itself to some of them:
``train_templates`` and ``scoped(templates)`` (``PocketWorldSuite`` has both). Every screen is
appended to ``screens.jsonl`` in the run folder (one JSON row: step, success by template, pool,
tokens, seconds, and each template's outcomes).

Between screens the pool can follow the model from the steps' own groups (``rollout.pool_memory``)
and look outside itself (``rollout.pool_explore``): rollout/tracking.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import json
import random
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sage_rl.rollout import tracking
from sage_rl.rollout.chain import ChainRunner
from sage_rl.rollout.journal import StepJournal, run_group_kept
from sage_rl.skills.library import Library
from sage_rl.types import Chain, Task

SCREENS = "screens.jsonl"
#: Group indices of screening chains start here: they never collide with a step's groups (provenance).
SCREEN_GROUP_BASE = 1_000_000


class PoolKind(enum.StrEnum):
    ALL = "all"  # every template of the split (the default)
    SCREENED = "screened"  # templates with 0 < sampled success < 1 (this module)


def informative(success: Mapping[str, float]) -> tuple[str, ...]:
    """The templates whose success lies strictly between 0 and 1, sorted (pure)."""
    return tuple(sorted(k for k, s in success.items() if 0.0 < s < 1.0))


def screen_due(step: int, every: int) -> bool:
    """Whether step ``step`` screens: step 0, then every ``every``-th step."""
    return step % every == 0


@dataclasses.dataclass(frozen=True)
class Screen:
    """One screening pass: success by template at ``step``, what it cost, and the pool it gives;
    ``outcomes``: each template's task outcomes, in order (empty in rows written before they were kept)."""

    step: int
    success: Mapping[str, float]
    tokens: int
    seconds: float
    outcomes: Mapping[str, tuple[bool, ...]] = dataclasses.field(default_factory=dict)

    @property
    def pool(self) -> tuple[str, ...]:
        return informative(self.success)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Screen:
        """A row of ``screens.jsonl``; a ``ValueError`` (or ``KeyError``, ``TypeError``) where it is
        not one: a rate of success that is not a number in [0, 1] would move the pool."""
        success = dict(row["success"])
        for template, rate in success.items():
            if not isinstance(rate, (int, float)) or isinstance(rate, bool) or not 0.0 <= rate <= 1.0:
                raise ValueError(f"success of {template!r} is {rate!r}, not a rate in [0, 1]")
        outcomes = row.get("outcomes", {})
        tracking.check_outcomes(outcomes)
        kept = {t: tuple(bool(x) for x in seq) for t, seq in outcomes.items()}
        return cls(int(row["step"]), success, int(row["tokens"]), float(row["seconds"]), kept)

    def row(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "pool": list(self.pool),
            "success": dict(self.success),
            "tokens": self.tokens,
            "seconds": round(self.seconds, 2),
            "outcomes": {t: [int(x) for x in seq] for t, seq in self.outcomes.items()},
        }


def check_suite(suite: Any) -> None:
    """A ``ValueError`` naming what is missing when ``suite`` cannot be screened."""
    if not hasattr(suite, "train_templates") or not hasattr(suite, "scoped"):
        raise ValueError(
            f"rollout.pool=screened needs a suite that lists and narrows its train templates "
            f"(pocketworld); {getattr(suite, 'name', type(suite).__name__)} does not"
        )


async def screen(
    runner: ChainRunner,
    rng: random.Random,
    chain_length: int,
    samples: int,
    split: str,
    step: int,
    concurrency: int,
    journal: StepJournal | None = None,
    scenarios: int = 1,
    confirm: int = 0,
) -> Screen:
    """Screen every train template of ``runner.suite`` on ``scenarios`` scenarios each (see the
    module docstring); ``journal`` keeps its finished groups (a resumed step's screen samples only
    those it lacks). Group ``SCREEN_GROUP_BASE + i * scenarios + j`` is template i's j-th scenario.
    ``confirm``: that many more scenarios for each template the first pass found all solved or all
    failed, pooled with its first ones (their groups numbered on after the first pass's): a
    template solved a third of the time fails 6 samples in a row 9% of the time."""
    check_suite(runner.suite)
    names = tuple(runner.suite.train_templates)
    sem = asyncio.Semaphore(max(1, concurrency // max(1, samples)))
    t0 = time.perf_counter()

    async def one(i: int, seq) -> list:
        async with sem:
            return await run_group_kept(runner, seq, Library(), SCREEN_GROUP_BASE + i, samples, step, journal)

    async def sample(templates: tuple[str, ...], n: int, first: int) -> list[tuple[str, list]]:
        """``n`` fresh scenarios of each template: (template, the trajectories of its group)."""
        seqs = [(t, runner.suite.scoped([t]).sample_chain(rng, chain_length, split)) for t in templates for _ in range(n)]
        groups = await asyncio.gather(*(one(first + i, seq) for i, (_, seq) in enumerate(seqs)))
        return [(name, [t for c in chains for t in c.trajectories]) for (name, _), chains in zip(seqs, groups, strict=True)]

    done = await sample(names, scenarios, 0)
    extremes = tuple(n for n, o in _outcomes(names, done).items() if len(set(o)) == 1)
    if confirm and extremes:
        done += await sample(extremes, confirm, len(done))
    outcomes = _outcomes(names, done)
    success = {n: sum(o) / max(1, len(o)) for n, o in outcomes.items()}
    tokens = sum(t.num_generated_tokens for _, trajs in done for t in trajs)
    kept = {n: tuple(o) for n, o in outcomes.items()}
    return Screen(step, success, tokens, time.perf_counter() - t0, kept)


def _outcomes(names: tuple[str, ...], sampled: list[tuple[str, list]]) -> dict[str, list[bool]]:
    """Each template's task outcomes, from a screen's (template, trajectories) pairs."""
    out: dict[str, list[bool]] = {n: [] for n in names}
    for name, trajs in sampled:
        out[name] += [t.outcome.success for t in trajs]
    return out


class ScreenedPool:
    """The pool of one training run: screens when due and hands out the runner to draw from.

    State: the screen in force (without ``pool_memory``, a run's pool changes only when it screens
    again), taken back from ``screens.jsonl`` when the run resumes at ``first_step``; with it, each
    template's recent outcomes (``record``), rebuilt from ``screens.jsonl`` and ``pool.jsonl``."""

    def __init__(self, runner: ChainRunner, rollout: Any, seed: int, run_dir: Path, first_step: int) -> None:
        check_suite(runner.suite)
        self._runner, self._cfg, self._seed, self._dir = runner, rollout, seed, Path(run_dir)
        self._log = Path(run_dir) / SCREENS
        # rows made by steps this run will make again, and a row a kill cut short, are dropped
        rows = [r for r in screens(run_dir) if int(r["step"]) <= first_step]
        text = "".join(json.dumps(r) + "\n" for r in rows)
        if self._log.is_file() and self._log.read_text(encoding="utf-8", errors="replace") != text:
            self._log.write_text(text, encoding="utf-8")
        self.last: Screen | None = in_force(rows, first_step, rollout.screen_every)
        #: a screen taken back at the step that made it: its tokens are that step's sampled tokens
        self._unpaid = self.last is not None and self.last.step == first_step
        self._memory: int | None = rollout.pool_memory
        self.record: tracking.Record = {}
        if self._memory:
            if not hasattr(runner.suite, "template_name"):
                raise ValueError(
                    "rollout.pool_memory needs a suite that names each task's template (pocketworld)"
                )
            self.record, _ = replay(rows, tracking.observed(run_dir, first_step), self._memory)
        self.pool: tuple[str, ...] = ()

    async def runner_for(
        self, step: int, journal: StepJournal | None = None
    ) -> tuple[ChainRunner, dict[str, float]]:
        """The runner whose suite draws from the pool at ``step`` (screening first when due), and
        the step's ``pool/*`` metrics (``pool/screen_tokens`` are sampled tokens of this step).
        ``journal``: the step's journal, which keeps the screen's groups as they finish."""
        cfg, row = self._cfg, {}
        if self.last is None or (screen_due(step, cfg.screen_every) and self.last.step != step):
            rng = random.Random(f"{self._seed}:screen:{step}")
            self.last = await screen(
                self._runner,
                rng,
                cfg.chain_length,
                cfg.screen_samples,
                cfg.split,
                step,
                cfg.concurrency,
                journal,
                scenarios=cfg.screen_scenarios,
                confirm=cfg.screen_confirm,
            )
            with self._log.open("a", encoding="utf-8") as f:
                f.write(json.dumps(self.last.row()) + "\n")
            self._unpaid = True
            if self._memory:
                self.record = tracking.remember(self.record, tracking.pairs(self.last.outcomes), self._memory)
        if self._unpaid:
            row = {"pool/screen_tokens": self.last.tokens, "pool/screen_s": self.last.seconds}
            row["pool/screened_success"] = sum(self.last.success.values()) / max(1, len(self.last.success))
            self._unpaid = False
        self.pool = pool = informative(tracking.success_of(self.record)) if self._memory else self.last.pool
        row["pool/size"] = len(pool)
        if not pool or cfg.pool_explore:  # every template (explore: draw() picks)
            return self._runner, row
        return dataclasses.replace(self._runner, suite=self._runner.suite.scoped(pool)), row

    def draw(self, rng: random.Random, n: int, length: int, split: str) -> list[tuple[Task, ...]]:
        """``n`` task sequences from the pool in force, ``pool_explore`` of them from outside it
        (rollout/tracking.py); the pool's own draws are those of its scoped suite."""
        return tracking.draw(self._runner.suite, rng, n, length, split, self.pool, self._cfg.pool_explore)

    def observe(self, step: int, chains: list[Chain]) -> None:
        """With ``pool_memory``: step ``step``'s drawn chains join the record (and ``pool.jsonl``);
        the next step's pool is derived from it."""
        if not self._memory:
            return
        outcomes = tracking.chain_outcomes(chains, self._runner.suite.template_name)
        tracking.append(self._dir, step, outcomes)
        self.record = tracking.remember(self.record, outcomes, self._memory)


def replay(
    screen_rows: list[dict[str, Any]], step_rows: list[dict[str, Any]], memory: int
) -> tuple[tracking.Record, dict[int, tuple[str, ...]]]:
    """A tracked run's record after ``screen_rows`` (``screens.jsonl``) and ``step_rows``
    (``pool.jsonl``), every screen and step in the order they were made (a step's screen before its
    groups), and the pool each step of ``step_rows`` drew from (pure)."""
    made = [(int(r["step"]), 0, tracking.pairs(Screen.from_row(r).outcomes), r) for r in screen_rows]
    made += [(r["step"], 1, tracking.pairs(r["outcomes"]), r) for r in step_rows]
    record: tracking.Record = {}
    pools: dict[int, tuple[str, ...]] = {}
    for step, is_step, outcomes, row in sorted(made, key=lambda m: m[:2]):
        if not is_step and "outcomes" not in row:
            raise ValueError(
                f"the screen of step {step} in {SCREENS} has no outcomes (made before rollout.pool_memory "
                "existed): the pool cannot be tracked from it; set rollout.pool_memory=null"
            )
        if is_step:
            pools[step] = informative(tracking.success_of(record))
        record = tracking.remember(record, outcomes, memory)
    return record, pools


def in_force(rows: list[dict[str, Any]], step: int, every: int) -> Screen | None:
    """The screen a run resumed at ``step`` draws from: the last screen made at or before it,
    provided no step due to screen lies after it (pure); None: the run screens at ``step``."""
    made = [r for r in rows if int(r["step"]) <= step]
    if not made:
        return None
    last = Screen.from_row(made[-1])
    return last if last.step >= step - step % every else None  # none due since it was made


def screens(run_dir: Path) -> list[dict[str, Any]]:
    """The screen rows a run wrote (``screens.jsonl``), oldest first; a line that is not a whole
    screen row (the one a kill cut short) is left out with a warning: its screen is not on record,
    so a run resumed at its step screens again."""
    path = Path(run_dir) / SCREENS
    return tracking.read_rows(path, Screen.from_row, "screen row") if path.is_file() else []


__all__ = [
    "PoolKind",
    "Screen",
    "ScreenedPool",
    "in_force",
    "informative",
    "replay",
    "screen",
    "screen_due",
    "screens",
]
