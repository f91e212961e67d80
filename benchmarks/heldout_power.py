"""How many held-out scenarios a paired TGC difference needs: from two evaluations' per-task
outcomes, the per-scenario difference's spread, and for each size the 95% interval's half-width and
the chance that a true effect passes issue 27's gate (a measured difference of at least +5 with the
interval above 0). A normal approximation of the scenario bootstrap that the recipe reports.

    .venv/bin/python benchmarks/heldout_power.py runs/laptop28/eval/sage_train_heldout/outcomes.json \\
        runs/laptop28/eval/sft_train_heldout/outcomes.json [--sizes 90,150,210,270] [--effects 5,6.3]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

from sage_rl.eval.ci import paired_outcomes


def scenario_differences(ua: list, ub: list) -> list[float]:
    """TGC (percent) of ``ua`` minus ``ub`` (outcome rows ``(task_id, scenario_id, success)``) per
    scenario, over the tasks both evaluated."""
    b = {row[0]: float(row[2]) for row in ub}
    per: dict[str, list[float]] = {}
    for task, scenario, success in ua:
        if task in b:
            per.setdefault(scenario, []).append(float(success) - b[task])
    return [100.0 * sum(v) / len(v) for v in per.values()]


def gate_chance(effect: float, se: float, floor: float = 5.0) -> float:
    """P(measured >= max(floor, 1.96 se)) for a true ``effect`` measured with standard error ``se``."""
    need = max(floor, 1.96 * se)
    return 1.0 - statistics.NormalDist().cdf((need - effect) / se)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("a", type=Path, help="outcomes.json of the first model (e.g. sage)")
    ap.add_argument("b", type=Path, help="outcomes.json of the second model (e.g. sft)")
    ap.add_argument("--sizes", default="90,120,150,180,210,270,400")
    ap.add_argument("--effects", default="5,6.3,10")
    args = ap.parse_args(argv)
    ua, ub = (json.loads(p.read_text(encoding="utf-8"))["outcomes"] for p in (args.a, args.b))
    diffs = scenario_differences(ua, ub)
    n, sd = len(diffs), statistics.stdev(diffs)
    value, (lo, hi) = paired_outcomes(ub, ua) or (float("nan"), (float("nan"), float("nan")))
    print(f"{n} scenarios; difference {value:+.2f} TGC [{lo:+.2f}, {hi:+.2f}] (the recipe's bootstrap); "
          f"per-scenario sd {sd:.2f}; {sum(d != 0 for d in diffs)} scenarios differ")  # fmt: skip
    effects = [float(e) for e in args.effects.split(",")]
    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        se = sd / math.sqrt(size)
        chances = {e: round(gate_chance(e, se), 2) for e in effects}
        rows.append({"scenarios": size, "se": round(se, 2), "half_width": round(1.96 * se, 2), "p_gate": chances})
        gates = "  ".join(f"P(gate | {e:+g}) {p:.2f}" for e, p in chances.items())
        print(f"{size:>4} scenarios: +-{1.96 * se:.2f}  {gates}")
    return {"scenarios": n, "sd": sd, "rows": rows}


if __name__ == "__main__":
    main()
