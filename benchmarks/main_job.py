"""Re-measures the main job, ``sage-rl train`` with no arguments (issue 32): wall time, peak RSS,
each stage's time and the report's held-out figures, as one JSON line and a Markdown table.

    .venv/bin/python benchmarks/main_job.py                       # a fresh run in a temporary out_dir
    .venv/bin/python benchmarks/main_job.py --out runs/mj         # ... in runs/mj (must be unused)
    .venv/bin/python benchmarks/main_job.py --isa avx2            # ... with AVX2 kernels only
    .venv/bin/python benchmarks/main_job.py --read runs/quickstart --time-log t.txt   # read a finished run

The command is ``SAGE_RL_STAGE_PEAKS=1 /usr/bin/time -v .venv/bin/sage-rl recipe out_dir=<out>``
(each stage records its own peak RSS in ``recipe.json``; the job's peak is the largest): what ``sage-rl train``
without arguments runs (the recipe of configs/quickstart.yaml as committed; ``sage-rl train`` with
any argument trains one model instead, so the out_dir goes to ``recipe``); extra ``key=value``
arguments are passed on. ``--isa avx2`` runs torch's, oneDNN's and MKL's AVX2 kernels on any x86
CPU (the AVX2-only figure the issue asks for, measured on an AVX-512 machine). Peak RSS is GNU time's "Maximum resident
set size" (the largest single process: the recipe runs its stages in one process; its sandbox
workers are separate, smaller processes); without /usr/bin/time it falls back to
``resource.getrusage(RUSAGE_CHILDREN)``, the same figure for the largest waited-for child. Wall
time is GNU time's, and the stages' own times come from ``<out>/recipe.json``. The load average
before and after and whether the CPU has AVX-512 are printed with them, since a shared machine
inflates every time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu_info, reexec_for_isa  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SAGE_RL = ROOT / ".venv" / "bin" / "sage-rl"


def parse_time_v(text: str) -> dict[str, float]:
    """Wall seconds and peak RSS (bytes) from GNU ``time -v`` output; missing fields are absent."""
    out: dict[str, float] = {}
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    if rss:
        out["peak_rss_bytes"] = int(rss.group(1)) * 1024
    for key, field in (("user_s", "User time"), ("system_s", "System time")):
        cpu = re.search(field + r" \(seconds\): ([\d.]+)", text)
        if cpu:
            out[key] = float(cpu.group(1))
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", text)
    if wall:
        secs = 0.0
        for part in wall.group(1).split(":"):
            secs = secs * 60 + float(part)
        out["wall_s"] = round(secs, 1)
    return out


def figures(out: Path) -> dict[str, object]:
    """The stages' times and the report's TGC and SGC (with intervals) of a finished recipe run."""
    state = json.loads((out / "recipe.json").read_text())
    row: dict[str, object] = {"stages_s": {k: e.get("wall_s") for k, e in state.items()},
                              "stages_peak_rss_gb": {k: e.get("peak_rss_gb") for k, e in state.items()}}  # fmt: skip
    row["stages_total_s"] = round(sum(e.get("wall_s") or 0 for e in state.values()), 1)
    for key, label in (("eval_base", "base"), ("eval_sft", "sft"), ("eval_sage", "sage")):
        for split, res in (state.get(key, {}).get("result") or {}).items():
            m = res["metrics"]
            row[f"{split}_{label}"] = {
                "tasks": m["tasks"],
                "tgc": round(m["tgc"], 1),
                "tgc_ci": [round(x, 1) for x in m["tgc_ci"]],
                "sgc": round(m["sgc"], 1),
                "avg_tokens": round(m["avg_tokens"]),
            }
    return row


def job_peak(row: dict[str, object]) -> dict[str, object]:
    """The job's peak RSS where the stages measured their own (``SAGE_RL_STAGE_PEAKS=1``): the largest
    stage's. Each stage's reset of the peak also resets GNU time's maximum, which then holds the
    last stage's alone (kept as ``peak_rss_last_stage_bytes``)."""
    peaks = [p for p in dict(row.get("stages_peak_rss_gb") or {}).values() if p]  # type: ignore[call-overload]
    if not peaks:
        return {}
    return {"peak_rss_bytes": int(max(peaks) * 1e9), "peak_rss_last_stage_bytes": row.get("peak_rss_bytes")}


def measure(out: Path, overrides: list[str]) -> tuple[dict[str, float], str]:
    """Run the main job into ``out``; returns (GNU time's figures, its raw report)."""
    cmd = [str(SAGE_RL), "recipe", f"out_dir={out}", *overrides]  # = `sage-rl train` without arguments
    env = os.environ | {"SAGE_RL_STAGE_PEAKS": "1"}  # each stage records its own peak (recipe.json)
    gnu = shutil.which("time") or ("/usr/bin/time" if Path("/usr/bin/time").exists() else None)
    if gnu:
        with tempfile.NamedTemporaryFile("r", suffix=".time") as log:
            proc = subprocess.run([gnu, "-v", "-o", log.name, *cmd], cwd=ROOT, env=env)
            text = Path(log.name).read_text()
        if proc.returncode != 0:
            raise SystemExit(f"sage-rl train failed (exit {proc.returncode})")
        return parse_time_v(text), text
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"sage-rl train failed (exit {proc.returncode})")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # Linux: kilobytes
    return {"wall_s": round(time.perf_counter() - t0, 1), "peak_rss_bytes": peak}, ""


def table(row: dict[str, object]) -> str:
    lines = ["| figure | value |", "|---|---|"]
    if "wall_s" in row:
        lines.append(f"| wall (GNU time) | {row['wall_s']:.0f} s ({float(row['wall_s']) / 60:.1f} min) |")
    if "peak_rss_bytes" in row:
        lines.append(f"| peak RSS | {float(row['peak_rss_bytes']) / 1e9:.2f} GB |")
    if "user_s" in row:
        lines.append(
            f"| CPU (all processes) | user {row['user_s']:.0f} s + system {row.get('system_s', 0):.0f} s |"
        )
    peaks = dict(row.get("stages_peak_rss_gb") or {})  # type: ignore[call-overload]
    for stage, secs in dict(row["stages_s"]).items():  # type: ignore[arg-type]
        peak = f", peak RSS {peaks[stage]} GB" if peaks.get(stage) else ""
        lines.append(f"| stage {stage} | {secs} s{peak} |")
    for key, v in row.items():
        if isinstance(v, dict) and "tgc" in v:
            lines.append(
                f"| {key}: TGC ({v['tasks']} tasks) | {v['tgc']} [{v['tgc_ci'][0]}, {v['tgc_ci'][1]}], "
                f"SGC {v['sgc']}, {v['avg_tokens']} tokens/task |"
            )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, help="run folder (default: a new temporary one)")
    ap.add_argument("--read", type=Path, help="only read the figures of this finished run")
    ap.add_argument("--time-log", type=Path, help="with --read: GNU time -v output of that run")
    ap.add_argument("--isa", choices=["avx2"], help="run torch, oneDNN and MKL with these kernels")
    ap.add_argument("overrides", nargs="*", help="key=value overrides passed to sage-rl recipe")
    a = ap.parse_args()
    reexec_for_isa(a.isa)  # the variables reach the recipe's process through the environment
    cpu = cpu_info()
    flags = cpu["isa_flags"]
    row: dict[str, object] = {
        "cpu": "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "other",
        "cpu_model": cpu["model"],
        "kernels": a.isa or "native",
        "cores": os.cpu_count(),
        "load_before": os.getloadavg(),
    }
    if a.read:
        out = a.read
        if a.time_log:
            row |= parse_time_v(a.time_log.read_text())
    else:
        out = a.out or Path(tempfile.mkdtemp(prefix="sage-rl-main-job-")) / "run"
        row |= measure(out, a.overrides)[0]
    row |= figures(out) | {"load_after": os.getloadavg(), "out_dir": str(out)}
    row |= job_peak(row)
    print(json.dumps(row), flush=True)
    print(table(row), file=sys.stderr)


if __name__ == "__main__":
    main()
