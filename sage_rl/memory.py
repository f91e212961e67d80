"""The process's heap: glibc's mmap threshold fixed, and freed pages handed back between stages.

Long CPU runs (an RL trainer, the recipe's stages one after another) otherwise keep the high-water
mark of their biggest step resident: left dynamic, glibc raises its mmap threshold to 32 MiB after
the first frees, so a step's activations come from the heap and stay there (docs/LOG.md, issue
32). ``sage-rl train``, ``sage-rl sft`` and the recipes call :func:`bound_heap` first; the recipes
call :func:`release_memory` between stages. Both are no-ops without glibc. :func:`reset_peak` and
:func:`peak_rss_bytes` give each stage its own peak resident set (Linux's ``VmHWM``, reset through
``/proc/self/clear_refs``): which stage holds the job's peak, not only the job's. The reset also
resets what ``getrusage`` and GNU time report as the process's maximum, so the recipe resets only
when asked (``SAGE_RL_STAGE_PEAKS=1``, which ``benchmarks/main_job.py`` sets; the job's peak is
then the largest stage's)."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
from pathlib import Path

_PROC = Path("/proc/self")

#: Blocks this large or larger are mapped on their own and unmapped when freed.
MMAP_THRESHOLD = 1 << 20
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)


def bound_heap() -> None:
    """Fix glibc's mmap threshold at ``MMAP_THRESHOLD``."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)


def release_memory() -> None:
    """Collect what the finished stage left and hand glibc's freed heap back to the OS
    (``malloc_trim``), so that the process's resident memory between stages is what the next
    stage holds, not the high-water mark of the ones before."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def stage_peaks_wanted() -> bool:
    """Whether the recipe measures each stage's peak (``SAGE_RL_STAGE_PEAKS=1``)."""
    return os.environ.get("SAGE_RL_STAGE_PEAKS", "").strip().lower() in ("1", "true", "yes", "on")


def reset_peak() -> bool:
    """Start a new peak: the process's high-water mark of resident memory (``VmHWM``, and with it
    ``getrusage``'s ``ru_maxrss``) is set back to its current resident set (Linux >= 4.0). False
    where that cannot be done."""
    try:
        (_PROC / "clear_refs").write_text("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int | None:
    """The process's peak resident memory since it started or since :func:`reset_peak` (None where
    ``/proc`` does not say)."""
    with contextlib.suppress(OSError, ValueError):
        for line in (_PROC / "status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    return None
