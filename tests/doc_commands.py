"""The ``sage-rl`` command lines of the README and docs/*.md, read from the files as they are now.

A command is a line of a fenced code block (``\\`` continuations joined, ``# comments`` cut, one
command per ``&&`` / ``;`` / ``|`` segment) or an inline code span, whose program is ``sage-rl``
(any path to it, after ``VAR=value`` assignments), ``python -m sage_rl.cli`` or
``python -m sage_rl.integrations.verl.main`` (= ``sage-rl verl``); ``resolve`` checks one against
the command tree. Used by test_docs_commands.py.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path
from typing import Any

import typer
from markdown_it import MarkdownIt

from sage_rl.cli import _register, app

ROOT = Path(__file__).resolve().parents[1]

#: ``python -m MODULE`` forms of the command, and the argv prefix each stands for.
MODULES = {
    "sage_rl.cli": (),
    "sage_rl.integrations.verl.main": ("verl",),
    "sage_rl.cli.appworld": ("appworld",),
}
#: Tokens written in place of a value the reader supplies: ``RUN_DIR``, ``<that jsonl>``, ``...``,
#: ``step_NNNNNN``, ``path/to/x``, ``http://HOST:8000/v1``.
_PLACEHOLDER = re.compile(r"^(?:[A-Z][A-Z0-9_]*|\.\.\.|.*NNN.*|/?path/to/.*|.*://[A-Z][A-Z_]*\b.*)$")
_ANGLE = re.compile(r"<[A-Za-z][^<>\n]*>")  # <that jsonl>, <dir>: one placeholder token each
_ENV = re.compile(r"^[A-Z_][A-Z0-9_]*=")
_SEPARATORS = {"&&", "||", ";", "|", "&"}


@dataclasses.dataclass(frozen=True)
class DocCommand:
    """One command line shown in the docs: where, as written, and its arguments after the program."""

    where: str  # "docs/viewer.md:9"
    text: str
    argv: tuple[str, ...]

    @property
    def synopsis(self) -> bool:
        """A usage line (``[--json]``, ``a / b``, ``(--x | --y)``), not a command to copy as is."""
        return any(
            t[:1] in "[(" or t in ("/", "|") or ("=" not in t and t.endswith(("]", ")"))) for t in self.argv
        )

    @property
    def runnable(self) -> tuple[str, ...] | None:
        """What to run: the command; for a usage line its shortest form (no ``[...]`` parts, the
        first of each ``(a | b)``); None for a list of subcommands (``world stats / list``)."""
        if not self.synopsis:
            return self.argv
        if "/" in self.argv:
            return None
        out, depth, skipping = [], 0, False
        for t in self.argv:
            depth += t.count("[")
            if depth == 0:
                if t.startswith("("):
                    skipping, t = False, t[1:]
                skipping = skipping or t == "|"
                if not skipping and t.rstrip(")"):
                    out.append(t.rstrip(")"))
                skipping = skipping and not t.endswith(")")
            depth -= t.count("]")
        return tuple(out)


def is_placeholder(value: str) -> bool:
    """Whether a token or an override's value stands for something the reader supplies."""
    return bool(_PLACEHOLDER.match(value))


def doc_files() -> list[Path]:
    """README.md and docs/*.md, except the experiment log (see test_docs_commands.NOT_CHECKED)."""
    return [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "LOG.md")]


def commands(path: Path) -> list[DocCommand]:
    """Every sage-rl command in the markdown file ``path``, in file order."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    name = path.relative_to(ROOT).as_posix()
    found: list[DocCommand] = []
    for token in MarkdownIt("commonmark").enable("table").parse(text):
        if token.type in ("fence", "code_block") and token.map:
            first = token.map[0] + (1 if token.type == "fence" else 0)
            for offset, line in _logical_lines(token.content):
                found += _parse(f"{name}:{first + offset + 1}", line, in_block=True)
        elif token.type == "inline" and token.map:
            for child in token.children or ():
                if child.type == "code_inline":
                    line = _line_of(child.content, lines, token.map[0], token.map[1])
                    found += _parse(f"{name}:{line}", child.content, in_block=False)
    return found


def _logical_lines(block: str) -> list[tuple[int, str]]:
    """(0-based offset of the first physical line, the line with its continuations joined)."""
    out: list[tuple[int, str]] = []
    pending, start = "", 0
    for i, raw in enumerate(block.splitlines()):
        if not pending:
            start = i
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        out.append((start, pending + raw))
        pending = ""
    if pending:
        out.append((start, pending))
    return out


def _line_of(span: str, lines: list[str], begin: int, end: int) -> int:
    """1-based line of an inline span inside the block lines[begin:end] (its first words)."""
    head = span.split()[:2]
    for i in range(begin, end):
        if " ".join(head) in " ".join(lines[i].split()):
            return i + 1
    return begin + 1


def _parse(where: str, line: str, in_block: bool) -> list[DocCommand]:
    """The sage-rl commands of one logical line (a shell line, or the text of an inline span)."""
    source = _ANGLE.sub("PLACEHOLDER", line)
    try:
        tokens = shlex.split(source, comments=in_block)
    except ValueError:  # an unbalanced quote: prose, not a command
        return []
    out: list[DocCommand] = []
    for segment in _segments(tokens):
        argv = _sage_argv(segment)
        if argv is not None:
            shown = line.split(" #")[0].strip() if in_block else line.strip()
            out.append(DocCommand(where, shown, argv))
    return out


def _segments(tokens: list[str]) -> list[list[str]]:
    """Split at shell separators; a ``|`` inside ``( ... )`` belongs to a usage line, not a pipe."""
    segments: list[list[str]] = [[]]
    depth = 0
    for t in tokens:
        depth += t.count("(") - t.count(")")
        if t in _SEPARATORS and not (t == "|" and depth > 0):
            segments.append([])
        else:
            segments[-1].append(t)
    return [s for s in segments if s]


def _sage_argv(tokens: list[str]) -> tuple[str, ...] | None:
    """The arguments after the program when ``tokens`` run sage-rl (with >= 1 argument), else None."""
    i = 0
    while i < len(tokens) and _ENV.match(tokens[i]):
        i += 1
    rest = tokens[i:]
    if not rest:
        return None
    program = rest[0].rsplit("/", 1)[-1]
    if program == "sage-rl" and len(rest) > 1:
        return tuple(rest[1:])
    if program.startswith("python") and len(rest) > 3 and rest[1] == "-m" and rest[2] in MODULES:
        return (*MODULES[rest[2]], *rest[3:])
    return None


# ---- the command tree ------------------------------------------------------------------------

_register()
ROOT_COMMAND = typer.main.get_command(app)


@dataclasses.dataclass
class Parsed:
    """A doc command resolved against the CLI: its command path and what follows it."""

    path: tuple[str, ...]
    command: Any  # a (typer-vendored) click command
    positionals: list[str]
    options: list[tuple[str, str | None]]  # (option, value or None for a flag)


def resolve(argv: tuple[str, ...]) -> Parsed:
    """Walk the command tree; fail on an unknown subcommand or option."""
    cmd, path, i = ROOT_COMMAND, (), 0
    while hasattr(cmd, "commands") and i < len(argv) and not argv[i].startswith("-"):
        sub = cmd.commands.get(argv[i])
        if sub is None:
            raise AssertionError(
                f"`sage-rl {' '.join(path)}` has no subcommand {argv[i]!r} (it has {sorted(cmd.commands)})"
            )
        cmd, path, i = sub, (*path, argv[i]), i + 1
    known = {o: p for p in cmd.params if p.param_type_name == "option" for o in (*p.opts, *p.secondary_opts)}
    positionals, options, rest = [], [], list(argv[i:])
    while rest:
        token = rest.pop(0)
        name, eq, value = token.partition("=")
        if not token.startswith("-"):
            positionals.append(token)
        elif name not in known:
            raise AssertionError(
                f"`sage-rl {' '.join(path)}` has no option {name!r} (it has {sorted(known)})"
            )
        elif known[name].is_flag:
            options.append((name, None))
        else:
            options.append((name, value if eq else rest.pop(0) if rest else None))
    return Parsed(path, cmd, positionals, options)


def check_exists(doc: DocCommand) -> None:
    """The command exists, and so does every option and subcommand a usage line names."""
    if "/" in doc.argv:  # "world stats / list / show": the first, then its siblings
        cut = doc.argv.index("/")
        first = resolve(doc.argv[:cut])
        for sibling in (t for t in doc.argv[cut:] if t != "/"):
            resolve((*first.path[:-1], sibling))
        return
    tokens = (t.strip("[]()") for t in doc.argv)
    resolve(tuple(t for t in tokens if t not in ("", "|", "...") and ("=" not in t or t.startswith("-"))))
