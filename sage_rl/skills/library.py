"""The in-memory skill library: one per chain during rollouts, passed explicitly (STYLE.md, 11).

- ``add`` replaces by name (the old version goes to history, the version number goes up) and
  refuses identical code under another name (same ``content_hash``), recording the new name as an
  alias of the existing skill so that code calling it still runs.
- ``render`` lists skills for the prompt, compact (signature + docstring) or full source, within a
  token budget, dropping the least useful first. Usefulness, most useful first: higher tier, then
  more successes, then more uses, then more recent (``provenance.created_at``, then insertion).
- ``preamble`` gives the cells that define the library in a new interpreter, dependencies first;
  ``drop`` removes skills whose definition failed there, and those that depend on them.
- ``copy`` is cheap (two dict copies of references; skills are frozen), so each of G chains forks
  from the same start library.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

from sage_rl.skills.record import Skill
from sage_rl.skills.source import FunctionNode, function_node
from sage_rl.text import source_lines
from sage_rl.types import skill_origin


class AddStatus(enum.StrEnum):
    ADDED = "added"
    REPLACED = "replaced"  # same name, new code: old version kept in history
    UNCHANGED = "unchanged"  # same name, same code: tier/counters merged upwards
    DUPLICATE = "duplicate"  # same code under another name: stored as an alias


@dataclass(frozen=True)
class AddResult:
    status: AddStatus
    name: str  # the name the skill lives under in the library afterwards
    version: int


class PreambleCell(NamedTuple):
    """One cell to execute into a new interpreter. Unpacks as ``(name, code)``; compile it with
    ``origin`` (``<skill:NAME>``) so call records show a library skill was used."""

    name: str
    code: str

    @property
    def origin(self) -> str:
        return skill_origin(self.name)


def approx_tokens(text: str) -> int:
    """Default token count for budgets: about 4 characters per token."""
    return (len(text) + 3) // 4


class Library:
    """Skills by name, with history and aliases. Not thread-safe; one per chain."""

    def __init__(self, skills: Iterable[Skill] = ()) -> None:
        self._skills: dict[str, Skill] = {}
        self._history: dict[str, tuple[Skill, ...]] = {}
        self._aliases: dict[str, str] = {}
        self._order: dict[str, int] = {}
        self._hashes: dict[str, str] = {}  # content hash -> a name holding that code
        self._clock = 0
        self.revision = 0  # bumped on every change; retrievers rebuild indexes when it moves
        for s in skills:
            self.add(s)

    @classmethod
    def of(cls, skills: Iterable[Skill]) -> Library:
        """A library holding ``skills`` (added in order)."""
        return cls(skills)

    # -- reading ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._skills)

    def __contains__(self, name: object) -> bool:
        return name in self._skills

    def __iter__(self) -> Iterator[Skill]:
        return iter(self._skills.values())

    def names(self) -> tuple[str, ...]:
        return tuple(self._skills)

    def get(self, name: str) -> Skill | None:
        """The current skill called ``name`` (or of which ``name`` is an alias)."""
        return self._skills.get(self._aliases.get(name, name))

    def resolve(self, name: str) -> str:
        return self._aliases.get(name, name)

    def aliases(self) -> dict[str, str]:
        return dict(self._aliases)

    def history(self, name: str) -> tuple[Skill, ...]:
        """Earlier versions of ``name``, oldest first (the current one excluded)."""
        return self._history.get(name, ())

    def function_nodes(self) -> dict[str, FunctionNode]:
        """Namespace name -> function syntax tree, aliases included (for static usage detection)."""
        nodes = {name: function_node(s.source, name) for name, s in self._skills.items()}
        nodes.update({a: nodes[c] for a, c in self._aliases.items() if c in nodes})
        return nodes

    # -- writing ---------------------------------------------------------------------------
    def add(self, skill: Skill) -> AddResult:
        """Add with replace-by-name and dedup by content hash; see the module docstring."""
        old = self._skills.get(skill.name)
        if old is not None and old.content_hash == skill.content_hash:
            merged = dataclasses.replace(
                old, tier=max(old.tier, skill.tier), uses=max(old.uses, skill.uses),
                successes=max(old.successes, skill.successes),
            )  # fmt: skip
            self._put(merged)
            return AddResult(AddStatus.UNCHANGED, old.name, old.version)
        twin = self._by_hash(skill.content_hash)
        if old is None and twin is not None:
            self._aliases[skill.name] = twin.name
            self.revision += 1
            return AddResult(AddStatus.DUPLICATE, twin.name, twin.version)
        if old is not None:
            self._history[skill.name] = (*self._history.get(skill.name, ()), old)
            skill = dataclasses.replace(skill, version=max(skill.version, old.version + 1))
        self._aliases.pop(skill.name, None)
        self._put(skill)
        return AddResult(AddStatus.REPLACED if old else AddStatus.ADDED, skill.name, skill.version)

    def record_use(self, names: Iterable[str], success: bool) -> None:
        """Count one use (and a success when the task succeeded) for each named skill."""
        for name in set(map(self.resolve, names)):
            s = self._skills.get(name)
            if s is not None:
                self._put(dataclasses.replace(s, uses=s.uses + 1, successes=s.successes + int(success)))

    def drop(self, names: Iterable[str]) -> tuple[str, ...]:
        """Remove ``names`` and every skill that depends on them (transitively); returns all
        removed names, sorted. Used when a definition fails in a new interpreter."""
        gone = {self.resolve(n) for n in names} & set(self._skills)
        while True:
            more = {
                s.name for s in self if s.name not in gone and set(map(self.resolve, s.depends_on)) & gone
            }
            if not more:
                break
            gone |= more
        for n in gone:
            self._forget_hash(self._skills.pop(n))
            self._order.pop(n, None)
        self._aliases = {a: c for a, c in self._aliases.items() if c not in gone}
        self.revision += 1
        return tuple(sorted(gone))

    def copy(self) -> Library:
        new = Library()
        new._skills, new._history = dict(self._skills), dict(self._history)
        new._aliases, new._order, new._hashes = dict(self._aliases), dict(self._order), dict(self._hashes)
        new._clock, new.revision = self._clock, self.revision
        return new

    def _put(self, skill: Skill) -> None:
        old = self._skills.get(skill.name)
        if old is None or old.content_hash != skill.content_hash:
            self._clock += 1
            self._order[skill.name] = self._clock
            if old is not None:
                self._forget_hash(old)
        self._skills[skill.name] = skill
        self._hashes.setdefault(skill.content_hash, skill.name)
        self.revision += 1

    def _forget_hash(self, old: Skill) -> None:
        if self._hashes.get(old.content_hash) == old.name:
            del self._hashes[old.content_hash]
            other = next(
                (
                    s.name
                    for s in self._skills.values()
                    if s.content_hash == old.content_hash and s.name != old.name
                ),
                None,
            )
            if other is not None:  # rare: two names came to hold the same code by replacement
                self._hashes[old.content_hash] = other

    def _by_hash(self, h: str) -> Skill | None:
        name = self._hashes.get(h)
        return None if name is None else self._skills.get(name)

    # -- prompt and interpreter ------------------------------------------------------------
    def by_usefulness(self) -> list[Skill]:
        """Most useful first: tier, successes, uses, created_at, insertion order (all descending)."""
        return sorted(
            self,
            key=lambda s: (s.tier, s.successes, s.uses, s.provenance.created_at, self._order[s.name]),
            reverse=True,
        )

    def select(
        self,
        mode: str = "compact",
        token_budget: int | None = None,
        count_tokens: Callable[[str], int] = approx_tokens,
    ) -> list[Skill]:
        """The skills ``render`` shows: the longest most-useful-first prefix that fits the budget,
        returned in insertion order."""
        ranked = self.by_usefulness()
        if token_budget is not None:
            lo, hi = 0, len(ranked)  # largest n with cost(ranked[:n]) <= budget (cost grows with n)
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if count_tokens(_join(ranked[:mid], mode)) <= token_budget:
                    lo = mid
                else:
                    hi = mid - 1
            ranked = ranked[:lo]
        return sorted(ranked, key=lambda s: self._order[s.name])

    def render(
        self,
        mode: str = "compact",
        token_budget: int | None = None,
        count_tokens: Callable[[str], int] = approx_tokens,
    ) -> str:
        """Prompt text for the library; ``mode`` is ``compact`` or ``full``. Empty if nothing fits."""
        return _join(self.select(mode, token_budget, count_tokens), mode)

    def preamble(self) -> list[PreambleCell]:
        """Cells defining every skill, dependencies first (ties: insertion order), then aliases."""
        done: dict[str, None] = {}
        for s in sorted(self, key=lambda s: self._order[s.name]):
            self._visit(s.name, done)
        cells = [PreambleCell(n, self._skills[n].code) for n in done]
        cells += [PreambleCell(a, f"{a} = {c}") for a, c in self._aliases.items() if c in self._skills]
        return cells

    def _visit(self, root: str, done: dict[str, None]) -> None:
        """Depth first from ``root``, each skill after its dependencies (in their order). With a
        stack, not recursion: a chain of a thousand helpers, each calling the one before, is a
        library agent code can make (it ended the rollout with a RecursionError). A cycle is fine:
        definitions do not call each other when they execute."""
        if root in done or root not in self._skills:
            return
        entered, stack = {root}, [(root, iter(self._skills[root].depends_on))]
        while stack:
            name, deps = stack[-1]
            for dep in deps:
                d = self.resolve(dep)
                if d not in done and d not in entered and d in self._skills:
                    entered.add(d)
                    stack.append((d, iter(self._skills[d].depends_on)))
                    break
            else:
                stack.pop()
                done[name] = None


def render_skill(skill: Skill, mode: str) -> str:
    """One skill as prompt text: ``compact`` = signature and docstring, ``full`` = imports + source."""
    if mode == "full":
        return skill.code
    if mode != "compact":
        raise ValueError(f"render mode must be 'compact' or 'full', not {mode!r}")
    doc = skill.docstring.replace('"""', r"\"\"\"")
    body = f'    """{doc}"""' if doc else "    ..."
    return f"{skill.signature}:\n{_indent_doc(body)}"


def _indent_doc(body: str) -> str:
    return "\n".join(
        line if i == 0 or not line else "    " + line for i, line in enumerate(source_lines(body))
    )


def _join(skills: list[Skill], mode: str) -> str:
    return "\n\n".join(render_skill(s, mode) for s in skills)
