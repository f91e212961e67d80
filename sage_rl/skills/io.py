"""Export and import of skills, so people can read, edit and share libraries (issue 4).

Two formats:
- JSON Lines: one ``Skill.to_dict()`` object per line;
- a folder with one ``<name>.py`` file per skill: a provenance header of ``# key: value`` comment
  lines, then the import lines, a blank line and the function. Edit the code freely: signature,
  docstring and content hash are recomputed on import.

Imports validate every record and never stop at the first bad one: ``ImportReport.errors`` names
each bad line (JSON Lines) or file and line (folder), and ``skills`` holds all the good ones.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from sage_rl.skills.record import Skill, SkillError, check_field
from sage_rl.skills.source import SkillTextError, split_definition
from sage_rl.text import source_lines

HEADER = "# sage-rl skill"
_HEADER_KEYS = ("name", "version", "tier", "uses", "successes", "depends_on", "content_hash", "provenance")


@dataclass(frozen=True)
class BadRecord:
    """One bad record: where it is (``path`` and 1-based ``line``) and what is wrong."""

    path: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


@dataclass(frozen=True)
class ImportReport:
    skills: tuple[Skill, ...] = ()
    errors: tuple[BadRecord, ...] = field(default_factory=tuple)


# -- JSON Lines --------------------------------------------------------------------------------
def write_jsonl(skills: Iterable[Skill], path: str | Path) -> int:
    """Write one JSON object per skill; returns the count."""
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for s in skills:
            f.write(s.to_json() + "\n")
            n += 1
    return n


def read_jsonl(path: str | Path) -> ImportReport:
    """Parse and validate every line; blank lines are skipped."""
    skills, errors = [], []
    with open(path, encoding="utf-8", errors="replace") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                skills.append(Skill.from_json(line))
            except SkillError as e:
                errors.append(BadRecord(str(path), i, str(e)))
            except Exception as e:  # noqa: BLE001 - a record must never abort the import (a bug: say so)
                errors.append(BadRecord(str(path), i, f"unexpected {type(e).__name__}: {str(e)[:200]}"))
    return ImportReport(tuple(skills), tuple(errors))


# -- a folder of .py files ---------------------------------------------------------------------
def skill_file_text(s: Skill) -> str:
    """The ``.py`` file for one skill: provenance header, imports, function."""
    header = [
        HEADER,
        f"# name: {s.name}",
        f"# version: {s.version}",
        f"# tier: {s.tier.label}",
        f"# uses: {s.uses}",
        f"# successes: {s.successes}",
        f"# depends_on: {', '.join(s.depends_on)}",
        f"# content_hash: {s.content_hash}",
        f"# provenance: {json.dumps(s.provenance.__dict__, sort_keys=True)}",
    ]
    return "\n".join(header) + "\n\n" + s.code + "\n"


def write_folder(skills: Iterable[Skill], folder: str | Path) -> int:
    """Write ``<name>.py`` per skill into ``folder`` (created); returns the count."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    n = 0
    for s in skills:
        (out / f"{s.name}.py").write_text(skill_file_text(s), encoding="utf-8")
        n += 1
    return n


def read_folder(folder: str | Path) -> ImportReport:
    """Read every ``*.py`` file of ``folder`` (sorted by name)."""
    folder = Path(folder)
    if not folder.is_dir():
        return ImportReport(errors=(BadRecord(str(folder), 0, "not a folder"),))
    skills, errors = [], []
    for path in sorted(folder.glob("*.py")):
        try:
            skills.append(parse_skill_file(path.read_text(encoding="utf-8", errors="replace"), path.stem))
        except _FileError as e:
            errors.append(BadRecord(str(path), e.line, e.message))
    return ImportReport(tuple(skills), tuple(errors))


class _FileError(Exception):
    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line, self.message = line, message


def parse_skill_file(text: str, default_name: str) -> Skill:
    """One ``.py`` skill file -> ``Skill``. Raises ``_FileError`` with the offending line."""
    header, body_start = _read_header(text)
    lines = source_lines(text)
    body = "\n".join(lines[body_start:])
    try:
        tree = ast.parse(body)
    except SyntaxError as e:
        raise _FileError(body_start + (e.lineno or 1), f"does not parse: {e.msg}") from None
    except (ValueError, RecursionError, MemoryError) as e:  # a null byte; nesting too deep to parse
        raise _FileError(body_start + 1, f"does not parse ({type(e).__name__})") from None
    name = header["name"][1] if "name" in header else default_name
    try:
        import_nodes, f = split_definition(tree, name)
    except SkillTextError as e:
        raise _FileError(body_start + e.line, e.message) from None
    imports = [ast.get_source_segment(body, node) or ast.unparse(node) for node in import_nodes]
    start = min([d.lineno for d in f.decorator_list] + [f.lineno])
    source = "\n".join(source_lines(body)[start - 1 : f.end_lineno])
    return _skill_from_header(source, name, tuple(imports), header)


def _read_header(text: str) -> tuple[dict[str, tuple[int, str]], int]:
    """Leading ``# key: value`` lines -> ({key: (line number, value)}, index of the first body line)."""
    header: dict[str, tuple[int, str]] = {}
    lines = source_lines(text)
    i = 0
    while i < len(lines) and lines[i].startswith("#"):
        key, sep, value = lines[i][1:].partition(":")
        key = key.strip()
        if sep and key in _HEADER_KEYS:
            header[key] = (i + 1, value.strip())
        i += 1
    return header, i


def _skill_from_header(
    source: str, name: str, imports: tuple[str, ...], header: dict[str, tuple[int, str]]
) -> Skill:
    def field_(key: str, default: str) -> tuple[int, str]:
        return header.get(key, (1, default))

    try:
        line, raw = field_("provenance", "{}")
        fields = {"provenance": check_field(name, "provenance", json.loads(raw)).__dict__}
        line, raw = field_("tier", "parsed")
        fields["tier"] = check_field(name, "tier", raw).label
        for key, default in (("version", "1"), ("uses", "0"), ("successes", "0")):
            line, raw = field_(key, default)
            fields[key] = check_field(name, key, int(raw) if len(raw) <= 20 else raw)
        line, raw = field_("depends_on", "")
        fields["depends_on"] = list(
            check_field(name, "depends_on", [d.strip() for d in raw.split(",") if d.strip()])
        )
        line = 1
        return Skill.from_dict({"name": name, "source": source, "imports": list(imports), **fields})
    except (ValueError, TypeError, RecursionError, SkillError) as e:
        raise _FileError(line, str(e)) from None
