"""Summaries of benchmark runs side by side: each system's figures over repeated runs, and the
ratios of the engine's systems to the baselines (``engine_bench.py``)."""

from __future__ import annotations


def median_runs(runs: list[dict]) -> dict:
    """Each system's run of median tokens/s (an odd count: a measured run, not an average), with
    every run's tokens/s beside it."""
    out = {}
    for name in runs[0]:
        entries = [r[name] for r in runs if isinstance(r.get(name), dict)]
        if not entries:
            out[name] = runs[0][name]
            continue
        ordered = sorted(entries, key=lambda e: e["tokens_per_s"])
        out[name] = ordered[(len(ordered) - 1) // 2] | {
            "runs_tokens_per_s": [e["tokens_per_s"] for e in entries]
        }
    return out


def ratios(systems: dict) -> dict:
    out = {}
    for name, entry in systems.items():
        if not name.startswith("policy"):
            continue
        for base in ("hf_generate", "llama_cpp"):
            if isinstance(systems.get(base), dict):
                for unit in ("tokens_per_s", "tokens_per_cpu_s"):
                    out[f"{name}/{base} ({unit})"] = round(entry[unit] / systems[base][unit], 2)
    return out
