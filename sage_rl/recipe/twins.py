"""An evaluation the run has already made: the same settings and the same weights.

An RL arm that keeps its best model on validation (``eval.keep: best``) keeps its start's weights
when no step beat the start (laptop35's SAGE arm, 2026-12-07: the kept ``best/step_000000.*/model``
holds ``sft/final``'s tensors byte for byte). Its evaluation is then the start's: greedy decoding
of the same weights under the same settings gave the same tokens on every chain compared
(laptop35's ``sage`` against ``sft``: 83 of 83 chains of ``train_heldout`` and 8 of 8 of ``dev``,
token for token). Evaluating it again costs an hour of a 2-core machine and measures nothing new,
so the recipe reads the twin's back instead.

A twin is a finished evaluation (``outcomes.json``) whose recorded settings (``resume.json``)
equal this evaluation's in everything but the model's folder, and whose model folder holds the
same files with the same contents (weights: the same tensors, byte for byte). Its results are
copied into this evaluation's folder with this evaluation's own ``resume.json`` and
``config.yaml`` and a ``same_as.json`` naming the twin and why, so the folder reads back as any
finished evaluation does and says where its figures come from.
"""

from __future__ import annotations

import filecmp
import json
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from sage_rl.config import dump_config
from sage_rl.eval.resume import SETTINGS, located, settings_of

SAME_AS = "same_as.json"
#: what a twin's folder gives a read-back: its results, not its own settings, owner or report
_COPIED = ("metrics.json", "by_position.png", "trajectories.*.jsonl", "outcomes.json")


def same_weights(a: str | Path, b: str | Path) -> bool:
    """Two model folders hold the same files (names and contents: ``_same_file``); the same folder
    always does."""
    a, b = Path(located(str(a))), Path(located(str(b)))
    if a == b:
        return True
    if not (a.is_dir() and b.is_dir()):
        return False
    names = sorted(p.name for p in a.iterdir() if p.is_file())
    if names != sorted(p.name for p in b.iterdir() if p.is_file()) or not names:
        return False
    return all(_same_file(a / n, b / n) for n in names)


def _same_file(a: Path, b: Path) -> bool:
    """The same bytes; for a ``.safetensors`` file the same header (as JSON: its metadata's key
    order varies from save to save) and the same tensor bytes after it."""
    if a.suffix != ".safetensors":
        return filecmp.cmp(a, b, shallow=False)
    if a.stat().st_size != b.stat().st_size:
        return False
    with a.open("rb") as fa, b.open("rb") as fb:
        heads = []
        for f in (fa, fb):
            n = int.from_bytes(f.read(8), "little")
            if n > a.stat().st_size - 8:
                return False  # not a safetensors header: nothing to vouch for
            try:
                heads.append(json.loads(f.read(n)))
            except ValueError:
                return False  # not a readable safetensors header: nothing to vouch for
        if heads[0] != heads[1]:
            return False
        while True:
            x, y = fa.read(1 << 24), fb.read(1 << 24)
            if x != y:
                return False
            if not x:
                return True


def twin(ev: BaseModel, folders: Iterable[Path]) -> Path | None:
    """The first of ``folders`` holding a finished greedy evaluation of ``ev``'s settings on
    weights byte-identical to ``ev``'s model, one that ran (not itself read back, nor
    ``ev.out_dir``); None when there is none, or when ``ev`` samples."""
    mine = settings_of(ev)
    model = mine["policy"]["model"]
    if (mine.get("sampling") or {}).get("temperature") != 0:
        return None  # only greedy decoding has been seen to repeat itself token for token
    for folder in folders:
        if folder.resolve() == Path(ev.out_dir).resolve() or not (folder / "outcomes.json").is_file():
            continue
        if (folder / SAME_AS).is_file():
            continue  # a read-back itself: its own twin is the evaluation that ran
        try:
            theirs = json.loads((folder / SETTINGS).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # no settings to check against: not a twin
        if not isinstance(theirs, dict) or not isinstance(theirs.get("policy"), dict):
            continue
        other = theirs["policy"].get("model")
        same_rest = {**theirs, "policy": {**theirs["policy"], "model": model}} == mine
        if same_rest and isinstance(other, str) and same_weights(model, other):
            return folder
    return None


def read_twin(ev: BaseModel, source: Path) -> dict[str, Any]:
    """Copy ``source``'s results into ``ev.out_dir`` (replacing what a stopped evaluation left
    there), with ``ev``'s settings and ``same_as.json``; returns what ``same_as.json`` holds."""
    out = Path(ev.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    note = {
        "evaluation": str(source),
        "model": settings_of(ev)["policy"]["model"],
        "same_weights_as": json.loads((source / SETTINGS).read_text(encoding="utf-8"))["policy"]["model"],
        "why": "the same settings and the same weights (tensors byte for byte): greedy decoding repeats the twin",
    }
    (out / SETTINGS).write_text(json.dumps(settings_of(ev), indent=1, sort_keys=True), encoding="utf-8")
    (out / SAME_AS).write_text(json.dumps(note, indent=1), encoding="utf-8")
    (out / "config.yaml").write_text(dump_config(ev), encoding="utf-8")
    for pattern in _COPIED:  # outcomes.json last: it is what marks an evaluation finished
        for path in sorted(source.glob(pattern)):
            shutil.copyfile(path, out / f".{path.name}.tmp")
            (out / f".{path.name}.tmp").replace(out / path.name)
    return note


def read_back(ev: BaseModel, folders: Iterable[Path]) -> Path | None:
    """When ``ev`` has not finished (no ``outcomes.json``) and one of ``folders`` is its ``twin``:
    the twin's results copied in (``read_twin``); returns the twin's folder, else None."""
    if (Path(ev.out_dir) / "outcomes.json").is_file():
        return None  # finished: read back as itself
    source = twin(ev, folders)
    if source is not None:
        read_twin(ev, source)
    return source
