"""What the page shows, as small frozen records built from a run's data (``chains.py``,
``collected.py``) and rendered by the templates (``page.py``). No I/O here.

Ids are HTML ids, unique within one page: a run's prefix (``a``, ``b``), then the section, group,
chain and position, e.g. ``a-s3-g0-c1-k0`` (step 3, group 0, chain 1, task 1). Every ``href`` is
``#`` + an id that exists on the page.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Link:
    label: str
    href: str | None = None  # "#id", or None when the target is not on the page


@dataclass(frozen=True)
class CallMark:
    """A library skill called in one cell (the sandbox's call record), linked to its maker."""

    name: str
    calls: int
    errors: int
    href: str | None


@dataclass(frozen=True)
class TurnView:
    index: int
    code: str | None  # the executed cell, None when the reply held no code
    text: str  # the whole reply (shown when there is no code)
    observation: str
    tokens: int | None  # generated tokens of the turn; None when not recorded (collect)
    ok: bool | None  # the cell ran without an exception; None when not recorded
    timed_out: bool = False
    defines: tuple[tuple[str, str], ...] = ()  # (skill name, anchor id) of skills saved from this cell
    calls: tuple[CallMark, ...] = ()


@dataclass(frozen=True)
class CheckView:
    name: str
    passed: bool
    detail: str


@dataclass(frozen=True)
class TrajView:
    """One task of one chain: the row of the chains table and its expandable body."""

    id: str
    task_id: str
    scenario_id: str
    position: int  # 1-based, as in ``Task.position``
    instruction: str
    score: float
    success: bool
    stop: str
    checks: tuple[CheckView, ...] = ()
    turns: tuple[TurnView, ...] = ()
    steps: int = 0  # policy turns (a collect task whose example was dropped has steps but no turns)
    tokens: int | None = None
    reward: float | None = None  # train only (rollout/batch.py: to_samples with the run's config)
    advantage: float | None = None
    trained: bool | None = None  # False when |A| < drop_below dropped the sample
    library_in: tuple[str, ...] = ()
    saved: tuple[Link, ...] = ()  # -> the skill's entry on the Skills tab
    used: tuple[Link, ...] = ()  # -> the definition in the task that made it
    error: str = ""
    note: str = ""  # collect: whether the task's example was kept, or why it was dropped
    prompt: str = ""  # collect: the task's opening user message (instruction and library section)


@dataclass(frozen=True)
class ChainView:
    id: str
    label: str
    trajectories: tuple[TrajView, ...]


@dataclass(frozen=True)
class GroupView:
    """The G chains that ran one task sequence (train), or one scenario's chain (eval, collect)."""

    id: str
    label: str
    chains: tuple[ChainView, ...]

    @property
    def size(self) -> int:
        return sum(len(c.trajectories) for c in self.chains)


@dataclass(frozen=True)
class Use:
    traj: Link
    success: bool


@dataclass(frozen=True)
class VersionView:
    version: int
    status: str  # Library.add's AddStatus: added / replaced / unchanged / duplicate; or "start library"
    maker: Link  # -> the definition in the trajectory that saved it
    source: str
    tier: str = ""


@dataclass(frozen=True)
class SkillView:
    """One skill of one chain's library: who made it, its versions, and the tasks that used it."""

    id: str
    name: str
    chain: Link
    versions: tuple[VersionView, ...]
    uses: tuple[Use, ...]

    @property
    def success_when_used(self) -> float | None:
        return sum(u.success for u in self.uses) / len(self.uses) if self.uses else None


@dataclass(frozen=True)
class SectionView:
    """One step (train), strategy (eval) or temperature (collect): its groups and their skills."""

    id: str
    label: str
    groups: tuple[GroupView, ...]
    skills: tuple[tuple[str, tuple[SkillView, ...]], ...]  # (group id, its chains' skills)
    stats: tuple[tuple[str, str], ...] = ()  # e.g. the step's row of metrics.jsonl
