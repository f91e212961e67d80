"""The skill record: one agent-written Python function, with what it needs, where it came from and
how far it has been validated (issue 4, "Skill record").

Pure code: nothing here reads the clock or the disk. ``make_skill`` builds a record from source
text, computing the signature, docstring, content hash and dependencies with ``ast``.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sage_rl.agent.syntax import CodeError, parse_code
from sage_rl.skills.source import (
    FunctionNode,
    SkillError,
    SkillTextError,
    content_hash,
    function_node,
    signature_of,
    split_definition,
)


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
        """Validate and rebuild. Every field is checked for its type and range (a bad record raises
        ``SkillError`` naming the field, never anything else); derived fields (signature, docstring,
        hash) are recomputed from the source, so an edited source stays consistent."""
        if not isinstance(d, Mapping):
            raise SkillError(f"a skill record must be a JSON object, not {type(d).__name__}")
        for key in ("name", "source"):
            if not isinstance(d.get(key), str) or not d.get(key):
                raise SkillError(f"skill record lacks a non-empty string field {key!r}")
        name = d["name"]
        check_name(name)
        unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise SkillError(f"skill {name!r}: unknown fields {sorted(map(str, unknown))[:10]}")
        for key in ("signature", "docstring", "content_hash"):  # recomputed; only their type is checked
            if not isinstance(d.get(key, ""), str):
                raise SkillError(f"skill {name!r}: {key} must be a string")
        if len(d["source"]) > MAX_SOURCE_CHARS:
            raise SkillError(f"skill {name!r}: source is longer than {MAX_SOURCE_CHARS} characters")
        fields = dict(
            name=name,
            imports=_strings(d, "imports", _is_import, "an import statement"),
            depends_on=_strings(d, "depends_on", str.isidentifier, "a skill name"),
            provenance=provenance_from(d.get("provenance"), name),
            version=_int_field(d, "version", 1, low=1),
            tier=Tier.parse(d.get("tier", "parsed")),
            uses=_int_field(d, "uses", 0),
            successes=_int_field(d, "successes", 0),
        )
        try:
            _definition_only(d["source"], name)
            return make_skill(d["source"], **fields)
        except (RecursionError, MemoryError, ValueError) as e:  # absurdly nested source
            if isinstance(e, SkillError):
                raise
            raise SkillError(f"skill {name!r}: source cannot be analysed ({type(e).__name__})") from None

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, sort_keys=True)

    @classmethod
    def from_json(cls, line: str) -> Skill:
        try:
            d = json.loads(line)
        except json.JSONDecodeError as e:
            raise SkillError(f"not valid JSON: {e.msg} at column {e.colno}") from None
        except (ValueError, RecursionError) as e:  # an integer past the str limit, deep nesting
            raise SkillError(f"not usable JSON: {type(e).__name__}: {str(e)[:200]}") from None
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
    check_name(node.name)
    check_definition_time(node)
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


def _definition_only(source: str, name: str) -> None:
    """``split_definition`` for a record's ``source`` (``SkillError``); text that does not parse or
    holds no function ``name`` is left to ``make_skill``, which says so."""
    tree = parse_code(source)
    if isinstance(tree, CodeError):
        return
    if not any(isinstance(n, FunctionNode) and n.name == name for n in tree.body):
        return
    try:
        split_definition(tree, name)
    except SkillTextError as e:
        raise SkillError(f"skill {name!r}: source line {e.line}: {e.message}") from None


#: Bounds of a valid record: counters fit SQLite's 64-bit INTEGER; text stays readable in a prompt.
MAX_COUNT = 2**62
MAX_NAME_CHARS = 200
MAX_SOURCE_CHARS = 200_000
MAX_TEXT_CHARS = 1_000
MAX_ITEMS = 200

#: Names no skill may take. A library skill is defined into every later task's namespace, so one
#: named ``print`` or ``len`` (or ``apis``, or ``ApiError``, which the sandbox binds in every task)
#: would replace what the task's own code calls (``except ApiError`` then fails), and each
#: ordinary call of it would be credited as a use of the skill (found by the reward audit of
#: session 26: a ``print`` that made one API call paid the skill bonus on every later task).
RESERVED_NAMES = frozenset(dir(builtins)) | {"apis", "ApiError"}


def check_name(name: str) -> None:
    """Raise ``SkillError`` when ``name`` cannot name a skill (not an identifier, too long, reserved)."""
    if len(name) > MAX_NAME_CHARS or not name.isidentifier():
        raise SkillError(
            f"skill name must be a Python identifier of at most {MAX_NAME_CHARS} characters, got {name[:80]!r}"
        )
    if name in RESERVED_NAMES or name.startswith("__"):
        raise SkillError(
            f"skill name {name!r} is reserved: it would shadow a builtin, apis, ApiError or a dunder in every task"
        )


def check_definition_time(node: FunctionNode) -> None:
    """Raise ``SkillError`` when what runs as the library loads, before every later task's first
    turn (decorators, default values, annotations), calls anything or names ``apis``: a saved
    ``def f(x=apis.supervisor.complete_task(answer='planted'))`` completed each later task unseen.
    PocketWorld also refuses API calls then (``envs/pocketworld/env.py``); AppWorld's shell does not."""
    a = node.args
    args = (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg)
    parts = [*node.decorator_list, *a.defaults, *a.kw_defaults, node.returns]
    parts += [x.annotation for x in args if x]
    for n in (n for part in parts if part is not None for n in ast.walk(part)):
        if isinstance(n, ast.Call | ast.Await | ast.Yield | ast.YieldFrom | ast.NamedExpr) or (
            isinstance(n, ast.Name) and n.id == "apis"
        ):
            raise SkillError(
                f"skill {node.name!r}: its decorators, default values and annotations run when the library "
                "loads, before every later task: they may not call anything or use apis"
            )


def provenance_from(value: Any, name: str) -> Provenance:
    """A ``Provenance`` from a record's ``provenance`` object, each field checked (``SkillError``)."""
    if value is None:
        return Provenance()
    if not isinstance(value, Mapping):
        raise SkillError(f"skill {name!r}: bad provenance: must be an object, not {type(value).__name__}")
    unknown = set(value) - {f.name for f in dataclasses.fields(Provenance)}
    if unknown:
        raise SkillError(f"skill {name!r}: bad provenance: unknown fields {sorted(map(str, unknown))[:10]}")
    for key in ("task_id", "scenario_id", "policy"):
        v = value.get(key, "")
        if not isinstance(v, str) or len(v) > MAX_TEXT_CHARS:
            raise SkillError(
                f"skill {name!r}: bad provenance: {key} must be a string of at most {MAX_TEXT_CHARS} characters"
            )
    step = _int_field({"name": name, **value}, "step", 0, where="bad provenance: step")
    created = value.get("created_at", 0.0)
    if isinstance(created, bool) or not isinstance(created, (int, float)) or not 0 <= created < 1e12:
        raise SkillError(
            f"skill {name!r}: bad provenance: created_at must be seconds since the epoch (a number), "
            f"got {_brief(created)}"
        )
    return Provenance(
        value.get("task_id", ""), value.get("scenario_id", ""), value.get("policy", ""), step, float(created)
    )


def check_field(name: str, key: str, value: Any) -> Any:
    """Validate one field of a record named ``name`` (as ``Skill.from_dict`` does); ``SkillError``
    names what is wrong. For readers that know where each field came from (the folder format)."""
    d = {"name": name, key: value}
    if key in ("version", "uses", "successes"):
        return _int_field(d, key, 0, low=1 if key == "version" else 0)
    if key == "imports":
        return _strings(d, key, _is_import, "an import statement")
    if key == "depends_on":
        return _strings(d, key, str.isidentifier, "a skill name")
    if key == "provenance":
        return provenance_from(value, name)
    if key == "tier":
        return Tier.parse(value)
    raise KeyError(key)


def _strings(d: Mapping[str, Any], key: str, valid: Any, what: str) -> tuple[str, ...]:
    v = d.get(key) or ()
    if not isinstance(v, (list, tuple)) or len(v) > MAX_ITEMS:
        raise SkillError(
            f"skill {d['name']!r}: {key} must be a list of at most {MAX_ITEMS} strings, got {_brief(v)}"
        )
    for item in v:
        if not isinstance(item, str) or len(item) > MAX_TEXT_CHARS or not valid(item):
            raise SkillError(f"skill {d['name']!r}: each of {key} must be {what}, got {_brief(item)}")
    return tuple(v)


def _is_import(text: str) -> bool:
    """One ``import``/``from ... import`` statement and nothing else (imports run before each task)."""
    tree = parse_code(text)
    if isinstance(tree, CodeError):
        return False
    return len(tree.body) == 1 and isinstance(tree.body[0], ast.Import | ast.ImportFrom)


def _int_field(d: Mapping[str, Any], key: str, default: int, low: int = 0, where: str = "") -> int:
    v = d.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool) or not low <= v < MAX_COUNT:
        raise SkillError(
            f"skill {d.get('name')!r}: {where or key} must be a {'non-negative' if low == 0 else 'positive'} "
            f"integer below 2**62, got {_brief(v)}"
        )
    return v


def _brief(v: Any) -> str:
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 64:
        return f"an integer of {v.bit_length()} bits"
    text = (
        repr(v)
        if not isinstance(v, (list, dict, str)) or len(v) < 100
        else f"a {type(v).__name__} of length {len(v)}"
    )
    return text[:100]
