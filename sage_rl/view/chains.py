"""Chains of a train or eval run -> the page's records (``model.py``).

Two things are derived here rather than read, both with the project's own functions:

- rewards and advantages of training samples, which the rollouts files do not record: each group
  of a step goes through ``rollout.batch.to_samples`` with the run's ``rollout`` config. A group
  with fewer chains than ``rollout.group_size`` (a line could not be read) shows rewards but no
  advantages, since its baseline would be wrong;
- each chain's library as it grew: the chain's skills are extracted again from the executed cells
  (``skills.extract.extract_skills`` with the run's save policy) and added to a ``Library`` in
  order, as ``rollout/chain.py`` did, which gives each skill's source, versions and maker. The
  names saved and used are the ones the trajectory recorded.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pydantic import ValidationError

from sage_rl.rollout.batch import RolloutConfig, to_samples
from sage_rl.skills.extract import SavePolicy, extract_skills, function_source
from sage_rl.skills.library import Library
from sage_rl.skills.record import Skill, SkillError, make_skill
from sage_rl.skills.static import parse_cell
from sage_rl.types import SKILL_ORIGIN_PREFIX, Chain, ExecResult, Trajectory, Turn, cell_origin
from sage_rl.view.library_log import LibraryLog
from sage_rl.view.model import (
    CallMark,
    ChainView,
    CheckView,
    GroupView,
    Link,
    SectionView,
    SkillView,
    TrajView,
    TurnView,
)
from sage_rl.view.read import ChainSection

Credit = tuple[float, float | None, bool | None]  # reward, advantage, trained


@dataclass(frozen=True)
class ChainOptions:
    """How the run made its chains: from its config.yaml (``from_config``)."""

    save_policy: SavePolicy = SavePolicy.CALLED_OK
    rollout: RolloutConfig | None = None  # train only: rewards and advantages are computed
    group_size: int | None = None

    @classmethod
    def from_config(
        cls, config: dict, train: bool, problems: list[str], source: str = "config.yaml"
    ) -> ChainOptions:
        """``source`` names the file in the sentences added to ``problems``."""
        skills = config.get("skills") if isinstance(config.get("skills"), dict) else {}
        try:
            policy = SavePolicy(skills.get("save_policy", SavePolicy.CALLED_OK.value))
        except ValueError:
            problems.append(
                f"{source}: unknown skills.save_policy {skills.get('save_policy')!r}; using called_ok."
            )
            policy = SavePolicy.CALLED_OK
        if not train:
            return cls(policy)
        if not isinstance(config.get("rollout"), dict):
            problems.append(f"{source} has no rollout section, so rewards and advantages are not shown.")
            return cls(policy)
        section = config["rollout"]
        unknown = sorted(set(section) - set(RolloutConfig.model_fields))
        if unknown:  # a run from another version of sage-rl: use what this version knows
            problems.append(f"{source}: rollout keys {unknown} are unknown here and ignored for the rewards.")
        try:
            rollout = RolloutConfig.model_validate({k: v for k, v in section.items() if k not in unknown})
        except ValidationError as e:
            err = e.errors()[0]
            where = ".".join(["rollout", *map(str, err["loc"])])
            problems.append(f"{source}: {where} is not valid ({err['msg']}), so rewards are not shown.")
            return cls(policy)
        return cls(policy, rollout, rollout.group_size)


def section_view(section: ChainSection, prefix: str, opts: ChainOptions, problems: list[str]) -> SectionView:
    sid = f"{prefix}-{section.key}"
    groups: dict[int, list[Chain]] = defaultdict(list)
    for c in sorted(section.chains, key=lambda c: (c.group_index, c.chain_index)):
        groups[c.group_index].append(c)
    group_views, skills = [], []
    for gi, chains in sorted(groups.items()):
        gid = f"{sid}-g{gi}"
        credit = _credit(chains, opts, f"{section.label} group {gi}", problems)
        views = [
            chain_view(c, f"{gid}-c{c.chain_index}", opts.save_policy, credit.get(c.chain_index))
            for c in chains
        ]
        group_views.append(GroupView(gid, _group_label(gi, chains, opts), tuple(v for v, _ in views)))
        skills.append((gid, tuple(s for _, ss in views for s in ss)))
    return SectionView(sid, section.label, tuple(group_views), tuple(skills))


def _group_label(gi: int, chains: Sequence[Chain], opts: ChainOptions) -> str:
    first = chains[0].trajectories[0].task if chains[0].trajectories else None
    scenario = first.scenario_id if first else "?"
    if opts.rollout is None:
        return scenario
    size = f"{len(chains)} chains" + (f" of {opts.group_size}" if len(chains) != opts.group_size else "")
    return f"group {gi}: {scenario} ({size})"


def _credit(
    chains: Sequence[Chain], opts: ChainOptions, where: str, problems: list[str]
) -> dict[int, list[Credit]]:
    """chain index -> per position (reward, advantage, trained) for one group (see module docstring)."""
    if opts.rollout is None:
        return {}
    cfg = opts.rollout.model_copy(update={"drop_below": None})  # values for every sample; keep below
    try:
        samples = iter(to_samples([chains], cfg))
    except ValueError as e:
        problems.append(f"{where}: rewards cannot be computed ({e}).")
        return {}
    complete = opts.group_size is None or len(chains) == opts.group_size
    drop = opts.rollout.drop_below
    out: dict[int, list[Credit]] = {}
    for c in chains:
        out[c.chain_index] = []
        for _ in c.trajectories:
            s = next(samples)
            trained = None if not complete else (drop is None or abs(s.advantage) >= drop)
            out[c.chain_index].append((s.reward, s.advantage if complete else None, trained))
    return out


def chain_view(
    chain: Chain, cid: str, policy: SavePolicy, credit: list[Credit] | None = None
) -> tuple[ChainView, list[SkillView]]:
    """One chain's trajectories, and its library's skills, replaying the library in order."""
    log = LibraryLog(cid)
    trajs = []
    for k, traj in enumerate(chain.trajectories):
        tid = f"{cid}-k{k}"
        here = Link(f"task {traj.task.position} ({traj.task.task_id})", f"#{tid}")
        log.start(traj.library_in)
        found = saved_skills(traj, log.library, policy)
        defines: dict[int, list[tuple[str, str]]] = defaultdict(list)
        for skill, turn in found:
            defines[turn].append((skill.name, f"{tid}-def-{skill.name}"))
        turns = tuple(_turn_view(i, t, defines.get(i, ()), log.maker) for i, t in enumerate(traj.turns))
        used = log.use(traj.skills_used, here, traj.outcome.success)
        for skill, _ in found:
            log.save(skill, here, f"{tid}-def-{skill.name}")
        for name in sorted(set(traj.skills_saved) - {s.name for s, _ in found}):
            log.missing(name, here)
        saved = tuple(Link(n, log.entry(n)) for n in traj.skills_saved)
        trajs.append(_traj_view(tid, traj, turns, used, saved, credit[k] if credit else None))
    label = f"chain {chain.chain_index}"
    return ChainView(cid, label, tuple(trajs)), log.skills(Link(label, f"#{cid}"))


def _traj_view(tid, traj: Trajectory, turns, used, saved, credit: Credit | None) -> TrajView:
    t, o = traj.task, traj.outcome
    reward, adv, trained = credit if credit else (None, None, None)
    return TrajView(
        id=tid,
        task_id=t.task_id,
        scenario_id=t.scenario_id,
        position=t.position,
        instruction=t.instruction,
        score=o.score,
        success=o.success,
        stop=traj.stop.value,
        checks=tuple(CheckView(c.name, c.passed, c.detail) for c in o.checks),
        turns=turns,
        steps=len(traj.turns),
        tokens=traj.num_generated_tokens,
        reward=reward,
        advantage=adv,
        trained=trained,
        library_in=traj.library_in,
        saved=saved,
        used=used,
        error=traj.error,
    )


def _turn_view(i: int, turn: Turn, defines, maker: Callable[[str], str]) -> TurnView:
    result = exec_result(turn)
    calls = []
    for rec in result.calls or ():
        name = rec.origin[len(SKILL_ORIGIN_PREFIX) : -1] if rec.from_library else None
        if name is not None and rec.name == name:  # the skill itself, not a function nested in it
            calls.append(CallMark(name, rec.calls, rec.errors, maker(name)))
    return TurnView(
        index=i,
        code=turn.code,
        text=turn.text,
        observation=result.observation,
        tokens=turn.num_tokens,
        ok=result.ok if turn.code else None,
        timed_out=result.timed_out,
        defines=tuple(defines),
        calls=tuple(calls),
    )


def exec_result(turn: Turn) -> ExecResult:
    """What executing the turn's cell produced."""
    return turn.result


def saved_skills(traj: Trajectory, library: Library, policy: SavePolicy) -> list[tuple[Skill, int]]:
    """The skills ``traj`` saved (the names it recorded), each with the index of the turn whose
    cell defined it. Extracted as the chain did; a name the extraction does not give back (a
    different save policy, a dependency from a start library) falls back to its last definition."""
    code_turns = [(i, t) for i, t in enumerate(traj.turns) if t.code]
    cells = [(t.code or "", exec_result(t)) for _, t in code_turns]
    extracted = extract_skills(
        cells,
        policy=policy,
        task_success=traj.outcome.success,
        library=library,
        origins=[cell_origin(i) for i, _ in code_turns],
    )
    by_name = {s.name: s for s in extracted}
    out = []
    for name in traj.skills_saved:
        skill = by_name.get(name) or _last_definition(name, code_turns)
        if skill is not None:
            turn = max((i for i, t in code_turns if skill.source in (t.code or "")), default=-1)
            out.append((skill, turn))
    return out


def _last_definition(name: str, code_turns: Sequence[tuple[int, Turn]]) -> Skill | None:
    for _, t in reversed(code_turns):
        tree = parse_cell(t.code or "")
        nodes = [n for n in (tree.body if tree else []) if getattr(n, "name", None) == name]
        if nodes and hasattr(nodes[-1], "args"):
            try:
                return make_skill(function_source(t.code or "", nodes[-1]), name=name)
            except SkillError:
                return None
    return None
