"""A collection (``sage-rl collect``) -> the page's records (``model.py``).

A collection keeps less than a train or eval run: the ledger records every task's outcome and
drop reason, and the dataset holds the conversations of kept tasks only (``ChatExample``), without
token ids or call records. So here:

- every task of every job is a trajectory row; kept tasks also show their turns (code parsed from
  the assistant message with ``agent.parse.parse_reply``, as the agent loop did);
- skills are the top-level functions the kept conversations define; a later task of the same job
  used one when its prompt listed it (``ChatExample.library``) and static detection
  (``skills.usage.used_skills_static``) finds it called. Tasks whose example was dropped have no
  code to look at.
"""

from __future__ import annotations

from collections import defaultdict

from sage_rl.agent.parse import parse_reply
from sage_rl.collect_store import TaskRecord
from sage_rl.data.records import ChatExample
from sage_rl.skills.extract import function_source
from sage_rl.skills.library import Library
from sage_rl.skills.record import Skill, SkillError, make_skill
from sage_rl.skills.static import parse_cell
from sage_rl.skills.usage import used_skills_static
from sage_rl.view.library_log import LibraryLog
from sage_rl.view.model import (
    ChainView,
    GroupView,
    Link,
    SectionView,
    SkillView,
    TrajView,
    TurnView,
)
from sage_rl.view.read import CollectJob, RunData

TASK_HEADING = "# Your task"  # agent/prompts/task.j2: the instruction follows this heading


def collect_sections(run: RunData, prefix: str) -> list[SectionView]:
    """One section per temperature of the sweep, one group (one chain) per scenario job."""
    by_temp: dict[float, list[CollectJob]] = defaultdict(list)
    for job in run.jobs:
        by_temp[job.record.temperature].append(job)
    out = []
    for n, (temp, jobs) in enumerate(sorted(by_temp.items())):
        sid = f"{prefix}-t{n}"
        groups, skills = [], []
        for i, job in enumerate(jobs):
            gid = f"{sid}-g{i}"
            chain, sk = job_view(job, f"{gid}-c0")
            verdict = "passed the screen" if job.record.accepted else "rejected"
            label = f"{job.record.scenario_id} ({verdict}, {job.record.examples} examples kept)"
            groups.append(GroupView(gid, label, (chain,)))
            skills.append((gid, tuple(sk)))
        out.append(SectionView(sid, f"temperature {temp:g}", tuple(groups), tuple(skills)))
    return out


def job_view(job: CollectJob, cid: str) -> tuple[ChainView, list[SkillView]]:
    examples = {ex.task_id: ex for ex in job.examples}
    scenario = job.record.scenario_id
    log = LibraryLog(cid)
    trajs = []
    for k, task in enumerate(job.record.tasks):
        tid = f"{cid}-k{k}"
        ex = examples.get(task.task_id)
        if ex is None:
            trajs.append(_traj(tid, scenario, task, None, (), (), ()))
            continue
        here = Link(f"task {task.position} ({task.task_id})", f"#{tid}")
        codes = [parse_reply(m.content).code for m in ex.messages[2:] if m.role == "assistant"]
        shown = Library.of(s for n in ex.library if (s := log.library.get(n)) is not None)
        used = log.use(
            sorted(used_skills_static([c for c in codes if c], shown)) if len(shown) else [],
            here,
            task.success,
        )
        defines: dict[int, list[tuple[str, str]]] = defaultdict(list)
        for turn, skill in _definitions(codes):
            defines[turn].append((skill.name, f"{tid}-def-{skill.name}"))
            log.save(skill, here, f"{tid}-def-{skill.name}")
        saved = tuple(Link(n, log.entry(n)) for ds in defines.values() for n, _ in ds)
        trajs.append(_traj(tid, scenario, task, ex, _turns(ex, codes, defines), used, saved))
    return ChainView(cid, scenario, tuple(trajs)), log.skills(Link(scenario, f"#{cid}"))


def _definitions(codes: list[str | None]) -> list[tuple[int, Skill]]:
    """(turn index, skill) for each top-level function definition, the last one per name."""
    last: dict[str, tuple[int, Skill]] = {}
    for i, code in enumerate(codes):
        tree = parse_cell(code or "")
        for node in tree.body if tree else []:
            if hasattr(node, "args") and hasattr(node, "name"):
                try:
                    last[node.name] = (i, make_skill(function_source(code or "", node), name=node.name))
                except SkillError:
                    continue
    return sorted(last.values(), key=lambda t: t[0])


def _turns(ex: ChatExample, codes, defines) -> tuple[TurnView, ...]:
    """One turn per assistant message; its observation is the user message after it."""
    body = list(ex.messages[2:])
    replies = [j for j, m in enumerate(body) if m.role == "assistant"]
    out = []
    for i, (j, code) in enumerate(zip(replies, codes, strict=True)):
        obs = body[j + 1].content if j + 1 < len(body) and body[j + 1].role == "user" else ""
        out.append(TurnView(i, code, body[j].content, obs, None, None, defines=tuple(defines.get(i, ()))))
    return tuple(out)


def _traj(tid: str, scenario: str, task: TaskRecord, ex: ChatExample | None, turns, used, saved) -> TrajView:
    prompt = ex.messages[1].content if ex is not None and len(ex.messages) > 1 else ""
    _, sep, instruction = prompt.rpartition(TASK_HEADING)
    return TrajView(
        id=tid,
        task_id=task.task_id,
        scenario_id=scenario,
        position=task.position,
        instruction=instruction.strip() if sep else "",
        score=task.score,
        success=task.success,
        stop=task.stop,
        turns=turns,
        steps=task.steps,
        library_in=ex.library if ex else (),
        saved=saved,
        used=used,
        note=f"dropped: {task.reason}" if task.reason else "kept in the dataset",
        prompt=prompt,
    )
