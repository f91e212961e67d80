"""What a benchmark ran on, and the conditions it can impose: the CPU and its ISA flags, the load,
AVX2 kernels on any x86 CPU (``--isa avx2``) and a competing job on the cores (``--busy``).

Used by ``benchmarks/engine_bench.py``; every figure it prints carries :func:`cpu_info` and the
``uptime`` load, since other jobs on a shared machine change the absolute numbers.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

# Set before torch loads: torch's own kernels, oneDNN's (bf16 and packed products) and MKL's BLAS.
ISA_ENV = {
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
}
FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_tile")

BUSY_LOOP = """
import os, sys, time, torch
torch.set_num_threads(2)
a = torch.randn(512, 512)
n, t0 = 0, time.perf_counter()
while True:
    a @ a
    n += 1
    if n % 50 == 0:  # matmuls per second over the last 50
        t1 = time.perf_counter()
        with open(sys.argv[1] + ".tmp", "w") as f:
            f.write(f"{50 / (t1 - t0):.1f}")
        os.replace(sys.argv[1] + ".tmp", sys.argv[1])
        t0 = t1
"""


def reexec_for_isa(isa: str | None) -> None:
    """Re-execute this process with the variables of ``isa`` set, unless they already are (they
    only take effect when set before torch loads)."""
    if not isa:
        return
    if isa not in ISA_ENV:
        raise SystemExit(f"--isa must be one of {sorted(ISA_ENV)}, got {isa!r}")
    env = ISA_ENV[isa]
    if all(os.environ.get(k) == v for k, v in env.items()):
        return
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **env})


def cpu_info() -> dict:
    """The CPU model, its ISA flags of interest, torch's kernel level and the ISA variables."""
    import torch

    model, flags = "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model == "unknown":
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return {
        "model": model,
        "cores": os.cpu_count(),
        "isa_flags": [f for f in FLAGS if f in flags],
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "isa_env": {k: os.environ[k] for k in ISA_ENV["avx2"] if k in os.environ},
        "torch": torch.__version__,
    }


def uptime() -> str:
    """``uptime``'s load averages (1, 5, 15 min) and the runnable/total threads right now."""
    try:
        fields = Path("/proc/loadavg").read_text().split()
        return f"load {fields[0]} {fields[1]} {fields[2]} (runnable/threads {fields[3]})"
    except OSError:
        return "load " + " ".join(f"{x:.2f}" for x in os.getloadavg())


class Busy:
    """A competing 2-thread matmul loop in another process, for the ``with`` block's duration;
    ``rate()`` is its latest matmuls per second (how much CPU it was getting)."""

    def __init__(self) -> None:
        import tempfile

        self.proc: subprocess.Popen | None = None
        self.path = Path(tempfile.mkdtemp(prefix="engine-bench-busy-")) / "rate"

    def __enter__(self) -> Busy:
        self.proc = subprocess.Popen([sys.executable, "-c", BUSY_LOOP, str(self.path)])
        time.sleep(3)  # let it reach its loop
        return self

    def rate(self) -> float | None:
        try:
            return float(self.path.read_text())
        except (OSError, ValueError):
            return None

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        self.proc.wait()
