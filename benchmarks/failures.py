"""Why an evaluation's tasks failed, by the errors their code raised (issue 27: why the library-free
SFT model, the GRPO baseline's start, scores below the skill-library one without its library).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/failures.py runs/laptop35 sft sft_nolib sft_inline [--split train_heldout] [--top 8] [--json FILE]

For each model (a name of the run's evaluations, ``<run>/eval/<name>_<split>``, or an evaluation
folder's path) from its headline trajectories: its tasks and failed tasks, and of the failed ones
why they stopped (``stops``), how many ended on a reply cut off by a limit (``cut``: its last reply
opens a code fence it never closes, which the agent runs as it is), how many raised each exception
type in a cell of a finished reply (a task counts once per type; ``none`` = none did: a wrong
answer, or a limit reached), how many wrote a ``def``, and the names most often reported undefined
by a ``NameError`` (counted once per cell). A cut reply's error is its cut, not the model's syntax:
on laptop35 most SyntaxErrors were the token budget ending a cell mid-line.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

from paired import is_folder, label

from sage_rl.recipe.controls import readable
from sage_rl.types import Chain

#: a traceback's last line names its exception: ``KeyError: 'x'`` (no indentation)
RAISED = re.compile(r"^([A-Z]\w*(?:Error|Exception)|StopIteration)\b", re.M)
UNDEFINED = re.compile(r"NameError: name '(\w+)' is not defined")
DEF = re.compile(r"^\s*def \w+\(", re.M)


def failures(chains: list[Chain], top: int = 8) -> dict[str, Any]:
    """The failure profile of ``chains``' tasks (pure)."""
    tasks = failed = with_def = cut = 0
    raised: Counter[str] = Counter()
    undefined: Counter[str] = Counter()
    stops: Counter[str] = Counter()
    for chain in chains:
        for t in chain.trajectories:
            tasks += 1
            if t.outcome.success:
                continue
            failed += 1
            stops[str(t.stop)] += 1
            cut += bool(t.turns) and unfinished(t.turns[-1].text)
            finished = [turn for turn in t.turns if not unfinished(turn.text)]
            seen = {name for turn in finished for name in RAISED.findall(turn.result.observation)}
            raised.update(seen or {"none"})
            with_def += any(DEF.search(turn.code or "") for turn in t.turns)
            undefined.update(n for turn in t.turns for n in set(UNDEFINED.findall(turn.result.observation)))
    return {
        "tasks": tasks,
        "failed": failed,
        "stops": dict(stops.most_common()),
        "cut": cut,
        "raised": dict(raised.most_common()),
        "with_def": with_def,
        "undefined": undefined.most_common(top),
    }


def unfinished(reply: str) -> bool:
    """A reply that opens a code fence and never closes it (cut off by a limit, or never ended)."""
    return reply.count("```") % 2 == 1


def trajectories(run: Path, model: str, split: str) -> list[Chain]:
    folder = Path(model) if is_folder(model) else run / "eval" / f"{model}_{split}"
    paths = sorted(folder.glob("trajectories*.jsonl"))[:1]  # one strategy: the headline
    if not paths:
        raise SystemExit(
            f"failures: {folder} holds no trajectories*.jsonl: no finished evaluation of {model}"
        )
    return readable(paths[0], Chain.from_dict, "chain record")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", type=Path)
    p.add_argument("models", nargs="+")
    p.add_argument("--split", default="train_heldout")
    p.add_argument("--top", type=int, default=8, help="undefined names listed")
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args(argv)
    out = {label(m): failures(trajectories(a.run, m, a.split), a.top) for m in a.models}
    for name, f in out.items():
        raised = ", ".join(f"{k} {v}" for k, v in f["raised"].items())
        names = ", ".join(f"{k} {v}" for k, v in f["undefined"])
        stops = ", ".join(f"{k} {v}" for k, v in f["stops"].items())
        print(f"{name}: {f['failed']} of {f['tasks']} tasks failed ({stops}); last reply cut {f['cut']}; "
              f"with a def {f['with_def']}; raised: {raised}")  # fmt: skip
        print(f"  undefined names: {names or '-'}")
    if a.json:
        a.json.write_text(json.dumps({"run": str(a.run), "split": a.split, "models": out}, indent=1))
    return out


if __name__ == "__main__":
    main()
