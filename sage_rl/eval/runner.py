"""Scenario-ordered evaluation (SAGE.md section 8).

Each scenario's tasks run in order as one chain, with the library carried from task to task;
scenarios run concurrently. The same ``ChainRunner`` drives training rollouts, so evaluation
measures exactly the agent that is trained.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from itertools import groupby

from sage_rl.rollout.chain import ChainRunner
from sage_rl.skills.library import Library
from sage_rl.types import Chain, Task


def scenarios_of(tasks: Sequence[Task]) -> list[tuple[Task, ...]]:
    """Split an ordered task list into scenarios (consecutive runs of one scenario id), each in
    position order."""
    return [
        tuple(sorted(g, key=lambda t: t.position)) for _, g in groupby(tasks, key=lambda t: t.scenario_id)
    ]


async def evaluate_chains(
    runner: ChainRunner,
    tasks: Sequence[Task],
    library: Library,
    concurrency: int = 4,
    on_done: Callable[[Chain], None] | None = None,
) -> list[Chain]:
    """Run every scenario of ``tasks`` as one chain starting from ``library``; results in order."""
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int, scenario: tuple[Task, ...]) -> Chain:
        async with sem:
            chain = await runner.run(scenario, library, group_index=i, chain_index=0)
        if on_done:
            on_done(chain)
        return chain

    return list(await asyncio.gather(*(one(i, s) for i, s in enumerate(scenarios_of(tasks)))))
