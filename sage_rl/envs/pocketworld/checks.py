"""AppWorld-style checks: required changes, no collateral damage (a state diff), a normalised answer.

A template's oracle returns an ``Expect`` computed from the *initial* state and the task's
parameters - independently of the reference solution, which only ever uses the public APIs.
``evaluate`` turns it into ``CheckResult``s and scores them with ``gated_outcome``: the task's own
checks (requirements, answer) count as they pass; "no collateral changes" counts only once all of
them pass. A no-op passes the collateral check and nothing else, so it scores 0, not 0.5
(issue 30). A requirement on the state counts only when nothing collateral changed: acting on
every item ("like every song", "delete every email") meets "all of the artist's songs are liked"
and would otherwise score 0.5, more than a careful attempt that missed one target (0). docs/pocketworld.md,
"Scoring", compares this with AppWorld's fraction of all tests.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sage_rl.envs.pocketworld.bounds import MAX_DEPTH, brief
from sage_rl.envs.pocketworld.world import Db
from sage_rl.types import CheckResult, Outcome

NO_ANSWER: Any = object()  # sentinel: the task asks for no answer


@dataclass(frozen=True)
class Change:
    """One row of one table that differs between two states (added: before is None; removed: after is None)."""

    app: str
    table: str
    key: Any
    before: dict[str, Any] | None
    after: dict[str, Any] | None

    def __str__(self) -> str:
        kind = "added" if self.before is None else "removed" if self.after is None else "changed"
        return f"{self.app}.{self.table}[{self.key!r}] {kind}"


@dataclass(frozen=True)
class Allow:
    """An allowed change: rows of ``app.table`` for which ``where(row)`` holds (any row if None).

    ``where`` sees the row after the change (before it, for a removal).
    """

    app: str
    table: str
    where: Callable[[dict[str, Any]], bool] | None = None

    def permits(self, c: Change) -> bool:
        if (c.app, c.table) != (self.app, self.table):
            return False
        row = c.after if c.after is not None else c.before
        return self.where is None or bool(self.where(row))


@dataclass(frozen=True)
class Require:
    """A required property of the final state, named for the report."""

    name: str
    holds: Callable[[Db], bool]


@dataclass(frozen=True)
class Expect:
    answer: Any = NO_ANSWER
    ordered: bool = False  # compare list answers in order
    requires: tuple[Require, ...] = ()
    allow: tuple[Allow, ...] = ()


def diff(before: Db, after: Db) -> list[Change]:
    """Every row that differs between two states, in a deterministic order."""
    out = []
    for app in sorted(set(before) | set(after)):
        ta, tb = before.get(app, {}), after.get(app, {})
        if ta == tb:
            continue
        for table in sorted(set(ta) | set(tb)):
            ra, rb = ta.get(table, {}), tb.get(table, {})
            if ra == rb:
                continue
            for key in sorted(set(ra) | set(rb), key=repr):
                if ra.get(key) != rb.get(key):
                    out.append(Change(app, table, key, ra.get(key), rb.get(key)))
    return out


#: A field (app, table, row key, field name) of the data.
Field = tuple[str, str, Any, str]
#: Fields so named hold a time stamp (``created_at``, ``updated_at``, ``sent_at``): ``lasting`` skips them.
STAMP_SUFFIX = "_at"
#: What a field of a missing row, or a missing field, holds (equal only to itself).
ABSENT: Any = object()


def touched(before: Db, after: Db) -> dict[Field, Any]:
    """The fields that differ between two states, with what ``after`` holds in them (``ABSENT``
    for a removed row's fields). Both states must be copies no later change can mutate."""
    out: dict[Field, Any] = {}
    for c in diff(before, after):
        b, a = c.before or {}, c.after or {}
        for name in set(b) | set(a):
            if b.get(name, ABSENT) != a.get(name, ABSENT):
                out[(c.app, c.table, c.key, name)] = a.get(name, ABSENT)
    return out


def _value(db: Db, field: Field) -> Any:
    app, table, key, name = field
    row = db.get(app, {}).get(table, {}).get(key)
    return ABSENT if row is None else row.get(name, ABSENT)


def lasting(steps: list[dict[Field, Any]], initial: Db, final: Db) -> tuple[int, ...]:
    """Which of an episode's world changes lasted, by their order (1, 2, ...): those that left a
    field holding at the end what the change put there, and not what it held at the start
    (``Outcome.lasting``). ``steps``: ``touched`` of each change. A row created then deleted, a
    field changed back, or one changed again to something else, is not; nor is a change whose
    only lasting field is a time stamp (``updated_at``: when, not what; the world's clock does not
    move within an episode, so a later change of the same row writes the same stamp)."""
    return tuple(
        i
        for i, fields in enumerate(steps, 1)
        if any(
            (end := _value(final, f)) == left and end != _value(initial, f)
            for f, left in fields.items()
            if not f[3].endswith(STAMP_SUFFIX)
        )
    )


_NUM = re.compile(r"^\$?\s*(-?\d+(?:\.\d+)?)\s*(?:\$|dollars?|usd)?$")


#: What a value nested deeper than the API allows normalises to: equal to no expected answer.
TOO_DEEP = "<nested too deep>"


def normalize(value: Any, _depth: int = 0) -> Any:
    """Canonical form of an answer: numbers as rounded floats (also "$12.50"), strings lower-cased
    with collapsed whitespace, lists element-wise. Total: any value gives a result (an integer too
    large for a float becomes +-inf, NaN stays NaN; both equal no expected answer), never an error."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        try:
            return round(float(value), 2)
        except OverflowError:
            return math.inf if value > 0 else -math.inf
    if isinstance(value, float):
        return round(value, 2)  # NaN and inf round to themselves
    if isinstance(value, str):
        s = " ".join(value.lower().split()).strip(" .")
        m = _NUM.match(s.replace(",", ""))
        return round(float(m.group(1)), 2) if m else s
    if isinstance(value, (list, tuple)):
        if _depth >= MAX_DEPTH:
            return TOO_DEEP
        return [normalize(v, _depth + 1) for v in value]
    return value


def answers_match(given: Any, expected: Any, ordered: bool = False) -> bool:
    """True when ``given`` equals ``expected`` after normalising (lists order-insensitive unless ``ordered``).

    A list answer may also be given as one comma-separated string.
    """
    g, e = normalize(given), normalize(expected)
    if isinstance(e, list):
        if isinstance(g, str):
            g = [normalize(p) for p in g.split(",")] if g else []
        if not isinstance(g, list):
            return False
        return g == e if ordered else sorted(map(repr, g)) == sorted(map(repr, e))
    if isinstance(e, float) and isinstance(g, float):
        return abs(g - e) < 0.011
    return g == e


def evaluate(expect: Expect, initial: Db, final: Db, answer: Any) -> Outcome:
    """Score a final state: each requirement, the answer (if any), and no collateral changes."""
    state = []
    for r in expect.requires:
        try:
            ok = bool(r.holds(final))
        except (KeyError, IndexError, TypeError, ValueError, StopIteration, ArithmeticError, RecursionError):
            ok = False  # the agent broke the structure the requirement reads
        state.append(CheckResult(r.name, ok))
    answers = []
    if expect.answer is not NO_ANSWER:
        ok = answers_match(answer, expect.answer, expect.ordered)
        answers.append(
            CheckResult(
                "answer is correct", ok, "" if ok else f"expected {expect.answer!r}, got {brief(answer)}"
            )
        )
    bad = [c for c in diff(initial, final) if not any(a.permits(c) for a in expect.allow)]
    detail = "; ".join(str(c) for c in bad[:5]) + (f" (+{len(bad) - 5} more)" if len(bad) > 5 else "")
    outcome = gated_outcome(
        tuple(state), tuple(answers), CheckResult("no collateral changes", not bad, detail)
    )
    # a task that asks for no answer ignores one: a skill's value passed as one reached nothing
    return dataclasses.replace(outcome, answer_scored=bool(answers))


def gated_outcome(
    state_checks: tuple[CheckResult, ...], answer_checks: tuple[CheckResult, ...], guard: CheckResult
) -> Outcome:
    """Score = (answer checks passed + state checks passed if ``guard`` passed + 1[every check
    passed]) / (checks + 1); success = every check passed.

    ``guard`` is a check that an untouched world passes ("no collateral changes"). Counted like
    the others (AppWorld's fraction of all tests), it paid a no-op 1/(n+1): 0.5 on a one-check
    task, a reward RL climbs towards by doing nothing. Gated, it adds only to work that already
    did everything the task asked, so a no-op scores what it achieves (0).

    ``state_checks`` (requirements on the final state) count only when ``guard`` passed: a change
    outside what the task allows may be what met them (acting on every item meets "every one of
    the artist's songs is liked"), and paying for it would rank a blanket action (0.5 on a
    one-requirement task) above a careful attempt that missed one target (0). An answer cannot be
    met by changing the world, so ``answer_checks`` count either way."""
    task_checks = (*state_checks, *answer_checks)
    checks = (*task_checks, guard)
    done = all(c.passed for c in task_checks) and guard.passed
    state = sum(c.passed for c in state_checks) if guard.passed else 0
    passed = state + sum(c.passed for c in answer_checks) + done
    return Outcome(score=passed / len(checks), success=done, checks=checks)
