"""The step in progress, kept on disk group by group, so a stopped training run loses no rollout.

A training step samples B groups of G chains (and, when due, a screen: one group per template),
which can take most of an hour on a laptop CPU. A run stopped in the middle of a step (the session
ends, the machine is reclaimed) resumes from its last checkpoint; without this journal it would
sample the whole step again.

Each group is appended to ``rollouts/step_<n>.partial.jsonl`` (beside the step's
``step_<n>.jsonl``, written when it ends) as it finishes. A resumed run draws
the same task sequences (the step's seeded RNG), takes from the journal every group whose index,
task sequence, start library and chain count match, and samples only the others. The journal is
used only by the step it was written for, from the same weights and settings: its first line
records a digest of the model's weights and the rollout settings (less ``concurrency``, which a resume
may change), and a journal that disagrees is
moved aside (``*.stale``), never reused; a resumed run removes the journals of other steps. When
the step has ended (logged, and checkpointed when due), its journal is removed.

What is kept is what was sampled: the reused groups come from the same weights and settings, so the
step's data is drawn as it would have been; only the rows a batch decoded beside each other differ.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sage_rl.rollout.chain import ChainRunner, run_group, start_fingerprint
from sage_rl.skills.library import Library
from sage_rl.text import dumps
from sage_rl.types import Chain, Task

log = logging.getLogger(__name__)

SUFFIX = ".partial.jsonl"


def weights_digest(model: Any) -> str:
    """A digest of a model's weights from a strided sample of every parameter (64 values each):
    any optimizer step changes it; cheap for any model size. "" for an object without parameters."""
    params = getattr(model, "named_parameters", None)
    if params is None:
        return ""
    import torch

    h = hashlib.sha1()
    with torch.no_grad():
        for name, p in params():
            flat = p.detach().reshape(-1)
            picked = flat[:: max(1, flat.numel() // 64)].float().cpu()
            h.update(name.encode())
            h.update(picked.numpy().tobytes())
    return h.hexdigest()


def journal_path(rollout_file: Path) -> Path:
    """The journal of the step whose rollouts go to ``rollout_file`` (``step_<n>.jsonl``)."""
    return rollout_file.with_suffix(SUFFIX)


class StepJournal:
    """The finished groups of one step (see the module docstring), at ``path``. ``key``: what the
    groups were sampled under (weights digest, settings); a journal on disk with another key is
    moved aside as ``*.stale`` and the step starts empty."""

    def __init__(self, path: Path, key: str) -> None:
        self.path, self.key = Path(path), key
        self._groups: dict[int, list[tuple[Chain, ...]]] = {}  # a damaged line may claim another's index
        self.reused = 0
        self._load()

    def _load(self) -> None:
        if not self.path.is_file():
            return
        # JSON Lines end at "\n" only: a chain's text may hold U+2028 or U+0085, which splitlines cuts at
        lines = [x for x in self.path.read_text(encoding="utf-8", errors="surrogateescape").split("\n") if x]
        try:
            head = json.loads(lines[0]) if lines else {}
        except ValueError:
            head = {}
        if head != {"key": self.key}:
            stale = self.path.with_suffix(".stale")
            self.path.replace(stale)
            log.warning("%s: sampled under other weights or settings; moved to %s", self.path, stale)
            return
        for n, line in enumerate(lines[1:], 2):
            try:
                row = json.loads(line)
                chains = tuple(Chain.from_dict(c) for c in row["chains"])
                self._groups.setdefault(int(row["group"]), []).append(chains)
            except (ValueError, KeyError, TypeError) as e:  # the line a kill cut short, a damaged one
                log.warning("%s:%d: not a group (%s); it is sampled again", self.path, n, type(e).__name__)

    def take(self, index: int, tasks: Sequence[Task], size: int, library: Library) -> list[Chain] | None:
        """Group ``index``'s chains when the journal holds them for this task sequence, ``size``
        chains from this start library; else None (the group is sampled)."""
        ids, start = tuple(t.task_id for t in tasks), start_fingerprint(library)
        for chains in reversed(self._groups.get(index, [])):
            if len(chains) == size and all(c.task_ids == ids and c.start_library == start for c in chains):
                self.reused += 1
                return list(chains)
        return None

    def add(self, index: int, chains: Sequence[Chain]) -> None:
        """Append a finished group (the file and its first line are made on the first one)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new = not self.path.is_file()
        with open(self.path, "a", encoding="utf-8") as f:
            if new:
                f.write(json.dumps({"key": self.key}) + "\n")
            f.write(dumps({"group": index, "chains": list(chains)}) + "\n")
            f.flush()
        self._groups.setdefault(index, []).append(tuple(chains))

    def close(self) -> None:
        """The step has ended (logged, checkpointed when due): its journal is not needed any more."""
        self.path.unlink(missing_ok=True)


async def run_group_kept(
    runner: ChainRunner,
    tasks: Sequence[Task],
    library: Library,
    index: int,
    size: int,
    step: int,
    journal: StepJournal | None,
) -> list[Chain]:
    """``run_group``, through ``journal``: its kept chains when it has them, else sampled and kept."""
    kept = journal.take(index, tasks, size, library) if journal is not None else None
    if kept is not None:
        return kept
    chains = await run_group(runner, tasks, library, index, size, step)
    if journal is not None:
        journal.add(index, chains)
    return chains


def drop_others(keep: Path) -> None:
    """Remove every journal beside ``keep`` but ``keep`` (a run resumed at a step: another step's
    journal was sampled from weights this run will not have)."""
    for path in keep.parent.glob(f"*{SUFFIX}"):
        if path.name != keep.name:
            path.unlink()
