"""Dataset exports: our chat JSON Lines, a Hugging Face ``datasets`` folder, LLaMA-Factory sharegpt.

- Chat JSON Lines (``write_jsonl`` / ``read_jsonl`` in ``records``): lossless, the input of
  ``sage-rl sft``.
- Hugging Face folder: ``<dir>/data/<split>-00000-of-00001.parquet`` with the same fields, loadable
  with ``datasets.load_dataset(dir)``. Lossless.
- LLaMA-Factory sharegpt: ``<dir>/<name>.json`` plus ``<dir>/dataset_info.json``. LLaMA-Factory
  trains on every ``gpt`` turn (or only the last one with ``mask_history: true``), so the per-message
  train flag maps as described in ``export_sharegpt`` and docs/sft.md.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from sage_rl.data.records import ChatExample, DatasetError, Message, write_jsonl

#: Provenance columns carried next to the messages in the parquet and sharegpt exports.
PROVENANCE = ("policy", "temperature", "scenario_id", "task_id", "position", "score", "success", "library")

SharegptMode = Literal["all", "last"]


class ExportError(DatasetError):
    """An example cannot be written in the requested format without changing what is trained."""


# --------------------------------------------------------------------------------------------
# Hugging Face datasets (parquet)
# --------------------------------------------------------------------------------------------


def _features() -> Any:
    from datasets import Features, List, Value

    message = {"role": Value("string"), "content": Value("string"), "train": Value("bool")}
    return Features(
        {
            "messages": List(message),
            "policy": Value("string"),
            "temperature": Value("float64"),
            "scenario_id": Value("string"),
            "task_id": Value("string"),
            "position": Value("int64"),
            "score": Value("float64"),
            "success": Value("bool"),
            "library": List(Value("string")),
        }
    )


def export_hf(examples: Sequence[ChatExample], folder: str | Path, split: str = "train") -> Path:
    """Write ``examples`` as one parquet file of split ``split``; returns the file's path."""
    from datasets import Dataset

    path = Path(folder) / "data" / f"{split}-00000-of-00001.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    features, rows = _features(), [ex.to_dict() for ex in examples]
    # from_dict, not from_list: with no rows (a collection that kept nothing) from_list loses the columns
    columns = {name: [row.get(name) for row in rows] for name in features}
    Dataset.from_dict(columns, features=features).to_parquet(str(path))
    return path


def read_hf(folder: str | Path, split: str = "train") -> list[ChatExample]:
    """Read a split written by ``export_hf`` back into examples."""
    import pyarrow.parquet as pq  # not datasets' from_parquet: it refuses a file with no rows

    path = Path(folder) / "data" / f"{split}-00000-of-00001.parquet"
    if not path.is_file():
        raise DatasetError(f"no parquet file for split {split!r}: {path}")
    return [ChatExample.from_dict(row) for row in pq.read_table(path).to_pylist()]


# --------------------------------------------------------------------------------------------
# LLaMA-Factory sharegpt
# --------------------------------------------------------------------------------------------


def _check_layout(ex: ChatExample) -> list[Message]:
    """The messages after the system prompt, alternating user/assistant from a user message."""
    body = list(ex.messages[1:] if ex.messages[0].role == "system" else ex.messages)
    for i, m in enumerate(body):
        want = "user" if i % 2 == 0 else "assistant"
        if m.role != want:
            raise ExportError(
                f"example {ex.task_id or '?'}: sharegpt needs user/assistant turns alternating from a "
                f"user turn; message {i} after the system prompt is {m.role!r}"
            )
    return body


def _sharegpt_row(ex: ChatExample, body: list[Message], observation_tag: str) -> dict[str, Any]:
    conv = []
    for i, m in enumerate(body):
        tag = "gpt" if m.role == "assistant" else ("human" if i == 0 else observation_tag)
        conv.append({"from": tag, "value": m.content})
    system = ex.messages[0].content if ex.messages[0].role == "system" else ""
    row = {"conversations": conv, "system": system}
    row.update({k: v for k, v in ex.to_dict().items() if k in PROVENANCE})
    return row


def sharegpt_rows(ex: ChatExample, mode: SharegptMode = "all", observation_tag: str = "human") -> list[dict]:
    """The sharegpt records of one example.

    LLaMA-Factory trains on every ``gpt`` turn, and a conversation must end on one. So:

    - the conversation is cut after its last trained assistant message (a trailing observation
      or untrained assistant turn carries no loss anyway);
    - mode ``"all"`` (train with LLaMA-Factory's defaults): one record; an untrained assistant
      message before a trained one cannot be expressed and raises ``ExportError``;
    - mode ``"last"`` (train with ``mask_history: true``, which trains the last turn only): one
      record per trained assistant message, the conversation up to and including it. Exact for any
      train flags, at the cost of repeating prefixes.

    Observations (user messages after the first) get ``observation_tag``. The default ``"human"``
    keeps the token layout the policy sees at rollout time, where an observation is a plain user
    message; LLaMA-Factory's ``"observation"`` role wraps it in the template's tool-result markup.
    """
    body = _check_layout(ex)
    trained = [i for i, m in enumerate(body) if m.train]
    if mode == "last":
        return [_sharegpt_row(ex, body[: i + 1], observation_tag) for i in trained]
    if mode != "all":
        raise ExportError(f"sharegpt mode must be 'all' or 'last', got {mode!r}")
    body = body[: trained[-1] + 1]
    untrained = [i for i, m in enumerate(body) if m.role == "assistant" and not m.train]
    if untrained:
        raise ExportError(
            f"example {ex.task_id or '?'}: assistant message(s) {untrained} are not trained on but come "
            "before a trained one; LLaMA-Factory would train on them. Use mode='last' with mask_history: true"
        )
    return [_sharegpt_row(ex, body, observation_tag)]


def dataset_info_entry(file_name: str, observation_tag: str = "human") -> dict[str, Any]:
    """LLaMA-Factory's ``dataset_info.json`` entry for a file written by ``export_sharegpt``."""
    tags = {"role_tag": "from", "content_tag": "value", "user_tag": "human", "assistant_tag": "gpt"}
    if observation_tag != "human":
        tags["observation_tag"] = observation_tag
    return {
        "file_name": file_name,
        "formatting": "sharegpt",
        "columns": {"messages": "conversations", "system": "system"},
        "tags": tags,
    }


def export_sharegpt(
    examples: Sequence[ChatExample],
    folder: str | Path,
    name: str = "sage_expert",
    mode: SharegptMode = "all",
    observation_tag: str = "human",
) -> Path:
    """Write ``<folder>/<name>.json`` and add ``name`` to ``<folder>/dataset_info.json``.

    Entries already in ``dataset_info.json`` for other datasets are kept. Returns the data file.
    """
    rows = [r for ex in examples for r in sharegpt_rows(ex, mode, observation_tag)]
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    data_file = out / f"{name}.json"
    # a lone surrogate (UTF-8 cannot encode it) becomes its JSON escape, as in text.dumps
    data_file.write_text(
        json.dumps(rows, ensure_ascii=False, indent=1), encoding="utf-8", errors="backslashreplace"
    )
    info_path = out / "dataset_info.json"
    info = json.loads(info_path.read_text(encoding="utf-8")) if info_path.is_file() else {}
    info[name] = dataset_info_entry(data_file.name, observation_tag)
    info_path.write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return data_file


def read_sharegpt(folder: str | Path, name: str = "sage_expert") -> list[ChatExample]:
    """Read a sharegpt export back (every ``gpt`` turn trained, as LLaMA-Factory would)."""
    info_path = Path(folder) / "dataset_info.json"
    if not info_path.is_file():
        raise DatasetError(f"not a LLaMA-Factory data folder (no dataset_info.json): {folder}")
    entry = json.loads(info_path.read_text(encoding="utf-8")).get(name)
    if entry is None:
        raise DatasetError(f"{info_path}: no dataset named {name!r}")
    gpt = entry["tags"]["assistant_tag"]
    rows = json.loads((Path(folder) / entry["file_name"]).read_text(encoding="utf-8"))
    out = []
    for n, row in enumerate(rows):
        msgs = [{"role": "system", "content": row["system"]}] if row.get("system") else []
        msgs += [
            {"role": "assistant" if t["from"] == gpt else "user", "content": t["value"]}
            for t in row["conversations"]
        ]
        try:
            out.append(
                ChatExample.from_dict({"messages": msgs, **{k: row[k] for k in PROVENANCE if k in row}})
            )
        except (KeyError, TypeError, DatasetError) as e:
            raise DatasetError(f"{entry['file_name']} record {n}: {e}") from None
    return out


# --------------------------------------------------------------------------------------------
# All formats at once (what `sage-rl collect` writes)
# --------------------------------------------------------------------------------------------


def export_all(
    examples: Sequence[ChatExample],
    folder: str | Path,
    name: str = "sage_expert",
    sharegpt_mode: SharegptMode = "all",
) -> dict[str, Path]:
    """Write ``<folder>/<name>.jsonl`` (chat JSON Lines), ``<folder>/hf/`` (parquet) and
    ``<folder>/llamafactory/`` (sharegpt + dataset_info.json). Returns format -> path."""
    out = Path(folder)
    jsonl = out / f"{name}.jsonl"
    write_jsonl(examples, jsonl)
    return {
        "jsonl": jsonl,
        "hf": export_hf(examples, out / "hf"),
        "sharegpt": export_sharegpt(examples, out / "llamafactory", name, sharegpt_mode),
    }
