"""Reading a run folder of ``sage-rl train``, ``eval`` or ``collect`` for the viewer. Read-only.

Records are read through the project's own types (``Chain.from_dict``, ``ScenarioRecord.from_dict``,
``ChatExample.from_dict``), so the viewer follows their layouts as they change. A line that cannot
be read (cut off, not JSON, not a record) is left out and described in ``RunData.problems``, one
sentence naming the file and line; everything readable is still shown. A folder that is not a run
folder raises ``ViewError``.

What each command writes (see the writers):

- train (``train/loop.py``, ``runs/train.py``; ``train/layout.py``): ``config.yaml``, ``rollouts/step_NNNNNN.jsonl``
  (one ``Chain`` per line), ``metrics.jsonl`` (one row per step), ``summary.json`` (before/after);
- eval (``eval/report.py: write_run``): ``config.yaml``, ``trajectories.<strategy>.jsonl`` (one
  ``Chain`` per scenario), ``metrics.json``;
- collect (``collect_store.py``): ``config.yaml``, ``progress.jsonl`` (a header, then one
  ``ScenarioRecord`` per job), ``<name>.jsonl`` (the kept ``ChatExample``s), ``summary.json``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml

from sage_rl.collect_store import LEDGER, ScenarioRecord
from sage_rl.data.records import ChatExample
from sage_rl.text import brief
from sage_rl.train.logging import is_metric, metrics_row
from sage_rl.types import Chain

Kind = Literal["train", "eval", "collect"]
T = TypeVar("T")

_STEP_FILE = re.compile(r"step_(\d+)\.jsonl$")
_TRAJ_FILE = re.compile(r"trajectories\.(.+)\.jsonl$")


class ViewError(ValueError):
    """The path cannot be viewed at all. The message is one sentence naming the path and why."""


@dataclass(frozen=True)
class ChainSection:
    """The chains of one training step (train) or one retrieval strategy (eval)."""

    label: str  # "step 3" or "same_scenario"
    key: str  # id-safe: "s3" or "same_scenario"
    path: Path
    chains: tuple[Chain, ...]
    step: int | None = None


@dataclass(frozen=True)
class CollectJob:
    """One (scenario, temperature) job of a collection and the examples it added to the dataset."""

    record: ScenarioRecord
    examples: tuple[ChatExample, ...]


@dataclass(frozen=True)
class RunData:
    path: Path
    kind: Kind
    config_text: str  # config.yaml as written ("" when missing)
    config: dict[str, Any]  # config.yaml parsed ({} when missing or unreadable)
    sections: tuple[ChainSection, ...] = ()
    metrics_rows: tuple[dict[str, Any], ...] = ()  # train: metrics.jsonl
    summary: dict[str, Any] | None = None  # train and collect: summary.json
    jobs: tuple[CollectJob, ...] = ()
    dataset: Path | None = None  # collect: the chat JSON Lines
    problems: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.path.name or str(self.path)

    @property
    def num_trajectories(self) -> int:
        if self.kind == "collect":
            return sum(len(j.record.tasks) for j in self.jobs)
        return sum(len(c.trajectories) for s in self.sections for c in s.chains)


def run_kind(path: Path) -> Kind:
    """Which command wrote ``path``; ``ViewError`` when none did."""
    if not path.exists():
        raise ViewError(f"{path} does not exist")
    if not path.is_dir():
        raise ViewError(f"{path} is a file, not a run folder (pass the folder that holds it)")
    if (path / "rollouts").is_dir() or (path / "metrics.jsonl").is_file():
        return "train"
    if any(path.glob("trajectories.*.jsonl")):
        return "eval"
    if (path / LEDGER).is_file():
        return "collect"
    raise ViewError(
        f"{path} is not a sage-rl run folder: it holds no rollouts/ or metrics.jsonl (train), "
        f"no trajectories.*.jsonl (eval) and no {LEDGER} (collect)"
    )


def read_run(path: str | Path) -> RunData:
    """Everything the viewer shows of one run folder (see the module docstring)."""
    path = Path(path)
    kind = run_kind(path)
    problems: list[str] = []
    text, config = _config(path, problems)
    if kind == "train":
        files = sorted(
            (int(m.group(1)), f)
            for f in (path / "rollouts").glob("step_*.jsonl")
            if (m := _STEP_FILE.search(f.name))
        )
        sections = tuple(
            ChainSection(f"step {n}", f"s{n}", f, tuple(_chains(f, problems)), step=n) for n, f in files
        )
        rows = read_jsonl(path / "metrics.jsonl", metrics_row, "metrics row", problems)
        return RunData(
            path,
            kind,
            text,
            config,
            sections,
            tuple(rows),
            _train_summary(path / "summary.json", problems),
            problems=tuple(problems),
        )
    if kind == "eval":
        names = {m.group(1): f for f in path.glob("trajectories.*.jsonl") if (m := _TRAJ_FILE.search(f.name))}
        listed = config.get("strategies")
        listed = [s for s in listed if isinstance(s, str)] if isinstance(listed, list) else []
        order = [s for s in dict.fromkeys(listed) if s in names] + sorted(set(names) - set(listed))
        sections = tuple(
            ChainSection(s, _id_safe(s), names[s], tuple(_chains(names[s], problems))) for s in order
        )
        return RunData(path, kind, text, config, sections, problems=tuple(problems))
    return _read_collect(path, text, config, problems)


def read_jsonl(path: Path, parse: Callable[[Any], T], what: str, problems: list[str]) -> list[T]:
    """The records of ``path`` that parse; each line that does not adds one sentence to ``problems``."""
    if not path.is_file():
        return []
    out: list[T] = []
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if raw.strip():
                record = _parse_line(path, lineno, raw, parse, what, problems)
                if record is not None:
                    out.append(record)
    return out


def _parse_line(path: Path, lineno: int, raw: bytes, parse, what: str, problems: list[str]):
    try:
        data = json.loads(raw)
    except ValueError as e:  # JSONDecodeError, or bytes that are not UTF-8
        cut = "is cut off" if not raw.endswith(b"\n") else "is not valid JSON"
        problems.append(f"{path} line {lineno} {cut} ({e}), so it is left out; the other lines are shown.")
        return None
    try:
        return parse(data)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        problems.append(
            f"{path} line {lineno} is not a {what} ({type(e).__name__}: {e}), so it is left out; "
            "the other lines are shown."
        )
        return None


def _train_summary(f: Path, problems: list[str]) -> dict[str, Any] | None:
    """``summary.json`` of a training run with what the overview reads checked (``steps``,
    ``wall_s``: numbers; ``before``, ``after`` and ``kept``: objects of numbers): a value of another
    type is named in ``problems`` and read as null (shown as -)."""
    data = _json(f, problems)
    if data is None:
        return None
    bad: list[str] = []

    def number(where: str, v: Any) -> Any:
        if is_metric(v):
            return v
        bad.append(f"{where} = {brief(v)}")
        return None

    out = {**data, **{k: number(k, data[k]) for k in ("steps", "wall_s") if k in data}}
    for name in ("before", "after", "kept"):
        section = data.get(name)
        if isinstance(section, dict):
            out[name] = {k: number(f"{name}.{k}", v) for k, v in section.items()}
        elif section is not None:
            bad.append(f"{name} = {brief(section)}")
            out[name] = None
    if bad:
        more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
        problems.append(f"{f}: {'; '.join(bad[:3])}{more}: not of the type written, so shown as -.")
    return out


def _chains(path: Path, problems: list[str]) -> list[Chain]:
    return read_jsonl(path, Chain.from_dict, "chain record", problems)


def _config(path: Path, problems: list[str]) -> tuple[str, dict[str, Any]]:
    f = path / "config.yaml"
    if not f.is_file():
        problems.append(f"{f} is missing, so the config is not shown.")
        return "", {}
    text = f.read_text(encoding="utf-8", errors="replace")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        problems.append(f"{f} is not valid YAML ({e}); it is shown as text.")
        return text, {}
    return text, data if isinstance(data, dict) else {}


def _json(f: Path, problems: list[str]) -> dict[str, Any] | None:
    if not f.is_file():
        return None
    try:
        data = json.loads(f.read_bytes())
    except ValueError as e:
        problems.append(f"{f} is not valid JSON ({e}), so its numbers are not shown.")
        return None
    return data if isinstance(data, dict) else None


def _id_safe(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", s)


# --------------------------------------------------------------------------------------------
# collect
# --------------------------------------------------------------------------------------------


def _read_collect(path: Path, text: str, config: dict[str, Any], problems: list[str]) -> RunData:
    """Jobs from the ledger; each job's examples are the dataset lines its byte range covers.

    The ledger records the dataset's size after each job's append (``jsonl_bytes``), so the lines
    between the previous job's size and this one's are this job's, exactly.
    """
    ledger = path / LEDGER
    records = read_jsonl(ledger, _ledger_entry, "collect ledger record", problems)
    header = [r for r in records if r is _HEADER]
    records = [r for r in records if r is not _HEADER]
    if not header:
        problems.append(f"{ledger} has no readable header line; the jobs after it are shown anyway.")
    name = config.get("name", "sage_expert")
    dataset = path / f"{name if isinstance(name, str) and Path(name).name == name else 'sage_expert'}.jsonl"
    if not dataset.is_file():
        dataset = next((f for f in path.glob("*.jsonl") if f.name != LEDGER), dataset)
    lines = _lines_with_offsets(dataset, problems)
    jobs, start = [], 0
    for rec in records:
        mine = [
            ex for end, ex in lines if start < end <= rec.jsonl_bytes and ex.scenario_id == rec.scenario_id
        ]
        jobs.append(CollectJob(rec, tuple(mine)))
        start = max(start, rec.jsonl_bytes)
    extra = sum(1 for end, _ in lines if end > start)
    if extra:
        problems.append(
            f"{dataset} holds {extra} example(s) after the last job in {ledger} (an interrupted job); "
            "they are not shown."
        )
    summary = _json(path / "summary.json", problems)
    return RunData(
        path,
        "collect",
        text,
        config,
        summary=summary,
        jobs=tuple(jobs),
        dataset=dataset,
        problems=tuple(problems),
    )


_HEADER = object()


def _ledger_entry(d: Any) -> Any:
    if isinstance(d, dict) and d.get("kind") == "header":
        return _HEADER
    return ScenarioRecord.from_dict(d)


def _lines_with_offsets(path: Path, problems: list[str]) -> list[tuple[int, ChatExample]]:
    """(byte offset of the line's end, example) for each readable example line."""
    if not path.is_file():
        return []
    out, end = [], 0
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            end += len(raw)
            if raw.strip():
                ex = _parse_line(path, lineno, raw, ChatExample.from_dict, "chat example", problems)
                if ex is not None:
                    out.append((end, ex))
    return out
