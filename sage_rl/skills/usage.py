"""Usage detection: which library skills a task really used (SAGE.md section 2; issue 4).

A task used a library skill when the skill's own code ran: it was called, directly or through
another function, and the task had not rebound its name first. Two detectors, which agree on the
shared corpus in ``tests/skill_corpus.py``:

- ``used_skills_from_calls``: exact, from the sandbox's call records. A record with origin
  ``<skill:NAME>`` and ``calls > 0`` means the library's definition of NAME ran; a function the task
  redefined has a ``<cell-N>`` origin instead, so redefinition needs no special rule;
- ``used_skills_static``: for environments without call records (AppWorld), a replay of the cells
  over a model of the namespace (``static.CallSimulator``; its rules are in that module).

``used_skills`` is what the rollout credits: with records, both detectors must agree (records can
be forged inside the worker; the cells cannot), so a skill is credited only when it ran and the
task's own code calls it by name.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

from sage_rl.skills.library import Library
from sage_rl.skills.static import CallSimulator, parse_cell
from sage_rl.types import SKILL_ORIGIN_PREFIX, ExecResult


def used_skills_from_calls(results: Iterable[ExecResult], library_names: Collection[str]) -> set[str]:
    """Library skills whose library definition was called in any of ``results``."""
    names = set(library_names)
    used: set[str] = set()
    for result in results:
        for rec in result.calls or ():
            if rec.calls > 0 and rec.from_library:
                name = rec.origin[len(SKILL_ORIGIN_PREFIX) : -1]
                if name in names:
                    used.add(name)
    return used


def used_skills_static(cells: Sequence[str], library: Library) -> set[str]:
    """Library skills called by the cells (in order), transitively, and not rebound first.
    Aliases count as their canonical skill."""
    sim = CallSimulator(library.function_nodes())
    used: set[str] = set()
    for i, code in enumerate(cells):
        used.update(library.resolve(b.name) for b in sim.run_cell(i, parse_cell(code)) if b.from_library)
    return used


def used_skills(cells: Sequence[tuple[str, ExecResult]], library: Library) -> set[str]:
    """Library skills (canonical names) a task used.

    With call records (every cell has them): a skill counts only when the records say its library
    definition ran AND the task's own code calls it (``used_skills_static``). Both must agree: the
    records are counted inside the worker, which agent code controls and can forge
    (docs/sandbox.md), while the cells are text the parent holds. Without records: static detection.
    """
    static = used_skills_static([code for code, _ in cells], library)
    results = [r for _, r in cells]
    if not all(r.calls is not None for r in results):
        return static
    names = set(library.names()) | set(library.aliases())
    return {library.resolve(n) for n in used_skills_from_calls(results, names)} & static
