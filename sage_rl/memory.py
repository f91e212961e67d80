"""The process's heap: glibc's mmap threshold fixed, and freed pages handed back between stages.

Long CPU runs (an RL trainer, the recipe's stages one after another) otherwise keep the high-water
mark of their biggest step resident: left dynamic, glibc raises its mmap threshold to 32 MiB after
the first frees, so a step's activations come from the heap and stay there (docs/LOG.md, issue
32). ``sage-rl train``, ``sage-rl sft`` and the recipes call :func:`bound_heap` first; the recipes
call :func:`release_memory` between stages. Both are no-ops without glibc."""

from __future__ import annotations

import contextlib
import ctypes
import gc

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
