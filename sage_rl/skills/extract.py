"""Skill extraction: which functions a finished trajectory defined, and which of them to save
(SAGE.md section 2; issue 4, "Extraction").

A candidate is a top-level ``def``/``async def`` of an executed cell. Its tier is how far it got:

- ``defined``: its definition executed. From ``ExecResult.defined`` when the sandbox reports it;
  otherwise every top-level def of a cell that finished ok, and none of a cell that failed (where
  it failed is not known, so nothing of it is trusted);
- ``called_ok``: the definition was called at least once and no call raised. From call records
  (``CallRecord.origin`` = the defining cell's origin, summed over all cells), and only if the
  cells call it by name (``static.CallSimulator``): records are counted inside the worker, where
  agent code can forge them, so a record alone never promotes a function (docs/sandbox.md);
  without records, from the simulator alone: called in at least one cell that finished ok and in
  no cell that failed;
- ``task_success``: called ok, and the task succeeded.

Replace-by-name within a trajectory: for each name, the last definition that reaches the policy's
tier wins. A saved skill whose dependency (another function of the trajectory) is not saved and is
not in the library is dropped too, since it could not run. Syntax errors extract nothing.
"""

from __future__ import annotations

import ast
import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from sage_rl.skills.library import Library
from sage_rl.skills.record import (
    RESERVED_NAMES,
    Provenance,
    Skill,
    SkillError,
    Tier,
    make_skill,
)
from sage_rl.skills.source import FunctionNode, dependencies
from sage_rl.skills.static import CallSimulator, bound_names, global_reads, parse_cell
from sage_rl.text import source_lines
from sage_rl.types import ExecResult


class SavePolicy(enum.StrEnum):
    """Which candidates are saved: the lowest tier a skill must reach."""

    DEFINED = "defined"  # the authors' code: the definition executed
    CALLED_OK = "called_ok"  # the paper's text (default)
    TASK_SUCCESS = "task_success"

    @property
    def min_tier(self) -> Tier:
        return {"defined": Tier.DEFINED, "called_ok": Tier.CALLED_OK, "task_success": Tier.TASK_SUCCESS}[self]


@dataclass(frozen=True)
class Candidate:
    """One executed top-level definition, before the save policy is applied."""

    cell: int
    node: FunctionNode
    source: str
    imports: tuple[str, ...]
    tier: Tier


def extract_skills(
    cells: Sequence[tuple[str, ExecResult]],
    *,
    policy: SavePolicy = SavePolicy.CALLED_OK,
    task_success: bool = False,
    provenance: Provenance | None = None,
    library: Library | None = None,
    origins: Sequence[str] | None = None,
) -> list[Skill]:
    """The skills a trajectory saves, in order of their winning definition.

    ``cells`` are the executed cells in order, as (code, result). ``origins`` are the filenames
    they were compiled with (``<cell-N>``); with them, call records are matched to definitions
    exactly. Without them, a record of a cell's function in cell j is credited to the latest
    definition of that name in cells <= j (exact unless a cell calls the old version of a function
    and then redefines it, or keeps calling an old version through another reference). ``library`` holds the skills loaded before the task: they count as
    satisfied dependencies, and static detection follows calls through them. Never raises on
    agent code.
    """
    if origins is not None and len(origins) != len(cells):
        raise ValueError(f"extract_skills: {len(cells)} cells but {len(origins)} origins")
    lib_names = set(library.names()) | set(library.aliases()) if library is not None else set()
    # the names the library's import lines bind: its cells bind them in every task that loads it
    lib_imports = _import_names(line for s in library or () for line in s.imports)
    cands = candidates(cells, origins, task_success, library.function_nodes() if library is not None else {})
    winners: dict[str, Candidate] = {}
    for c in cands:
        if c.tier >= policy.min_tier:
            winners.pop(c.node.name, None)
            winners[c.node.name] = c  # re-insert: order follows the winning definition
    defined_names = _all_def_names(code for code, _ in cells)  # executed or not: a helper that did not run
    made: dict[str, Skill] = {}
    for name, c in winners.items():
        if not _self_contained(c, defined_names | lib_names | lib_imports):
            continue
        try:
            made[name] = make_skill(
                c.source,
                name=name,
                imports=c.imports,
                depends_on=dependencies(c.node, defined_names | lib_names),
                provenance=provenance or Provenance(),
                tier=c.tier,
            )
        except SkillError:  # valid Python no record holds: a name over MAX_NAME_CHARS, or one that
            continue  # would shadow a builtin, apis or ApiError in every later task (record.check_name)
    kept = _with_dependencies({n: winners[n] for n in made}, defined_names, lib_names)
    return [skill for name, skill in made.items() if name in kept]


def candidates(
    cells: Sequence[tuple[str, ExecResult]],
    origins: Sequence[str] | None,
    task_success: bool,
    library: Mapping[str, FunctionNode],
) -> list[Candidate]:
    """Every executed top-level definition with its tier, in execution order."""
    trees = [parse_cell(code) for code, _ in cells]
    if all(r.calls is not None for _, r in cells):
        called = _called_ok_from_records(cells, origins, trees) & _called_static(trees, library)
    else:
        called = _called_ok_static(cells, trees, library)
    imports: dict[str, tuple[int, ast.Import | ast.ImportFrom]] = {}  # name -> (order, statement)
    out: list[Candidate] = []
    for i, ((code, result), tree) in enumerate(zip(cells, trees, strict=True)):
        if tree is None:
            continue
        _note_imports(tree, imports)
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or not _executed(node, result):
                continue
            tier = Tier.DEFINED
            if (i, node.name) in called:
                tier = Tier.TASK_SUCCESS if task_success else Tier.CALLED_OK
            out.append(Candidate(i, node, function_source(code, node), needed_imports(node, imports), tier))
    return out


def function_source(code: str, node: FunctionNode) -> str:
    """The function's text, decorators included, exactly as written."""
    start = min([d.lineno for d in node.decorator_list] + [node.lineno])
    lines = source_lines(code)[start - 1 : node.end_lineno]
    return "\n".join(lines)


def needed_imports(
    node: FunctionNode, imports: Mapping[str, tuple[int, ast.Import | ast.ImportFrom]]
) -> tuple[str, ...]:
    """The import statements binding names that ``node`` reads, each cut down to those names, in
    execution order."""
    names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    chosen = {imports[n][0]: imports[n][1] for n in names if n in imports}
    out: list[str] = []
    for _, stmt in sorted(chosen.items()):
        aliases = [a for a in stmt.names if (a.asname or a.name).split(".")[0] in names]
        if isinstance(stmt, ast.Import):
            text = ast.unparse(ast.Import(aliases))
        else:
            text = ast.unparse(ast.ImportFrom(stmt.module, aliases, stmt.level))
        if text not in out:
            out.append(text)
    return tuple(out)


def _note_imports(tree: ast.Module, imports: dict[str, tuple[int, ast.Import | ast.ImportFrom]]) -> None:
    order = max((o for o, _ in imports.values()), default=0)
    for s in tree.body:
        if isinstance(s, ast.Import | ast.ImportFrom):
            order += 1
            for a in s.names:
                if a.name != "*":
                    imports[(a.asname or a.name).split(".")[0]] = (order, s)


def _all_def_names(codes: Iterable[str]) -> set[str]:
    trees = [parse_cell(c) for c in codes]
    return {
        n.name for t in trees if t for n in t.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
    }


def _executed(node: FunctionNode, result: ExecResult) -> bool:
    if result.defined is not None:
        return node.name in result.defined
    return result.ok  # without a report, a failed cell's definitions are not trusted


def _called_ok_from_records(
    cells: Sequence[tuple[str, ExecResult]], origins: Sequence[str] | None, trees: Sequence[ast.Module | None]
) -> set[tuple[int, str]]:
    """(defining cell, name) pairs called at least once with no call raising."""
    index = {o: i for i, o in enumerate(origins)} if origins is not None else None
    def_cells = _executed_def_cells(cells, trees)
    calls: dict[tuple[int, str], list[int]] = {}
    for j, (_, result) in enumerate(cells):
        for rec in result.calls or ():
            if rec.from_library:
                continue
            if index is not None:
                cell = index.get(rec.origin)
            else:  # the latest definition of the name at or before this cell
                cell = max((i for i in def_cells.get(rec.name, ()) if i <= j), default=None)
            if cell is not None:
                tally = calls.setdefault((cell, rec.name), [0, 0])
                tally[0] += rec.calls
                tally[1] += rec.errors
    return {key for key, (n, errors) in calls.items() if n > 0 and errors == 0}


def _executed_def_cells(
    cells: Sequence[tuple[str, ExecResult]], trees: Sequence[ast.Module | None]
) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for i, ((_, result), tree) in enumerate(zip(cells, trees, strict=True)):
        for node in tree.body if tree else ():
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and _executed(node, result):
                out.setdefault(node.name, []).append(i)
    return out


def _called_static(
    trees: Sequence[ast.Module | None], library: Mapping[str, FunctionNode]
) -> set[tuple[int, str]]:
    """(defining cell, name) of every task function the cells call by name, in any cell."""
    sim = CallSimulator(library)
    return {
        (b.cell, b.name) for i, tree in enumerate(trees) for b in sim.run_cell(i, tree) if not b.from_library
    }


def _called_ok_static(
    cells: Sequence[tuple[str, ExecResult]],
    trees: Sequence[ast.Module | None],
    library: Mapping[str, FunctionNode],
) -> set[tuple[int, str]]:
    sim = CallSimulator(library)
    ok: set[tuple[int, str]] = set()
    bad: set[tuple[int, str]] = set()
    for i, ((_, result), tree) in enumerate(zip(cells, trees, strict=True)):
        for b in sim.run_cell(i, tree):
            (ok if result.ok else bad).add((b.cell, b.name))
    return ok - bad


def _self_contained(c: Candidate, functions: set[str]) -> bool:
    """Whether every global name the candidate reads is a function of the trajectory or the library
    (or a name the library's imports bind), one of its imports, a builtin or ``apis``: a skill that reads a task's variable (``return V``
    after the task set ``V``) would carry any value a later task put there and be paid for it (the
    review of session 40: (2.0, 2.0) for an answer the task computed), and it fails wherever the
    name is not set. A skill that declares a ``global`` is no skill either (``global_reads``)."""
    reads = global_reads(c.source, c.node.name)
    if reads is None:
        return False
    return reads <= functions | _import_names(c.imports) | RESERVED_NAMES


def _import_names(lines: Iterable[str]) -> set[str]:
    """The names import statements (``import json``, ``from re import sub``) bind."""
    return {n for line in lines for n in bound_names(ast.parse(line))}


def _with_dependencies(winners: dict[str, Candidate], defined: set[str], library: set[str]) -> set[str]:
    """Names of winners whose trajectory-defined dependencies are all kept or in the library: the
    winners less every one that reaches a missing dependency. A worklist over the users of what is
    dropped (a pass per drop re-read every winner: 15 s for a chain of 1,000 helpers whose root
    was not saved, the event loop blocked)."""
    deps = {name: dependencies(c.node, defined) for name, c in winners.items()}
    users: dict[str, set[str]] = {}
    for name, ds in deps.items():
        for d in ds:
            users.setdefault(d, set()).add(name)
    kept = set(winners)
    todo = [name for name, ds in deps.items() if any(d not in kept and d not in library for d in ds)]
    while todo:
        name = todo.pop()
        if name in kept:
            kept.discard(name)
            if name not in library:  # the library's version still serves its users
                todo.extend(users.get(name, ()))
    return kept
