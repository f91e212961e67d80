"""One chain's library as the page shows it, built task by task.

It keeps a real ``Library`` (so each version number and add status, ``added`` / ``replaced`` /
``unchanged`` / ``duplicate``, is the library's own), plus where each skill's definition sits on
the page and which tasks used it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from sage_rl.skills.library import Library
from sage_rl.skills.record import Skill, Tier
from sage_rl.view.model import Link, SkillView, Use, VersionView


class LibraryLog:
    def __init__(self, chain_id: str) -> None:
        self.chain_id = chain_id
        self.library = Library()
        self._made: dict[str, str] = {}  # name -> "#id" of the definition now in the library
        self._versions: dict[str, list[VersionView]] = defaultdict(list)
        self._uses: dict[str, list[Use]] = defaultdict(list)

    def entry(self, name: str) -> str:
        """``#id`` of the skill's entry on the Skills tab."""
        return f"#{self.chain_id}-skill-{name}"

    def maker(self, name: str) -> str:
        """``#id`` of the definition of the version now in the library (else the skill's entry)."""
        return self._made.get(name, self.entry(name))

    def start(self, names: Iterable[str]) -> None:
        """Note skills that were in the library before any task of the chain made them."""
        for name in names:
            if name not in self._made and not self._versions[name]:
                self._versions[name].append(VersionView(1, "start library", Link("start library"), ""))

    def use(self, names: Iterable[str], where: Link, success: bool) -> tuple[Link, ...]:
        """Record that the task at ``where`` used ``names``; links to each one's maker."""
        names = list(names)
        for name in names:
            self._uses[name].append(Use(where, success))
        self.library.record_use(names, success)
        return tuple(Link(name, self.maker(name)) for name in names)

    def save(self, skill: Skill, where: Link, anchor: str) -> None:
        """Add ``skill``, defined at ``#anchor`` in the task at ``where``."""
        result = self.library.add(skill)
        self._made[skill.name] = f"#{anchor}"
        tier = skill.tier.label if skill.tier > Tier.PARSED else ""
        self._versions[skill.name].append(
            VersionView(
                result.version, result.status.value, Link(where.label, f"#{anchor}"), skill.source, tier
            )
        )

    def missing(self, name: str, where: Link) -> None:
        """The task recorded saving ``name`` but its definition could not be found again."""
        self._versions[name].append(VersionView(0, "source not found", where, ""))

    def skills(self, chain: Link) -> list[SkillView]:
        names = dict.fromkeys([*self._versions, *self._uses])
        return [
            SkillView(self.entry(n)[1:], n, chain, tuple(self._versions[n]), tuple(self._uses[n]))
            for n in names
        ]
