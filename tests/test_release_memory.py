"""``sage_rl.memory.release_memory`` hands the heap's freed pages back to the OS (glibc's
``malloc_trim``): what the laptop experiment and the main job call between stages. Measured in a
fresh process: a freed 300 MB stays resident (the heap's top is pinned), until it is released."""

import platform
import subprocess
import sys

import pytest

CODE = """
from sage_rl.memory import bound_heap, release_memory

def rss_kb():
    return next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmRSS"))

bound_heap()  # 256 KiB blocks come from the heap, not mmap
blocks = [bytearray(256 * 1024) for _ in range(1200)]  # ~300 MB, every page written
pin = bytearray(256 * 1024)  # above them: the heap's top cannot shrink on its own
del blocks
before = rss_kb()
release_memory()
print(before, rss_kb())
"""


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_release_memory_returns_freed_heap_pages():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True)
    before, after = map(int, out.stdout.split())
    assert before - after > 200_000, (before, after)  # kB: most of the freed 300 MB left


@pytest.mark.parametrize("command", ["train", "sft"])
def test_the_training_commands_bound_the_heap(command, monkeypatch, tmp_path):
    """``sage-rl train CONFIG`` and ``sage-rl sft`` (not only the recipes) fix the mmap threshold
    before anything loads: here, before a missing config is refused."""
    import importlib

    import typer
    from typer.testing import CliRunner

    mod = importlib.import_module(f"sage_rl.cli.{command}")
    called = []
    monkeypatch.setattr(mod, "bound_heap", lambda: called.append(1))
    app = typer.Typer()
    app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(mod.main)
    result = CliRunner().invoke(app, [str(tmp_path / "missing.yaml")])
    assert result.exit_code != 0 and "missing.yaml" in result.output
    assert called == [1]


PEAK = """
from sage_rl.memory import peak_rss_bytes, release_memory, reset_peak

start = peak_rss_bytes()
big = bytearray(400 * 1024 * 1024)  # 400 MB, every page written
big[::4096] = b"x" * len(big[::4096])
high = peak_rss_bytes()
del big
release_memory()
ok = reset_peak()
after = peak_rss_bytes()
print(start, high, int(ok), after)
"""


@pytest.mark.skipif(platform.system() != "Linux", reason="/proc/self/status and clear_refs are Linux's")
def test_a_stage_gets_its_own_peak():
    """The recipe resets the peak at each stage's start (its ``peak_rss_gb``): a stage after a big
    one reports its own peak, not the big one's."""
    out = subprocess.run([sys.executable, "-c", PEAK], capture_output=True, text=True, check=True)
    start, high, ok, after = map(int, out.stdout.split())
    assert high - start > 380e6  # the 400 MB block counted
    assert ok == 1 and after < high - 300e6  # reset: the freed block no longer in the peak


def test_stage_peaks_only_when_asked(monkeypatch):
    """A reset of the peak also resets what GNU time and getrusage report for the whole process, so the
    recipe measures stages only under SAGE_RL_STAGE_PEAKS=1 (benchmarks/main_job.py sets it)."""
    from sage_rl.memory import stage_peaks_wanted

    monkeypatch.delenv("SAGE_RL_STAGE_PEAKS", raising=False)
    assert not stage_peaks_wanted()
    for on in ("1", "true", "yes"):
        monkeypatch.setenv("SAGE_RL_STAGE_PEAKS", on)
        assert stage_peaks_wanted()
    monkeypatch.setenv("SAGE_RL_STAGE_PEAKS", "0")
    assert not stage_peaks_wanted()
