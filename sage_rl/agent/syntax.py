"""Parsing agent code in the parent process: a syntax tree that every later walk can handle, or a
one-line reason why not. Never raises on any text.

Model output is hostile by accident. ``ast.parse`` raises more than ``SyntaxError`` on it:
``ValueError`` for a null byte, and ``RecursionError`` or ``MemoryError`` for deep nesting (on
Python 3.11, ``x = `` followed by 3,000 ``-`` and ``1``, about 50 tokens, exhausts the parser). A
tree that does parse can still be too deep for the standard library's recursive walkers
(``ast.unparse``, ``ast.NodeVisitor``/``NodeTransformer``, ``ast.dump``), which fail near 330
levels. So ``parse_code`` refuses trees deeper than ``MAX_DEPTH``: every recursive walk of a tree
it returned then needs at most about 410 frames (measured for ``ast.unparse``/``ast.dump`` of
nested lists; docs/LOG.md), well inside Python's default limit of 1,000. Real code is far
shallower: the deepest 0.1% of 13,500 library modules nest 42 levels.

The agent loop does not run a cell that is too deep (``CodeError.too_deep``), so a cell that ran is
always one the parent can analyse (skill usage, extraction, the viewer); such a turn fails with
``CodeError.message`` as its observation. Other syntax errors still go to the environment, which
reports them in the interpreter's own words.

The parser's warnings (``SyntaxWarning: invalid decimal literal`` for ``1if``, an invalid escape's
``DeprecationWarning``) are silenced here: they are about the agent's code, not ours, and under
``-W error`` they would turn code the interpreter runs into a ``CodeError``.
"""

from __future__ import annotations

import ast
import warnings
from dataclasses import dataclass

#: The deepest syntax tree accepted (the module is level 1). See the module docstring.
MAX_DEPTH = 100

TOO_DEEP = (
    f"SyntaxError: this code nests more than {MAX_DEPTH} levels deep (e.g. a long run of unary "
    "operators or brackets), so it was not run. Write it flatter."
)


@dataclass(frozen=True)
class CodeError:
    """Why code has no syntax tree. ``too_deep``: beyond the parser's or ``MAX_DEPTH``'s limits
    (it may be valid Python); otherwise an ordinary syntax error."""

    message: str
    too_deep: bool = False


def parse_code(code: str) -> ast.Module | CodeError:
    """The module's syntax tree, at most ``MAX_DEPTH`` levels deep, or a ``CodeError``."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            tree = ast.parse(code)
    except SyntaxError as e:
        return CodeError(f"SyntaxError: {e.msg} (line {e.lineno})")
    except ValueError as e:  # source with null bytes
        return CodeError(f"ValueError: {e}")
    except (RecursionError, MemoryError):  # the parser's own stack: deep nesting
        return CodeError(TOO_DEEP, too_deep=True)
    if deeper_than(tree, MAX_DEPTH):
        return CodeError(TOO_DEEP, too_deep=True)
    return tree


def deeper_than(tree: ast.AST, limit: int) -> bool:
    """Whether ``tree`` has more than ``limit`` levels (``tree`` itself is level 1). Iterative."""
    todo = [(tree, 1)]
    while todo:
        node, depth = todo.pop()
        if depth > limit:
            return True
        todo.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return False
