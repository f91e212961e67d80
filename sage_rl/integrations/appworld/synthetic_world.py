"""The sage-rl side of ``synthetic.py``: build a synthetic AppWorld world or bundle from here.

``synthetic.py`` runs under the AppWorld venv (it uses AppWorld's model classes); these helpers
start it as a subprocess. Used by the tests and by the benchmark.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from sage_rl.integrations.appworld.paths import AppWorldPaths, SetupError

SYNTHETIC_SCRIPT = Path(__file__).with_name("synthetic.py")

#: split -> tasks ({task_id, instruction, answer}); two scenarios of train, one of dev.
DEFAULT_SPEC: Mapping[str, Sequence[Mapping[str, object]]] = {
    "train": [
        {"task_id": "aaa_1", "instruction": "Answer with the number 42.", "answer": 42},
        {"task_id": "aaa_2", "instruction": "Answer with the number 43.", "answer": 43},
        {"task_id": "bbb_1", "instruction": "Answer with the word ok.", "answer": "ok"},
    ],
    "dev": [{"task_id": "ccc_1", "instruction": "Answer with the number 7.", "answer": 7}],
}


def _run(paths: AppWorldPaths, args: list[str], timeout_s: float) -> None:
    if not paths.python.exists():
        raise SetupError(f"AppWorld virtualenv not found at {paths.venv}: run `sage-rl appworld setup`")
    paths.root.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [str(paths.python), str(SYNTHETIC_SCRIPT), *args],
        env=paths.env(),
        cwd=paths.root,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"synthetic.py {args[0]} failed (exit {proc.returncode}): {proc.stderr[-2000:]}")


def build_world(
    paths: AppWorldPaths,
    spec: Mapping[str, Sequence[Mapping[str, object]]] = DEFAULT_SPEC,
    timeout_s: float = 300,
) -> None:
    """Write a synthetic ``<paths.root>/data`` holding the tasks of ``spec`` (split -> tasks)."""
    paths.root.mkdir(parents=True, exist_ok=True)
    spec_file = paths.root / "synthetic-spec.json"
    spec_file.write_text(json.dumps({"splits": {k: list(v) for k, v in spec.items()}}))
    _run(paths, ["build", str(paths.root), str(spec_file)], timeout_s)


def pack_bundle(paths: AppWorldPaths, out: Path, timeout_s: float = 300) -> None:
    """Pack ``<paths.root>/data`` into ``out`` with AppWorld's own bundle format."""
    _run(paths, ["bundle", str(paths.root), str(out)], timeout_s)
