"""Sequential rollout (SAGE.md section 3): K tasks of one scenario in order, one growing library.

A chain starts from its own copy of a start library. Before each task, retrieval picks the skills
the task sees; they are listed in the prompt and executed into its interpreter. After each task,
usage is detected (call records, or the AST where the environment cannot report calls) and the
skills the task made join the chain's library per the save policy. ``Chain.used_from[k]`` records
which earlier positions' skills task k used: the input of the skill-integrated reward.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

from sage_rl.agent.prompts import PromptBuilder
from sage_rl.config import Section
from sage_rl.envs.base import Suite
from sage_rl.policies.base import Policy, SamplingParams
from sage_rl.rollout.episode import AgentConfig, EpisodeSpec, run_episode
from sage_rl.skills.extract import SavePolicy, extract_skills
from sage_rl.skills.library import Library
from sage_rl.skills.record import Provenance, Skill
from sage_rl.skills.retrieval import RetrievalConfig, Retriever, TaskContext
from sage_rl.skills.usage import used_skills
from sage_rl.types import Chain, ExecResult, Task, Trajectory, cell_origin


class SkillsConfig(Section):
    """How the agent uses its library. ``use_skills=False`` is the plain CodeAct baseline."""

    use_skills: bool = True
    save_policy: SavePolicy = SavePolicy.CALLED_OK
    render: str = "full"  # "full" source or "compact" (signature + docstring) in the prompt
    token_budget: int = 2000  # for the library section of the prompt
    retrieval: RetrievalConfig = RetrievalConfig()


@dataclasses.dataclass(frozen=True)
class ChainRunner:
    """Everything a chain needs besides its tasks and start library. Shared by all chains."""

    policy: Policy
    suite: Suite
    prompts: PromptBuilder
    agent: AgentConfig
    skills: SkillsConfig
    params: SamplingParams
    retriever: Retriever
    step: int = 0  # training step, for skill provenance

    async def run(
        self, tasks: Sequence[Task], library: Library, group_index: int = 0, chain_index: int = 0
    ) -> Chain:
        library = library.copy()
        made_by: dict[str, int] = {}  # skill name -> chain position whose version is in the library
        history: list[tuple[Task, tuple[str, ...]]] = []
        trajectories, used_from = [], []
        for k, task in enumerate(tasks):
            visible = self._visible(library, task, history)
            traj = await self._episode(task, visible, chain_index)
            used = self._used(traj, visible)
            saved = self._saved(traj, library)
            library.record_use(used, traj.outcome.success)
            used_from.append(tuple(sorted({made_by[n] for n in used if n in made_by})))
            for skill in saved:
                library.add(skill)
                made_by[skill.name] = k
            history.append((task, tuple(s.name for s in saved)))
            trajectories.append(
                dataclasses.replace(
                    traj, skills_used=tuple(sorted(used)), skills_saved=tuple(s.name for s in saved)
                )
            )
        return Chain(group_index, chain_index, tuple(trajectories), tuple(used_from))

    def _visible(self, library: Library, task: Task, history) -> list[Skill]:
        if not self.skills.use_skills:
            return []
        return self.retriever.retrieve(
            TaskContext(task.instruction, task.scenario_id, tuple(history)), library
        )

    async def _episode(self, task: Task, visible: list[Skill], chain_index: int) -> Trajectory:
        shown = Library.of(visible)
        text = shown.render(mode=self.skills.render, token_budget=self.skills.token_budget) if visible else ""
        spec = EpisodeSpec(task, self.prompts.messages(task.instruction, text), tuple(shown.preamble()))
        params = (
            self.params
            if self.params.seed is None
            else dataclasses.replace(self.params, seed=self.params.seed + chain_index)
        )
        env = await self.suite.open()
        try:
            return await run_episode(self.policy, env, spec, self.agent, params)
        finally:
            await env.close()

    def _used(self, traj: Trajectory, visible: list[Skill]) -> set[str]:
        loaded = set(traj.library_in) - set(traj.library_dropped)
        if not loaded:
            return set()
        cells = [(t.code, _result(t)) for t in traj.turns if t.code]
        return used_skills(cells, Library.of([s for s in visible if s.name in loaded]))

    def _saved(self, traj: Trajectory, library: Library) -> list[Skill]:
        if not self.skills.use_skills:
            return []
        cells = [(t.code, _result(t)) for t in traj.turns if t.code]
        origins = [cell_origin(i) for i, t in enumerate(traj.turns) if t.code]
        prov = Provenance(
            task_id=traj.task.task_id, scenario_id=traj.task.scenario_id, policy=traj.policy, step=self.step
        )
        return extract_skills(
            cells,
            policy=self.skills.save_policy,
            task_success=traj.outcome.success,
            provenance=prov,
            library=library,
            origins=origins,
        )


def _result(turn) -> ExecResult:
    return ExecResult(
        turn.observation, turn.exec_ok, timed_out=turn.timed_out, calls=turn.calls, defined=turn.defined
    )


async def run_group(
    runner: ChainRunner, tasks: Sequence[Task], library: Library, group_index: int, size: int
) -> list[Chain]:
    """G chains of the same task sequence, concurrently, each from its own copy of ``library``."""
    return list(await asyncio.gather(*(runner.run(tasks, library, group_index, i) for i in range(size))))
