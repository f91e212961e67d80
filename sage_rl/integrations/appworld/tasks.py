"""AppWorld's task lists, read straight from its data folder (no AppWorld import needed).

Layout (AppWorld 0.1.3, data 0.1.0):
- ``data/datasets/<split>.txt``: one task id per line, optionally tagged ``<id>:<tag>``;
- ``data/tasks/<id>/specs.json``: instruction, supervisor, datetime, db_version;
- ``data/tasks/<id>/ground_truth/metadata.json``: difficulty (1-3), among others.

A task id is ``<scenario>_<n>``; the scenario (AppWorld's "generator id") is the prefix.

The filters follow AppWorld's own ``load_task_ids``: a difficulty keeps tasks whose ground-truth
metadata has it; ``num_tasks_per_scenario=N`` keeps tasks numbered 1..N and requires every
scenario left to have all of them.
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from collections.abc import Collection, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from sage_rl.integrations.appworld.paths import SetupError
from sage_rl.types import Task


def parse_task_id(task_id: str) -> tuple[str, int]:
    """``"50e1ac9_2"`` -> ``("50e1ac9", 2)``. A tag after ``:`` is dropped."""
    bare = task_id.split(":")[0].strip()
    scenario, sep, n = bare.rpartition("_")
    if not sep or not scenario or not n.isdigit():
        raise ValueError(f"AppWorld task id {task_id!r} is not of the form <scenario>_<n>")
    return scenario, int(n)


def split_ids(data: Path, split: str) -> list[str]:
    """The task ids of ``split``, tags removed, in file order."""
    path = data / "datasets" / f"{split}.txt"
    if not path.is_file():
        known = sorted(p.stem for p in (data / "datasets").glob("*.txt"))
        raise SetupError(
            f"AppWorld split {split!r} not found at {path} (known splits: {', '.join(known) or 'none'})"
        )
    return [line.split(":")[0].strip() for line in path.read_text().splitlines() if line.strip()]


def task_context(spec: Mapping[str, Any]) -> dict[str, str]:
    """What AppWorld's protocol tells the agent besides the instruction: who its supervisor is
    (the "I" and "my" of the task) and the world's date. Strings, keyed ``supervisor`` and
    ``date``; a key is left out when the task does not say."""
    out: dict[str, str] = {}
    sup = spec.get("supervisor") or {}
    name = " ".join(str(sup[k]) for k in ("first_name", "last_name") if sup.get(k))
    if name:
        contact = [
            f"{label} {sup[key]}"
            for key, label in (("email", "email"), ("phone_number", "phone"))
            if sup.get(key)
        ]
        out["supervisor"] = name + (f" ({', '.join(contact)})" if contact else "")
    when = str(spec.get("datetime") or "")
    if when:
        try:
            out["date"] = datetime.fromisoformat(when).strftime("%A, %Y-%m-%d, %H:%M")
        except ValueError:
            out["date"] = when
    return out


def load_task(data: Path, task_id: str, split: str) -> Task:
    """One AppWorld task as a sage-rl ``Task``: ``spec`` holds the supervisor and the datetime,
    ``context`` (where ``Task`` has it) what the agent is told of them (``task_context``)."""
    scenario, n = parse_task_id(task_id)
    folder = data / "tasks" / task_id
    specs_path = folder / "specs.json"
    if not specs_path.is_file():
        raise SetupError(f"AppWorld task {task_id} has no specs.json at {specs_path}")
    specs = json.loads(specs_path.read_text())
    meta_path = folder / "ground_truth" / "metadata.json"
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    supervisor = specs.get("supervisor") or specs.get("main_user") or {}
    spec = {"supervisor": dict(supervisor), "datetime": specs.get("datetime", "")}
    return Task(
        task_id=task_id,
        scenario_id=scenario,
        position=n,
        instruction=specs["instruction"],
        split=split,
        env="appworld",
        difficulty=int(meta.get("difficulty", 1)),
        spec=spec,
        context=task_context(spec),
    )


def load_split(data: Path, split: str) -> tuple[Task, ...]:
    """All tasks of ``split``, grouped by scenario (in order of first appearance), then position."""
    tasks = [load_task(data, tid, split) for tid in split_ids(data, split)]
    first_seen: dict[str, int] = {}
    for i, t in enumerate(tasks):
        first_seen.setdefault(t.scenario_id, i)
    return tuple(sorted(tasks, key=lambda t: (first_seen[t.scenario_id], t.position)))


def filter_tasks(
    tasks: tuple[Task, ...], difficulties: Collection[int] = (), num_tasks_per_scenario: int | None = None
) -> tuple[Task, ...]:
    """The tasks of the given difficulties (all when empty) numbered up to
    ``num_tasks_per_scenario`` (all when None), in input order. As AppWorld's ``load_task_ids``
    does, a scenario left without one of its tasks 1..N is an error (``SetupError``)."""
    kept = [t for t in tasks if not difficulties or t.difficulty in difficulties]
    if num_tasks_per_scenario is None:
        return tuple(kept)
    kept = [t for t in kept if t.position <= num_tasks_per_scenario]
    expected = list(range(1, num_tasks_per_scenario + 1))
    for scenario, group in scenarios(tuple(kept)).items():
        found = [t.position for t in group]
        if found != expected:
            raise SetupError(
                f"num_tasks_per_scenario={num_tasks_per_scenario}: AppWorld scenario {scenario} has "
                f"tasks {found}, not {expected}"
            )
    return tuple(kept)


def scenarios(tasks: tuple[Task, ...]) -> dict[str, tuple[Task, ...]]:
    """Scenario id -> its tasks in position order (input order of scenarios kept)."""
    out: dict[str, list[Task]] = defaultdict(list)
    for t in tasks:
        out[t.scenario_id].append(t)
    return {k: tuple(sorted(v, key=lambda t: t.position)) for k, v in out.items()}


def first_scenarios(tasks: tuple[Task, ...], limit: int | None) -> tuple[Task, ...]:
    """The tasks of the first ``limit`` scenarios of ``tasks`` (all of them when None)."""
    if limit is None:
        return tasks
    return tuple(t for group in list(scenarios(tasks).values())[:limit] for t in group)


def sample_chain(tasks: tuple[Task, ...], rng: random.Random, length: int) -> tuple[Task, ...]:
    """``length`` tasks of one random scenario, in position order.

    The scenario is drawn uniformly among those with at least ``length`` tasks; the tasks are a
    random subset of it, kept in position order (for AppWorld's 3 tasks and K=2: (1,2), (1,3) or
    (2,3)).
    """
    if length < 1:
        raise ValueError(f"chain length must be >= 1, got {length}")
    groups = [g for g in scenarios(tasks).values() if len(g) >= length]
    if not groups:
        raise ValueError(
            f"no scenario has {length} tasks (largest has {max(map(len, scenarios(tasks).values()), default=0)})"
        )
    group = rng.choice(groups)
    picked = sorted(rng.sample(range(len(group)), length))
    return tuple(group[i] for i in picked)
