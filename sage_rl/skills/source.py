"""A skill's source text: the one function in it, its signature, its content hash and the skills it
calls (``ast`` only; pure). ``skills/record.py`` builds the record from these."""

from __future__ import annotations

import ast
import hashlib
from collections.abc import Collection

from sage_rl.agent.syntax import CodeError, parse_code

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef


class SkillError(ValueError):
    """A skill record or skill source is invalid. The message says which skill and what is wrong."""


def function_node(source: str, name: str | None = None) -> FunctionNode:
    """The top-level function called ``name`` in ``source`` (the only/last one when ``name`` is None)."""
    tree = parse_code(source)
    if isinstance(tree, CodeError):  # a syntax error, a null byte, or nesting too deep to analyse
        raise SkillError(f"skill {name or '?'}: source does not parse ({tree.message})")
    funcs = [n for n in tree.body if isinstance(n, FunctionNode) and (name is None or n.name == name)]
    if not funcs:
        raise SkillError(f"skill {name or '?'}: source holds no top-level function {name or ''}".rstrip())
    return funcs[-1]


class SkillTextError(SkillError):
    """The text defining a skill holds something else; ``line`` (1-based) is where."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line, self.message = line, message


def split_definition(tree: ast.Module, name: str) -> tuple[list[ast.Import | ast.ImportFrom], FunctionNode]:
    """The rule for the text that defines a skill, in every format: import statements and exactly
    one top-level function ``name``, nothing else. Anything else (``os.system(...)`` before the
    ``def``) would run before every later task that retrieves the skill. Returns (imports, the
    function); raises ``SkillTextError`` at the first offence."""
    imports: list[ast.Import | ast.ImportFrom] = []
    funcs: list[FunctionNode] = []
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            imports.append(node)
        elif isinstance(node, FunctionNode) and node.name == name:
            funcs.append(node)
        else:
            raise SkillTextError(node.lineno, f"only imports and the function {name!r} may appear here")
    if len(funcs) != 1:
        raise SkillTextError(1, f"expected exactly one function {name!r}, found {len(funcs)}")
    return imports, funcs[0]


def signature_of(node: FunctionNode) -> str:
    """``async def f(x: int, y=2) -> str``: the def line without the colon."""
    prefix = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
    ret = f" -> {ast.unparse(node.returns)}" if node.returns else ""
    return f"{prefix} {node.name}({ast.unparse(node.args)}){ret}"


def content_hash(node: FunctionNode, strip: ast.NodeTransformer | None = None) -> str:
    """sha256 of the function's ``ast.dump`` with its own name (and self-references) blanked.

    ``ast.dump`` without attributes ignores formatting and comments; blanking the name makes the
    same code under another name hash equal (issue 4: dedup identical code with a different name).
    ``strip`` rewrites the tree before the dump (``rollout/makers.code_hash`` drops what never runs).
    """
    tree = _Renamer(node.name).visit(ast.parse(ast.unparse(node)).body[0])
    tree.name = "_"
    tree = strip.visit(tree) if strip is not None else tree
    return hashlib.sha256(ast.dump(tree, include_attributes=False).encode()).hexdigest()


class _Renamer(ast.NodeTransformer):
    def __init__(self, old: str) -> None:
        self.old = old

    def visit_Name(self, node: ast.Name) -> ast.Name:
        if node.id == self.old:
            node.id = "_"
        return node


def called_names(node: ast.AST) -> set[str]:
    """Names called as plain ``name(...)`` anywhere under ``node`` (attribute calls do not count)."""
    return {n.func.id for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}


def dependencies(node: FunctionNode, known: Collection[str]) -> tuple[str, ...]:
    """The ``known`` skill names that ``node`` calls (or passes along by name), sorted, not itself."""
    used = called_names(node) | {
        n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
    }
    return tuple(sorted((used & set(known)) - {node.name}))
