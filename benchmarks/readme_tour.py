"""Times every command of README.md's tour on this machine (issue 18): wall seconds, exit status,
the last line it printed, and the load average, as JSON lines, then a Markdown table.

    .venv/bin/python benchmarks/readme_tour.py                # every tour command, in the checkout
    .venv/bin/python benchmarks/readme_tour.py --skip train   # leave out commands containing "train"

Commands run as the README shows them, from the repository root (their run folders land in
``runs/``, as a user's would). The tour's code block is read from README.md at run time, so the
figures always belong to the commands the README shows now; re-run it after changing either.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def tour_commands(readme: Path) -> list[str]:
    """The command lines of the first bash block after the ``## A tour`` heading, comments removed."""
    text = readme.read_text()
    start = text.index("## A tour")
    block = re.search(r"```bash\n(.*?)```", text[start:], re.S)
    if block is None:
        raise SystemExit("README.md: no bash block under '## A tour'")
    lines = [line.split("  #")[0].strip() for line in block.group(1).splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def run(command: str, timeout_s: float) -> dict[str, object]:
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            shlex.split(command), cwd=ROOT, capture_output=True, text=True, timeout=timeout_s
        )
        rc, out = proc.returncode, (proc.stdout.strip() or proc.stderr.strip())
    except subprocess.TimeoutExpired:
        rc, out = "timeout", ""
    wall = time.perf_counter() - t0
    last = out.splitlines()[-1][:160] if out else ""
    return {
        "command": command,
        "wall_s": round(wall, 1),
        "rc": rc,
        "last_line": last,
        "load_1min_before": load,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--skip", action="append", default=[], help="leave out commands containing this text")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per command")
    a = ap.parse_args()
    rows = []
    for command in tour_commands(ROOT / "README.md"):
        if any(s in command for s in a.skip):
            continue
        row = run(command, a.timeout)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("\n| command | wall | exit |\n|---|---|---|", file=sys.stderr)
    for r in rows:
        print(f"| `{r['command']}` | {r['wall_s']} s | {r['rc']} |", file=sys.stderr)


if __name__ == "__main__":
    main()
