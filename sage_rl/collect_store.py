"""The on-disk state of ``sage-rl collect``: an append-only dataset plus a progress ledger.

Two files in the collection folder, both append-only and fsynced after every finished scenario:

- ``<name>.jsonl``: the dataset, one ``ChatExample`` per line (our chat JSON Lines format);
- ``progress.jsonl``: the ledger. Line 1 is a header holding the config that decides what is
  collected; then one ``ScenarioRecord`` per finished (scenario, temperature) job, with the size
  the dataset file had right after that job's examples were appended.

A job is committed by appending its examples to the dataset first, then its ledger line. So after
any crash the ledger is the truth: on reopen, a partial last ledger line is cut off, and the dataset
is cut back to the size the last complete ledger line recorded. That drops a partial last example
line and the examples of a job whose ledger line never made it, and loses no finished job.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pydantic

from sage_rl.data.records import ChatExample, DatasetError, read_jsonl
from sage_rl.text import dumps
from sage_rl.types import fault

LEDGER = "progress.jsonl"
LEDGER_VERSION = 1


class StoreError(RuntimeError):
    """The collection folder cannot be resumed. The message names the file and what is wrong."""


@dataclass(frozen=True)
class TaskRecord:
    """What happened to one task of one job. ``reason`` is None when its example was kept."""

    task_id: str
    position: int
    success: bool
    score: float
    produced_code: bool
    stop: str
    steps: int
    reason: str | None = None


@dataclass(frozen=True)
class ScenarioRecord:
    """One finished (scenario, temperature) job, as written to the ledger."""

    scenario_id: str
    temperature: float
    accepted: bool  # passed the scenario-level screen (its first N tasks succeeded)
    tasks: tuple[TaskRecord, ...]
    examples: int  # examples appended to the dataset by this job
    jsonl_bytes: int = 0  # size of the dataset file right after this job's append

    @property
    def key(self) -> tuple[str, float]:
        return (self.scenario_id, self.temperature)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ScenarioRecord:
        """Every field of its declared type, or ``ValueError`` naming the first that is not (a
        ``jsonl_bytes`` of null stopped a resume with a bare ``TypeError``)."""
        return _RECORD.validate_python(d)


_RECORD = pydantic.TypeAdapter(ScenarioRecord)


def conversation_hash(example: ChatExample) -> str:
    """Identity of a conversation for deduplication: the roles and contents of its messages."""
    text = json.dumps(example.chat(), ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class CollectStore:
    """The dataset and ledger of one collection folder, recovered and ready to append to.

    ``config`` is the JSON-able part of the config that decides what is collected; resuming a
    folder collected under a different one raises ``StoreError`` naming the keys that differ.
    ``resume=False`` starts over (the dataset and ledger are removed).
    """

    def __init__(self, folder: str | Path, name: str, config: Mapping[str, Any], resume: bool = True) -> None:
        self.folder = Path(folder)
        self.dataset = self.folder / f"{name}.jsonl"
        self.ledger = self.folder / LEDGER
        self.config = json.loads(json.dumps(dict(config)))  # normalised as it reads back from JSON
        self.records: list[ScenarioRecord] = []
        self.dropped_bytes = 0  # dataset bytes cut off on recovery (uncommitted or partial lines)
        self.folder.mkdir(parents=True, exist_ok=True)
        if not resume:
            self.dataset.unlink(missing_ok=True)
            self.ledger.unlink(missing_ok=True)
        self._recover()
        try:
            self._hashes = {conversation_hash(ex) for ex in self.examples()}
        except DatasetError as e:  # a line the ledger counts as committed no longer reads
            raise StoreError(
                f"{e}: the dataset was damaged after it was written; repair that line, or start over "
                "with resume=false or a new out_dir"
            ) from None

    @property
    def done(self) -> set[tuple[str, float]]:
        return {r.key for r in self.records}

    def seen(self, conversation: str) -> bool:
        return conversation in self._hashes

    def examples(self) -> list[ChatExample]:
        return read_jsonl(self.dataset) if self.dataset.is_file() else []

    def commit(self, record: ScenarioRecord, examples: Iterable[ChatExample]) -> ScenarioRecord:
        """Append ``examples`` (dataset, fsync), then ``record`` with the new size (ledger, fsync)."""
        examples = list(examples)
        if record.examples != len(examples):
            raise ValueError(
                f"record of {record.scenario_id} counts {record.examples} examples, got {len(examples)}"
            )
        with self.dataset.open("ab") as f:
            f.write("".join(dumps(ex) + "\n" for ex in examples).encode("utf-8"))
            _sync(f)
            size = f.tell()
        done = ScenarioRecord(
            record.scenario_id, record.temperature, record.accepted, record.tasks, record.examples, size
        )
        _append_line(self.ledger, {"kind": "scenario", **json.loads(dumps(done))})
        self.records.append(done)
        self._hashes.update(conversation_hash(ex) for ex in examples)
        return done

    # ---------------------------------------------------------------------------------------

    def _recover(self) -> None:
        if not self.ledger.is_file() and self.dataset.is_file() and self.dataset.stat().st_size:
            raise StoreError(
                f"{self.dataset} exists but its ledger {self.ledger} does not, so it cannot be resumed; "
                "use a new out_dir, or resume=false to start over"
            )
        lines = _complete_lines(self.ledger)
        if not lines:
            self.ledger.write_bytes(b"")
            _append_line(self.ledger, {"kind": "header", "version": LEDGER_VERSION, "config": self.config})
            lines = _complete_lines(self.ledger)
        self._check_header(lines[0])
        self.records = [self._parse(line, i) for i, line in enumerate(lines[1:], start=2)]
        committed = self.records[-1].jsonl_bytes if self.records else 0
        size = self.dataset.stat().st_size if self.dataset.is_file() else 0
        if size < committed:
            raise StoreError(
                f"{self.dataset} has {size} bytes but {self.ledger} records {committed}: the dataset was "
                "edited or lost; start over with resume=false or a new out_dir"
            )
        if size > committed:
            with self.dataset.open("r+b") as f:
                f.truncate(committed)
                _sync(f)
            self.dropped_bytes = size - committed

    def _check_header(self, line: bytes) -> None:
        header = self._parse_json(line, 1)
        if (
            not isinstance(header, dict)
            or header.get("kind") != "header"
            or header.get("version") != LEDGER_VERSION
            or not isinstance(header.get("config", {}), dict)
        ):
            raise StoreError(f"{self.ledger}: line 1 is not a version-{LEDGER_VERSION} collect ledger header")
        theirs = header.get("config", {})
        differ = sorted(k for k in set(theirs) | set(self.config) if theirs.get(k) != self.config.get(k))
        if differ:
            raise StoreError(
                f"{self.folder} was collected with a different config (differs in: {', '.join(differ)}); "
                "use a new out_dir, or resume=false to start over"
            )

    def _parse(self, line: bytes, lineno: int) -> ScenarioRecord:
        try:
            return ScenarioRecord.from_dict(self._parse_json(line, lineno))
        except (KeyError, TypeError, ValueError) as e:
            raise StoreError(f"{self.ledger}:{lineno}: not a scenario record ({fault(e)})") from None

    def _parse_json(self, line: bytes, lineno: int) -> dict[str, Any]:
        try:
            return json.loads(line)
        except ValueError as e:  # JSONDecodeError, or bytes that are not UTF-8
            raise StoreError(f"{self.ledger}:{lineno}: not JSON ({e})") from None


def _complete_lines(path: Path) -> list[bytes]:
    """The newline-terminated lines of ``path``; a partial last line is cut off the file."""
    if not path.is_file():
        return []
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data):
        with path.open("r+b") as f:
            f.truncate(end)
            _sync(f)
    return [line for line in data[:end].split(b"\n") if line.strip()]


def _append_line(path: Path, obj: Mapping[str, Any]) -> None:
    with path.open("ab") as f:
        f.write((json.dumps(obj, ensure_ascii=False, sort_keys=True) + "\n").encode("utf-8"))
        _sync(f)


def _sync(f) -> None:
    f.flush()
    os.fsync(f.fileno())
