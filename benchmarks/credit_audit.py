"""What a task did with the results of the library skills it was paid for: the reward's open door.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/credit_audit.py FILE.jsonl [FILE.jsonl ...] [--json OUT] [--examples N]

FILE is any JSON Lines file of chains: an evaluation's ``trajectories.*.jsonl`` or an RL run's
``rollouts/step_*.jsonl``. The default credit (``skills.credit=api``, docs/algorithm.md) pays a task
for a library skill that returned and made a successful API call. It does not look at what the
task did with the result, so a read-only skill called and ignored while the task is solved inline
is paid like a real use (docs/algorithm.md, "Left as it is"). This script measures how often that
happens, from the cells' text:

- each credited skill the task's own code calls is classed by what its call sites do with the
  value: ``used`` (bound to a name read later, or part of a larger expression or call: an
  argument, an answer, a subscript), ``printed`` (only shown to the model, inside ``print``),
  ``discarded`` (a bare statement, or bound to a name never read again); a credited skill the task
  never calls itself is a ``helper`` (paid because a skill that called it was);
- a skill ``writes`` when its code, or a skill it calls by name, calls a PocketWorld API that
  changes the world (every API but ``show_*``, ``search_*``, ``login`` and ``logout``) by name;
- a paid later task (one whose skill bonus was due: it used a skill an earlier task of its chain
  made, ``Chain.used_from``) is **suspect** when it succeeded and none of the skills it was paid
  for was used or writes: every one was discarded, printed or a helper of such.

Static and approximate: the call's value flowing through ``if`` (a test) counts as used, a value
used only via a side-effect-free alias may be missed. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import ast
import collections
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from sage_rl.envs.pocketworld.apps import APPS
from sage_rl.skills.static import parse_cell

#: API names that read the world (or only open and close a session): every other API writes.
READ_PREFIXES = ("show_", "search_")
SESSION_APIS = frozenset({"login", "logout"})
WRITE_APIS = frozenset(
    api
    for app in APPS.values()
    for api in app.apis
    if not api.startswith(READ_PREFIXES)
    and api not in SESSION_APIS
    and app.name not in ("api_docs", "supervisor")
)

CLASSES = ("used", "printed", "discarded", "helper")


def function_defs(cells: Iterable[str]) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    """The module-level defs of ``cells``, the last one of each name winning."""
    out: dict[str, Any] = {}
    for code in cells:
        tree = parse_cell(code)
        for node in tree.body if tree else ():
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                out[node.name] = node
    return out


def writes(name: str, defs: Mapping[str, ast.AST], seen: frozenset[str] = frozenset()) -> bool:
    """Whether ``defs[name]`` (or a def it calls by name) calls an API that changes the world."""
    node = defs.get(name)
    if node is None or name in seen:
        return False
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            if isinstance(n.func, ast.Attribute) and n.func.attr in WRITE_APIS:
                return True
            if isinstance(n.func, ast.Name) and writes(n.func.id, defs, seen | {name}):
                return True
    return False


def _loads_after(trees: list[ast.Module | None], cell: int, stmt: ast.stmt, names: set[str]) -> bool:
    """Whether any of ``names`` is read after ``stmt`` (in cell ``cell``) in this or a later cell."""
    end = (stmt.end_lineno or stmt.lineno, stmt.end_col_offset or 0)
    for i in range(cell, len(trees)):
        tree = trees[i]
        for n in ast.walk(tree) if tree else ():
            read = isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in names
            if read and (i > cell or (n.lineno, n.col_offset) > end):
                return True
    return False


def call_sites(cells: list[str], names: set[str]) -> dict[str, set[str]]:
    """Per name in ``names``: the classes (``used``/``printed``/``discarded``) of the task's own
    calls of it (``Name(...)`` calls in the cells)."""
    trees = [parse_cell(c) for c in cells]
    out: dict[str, set[str]] = collections.defaultdict(set)
    for i, tree in enumerate(trees):
        if tree is None:
            continue
        parent = {c: p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
        for n in ast.walk(tree):
            if not (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in names):
                continue
            up = parent.get(n)
            if isinstance(up, ast.Expr):
                kind = "discarded"
            elif isinstance(up, ast.Assign | ast.AnnAssign) and up.value is n:
                targets = up.targets if isinstance(up, ast.Assign) else [up.target]
                bound = {t.id for t in targets if isinstance(t, ast.Name)}
                simple = all(isinstance(t, ast.Name) for t in targets)
                kind = "used" if not simple or _loads_after(trees, i, up, bound) else "discarded"
            elif isinstance(up, ast.Call) and isinstance(up.func, ast.Name) and up.func.id == "print":
                kind = "printed"
            else:
                kind = "used"
            out[n.func.id].add(kind)
    return out


def skill_class(kinds: set[str]) -> str:
    """One class per skill: the best of its call sites' (``helper`` when the task never calls it)."""
    return next((k for k in CLASSES[:3] if k in kinds), "helper")


def audit_chain(chain: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per later task of ``chain`` that was credited with a library skill use."""
    rows = []
    trajs = chain.get("trajectories") or []
    used_from = chain.get("used_from") or [()] * len(trajs)
    for k, traj in enumerate(trajs):
        used = set(traj.get("skills_used") or ())
        if not used:
            continue
        earlier = [t.get("code") or "" for tr in trajs[:k] for t in tr.get("turns") or () if t.get("code")]
        defs = function_defs(earlier)
        cells = [t["code"] for t in traj.get("turns") or () if t.get("code")]
        sites = call_sites(cells, used)
        skills = {
            n: {"class": skill_class(sites.get(n, set())), "writes": writes(n, defs)} for n in sorted(used)
        }
        real = any(s["class"] == "used" or s["writes"] for s in skills.values())
        success = bool((traj.get("outcome") or {}).get("success"))
        paid = bool(used_from[k]) if k < len(used_from) else False
        rows.append({
            "task_id": (traj.get("task") or {}).get("task_id"), "position": k, "success": success,
            "paid": paid, "suspect": paid and success and not real, "skills": skills, "cells": cells,
        })  # fmt: skip
    return rows


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts over the rows of ``audit_chain``."""
    paid = [r for r in rows if r["paid"] and r["success"]]
    classes = collections.Counter(s["class"] for r in rows for s in r["skills"].values())
    writing = collections.Counter(s["class"] for r in rows for s in r["skills"].values() if s["writes"])
    return {
        "credited_tasks": len(rows),
        "skill_credits_by_class": dict(classes),
        "skill_credits_by_class_writing": dict(writing),
        "paid_successful_tasks": len(paid),
        "suspect": sum(r["suspect"] for r in rows),
        "suspect_fraction": sum(r["suspect"] for r in rows) / len(paid) if paid else None,
    }


def read_chains(path: Path) -> Iterable[dict[str, Any]]:
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            chain = json.loads(line)
        except json.JSONDecodeError as e:
            raise SystemExit(f"{path}:{n}: not a JSON line ({e.msg})") from None
        if isinstance(chain, dict) and "trajectories" in chain:
            yield chain


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--json", type=Path, help="also write the report here")
    ap.add_argument("--examples", type=int, default=3, help="suspect tasks to print the cells of")
    args = ap.parse_args(argv)
    rows = [row for f in args.files for chain in read_chains(f) for row in audit_chain(chain)]
    report = {"files": [str(f) for f in args.files], **summarise(rows)}
    report["examples"] = [
        {"task_id": r["task_id"], "skills": r["skills"], "cells": r["cells"]} for r in rows if r["suspect"]
    ][: args.examples]
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return report


if __name__ == "__main__":
    main()
