"""Size and build time of ``sage-rl view`` pages, and a real browser rendering them (issue 15).

Runs it measures, all from real trajectories:

- ``eval``: ``sage-rl eval policy.kind=scripted`` on the first 3 dev scenarios (9 trajectories);
- ``collect``: ``sage-rl collect`` of 3 train scenarios with ``scripted_fail_rate=0.3``;
- ``train_tiny`` (``--train``): ``sage-rl train`` of a tiny random model, 2 steps (needs torch);
- ``train_1k``: a training run's folder assembled from real rollouts: each step samples B task
  sequences of the train split as the trainer does (``suite.sample_chain``), and runs G chains of
  each with the scripted expert in the sandbox, chain j with expert seed j and ``fail_rate`` 0.25
  (so chains of a group differ), written as ``rollouts/step_*.jsonl`` with a ``config.yaml`` and a
  ``metrics.jsonl`` (``batch_metrics`` of ``to_samples``). No model is trained: the folder has the
  layout and the trajectories of a training run, which is what the viewer reads. Default: K=2,
  G=4, B=8, 16 steps = 1,024 trajectories.

For each page: bytes, bytes per trajectory, pages, build time (``build_html``, in process), and
with Debian's ``chromium``: load time (``--dump-dom``, against a 1-line page as the baseline,
side by side) and a screenshot of the Overview and of the Chains tab with one task open, checked
not blank (grey-level spread). Prints one JSON object.

    .venv/bin/python benchmarks/view_bench.py
    .venv/bin/python benchmarks/view_bench.py --train --readme-shot docs/images/view.png
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from sage_rl.build import build_policy, build_runner, build_suite
from sage_rl.eval.runner import EvalConfig
from sage_rl.rollout.batch import RolloutConfig, to_samples
from sage_rl.skills.library import Library
from sage_rl.text import dumps
from sage_rl.train.logging import batch_metrics
from sage_rl.view import build_html

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "sage_rl.cli"]
BROWSER = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]


def cli(*args: str) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([*CLI, *args], cwd=ROOT, capture_output=True, text=True, env=env)
    if r.returncode:
        raise SystemExit(f"sage-rl {args[0]} failed:\n{r.stderr[-2000:]}")


async def synthetic_train(out: Path, k: int, g: int, b: int, steps: int, fail_rate: float) -> None:
    """A training run's folder from real scripted rollouts (module docstring)."""
    cfg = EvalConfig(policy={"kind": "scripted"})
    suite = build_suite(cfg)
    runners = []
    for seed in range(g):
        policy = build_policy(
            cfg.model_copy(update={"policy": cfg.policy.model_copy(update={"expert_seed": seed})})
        )
        policy.fail_rate = fail_rate
        runners.append(build_runner(cfg, policy, suite))
    rollout = RolloutConfig(chain_length=k, group_size=g, groups_per_step=b)
    (out / "rollouts").mkdir(parents=True)
    rows = []
    for step in range(steps):
        rng = random.Random(f"view-bench:{step}")
        seqs = [suite.sample_chain(rng, k, "train") for _ in range(b)]
        groups = [
            list(await asyncio.gather(*(r.run(seq, Library(), i, j) for j, r in enumerate(runners))))
            for i, seq in enumerate(seqs)
        ]
        with open(out / "rollouts" / f"step_{step + 1:06d}.jsonl", "w") as f:
            f.writelines(dumps(c) + "\n" for chains in groups for c in chains)
        rows.append({"step": step + 1, **batch_metrics(to_samples(groups, rollout))})
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = {
        **json.loads(cfg.model_dump_json()),
        "rollout": json.loads(rollout.model_dump_json()),
        "steps": steps,
    }
    for key in ("split", "strategies", "concurrency", "limit_scenarios", "library_store", "out_dir"):
        config.pop(key, None)
    (out / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    (out / "summary.json").write_text(json.dumps({"steps": steps, "before": None, "after": None}))


def grey_spread(png: Path) -> dict:
    from PIL import Image, ImageStat

    img = Image.open(png).convert("L")
    levels = sum(1 for count in img.histogram() if count)
    return {"std": round(ImageStat.Stat(img).stddev[0], 1), "levels": levels, "size": list(img.size)}


def screenshot(html: Path, png: Path, script: str = "", size: str = "1400,1000") -> dict:
    """Headless chromium screenshot of ``html`` with ``script`` run at the end of the page.

    ``--screenshot`` captures a blank image of a scrolled page, so tabs are opened by a script that
    clicks them (as a user would) instead of a ``#fragment`` that scrolls."""
    page = html.with_name(html.stem + ".shot.html")
    page.write_text(html.read_text().replace("</body>", f"<script>{script}</script></body>"))
    subprocess.run([*BROWSER, f"--window-size={size}", f"--screenshot={png}", page.as_uri()],
                   capture_output=True, timeout=300)  # fmt: skip
    page.unlink()
    info = grey_spread(png)
    return {**info, "not_blank": info["std"] > 5 and info["levels"] > 20}


def load_seconds(html: Path, repeats: int = 3) -> float:
    """Median wall time of ``chromium --dump-dom`` (browser start + parse + script + serialise)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run([*BROWSER, "--dump-dom", html.as_uri()], capture_output=True, timeout=300)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


OPEN_CHAINS = (
    "document.querySelector('nav.tabs a[href=\"#tab-a-chains\"]').click();"
    "const t = document.querySelector('.traj.ok .chip.use') ? document.querySelector('.traj.ok .chip.use').closest('details') : document.querySelector('details.traj');"
    "t.open = true;"
)


def measure(name: str, run: Path, work: Path, browser: bool, page_size: int) -> dict:
    t0 = time.perf_counter()
    page, runs = build_html(run, page_size=page_size)
    build_s = time.perf_counter() - t0
    html = work / f"{name}.html"
    html.write_text(page, encoding="utf-8")
    n = runs[0].run.num_trajectories
    out = {
        "trajectories": n,
        "bytes": html.stat().st_size,
        "bytes_per_trajectory": round(html.stat().st_size / max(n, 1)),
        "pages": len(runs[0].pages),
        "build_s": round(build_s, 2),
        "problems": len(runs[0].problems),
    }
    if browser:
        out["load_s"] = round(load_seconds(html), 2)
        out["overview_shot"] = screenshot(html, work / f"{name}.overview.png")
        out["chains_shot"] = screenshot(html, work / f"{name}.chains.png", OPEN_CHAINS)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", action="store_true", help="also a tiny-model training run (needs torch)")
    ap.add_argument("--steps", type=int, default=16, help="steps of the synthetic training run")
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--g", type=int, default=4)
    ap.add_argument("--b", type=int, default=8)
    ap.add_argument("--page-size", type=int, default=100)
    ap.add_argument(
        "--readme-shot", type=Path, help="save the synthetic run's Chains screenshot here (PNG, 256 colours)"
    )
    ap.add_argument("--keep", type=Path, help="keep the runs and pages in this folder")
    args = ap.parse_args()
    browser = shutil.which("chromium") is not None
    work = args.keep or Path(tempfile.mkdtemp(prefix="view-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    runs = {"eval": work / "eval", "collect": work / "collect", "train_1k": work / "train_1k"}
    t0 = time.perf_counter()
    cli("eval", "policy.kind=scripted", "limit_scenarios=3", f"out_dir={runs['eval']}")
    cli("collect", "num_scenarios=3", "scripted_fail_rate=0.3", "resume=false", f"out_dir={runs['collect']}")
    if args.train:
        runs["train_tiny"] = work / "train_tiny"
        _tiny_train(runs["train_tiny"], work)
    shutil.rmtree(runs["train_1k"], ignore_errors=True)
    asyncio.run(synthetic_train(runs["train_1k"], args.k, args.g, args.b, args.steps, fail_rate=0.25))
    made_s = time.perf_counter() - t0
    result = {name: measure(name, run, work, browser, args.page_size) for name, run in runs.items()}
    if browser:
        blank = work / "blank.html"
        blank.write_text("<!doctype html><title>blank</title><p>baseline")
        result["baseline_blank_page_load_s"] = round(load_seconds(blank), 2)
    if args.readme_shot:
        _readme_shot(work / "train_1k.chains.png", args.readme_shot)
    print(json.dumps({"browser": browser, "runs_made_s": round(made_s, 1), "work": str(work),
                      "load": os.getloadavg()[0], **result}, indent=2))  # fmt: skip


def _tiny_train(out: Path, work: Path) -> None:
    from sage_rl.models import save_plain, tiny_model

    model, tok = tiny_model(seed=0)
    save_plain(model, work / "tiny_model")
    tok.save_pretrained(work / "tiny_model")
    shutil.rmtree(out, ignore_errors=True)
    cli("train", "configs/quickstart.yaml", f"policy.model={work / 'tiny_model'}", "steps=2",
        "rollout.group_size=2", "eval.scenarios=1", f"out_dir={out}", "init_from=null",
        "agent.max_steps=2", "agent.max_tokens_per_turn=12", "agent.context_limit=4096")  # fmt: skip


def _readme_shot(src: Path, dst: Path) -> None:
    from PIL import Image

    dst.parent.mkdir(parents=True, exist_ok=True)
    Image.open(src).convert("RGB").quantize(256, method=Image.Quantize.FASTOCTREE).save(dst, optimize=True)


if __name__ == "__main__":
    main()
