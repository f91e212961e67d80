"""The CPU decode step as a compiled kernel (``csrc/decode_cpu.cpp``; issue 29), built on first use.

:class:`~sage_rl.engine.decoder.NativeRunner`'s float32 decode step over a
:class:`~sage_rl.engine.pool.DecodePool` runs ~160 small torch operations a layer between its
matrix products; at two threads they cost as much as the products' weight traffic. The kernel does
them in a few loops a layer (attention one task per KV head and row, over the shared prefix and the
row's own positions) and the column blocks' products too (under AVX2 since 2026-12-04, with AVX-512
since 2026-12-05): 1.29x faster decode steps at 2 threads, quiet, on the first version (docs/LOG.md,
2026-12-03), 45.7 -> 36.8 ms a step's layers after its attention changed (2026-12-04, twenty-ninth
session), with the same logits within float32 rounding.

It is compiled from source with torch's extension builder the first time a process asks for it
(~20 s; a C++ compiler and ``ninja``, a pinned dependency), for the instruction set torch's own
kernels use here (``x86-64-v4`` for AVX-512, ``v3`` for AVX2, so ``ATEN_CPU_CAPABILITY=avx2``
measures AVX2 code), and cached under ``$SAGE_RL_NATIVE_CACHE`` (default
``~/.cache/sage-rl/native``) per source, flags, torch version and torch installation (the source is
copied into that folder and compiled there, so every checkout of it shares one build). Where it
cannot be built (no compiler, another CPU architecture) the runner keeps its torch path and says
why once; ``SAGE_RL_NATIVE=0`` turns it off.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import platform
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

SOURCE = Path(__file__).with_name("csrc") / "decode_cpu.cpp"
LEVELS = {"AVX512": "x86-64-v4", "AVX2": "x86-64-v3"}  # torch's CPU capability -> -march


def disabled() -> str | None:
    """Why the kernel is not to be used at all here (None when it may be)."""
    if os.environ.get("SAGE_RL_NATIVE", "1").strip().lower() in ("0", "false", "no", "off"):
        return "SAGE_RL_NATIVE=0"
    if platform.machine() not in ("x86_64", "AMD64"):
        return f"built for x86-64 only, this is {platform.machine()}"
    if torch.backends.cpu.get_cpu_capability().upper() not in LEVELS:
        return f"torch's CPU capability {torch.backends.cpu.get_cpu_capability()} (AVX2 or AVX-512 needed)"
    return None


def flags() -> list[str]:
    level = LEVELS[torch.backends.cpu.get_cpu_capability().upper()]
    # -ffp-contract=off: products and sums rounded one by one, as torch's element-wise ops do.
    return ["-O3", f"-march={level}", "-ffp-contract=off", "-fopenmp"]


def build_name() -> str:
    """The kernel's module name (its cache folder's name): one per source, flags, torch version and
    torch installation, whose headers and libraries the build names by path."""
    torch_dir = str(Path(torch.__file__).resolve().parent)
    parts = [SOURCE.read_bytes(), " ".join(flags()).encode(), torch.__version__.encode(), torch_dir.encode()]
    key = hashlib.sha256(b"\0".join(parts)).hexdigest()
    return f"sage_decode_cpu_{key[:12]}"


def staged_source(folder: Path) -> Path:
    """The source, copied into the build folder: torch's builder keys a build on its command line,
    which names the source by path, so two checkouts of the same source compiled from their own
    paths rebuilt the kernel in turn (21-42 s each; 2026-12-05)."""
    staged = folder / SOURCE.name
    text = SOURCE.read_bytes()
    if not staged.is_file() or staged.read_bytes() != text:
        tmp = staged.with_suffix(".tmp")
        tmp.write_bytes(text)
        tmp.replace(staged)
    return staged


def cache_root() -> Path:
    return Path(os.environ.get("SAGE_RL_NATIVE_CACHE", Path.home() / ".cache" / "sage-rl" / "native"))


@functools.cache
def decode_kernel() -> Any | None:
    """The compiled module (its ``decode_layers``), or None with a warning saying why not."""
    reason = disabled()
    if reason is not None:
        return None
    name = build_name()
    try:
        from torch.utils.cpp_extension import load

        _ninja_on_path()
        folder = cache_root() / name
        folder.mkdir(parents=True, exist_ok=True)
        with build_lock(folder):
            return load(
                name,
                [str(staged_source(folder))],
                extra_cflags=flags(),
                extra_ldflags=["-fopenmp"],
                build_directory=str(folder),
            )
    except Exception as e:  # noqa: BLE001 - any build failure leaves the torch path in place
        first = str(e).strip().splitlines()[:3]
        warnings.warn(
            f"sage-rl: the compiled CPU decode kernel could not be built ({type(e).__name__}: "
            f"{' '.join(first)[:300]}); decoding with the torch path (slower). SAGE_RL_NATIVE=0 silences this.",
            RuntimeWarning,
            stacklevel=2,
        )
        return None


@contextlib.contextmanager
def build_lock(folder: Path) -> Iterator[None]:
    """Hold an OS lock on ``folder`` while torch's builder runs in it, and clear a stale builder lock.

    torch's builder marks a build in progress with a lock file in the build folder (``folder/lock``)
    and makes every other process wait until that file is gone. A process killed while it holds it
    (a TERM or Ctrl-C in its first seconds, when each process checks the build) leaves the file
    behind, and from then on every process that loads the kernel waits for ever (a whole recipe run
    hung so, 2026-12-05). The lock taken here is the kernel's own (``flock``): it dies with its
    holder. Whoever holds it is the only sage-rl process inside torch's builder for ``folder``, so a
    builder lock file found then is stale, and is removed, with a warning."""
    try:
        import fcntl
    except ImportError:  # not POSIX: torch's lock file alone
        yield
        return
    with open(folder.parent / f"{folder.name}.flock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file closes or the process dies
        stale = folder / "lock"
        if stale.exists():
            warnings.warn(
                f"sage-rl: removed {stale}, left by a kernel build that was stopped mid-way "
                "(torch's builder would otherwise wait for it for ever)",
                RuntimeWarning,
                stacklevel=3,
            )
            stale.unlink(missing_ok=True)
        yield


def _ninja_on_path() -> None:
    """torch's builder runs ``ninja`` from PATH; the pinned ``ninja`` package's binary sits in the
    virtualenv's bin, which is not on PATH when ``.venv/bin/python`` runs without activation."""
    try:
        import ninja
    except ImportError:
        return
    folder = str(ninja.BIN_DIR)
    if folder not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = folder + os.pathsep + os.environ.get("PATH", "")


def layer_tensors(layers: list[Any]) -> list[torch.Tensor] | None:
    """The kernel's per-layer weight list (8 tensors a layer, ``decode_cpu.cpp``), or None when a
    layer does not fit it (not every projection packed, query/key norms)."""
    empty = torch.empty(0)
    out: list[torch.Tensor] = []
    for layer in layers:
        blocks = layer.blocks
        if layer.q_norm is not None or not all(k in blocks for k in ("qkv", "o", "gate_up", "down")):
            return None
        qkv, qkv_bias = blocks["qkv"]
        o, o_bias = blocks["o"]
        out += [
            layer.in_norm,
            layer.post_norm,
            qkv,
            qkv_bias if qkv_bias is not None else empty,
            o,
            o_bias if o_bias is not None else empty,
            blocks["gate_up"][0],
            blocks["down"][0],
        ]
    if any(t.dtype != torch.float32 or not t.is_contiguous() for t in out if t.numel()):
        return None
    return out


def decode_step(
    runner: Any, kernel: Any, weights: list[torch.Tensor], ids: list[int], seats: tuple
) -> torch.Tensor:
    """``runner``'s hidden states ``[B, D]`` after its layers for one new token per row, the rows
    seated in its pool (``seats``: ``NativeRunner._seat``'s tuple), through the kernel."""
    slots_B, starts_B, _, _, shared = seats
    prefix, source = shared if shared is not None else (0, 0)
    h_BD = torch.nn.functional.embedding(torch.tensor(ids, dtype=torch.long), runner.embed).contiguous()
    cos, sin = runner.hf.model.rotary_emb(h_BD, starts_B[None])
    return kernel.decode_layers(
        h_BD, weights, runner.pool.kv, cos[0].contiguous(), sin[0].contiguous(), slots_B, starts_B,
        prefix, source, runner.heads, runner.eps, runner.scaling,
    )  # fmt: skip
