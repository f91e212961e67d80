"""The core data types of sage-rl, in one place.

Every type here is a small frozen dataclass that round-trips through JSON (``text.dumps`` /
``from_dict``), so tasks, trajectories, chains and outcomes can be written to JSON Lines and read
back. ``from_dict`` validates with pydantic: a record read back has every field of its declared
type, or is refused (a damaged file's ``null`` token count once raised ``TypeError`` far from the
file, in the results' sums). Group keys are tuples, never strings to be parsed (STYLE.md, principle 1).
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pydantic

# --------------------------------------------------------------------------------------------
# Tasks and outcomes
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Task:
    """One task of one scenario.

    ``task_id`` is ``<scenario_id>_<n>`` for evaluation splits (AppWorld's convention);
    ``position`` is n, counted from 1. ``spec`` is environment-specific and JSON-able (for
    PocketWorld: the template name, seed and sampled parameters) - agent code never sees it.
    ``context`` is what the agent IS meant to see besides the instruction (e.g. AppWorld's
    supervisor and the task's date); the prompt renders it. Empty for PocketWorld.
    """

    task_id: str
    scenario_id: str
    position: int
    instruction: str
    split: str
    env: str = "pocketworld"
    difficulty: int = 1
    apps: tuple[str, ...] = ()
    spec: Mapping[str, Any] = field(default_factory=dict)
    context: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Task:
        return _adapter(cls).validate_python(d)


@dataclass(frozen=True)
class CheckResult:
    """One state-based check of a task (AppWorld-style unit test)."""

    name: str
    passed: bool
    detail: str = ""


@dataclass(frozen=True)
class Outcome:
    """The evaluation of one finished task: ``score`` is r in [0, 1] (SAGE.md section 4), the
    fraction of checks passed (``from_checks``; PocketWorld counts its collateral check only once
    the task's own checks pass, ``checks.gated_outcome``); ``success``: every check passed.
    ``lasting``: the episode's world changes (1, 2, ... in order, ``CallRecord.changes``) whose
    work is still there at the end (PocketWorld: a field holds what the change put there, and not
    what it held at the start); None where the environment does not say (all count as lasting).
    ``answer_scored``: whether a check scored the submitted answer (PocketWorld: the task asks for
    one); None where the environment does not say (an answer counts as a skill's effect)."""

    score: float
    success: bool
    checks: tuple[CheckResult, ...] = ()
    lasting: tuple[int, ...] | None = None
    answer_scored: bool | None = None

    @classmethod
    def from_checks(cls, checks: tuple[CheckResult, ...]) -> Outcome:
        n, passed = len(checks), sum(c.passed for c in checks)
        return cls(score=passed / n if n else 0.0, success=n > 0 and passed == n, checks=checks)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Outcome:
        return _adapter(cls).validate_python(d)


# --------------------------------------------------------------------------------------------
# Talking to a policy (the protocol itself is ``sage_rl.policies.base.Policy``)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_tokens: int = 1500  # per turn (SAGE.md section 1)
    seed: int | None = None


@dataclass(frozen=True)
class PolicyRequest:
    """One turn's request.

    Token-exact policies (transformers, vLLM completions) read ``prompt_ids``, the whole episode so
    far. Text policies (chat APIs) read ``messages``. ``task_id`` names the task the episode plays
    (for tracing, routing and recording; never its hidden ``spec``).
    """

    messages: tuple[Mapping[str, str], ...]
    prompt_ids: tuple[int, ...] | None
    params: SamplingParams = field(default_factory=SamplingParams)
    task_id: str = ""


@dataclass(frozen=True)
class Completion:
    text: str
    token_ids: tuple[int, ...] = ()  # exactly the sampled ids (empty for text-only backends)
    logprobs: tuple[float, ...] = ()  # one per sampled id, under the sampling distribution
    finish_reason: str = "stop"  # "stop" | "length"
    prompt_tokens: int = 0
    completion_tokens: int = 0


# --------------------------------------------------------------------------------------------
# Executing code
# --------------------------------------------------------------------------------------------

#: Code-object filename prefix for a library skill executed into a task's interpreter before the
#: task starts (``<skill:NAME>``). Agent cells are compiled as ``<cell-N>``. Call records carry the
#: filename of the function's code object, so "a library skill was called" is exact, and a skill
#: that the task redefined first no longer counts (SAGE.md section 2).
SKILL_ORIGIN_PREFIX = "<skill:"


def skill_origin(name: str) -> str:
    return f"{SKILL_ORIGIN_PREFIX}{name}>"


def cell_origin(index: int) -> str:
    return f"<cell-{index}>"


@dataclass(frozen=True)
class CallRecord:
    """Calls of one agent-defined function during one cell, as reported by the sandbox.

    ``origin`` is the filename its code object was compiled with: ``<cell-N>`` or ``<skill:NAME>``.
    ``errors`` counts the calls that raised; ``with_api`` the calls that returned without raising
    AND made at least one successful API call while they ran, made by their own code, by functions
    of the same origin or by library skills they called (not by the task's code passed in as a
    callback; generator and async functions never count; sage_rl/sandbox/tracking.py). ``effects``
    counts, for a library skill, the events this cell by which its work reached the world: an API
    call of its own that changed it, or a value it returned (in this cell or an earlier one) passed
    to such a call or in the last answer submitted (sage_rl/sandbox/flow.py; ``calls`` may be 0);
    ``changes``: the world changes among them, by their order in the episode (the others are the
    answer, or changes the environment could not number); ``Outcome.lasting`` says which lasted.
    Records written before issue 30 have no ``with_api``, before the ``flow`` credit no ``effects``
    (read as 0), before lasting changes no ``changes`` (their effects count as lasting).
    """

    name: str
    origin: str
    calls: int
    errors: int
    with_api: int = 0
    effects: int = 0
    changes: tuple[int, ...] = ()

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CallRecord:
        return _adapter(cls).validate_python(d)

    @classmethod
    def of_row(cls, row: Sequence[Any]) -> CallRecord:
        """From a tracker's ``[name, origin, calls, errors, with_api, events]`` (``flow``'s events:
        0 the answer, n the episode's n-th change; sandbox/tracking.py)."""
        *head, events = row
        distinct = set(events)
        return cls(*head, len(distinct), tuple(sorted(e for e in distinct if e > 0)))

    def reached(self, lasting: Collection[int] | None, answer: bool = True) -> bool:
        """Whether its work reached the world for good: event 0 (the answer where ``answer``, i.e. a
        check scored it; or an unnumbered change), or a change in ``lasting`` (None: all count)."""
        if answer and self.effects > len(self.changes):
            return True
        return any(c in lasting for c in self.changes) if lasting is not None else bool(self.changes)

    @property
    def from_library(self) -> bool:
        return self.origin.startswith(SKILL_ORIGIN_PREFIX)

    @property
    def returned(self) -> int:
        """Calls that did not raise."""
        return self.calls - self.errors


@dataclass(frozen=True)
class ExecResult:
    """What executing one code cell produced.

    ``calls`` is None where the environment cannot report calls (AppWorld); skill usage then falls
    back to static detection. ``defined`` names the functions whose definitions in this cell
    actually executed (bound in the namespace afterwards, compiled from this cell's ``origin``);
    None where the environment cannot tell, and extraction then falls back to the AST.
    ``api_ok`` is the number of API calls of this cell that succeeded, counted by the process that
    owns the world (the sandbox's parent), not by the worker; None where nobody counted them.
    """

    observation: str
    ok: bool
    completed: bool = False
    timed_out: bool = False
    calls: tuple[CallRecord, ...] | None = ()
    defined: tuple[str, ...] | None = ()
    duration_s: float = 0.0
    api_ok: int | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ExecResult:
        return _adapter(cls).validate_python(d)


# --------------------------------------------------------------------------------------------
# Trajectories
# --------------------------------------------------------------------------------------------


class StopReason(enum.StrEnum):
    """Why an episode ended. Data, not exceptions (STYLE.md, principle 12)."""

    COMPLETED = "completed"  # the agent called complete_task
    STEP_LIMIT = "step_limit"
    CONTEXT_LIMIT = "context_limit"  # the next turn would not fit the context window
    TOKEN_BUDGET = "token_budget"  # total generated tokens for the episode ran out
    POLICY_ERROR = "policy_error"  # the model backend failed (recorded, not raised)
    ENV_ERROR = "env_error"


@dataclass(frozen=True)
class Turn:
    """One policy turn and the environment's answer (``result``: what executing its code gave).

    Token layout of the episode: ``prompt_ids`` of the first turn is the rendered system+task
    prompt; each turn's ``obs_ids`` is the observation rendered as one new chat message (including
    the next generation prompt). The trained sequence is the concatenation
    ``prompt_ids(turn 0) + [gen_ids + obs_ids for each turn]`` and the loss mask is 1 exactly on
    ``gen_ids`` (ARCHITECTURE.md, principle 3). A turn without code has ``code=None`` and a result
    whose observation tells the agent so.
    """

    gen_ids: tuple[int, ...]
    gen_logprobs: tuple[float, ...]
    text: str
    code: str | None
    result: ExecResult
    obs_ids: tuple[int, ...] = ()
    completion_tokens: int = 0  # as counted by the backend (equals len(gen_ids) when token-exact)
    policy_s: float = 0.0
    env_s: float = 0.0

    @property
    def observation(self) -> str:
        return self.result.observation

    @property
    def num_tokens(self) -> int:
        return max(len(self.gen_ids), self.completion_tokens)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Turn:
        """Reads both layouts: ``result`` (since issue 12) and the older flat one, whose
        ``observation``, ``exec_ok``, ``timed_out``, ``calls`` and ``defined`` sat on the turn."""
        return _adapter(cls).validate_python(_turn_layout(d))


#: Fields of ``ExecResult`` that turns written before issue 12 held themselves.
_FLAT_RESULT = ("observation", "exec_ok", "timed_out", "calls", "defined")


@dataclass(frozen=True)
class Trajectory:
    """One episode: one task solved (or not) by one policy with one library."""

    task: Task
    prompt_ids: tuple[int, ...]
    turns: tuple[Turn, ...]
    outcome: Outcome
    stop: StopReason
    library_in: tuple[str, ...] = ()  # library skills retrieved for the task, loaded before it
    #: skills of ``library_in`` whose definition failed to execute, and those depending on them:
    #: left out of the prompt and dropped from the chain's library (SAGE.md section 1)
    library_dropped: tuple[str, ...] = ()
    skills_saved: tuple[str, ...] = ()  # skills this episode contributed to the chain's library
    skills_used: tuple[str, ...] = ()  # library skills actually used (SAGE.md section 2)
    policy: str = ""
    error: str = ""  # what went wrong when stop is POLICY_ERROR or ENV_ERROR

    @property
    def produced_code(self) -> bool:
        return any(t.code for t in self.turns)

    @property
    def num_generated_tokens(self) -> int:
        return sum(t.num_tokens for t in self.turns)

    def token_arrays(self) -> tuple[list[int], list[int], list[float]]:
        """(ids, mask, sampler logprobs) of the whole episode; mask=1 on generated tokens only."""
        ids, mask, lps = list(self.prompt_ids), [0] * len(self.prompt_ids), [0.0] * len(self.prompt_ids)
        for t in self.turns:
            ids += t.gen_ids
            mask += [1] * len(t.gen_ids)
            lps += t.gen_logprobs
            ids += t.obs_ids
            mask += [0] * len(t.obs_ids)
            lps += [0.0] * len(t.obs_ids)
        return ids, mask, lps

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Trajectory:
        return _adapter(cls).validate_python(_trajectory_layout(d))


GroupKey = tuple[tuple[str, ...], int]
"""(task sequence as a tuple of task ids, position k counted from 0): the GRPO group of a sample."""


@dataclass(frozen=True)
class Chain:
    """One sequential rollout (SAGE.md section 3): K tasks of one scenario, one growing library.

    ``used_from`` holds, per position k, the positions j < k whose skills task k used.
    ``start_library`` is the (name, content hash) of each skill the chain started from, sorted:
    the chains of a GRPO group must agree on it (``rollout.batch.check_group_contract``).
    """

    group_index: int
    chain_index: int
    trajectories: tuple[Trajectory, ...]
    used_from: tuple[tuple[int, ...], ...] = ()
    start_library: tuple[tuple[str, str], ...] = ()

    @property
    def task_ids(self) -> tuple[str, ...]:
        return tuple(t.task.task_id for t in self.trajectories)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Chain:
        """A chain record read back with every field of its declared type (pydantic checks them all,
        turns of the older flat layout read as ``Turn.from_dict`` reads them); ``ValueError`` naming
        the first fault for anything else: a damaged line, a crafted one, a number that is null."""
        try:
            trajectories = [_trajectory_layout(t) for t in d["trajectories"]]
            return _adapter(cls).validate_python({**d, "trajectories": trajectories})
        except (KeyError, TypeError, AttributeError, ValueError) as e:
            raise ValueError(f"not a chain record ({type(e).__name__}: {fault(e)})") from None


def fault(e: BaseException) -> str:
    """An exception's message on one line, cut to its first three: pydantic's validation error reads
    "1 validation error for X", the field, the fault, then a link; a record's reader names the first
    three in its own error. (Here, as the sandbox's workers load this module and no more.)"""
    return " ".join(str(e).split("\n")[:3])


@functools.cache
def _adapter(cls: type) -> pydantic.TypeAdapter:
    return pydantic.TypeAdapter(cls)


def _trajectory_layout(trajectory: Mapping[str, Any]) -> dict[str, Any]:
    return {**trajectory, "turns": [_turn_layout(u) for u in trajectory["turns"]]}


def _turn_layout(turn: Any) -> Any:
    """A turn in the ``result`` layout (``Turn.from_dict``'s reading of the older flat one)."""
    if not isinstance(turn, Mapping) or "result" in turn:
        return turn
    flat = {k: turn[k] for k in _FLAT_RESULT if k in turn}
    ok = flat.pop("exec_ok", True)
    result = {"observation": "", **flat, "ok": ok}
    return {**{k: v for k, v in turn.items() if k not in _FLAT_RESULT}, "result": result}


@dataclass(frozen=True)
class Sample:
    """One training sample: one task of one chain, with its reward and advantage."""

    group: GroupKey
    trajectory: Trajectory
    reward: float
    advantage: float
