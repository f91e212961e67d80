"""How much each PocketWorld template pays a shortcut: the best constant answer and a no-op (issue 30).

For every template of every split: its answer-returning tasks over scenario seeds 1..N plus the
scenario its split lists (seed 0; a train template's held-out seed), the constant answer that is
right most often and its share, and the highest no-op score. Prints a table, or JSON with --json.
Run:
    .venv/bin/python benchmarks/world_guess.py [--seeds N] [--json]
"""

from __future__ import annotations

import argparse
import json
import time

from sage_rl.envs.pocketworld.audit import audit_template
from sage_rl.envs.pocketworld.scenarios import TEMPLATES
from sage_rl.envs.pocketworld.tasks import HELDOUT_SEEDS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=30, help="scenario seeds 1..N per template (default 30)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.seeds < 1:
        ap.error(f"--seeds must be at least 1, got {args.seeds}")
    start, rows = time.perf_counter(), []
    for t in TEMPLATES:
        listed = HELDOUT_SEEDS.start if t.split == "train" else 0
        a = audit_template(t, [listed, *range(1, args.seeds + 1)])
        rows.append(
            {"template": a.template, "split": a.split, "tasks": a.tasks, "answer_tasks": a.answer_tasks,
             "guess": a.guess, "guess_share": round(a.guess_share, 4), "noop_score": round(a.noop_score, 4)}
        )  # fmt: skip
    answered = [r for r in rows if r["answer_tasks"]]
    summary = {
        "seeds": args.seeds,
        "templates": len(rows),
        "answer_templates": len(answered),
        "max_guess_share": max(r["guess_share"] for r in answered),
        "templates_over_10pct": sum(r["guess_share"] > 0.10 for r in answered),
        "max_noop_score": max(r["noop_score"] for r in rows),
        "seconds": round(time.perf_counter() - start, 1),
    }
    if args.json:
        print(json.dumps({"templates": rows, "summary": summary}, indent=1))
        return
    for r in rows:
        if r["answer_tasks"]:
            print(f"{r['template']:44s} {r['split']:15s} {r['guess_share']:6.3f}  {r['guess']!r:.32}")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
