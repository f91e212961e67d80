"""Read-only queries over a world's data, for samplers and oracles (never used by reference skills)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from sage_rl.envs.pocketworld.scenarios.base import Unsuitable
from sage_rl.envs.pocketworld.world import Db


def me(db: Db) -> str:
    return db["supervisor"]["profile"]["me"]["email"]


def my_phone(db: Db) -> str:
    return db["supervisor"]["profile"]["me"]["phone_number"]


def contacts(db: Db, relationship: str | None = None) -> list[dict[str, Any]]:
    rows = db["phone"]["contacts"].values()
    return [c for c in rows if relationship is None or c["relationship"] == relationship]


def full_name(c: dict[str, Any]) -> str:
    return f"{c['first_name']} {c['last_name']}"


def name_of(db: Db, email: str) -> str:
    return db["payments"]["users"][email]["name"]


def playlists(db: Db) -> dict[int, dict[str, Any]]:
    return {k: p for k, p in db["music"]["playlists"].items() if p["owner"] == me(db)}


def playlist_id(db: Db, title: str) -> int:
    return next(k for k, p in playlists(db).items() if p["title"] == title)


def my_ratings(db: Db) -> dict[int, int]:
    return {r["song_id"]: r["rating"] for r in db["music"]["ratings"].values() if r["user"] == me(db)}


def liked(db: Db) -> set[int]:
    return {r["song_id"] for r in db["music"]["likes"].values() if r["user"] == me(db)}


def pick(rng: random.Random, options: Sequence[Any], what: str) -> Any:
    """``rng.choice`` that raises Unsuitable on an empty sequence."""
    if not options:
        raise Unsuitable(what)
    return options[rng.randrange(len(options))]


#: The answers a counting template draws from (``spread``): 20 values, a constant is right 1 time in 20.
COUNTS = tuple(range(1, 21))


def spread(rng: random.Random, support: Sequence[Any], answer_of: dict[Any, Any]) -> Any:
    """Target-first sampling: draw the answer uniformly from ``support`` (from the task's stratum,
    ``base.TaskRandom``), then a key of ``answer_of`` (a parameter -> the answer it gives in this
    world) that gives it; Unsuitable when none does. ``make_task`` keeps the drawn target over the
    worlds it tries, so the answers are uniform over ``support`` and no constant answer is right
    much more than 1/len(support) of the time (issue 30)."""
    stratum = getattr(rng, "stratum", rng.random())  # a plain Random: a uniform draw
    if stratum is None:  # make_task's last resort: any answer in the support
        return pick(rng, sorted(k for k, v in answer_of.items() if v in support), "an answer in the support")
    target = support[int(stratum * len(support))]
    return pick(
        rng, sorted(k for k, v in answer_of.items() if v == target), f"a parameter with answer {target!r}"
    )


def unique_max(counts: dict[Any, float]) -> Any:
    """The key with the largest value; Unsuitable when there is a tie (the answer would be ambiguous)."""
    if not counts:
        raise Unsuitable("nothing to count")
    best = max(counts.values())
    keys = [k for k, v in counts.items() if v == best]
    if len(keys) != 1:
        raise Unsuitable("tie")
    return keys[0]


def sorted_unique(values: list[Any]) -> list[Any]:
    return sorted(set(values))


#: How a relationship reads in an instruction: one person / several people.
RELATION_PERSON = {
    "roommate": "roommate",
    "family": "family member",
    "friend": "friend",
    "coworker": "coworker",
}


def rel(relationship: str) -> dict[str, str]:
    """Params for a relationship: the value APIs use, plus the words phrasings use."""
    person = RELATION_PERSON[relationship]
    return {"relationship": relationship, "person": person, "people": person + "s"}
