"""The scenario template: phrasings, a parameter sampler, a reference skill and an oracle.

A template is one *scenario family*: every task sampled from it is solvable by the same reusable
skill with different arguments, which is what SAGE's sequential rollout relies on. The reference
solution is ``skill_source`` (typed, documented functions that use only ``apis``) followed by
``call_code(params)`` (a short snippet calling them and ``apis.supervisor.complete_task``).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sage_rl.envs.pocketworld.checks import Expect
from sage_rl.envs.pocketworld.generator import build_world
from sage_rl.envs.pocketworld.world import Db, World
from sage_rl.types import Task

SPLITS = ("train", "dev", "test_normal", "test_challenge")
TASKS_PER_SCENARIO = 3


class Unsuitable(Exception):
    """Raised by a sampler when a world cannot host the template; the next world seed is tried."""


#: Reusable helpers every reference skill builds on (defined once per library, like agent skills).
COMMON_SOURCE = '''
def login_to(app_name: str) -> str:
    """Log in to `app_name` as the supervisor and return the access token."""
    email = apis.supervisor.show_profile()["email"]
    passwords = {p["account_name"]: p["password"] for p in apis.supervisor.show_account_passwords()}
    app = getattr(apis, app_name)
    return app.login(username=email, password=passwords[app_name])["access_token"]


def fetch_all(api, **params) -> list:
    """Call a paginated listing API page by page (page_limit=20) and return all items."""
    items, page_index = [], 0
    while True:
        batch = api(page_index=page_index, page_limit=20, **params)
        items.extend(batch)
        if len(batch) < 20:
            return items
        page_index += 1
'''.strip()
COMMON_NAMES = ("login_to", "fetch_all")


@dataclass(frozen=True)
class Template:
    """One scenario template. ``phrasings`` and ``call`` are ``str.format`` strings over the params.

    ``sample(rng, world)`` returns JSON-able params (it may read ``world.db`` and ``world.now``) (raise ``Unsuitable`` to skip a world);
    ``expect(db, params)`` is the oracle, computed from the initial state without the APIs.
    """

    name: str
    split: str
    apps: tuple[str, ...]
    difficulty: int
    phrasings: tuple[str, ...]
    sample: Callable[[random.Random, World], dict[str, Any]]
    expect: Callable[[Db, Mapping[str, Any]], Expect]
    skill_source: str  # the template's own functions; they may call COMMON_NAMES
    skill_names: tuple[str, ...]
    call: str

    @property
    def full_skill_source(self) -> str:
        """The common helpers followed by this template's skills: what task 1 defines."""
        return f"{COMMON_SOURCE}\n\n\n{self.skill_source.strip()}\n"

    @property
    def all_skill_names(self) -> tuple[str, ...]:
        return COMMON_NAMES + self.skill_names

    def call_code(self, params: Mapping[str, Any]) -> str:
        """The snippet that solves one task given the skills are defined."""
        return self.call.format(**params).strip() + "\n"

    def solution(self, params: Mapping[str, Any]) -> str:
        """The full reference solution: skills + call, run as one agent cell."""
        return f"{self.full_skill_source}\n\n{self.call_code(params)}"


def stable_seed(*parts: Any) -> int:
    """A 31-bit seed from its parts (sha256; Python's ``hash`` is salted per process)."""
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


#: World seeds a task may try before its template is declared broken.
MAX_ATTEMPTS = 100
#: Worlds tried for one draw of the sampler's rng (a target answer) before it draws again.
TARGET_ATTEMPTS = 25
_GOLDEN = (5**0.5 - 1) / 2


class TaskRandom(random.Random):
    """A sampler's rng, plus ``stratum``: where in [0, 1) ``helpers.spread`` draws its target
    answer, or None for "any answer this world offers" (the last resort of ``sample_task``).

    Task k = 3 * scenario_seed + position - 1 of a template first gets frac(offset + k * golden
    ratio), a Weyl sequence: any run of consecutive tasks covers [0, 1) almost evenly, so answers
    drawn from it are balanced over a handful of scenarios (uniform draws need hundreds to be),
    and over the random scenario seeds training draws they are uniform."""

    def __init__(self, seed: int, stratum: float | None) -> None:
        super().__init__(seed)
        self.stratum = stratum


def sample_task(template: Template, scenario_seed: int, position: int) -> tuple[World, dict[str, Any]]:
    """The world and params of task ``position`` of scenario (template, scenario_seed).

    World seeds ``stable_seed(template, scenario_seed, position, attempt)`` are tried in turn until
    the sampler accepts one. The sampler's rng (a ``TaskRandom``) restarts from the same seed and
    stratum at every attempt, so what it draws before it looks at the world (a target answer,
    ``helpers.spread``) stays fixed while the worlds change: the answers then follow the target's
    distribution, not whichever worlds happen to host a value most easily (issue 30: guessable
    answers). Every ``TARGET_ATTEMPTS`` worlds it draws a new stratum, so an answer few worlds
    offer cannot stall a task; the last block takes any answer (no stratum), so a template whose
    worlds offer some answer never runs out of attempts."""
    k = TASKS_PER_SCENARIO * scenario_seed + position - 1
    weyl = (stable_seed(template.name, "stratum") / 2**31 + k * _GOLDEN) % 1.0
    last = (MAX_ATTEMPTS - 1) // TARGET_ATTEMPTS
    for attempt in range(MAX_ATTEMPTS):
        world = build_world(stable_seed(template.name, scenario_seed, position, attempt))
        block = attempt // TARGET_ATTEMPTS
        task_seed = stable_seed(template.name, scenario_seed, position, "params", block)
        stratum = weyl if block == 0 else None if block == last else random.Random(task_seed).random()
        try:
            return world, template.sample(TaskRandom(task_seed, stratum), world)
        except Unsuitable:
            continue
    raise RuntimeError(f"template {template.name!r}: no suitable world found in {MAX_ATTEMPTS} attempts")


def make_task(template: Template, scenario_id: str, scenario_seed: int, position: int, split: str) -> Task:
    """Task ``position`` (1-based) of a scenario: its own world seed, sampled params and phrasing."""
    world, params = sample_task(template, scenario_seed, position)
    phrasing = (position - 1 + scenario_seed) % len(template.phrasings)
    return Task(
        task_id=f"{scenario_id}_{position}",
        scenario_id=scenario_id,
        position=position,
        instruction=template.phrasings[phrasing].format(**params),
        split=split,
        env="pocketworld",
        difficulty=template.difficulty,
        apps=template.apps,
        spec={"template": template.name, "seed": world.seed, "params": params},
    )
