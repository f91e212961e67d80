"""Which task of a chain made each skill of its library: the ``gen`` bonus of the skill-integrated
reward (docs/algorithm.md, "Skill-integrated").

The task that made a skill is the one whose save first put the skill's code into the chain's
library. A save of code the library held before made nothing, whatever the status ``Library.add``
gives it: the same code again (unchanged), the same code under another name (an alias), or the
same code with only what never runs changed (docstrings and other constant statements, comments,
formatting, ``pass``, annotations: ``code_hash``). Until 2026-12-06 a re-save with a new docstring
was stored as a new version and moved the credit to the re-saving task: in a K = 3 chain task 2
pasted task 1's skill with another docstring, task 3 used it, and task 2 was paid for making it
(``tests/test_reward_doors.py``). Code that the chain's start library held was made by no task.

The skill's own local names (its parameters and what its body binds) are compared by their order
of appearance, not their spelling: a re-save that renames a local (``genre`` to ``g``) made nothing
either (until session 40 it did). Other changes that keep what the code does but not its syntax (an
unused statement added, ``x + 0``) still count as new code: the hash compares syntax, not behaviour.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable

from sage_rl.skills.record import Skill
from sage_rl.skills.source import FunctionNode, content_hash, function_node
from sage_rl.skills.static import NAMED_NODES, local_names


class _Inert(ast.NodeTransformer):
    """Drops what never runs: constant statements (docstrings), ``pass``, annotations."""

    def visit_Expr(self, node: ast.Expr) -> ast.AST | None:
        return None if isinstance(node.value, ast.Constant) else self.generic_visit(node)

    def visit_Pass(self, node: ast.Pass) -> None:
        return None

    def visit_arg(self, node: ast.arg) -> ast.arg:
        node.annotation = None
        return node

    def visit_FunctionDef(self, node: FunctionNode) -> ast.AST:
        node.returns = None
        return self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef


class _Canonical(ast.NodeTransformer):
    """``_Inert``, with the locals of the function and of the code nested in it spelled by their
    order of appearance (``_v0``, ``_v1``, ...) wherever the name occurs."""

    def visit(self, node: ast.AST) -> ast.AST:
        local: set[str] = set()  # the locals of every scope in it: a merged spelling only hashes equal more
        for n in ast.walk(node):
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef):
                local |= local_names(n)
            elif isinstance(n, ast.Lambda):
                local |= {a.arg for a in ast.walk(n.args) if isinstance(a, ast.arg)}
            elif isinstance(n, ast.MatchMapping) and n.rest:
                local.add(n.rest)
        order: dict[str, str] = {}

        def spell(name: str | None) -> str | None:
            if name not in local:
                return name
            return order.setdefault(name, f"_v{len(order)}")

        for n in _in_order(node):
            if isinstance(n, ast.Name):
                n.id = spell(n.id)
            elif isinstance(n, ast.arg):
                n.arg = spell(n.arg)
            elif isinstance(n, ast.alias):  # only hashed, never run: a consistent spelling is enough
                n.asname = spell(n.asname)
            elif isinstance(n, NAMED_NODES) and n is not node:
                n.name = spell(n.name)
            elif isinstance(n, ast.MatchMapping):
                n.rest = spell(n.rest)
        return _Inert().visit(node)


def _in_order(node: ast.AST) -> list[ast.AST]:
    """The nodes under ``node`` (itself included) in the order of their fields: the source's order."""
    out, todo = [], [node]
    while todo:
        n = todo.pop()
        out.append(n)
        todo.extend(reversed(list(ast.iter_child_nodes(n))))
    return out


def code_hash(skill: Skill) -> str:
    """``content_hash`` of what ``skill``'s code does: versions that differ only in what never runs
    or in the spelling of their locals (module docstring) hash equal."""
    return content_hash(function_node(skill.source, skill.name), strip=_Canonical())


class Makers:
    """The chain position that made each skill (module docstring), as a chain's saves go on."""

    def __init__(self, start: Iterable[Skill]) -> None:
        self._by_code: dict[str, int | None] = {code_hash(s): None for s in start}
        self._by_name: dict[str, int] = {}

    def saved(self, skill: Skill, position: int) -> None:
        """The task at ``position`` saved ``skill`` and the library stored it under its name (added
        or replaced): its maker is whoever first saved its code."""
        maker = self._by_code.setdefault(code_hash(skill), position)
        if maker is None:
            self._by_name.pop(skill.name, None)
        else:
            self._by_name[skill.name] = maker

    def of(self, names: Iterable[str]) -> tuple[int, ...]:
        """The positions that made the skills ``names`` (canonical names), sorted."""
        return tuple(sorted({self._by_name[n] for n in names if n in self._by_name}))
