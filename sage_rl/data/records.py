"""Dataset records for supervised fine-tuning: chat examples with a per-message train flag.

A ``ChatExample`` is one episode of an expert (one task solved in the skill-library format) as the
messages the policy saw and wrote, plus where it came from. It is our own format, written as JSON
Lines (one example per line), and the input of ``sage-rl sft`` (issue 7).

Message layout of an episode (the agent loop's rendering): ``system``, ``user`` (the task), then
alternating ``assistant`` (code text) / ``user`` (observation). ``Message.train`` says whether the
message's tokens carry loss; only assistant messages may be trained, and they are by default.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pydantic

from sage_rl.text import dumps
from sage_rl.types import Trajectory

ROLES = ("system", "user", "assistant")


class DatasetError(ValueError):
    """A dataset file or record is malformed. The message names the file, the line and the field."""


@dataclass(frozen=True)
class Message:
    """One chat message. ``train`` defaults to True for assistant messages and False otherwise."""

    role: str
    content: str
    train: bool | None = None

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise DatasetError(f"message role must be one of {ROLES}, got {self.role!r}")
        if not isinstance(self.content, str):
            raise DatasetError(f"message content must be a string, got {type(self.content).__name__}")
        if self.train is None:
            # frozen dataclass: the default depends on the role, so it is filled in here once.
            object.__setattr__(self, "train", self.role == "assistant")
        if self.train and self.role != "assistant":
            raise DatasetError(f"only assistant messages can be trained on, not {self.role!r} messages")

    def to_chat(self) -> dict[str, str]:
        """The ``{"role", "content"}`` dict that chat templates and chat APIs take."""
        return {"role": self.role, "content": self.content}


@dataclass(frozen=True)
class ChatExample:
    """One training conversation with its provenance.

    ``score``/``success`` are the task's outcome (SAGE.md section 4); ``library`` names the skills
    that were in the prompt's skill-library section; ``temperature`` is the expert's sampling
    temperature (None when unknown, e.g. a scripted expert).
    """

    messages: tuple[Message, ...]
    policy: str = ""
    temperature: float | None = None
    scenario_id: str = ""
    task_id: str = ""
    position: int = 0
    score: float = 0.0
    success: bool = False
    library: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.messages:
            raise DatasetError(f"example {self.task_id or '?'} has no messages")
        if not any(m.train for m in self.messages):
            raise DatasetError(f"example {self.task_id or '?'} has no trained (assistant) message")

    @property
    def num_trained_messages(self) -> int:
        return sum(bool(m.train) for m in self.messages)

    def chat(self) -> list[dict[str, str]]:
        return [m.to_chat() for m in self.messages]

    def to_dict(self) -> dict[str, Any]:
        return json.loads(dumps(self))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ChatExample:
        """Build from a JSON object; a missing or wrong field raises ``DatasetError`` naming it."""
        if not isinstance(d, Mapping):
            raise DatasetError(f"an example must be a JSON object, got {type(d).__name__}")
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(d) - known)
        if unknown:
            raise DatasetError(f"unknown field(s) {unknown}; expected some of {sorted(known)}")
        if "messages" not in d or not isinstance(d["messages"], list):
            raise DatasetError("field 'messages' is missing or not a list")
        try:  # every field of its declared type (a 'position' of "x" or a 'library' of 5 is refused)
            return _EXAMPLE.validate_python(d)
        except pydantic.ValidationError as e:
            err = e.errors()[0]
            if isinstance(err.get("ctx", {}).get("error"), DatasetError):  # __post_init__'s own
                raise err["ctx"]["error"] from None
            where = ".".join(map(str, err["loc"]))
            raise DatasetError(f"field {where!r}: {err['msg']} (got {err['input']!r:.60})") from None


_EXAMPLE = pydantic.TypeAdapter(ChatExample)


def episode_messages(opening: Sequence[Mapping[str, str]], trajectory: Trajectory) -> list[dict[str, str]]:
    """The whole message list of an episode: its ``opening`` (system, task) followed, for each
    turn, by the assistant text and the observation, as the agent loop appends them."""
    out = [dict(m) for m in opening]
    for t in trajectory.turns:
        out += [{"role": "assistant", "content": t.text}, {"role": "user", "content": t.observation}]
    return out


def example_from_trajectory(
    trajectory: Trajectory,
    messages: Sequence[Mapping[str, str]],
    temperature: float | None = None,
    train_no_code_turns: bool = False,
) -> ChatExample:
    """The chat example of one episode.

    ``messages`` is the episode as the agent loop rendered it: system, user (task), then one
    assistant message per turn (its text must equal ``turn.text``), each optionally followed by the
    user observation. Turns that produced no code are not trained on unless
    ``train_no_code_turns``: the expert's corrective no-code turns are not behaviour to copy.
    """
    roles = [m["role"] for m in messages]
    if roles[:2] != ["system", "user"]:
        raise DatasetError(
            f"episode {trajectory.task.task_id}: messages must start with system, user; got {roles[:2]}"
        )
    assistants = [i for i, r in enumerate(roles) if r == "assistant"]
    if len(assistants) != len(trajectory.turns):
        raise DatasetError(
            f"episode {trajectory.task.task_id}: {len(assistants)} assistant messages for "
            f"{len(trajectory.turns)} turns"
        )
    train_at: dict[int, bool] = {}
    for i, turn in zip(assistants, trajectory.turns, strict=True):
        if messages[i]["content"] != turn.text:
            raise DatasetError(f"episode {trajectory.task.task_id}: message {i} is not the text of its turn")
        train_at[i] = bool(turn.code) or train_no_code_turns
    out = tuple(Message(m["role"], m["content"], train_at.get(i, False)) for i, m in enumerate(messages))
    task = trajectory.task
    return ChatExample(
        messages=out,
        policy=trajectory.policy,
        temperature=temperature,
        scenario_id=task.scenario_id,
        task_id=task.task_id,
        position=task.position,
        score=trajectory.outcome.score,
        success=trajectory.outcome.success,
        library=trajectory.library_in,
    )


def write_jsonl(examples: Iterable[ChatExample], path: str | Path) -> int:
    """Write one example per line (UTF-8); returns how many were written."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with p.open("w", encoding="utf-8") as f:
        for ex in examples:
            f.write(dumps(ex) + "\n")
            n += 1
    return n


def iter_jsonl(path: str | Path) -> Iterator[ChatExample]:
    """Read examples lazily; a bad line raises ``DatasetError`` naming the file and line number."""
    p = Path(path)
    if not p.is_file():
        raise DatasetError(f"dataset file not found: {p}")
    with p.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                bad = raw[e.start]
                raise DatasetError(
                    f"{p}:{lineno}: not UTF-8 text (byte 0x{bad:02x} at column {e.start + 1})"
                ) from None
            if not line.strip():
                continue
            try:
                yield ChatExample.from_dict(json.loads(line))
            except (json.JSONDecodeError, DatasetError) as e:
                raise DatasetError(f"{p}:{lineno}: {e}") from None


def read_jsonl(path: str | Path) -> list[ChatExample]:
    return list(iter_jsonl(path))
