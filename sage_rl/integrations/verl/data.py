"""PocketWorld / AppWorld task sequences -> verl's dataset files (``train.parquet``, ``val.parquet``).

One row = one task sequence = one GRPO group: verl runs ``rollout.n`` = G sessions of it, and
sage-rl's agent loop runs each session as a chain of its K tasks. A row's columns:

- ``sage_tasks``: the K tasks as JSON (sage-rl's ``Task`` records: id, scenario, instruction,
  spec), read by the agent loop; the task list travels with the data, so a worker on any node
  runs exactly these tasks.
- ``prompt``: the first task's instruction as a one-message chat, verl's required prompt column.
  It is a label (logs, verl's dataset checks): sage-rl renders the real prompt itself.
- ``agent_name``: ``sage_chain``; ``data_source``; ``extra_info`` (index, split, task ids).

Train rows are sampled from ``rollout.split`` with a seed (PocketWorld generates unlimited train
chains; AppWorld samples its train scenarios). Validation rows are the first K tasks of each
scenario of ``data.val_split``, in order (verl needs a validation file; sage-rl's own
scenario-ordered ``sage-rl eval`` is the evaluation to report, docs/verl.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sage_rl.integrations.verl import bridge
from sage_rl.integrations.verl.config import AGENT_LOOP_NAME, VerlRunConfig


def rows(sequences: Sequence[Sequence[Any]], env: str, split: str) -> list[dict[str, Any]]:
    """Dataset rows for task sequences (``bridge`` tasks), in order."""
    return [
        {
            "data_source": f"sage-rl/{env}",
            "agent_name": AGENT_LOOP_NAME,
            "prompt": [{"role": "user", "content": seq[0].instruction}],
            "sage_tasks": bridge.tasks_to_json(seq),
            "extra_info": {"index": i, "split": split, "task_ids": " ".join(t.task_id for t in seq)},
        }
        for i, seq in enumerate(sequences)
    ]


def write_parquet(path: Path, records: list[dict[str, Any]]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not records:
        raise ValueError(f"no rows to write to {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".parquet.tmp")
    pq.write_table(pa.Table.from_pylist(records), tmp)
    tmp.replace(path)  # a reader never sees half a file


def prepare(cfg: VerlRunConfig, out_dir: Path | None = None) -> dict[str, int]:
    """Write ``train.parquet`` and ``val.parquet`` into ``out_dir`` (default ``cfg.data_dir``)."""
    out = Path(out_dir or cfg.data_dir)
    n = cfg.data.train_rows or cfg.steps * cfg.rollout.groups_per_step
    train = bridge.train_sequences(cfg, n, cfg.seed)
    val = bridge.eval_sequences(cfg, cfg.data.val_split, cfg.data.val_rows)
    short = [s for s in val if len(s) < cfg.rollout.chain_length]
    if short:
        raise ValueError(
            f"{len(short)} scenarios of {cfg.data.val_split!r} have fewer than chain_length="
            f"{cfg.rollout.chain_length} tasks (e.g. {short[0][0].scenario_id})"
        )
    write_parquet(out / "train.parquet", rows(train, cfg.env, cfg.rollout.split))
    write_parquet(out / "val.parquet", rows(val, cfg.env, cfg.data.val_split))
    return {"train": len(train), "val": len(val)}
