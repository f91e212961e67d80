"""Typed, validated configuration: pydantic models, YAML files and ``key.sub=value`` overrides.

One model per entry point (STYLE.md, principle 7). A bad value fails at start-up with a
``ConfigError`` that names the field and the file or override it came from.

    cfg = load_config(TrainConfig, "configs/quickstart.yaml", ["rollout.group_size=4"])
"""

from __future__ import annotations

import functools
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

M = TypeVar("M", bound=BaseModel)


class ConfigError(ValueError):
    """A config file or override is wrong. The message names the field and what was wrong."""


#: The most values one YAML document may expand to, aliases counted at every use: a 342-byte
#: "billion laughs" file expands to 10**9 strings, and copying or validating them never ends.
MAX_YAML_VALUES = 100_000


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, values are validated on assignment."""

    #: ``allow_inf_nan=False``: no rate, bound or reward of a config may be NaN or infinite.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _one_value_is_a_list(cls, data: Any) -> Any:
        """A list field given one value takes it as a one-item list: ``strategies=all`` is
        ``strategies=[all]``, ``formats=jsonl`` is ``formats=[jsonl]`` (in a file as in an override)."""
        if not isinstance(data, dict):
            return data
        names = _list_fields(cls)
        one = {k: [v] for k, v in data.items() if k in names and isinstance(v, str | int | float)}
        return {**data, **one} if one else data


@functools.cache
def _list_fields(model: type[BaseModel]) -> frozenset[str]:
    """Fields typed ``list[X]`` or ``list[X] | None``; not unions with other types, whose scalar
    values mean something else (``targets: list[str] | Literal["all-linear"]``)."""

    def is_list(annotation: Any) -> bool:
        if typing.get_origin(annotation) is list:
            return True
        if typing.get_origin(annotation) in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            return len(args) == 1 and typing.get_origin(args[0]) is list
        return False

    return frozenset(name for name, f in model.model_fields.items() if is_list(f.annotation))


def parse_override(item: str) -> tuple[list[str], Any]:
    """``"a.b=3"`` -> (["a", "b"], 3). The value is parsed as YAML, so ``x=[1,2]``, ``x=null`` work."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} is not of the form key.sub=value")
    key, raw = item.split("=", 1)
    path = [p for p in key.strip().split(".")]
    if not all(path):
        raise ConfigError(f"override {item!r} has an empty key segment")
    value = load_yaml(raw, f"override {item!r}") if raw.strip() else ""
    return path, value


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Return a copy of ``data`` with each ``key.sub=value`` set (creating nested dicts)."""
    out = _deep_copy(data)
    for item in overrides:
        path, value = parse_override(item)
        node = out
        for p in path[:-1]:
            nxt = node.get(p)
            if nxt is None:
                nxt = node[p] = {}
            if not isinstance(nxt, dict):
                raise ConfigError(f"override {item!r}: {p!r} is a value, not a section")
            node = nxt
        node[path[-1]] = value
    return out


def read_yaml(path: str | Path) -> dict[str, Any]:
    """The mapping a YAML config file holds. Any problem with the file (missing, unreadable, not
    UTF-8, not YAML, not a mapping) is a one-line ``ConfigError`` naming it."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"config file {p} is not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}); "
            "save it as UTF-8"
        ) from None
    except OSError as e:
        raise ConfigError(f"config file {p} cannot be read ({e.strerror or e})") from None
    data = load_yaml(text, f"config file {p}") or {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {p} must hold a mapping at the top level, not {type(data).__name__}")
    return data


def load_yaml(text: str, where: str) -> Any:
    """``yaml.safe_load`` that refuses, quickly and by name, documents whose aliases expand to more
    than ``MAX_YAML_VALUES`` values, recursive aliases and absurd nesting (``ConfigError``).

    The node graph is composed first (linear in the text) and its expanded size counted without
    expanding it; only then are Python values built."""
    loader = None
    try:
        loader = yaml.SafeLoader(text)  # its reader refuses control characters here already
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expansion(node, where)
        return loader.construct_document(node)
    except yaml.YAMLError as e:
        raise ConfigError(f"{where} is not valid YAML: {e}") from None
    except (ValueError, OverflowError, TypeError, AttributeError, LookupError) as e:
        # a constructor's: a 5,000-digit int, the date 2024-13-45, PyYAML's own `!!timestamp x`
        raise ConfigError(f"{where} holds a value YAML cannot build ({type(e).__name__}: {e})") from None
    except RecursionError:
        raise ConfigError(f"{where} is nested too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()


def _check_expansion(root: yaml.Node, where: str) -> None:
    """Count the values ``root`` expands to (each alias at every use) in time linear in the graph."""
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    todo: list[tuple[yaml.Node, bool]] = [(root, False)]
    while todo:
        node, done = todo.pop()
        kids = _children(node)
        if done:
            on_path.discard(id(node))
            sizes[id(node)] = 1 + sum(sizes[id(k)] for k in kids)
            if sizes[id(node)] > MAX_YAML_VALUES:
                raise ConfigError(
                    f"{where}: YAML aliases expand to more than {MAX_YAML_VALUES} values (an alias bomb?)"
                )
        elif id(node) in on_path:
            raise ConfigError(f"{where}: a YAML alias refers to itself (line {node.start_mark.line + 1})")
        elif id(node) not in sizes:
            on_path.add(id(node))
            todo.append((node, True))
            todo += [(k, False) for k in kids if id(k) not in sizes]


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def load_config(
    model: type[M],
    path: str | Path | None = None,
    overrides: Sequence[str] = (),
    base: Mapping[str, Any] | None = None,
) -> M:
    """Build ``model`` from ``base`` <- YAML file <- overrides, validating once at the end.

    A YAML file may start from another with ``extends: other.yaml`` (relative to the file): the
    ablation configs are one line of difference from the run they ablate.
    """
    data = _deep_merge(dict(base or {}), read_with_extends(path) if path else {})
    data = apply_overrides(data, overrides)
    source = f"{path}" if path else "defaults"
    if overrides:
        source += " + overrides " + " ".join(overrides)
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, source)) from None


def read_with_extends(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """``read_yaml`` following ``extends:`` chains (cycles are an error)."""
    p = Path(path).resolve()
    if p in _seen:
        raise ConfigError(f"config {p} extends itself (through {' -> '.join(map(str, _seen))})")
    data = read_yaml(p)
    parent = data.pop("extends", None)
    if parent is None:
        return data
    if not isinstance(parent, str):
        raise ConfigError(f"config {p}: 'extends' must be a file name, not {parent!r}")
    return _deep_merge(read_with_extends(p.parent / parent, (*_seen, p)), data)


def format_validation_error(e: ValidationError, source: str) -> str:
    lines = [f"invalid config ({source}):"]
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "config"
        msg = err["msg"]
        if err["type"] == "value_error" and "error" in err.get("ctx", {}):
            msg = str(err["ctx"]["error"])  # our own validators' sentences, without pydantic's prefix
        if err["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling; see the config reference in docs/)"
        got = err.get("input")
        got_s = "" if isinstance(got, dict) or err["type"] == "missing" else f" (got {got!r})"
        lines.append(f"  {loc}: {msg}{got_s}")
    return "\n".join(lines)


def dump_config(cfg: BaseModel) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


def _deep_copy(d: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, Mapping) else v for k, v in d.items()}


def _deep_merge(a: dict[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    out = _deep_copy(a)
    for k, v in b.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = _deep_copy(v) if isinstance(v, Mapping) else v
    return out


def describe_diff(diffs: list[tuple[str, Any, Any]], limit: int = 8) -> str:
    """``settings_diff``'s rows as one line for an error: ``key: old -> new; ...`` (the first ``limit``)."""
    more = f" (and {len(diffs) - limit} more)" if len(diffs) > limit else ""
    return "; ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in diffs[:limit]) + more


def settings_diff(saved: Mapping[str, Any], now: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any, Any]]:
    """``[(dotted key, saved value, new value)]`` where two dumped configs differ, in key order, at
    any depth. A key that only one side has (a setting added to the code since ``saved`` was
    written, say) is left out: resumes compare what both runs could set."""
    out: list[tuple[str, Any, Any]] = []
    for key in sorted(saved.keys() & now.keys()):
        a, b, name = saved[key], now[key], f"{prefix}{key}"
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out += settings_diff(a, b, f"{name}.")
        elif a != b:
            out.append((name, a, b))
    return out
