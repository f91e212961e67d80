"""The skill record: one agent-written Python function, with what it needs, where it came from and
how far it has been validated (issue 4, "Skill record").

Pure code: nothing here reads the clock or the disk. ``make_skill`` builds a record from source
text, computing the signature, docstring, content hash and dependencies with ``ast``.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import hashlib
import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef


class SkillError(ValueError):
    """A skill record or skill source is invalid. The message says which skill and what is wrong."""


class Tier(enum.IntEnum):
    """How far a skill has been validated. Ordered: a higher tier implies every lower one."""

    PARSED = 0  # the source parses and holds the function
    DEFINED = 1  # its definition executed without error
    CALLED_OK = 2  # it was called and no call raised
    TASK_SUCCESS = 3  # ... and the task that made it succeeded
    VERIFIED = 4  # re-verified in a fresh world

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, value: str | int) -> Tier:
        """``"called_ok"`` or ``2`` -> ``Tier.CALLED_OK``; anything else raises ``SkillError``."""
        if isinstance(value, int) and not isinstance(value, bool):
            if value in cls._value2member_map_:
                return cls(value)
        elif isinstance(value, str) and value.upper() in cls.__members__:
            return cls[value.upper()]
        raise SkillError(f"unknown tier {value!r}; expected one of {[t.label for t in cls]}")


@dataclass(frozen=True)
class Provenance:
    """Where a skill came from. ``created_at`` is seconds since the epoch, passed in by the caller."""

    task_id: str = ""
    scenario_id: str = ""
    policy: str = ""
    step: int = 0
    created_at: float = 0.0


@dataclass(frozen=True)
class Skill:
    """One saved function.

    ``source`` is the function's own text (decorators included, no imports); ``imports`` are the
    module-level import statements it needs, in execution order; ``depends_on`` names the other
    skills it calls. ``content_hash`` identifies the code up to formatting, comments and the
    function's own name (see ``content_hash``), so identical code saved under two names is found.
    """

    name: str
    signature: str
    docstring: str
    source: str
    imports: tuple[str, ...] = ()
    depends_on: tuple[str, ...] = ()
    content_hash: str = ""
    provenance: Provenance = field(default_factory=Provenance)
    version: int = 1
    tier: Tier = Tier.PARSED
    uses: int = 0
    successes: int = 0

    @property
    def code(self) -> str:
        """Imports then source: the text executed into an interpreter to define the skill."""
        head = "\n".join(self.imports)
        return f"{head}\n\n{self.source}" if head else self.source

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["tier"] = self.tier.label
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Skill:
        """Validate and rebuild. Derived fields (signature, docstring, hash) are recomputed from the
        source, so an edited source stays consistent; a bad record raises ``SkillError``."""
        if not isinstance(d, Mapping):
            raise SkillError(f"a skill record must be a JSON object, not {type(d).__name__}")
        missing = [k for k in ("name", "source") if not isinstance(d.get(k), str) or not d.get(k)]
        if missing:
            raise SkillError(f"skill record lacks a non-empty string field {missing[0]!r}")
        unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise SkillError(f"skill {d['name']!r}: unknown fields {sorted(unknown)}")
        prov = d.get("provenance") or {}
        try:
            provenance = Provenance(**prov)
        except TypeError as e:
            raise SkillError(f"skill {d['name']!r}: bad provenance: {e}") from None
        imports = d.get("imports") or ()
        if not all(isinstance(i, str) for i in imports):
            raise SkillError(f"skill {d['name']!r}: imports must be strings")
        return make_skill(
            d["source"],
            name=d["name"],
            imports=tuple(imports),
            depends_on=tuple(d.get("depends_on") or ()),
            provenance=provenance,
            version=_int_field(d, "version", 1),
            tier=Tier.parse(d.get("tier", "parsed")),
            uses=_int_field(d, "uses", 0),
            successes=_int_field(d, "successes", 0),
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, sort_keys=True)

    @classmethod
    def from_json(cls, line: str) -> Skill:
        try:
            d = json.loads(line)
        except json.JSONDecodeError as e:
            raise SkillError(f"not valid JSON: {e.msg} at column {e.colno}") from None
        return cls.from_dict(d)


def make_skill(
    source: str,
    *,
    name: str | None = None,
    imports: tuple[str, ...] = (),
    depends_on: tuple[str, ...] = (),
    provenance: Provenance | None = None,
    version: int = 1,
    tier: Tier = Tier.PARSED,
    uses: int = 0,
    successes: int = 0,
) -> Skill:
    """Build a ``Skill`` from the text of one top-level function (``name`` picks it when the text
    holds several). Raises ``SkillError`` when the text does not parse or holds no such function."""
    node = function_node(source, name)
    return Skill(
        name=node.name,
        signature=signature_of(node),
        docstring=ast.get_docstring(node) or "",
        source=source.strip("\n"),
        imports=imports,
        depends_on=depends_on,
        content_hash=content_hash(node),
        provenance=provenance or Provenance(),
        version=version,
        tier=tier,
        uses=uses,
        successes=successes,
    )


def function_node(source: str, name: str | None = None) -> FunctionNode:
    """The top-level function called ``name`` in ``source`` (the only/last one when ``name`` is None)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise SkillError(f"skill {name or '?'}: source does not parse (line {e.lineno}: {e.msg})") from None
    funcs = [n for n in tree.body if isinstance(n, FunctionNode) and (name is None or n.name == name)]
    if not funcs:
        raise SkillError(f"skill {name or '?'}: source holds no top-level function {name or ''}".rstrip())
    return funcs[-1]


def signature_of(node: FunctionNode) -> str:
    """``async def f(x: int, y=2) -> str``: the def line without the colon."""
    prefix = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
    ret = f" -> {ast.unparse(node.returns)}" if node.returns else ""
    return f"{prefix} {node.name}({ast.unparse(node.args)}){ret}"


def content_hash(node: FunctionNode) -> str:
    """sha256 of the function's ``ast.dump`` with its own name (and self-references) blanked.

    ``ast.dump`` without attributes ignores formatting and comments; blanking the name makes the
    same code under another name hash equal (issue 4: dedup identical code with a different name).
    """
    tree = _Renamer(node.name).visit(ast.parse(ast.unparse(node)).body[0])
    tree.name = "_"
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


def _int_field(d: Mapping[str, Any], key: str, default: int) -> int:
    v = d.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise SkillError(f"skill {d.get('name')!r}: {key} must be a non-negative integer, got {v!r}")
    return v
