"""The sandbox's template process: restarted when it dies, its stale spares dropped, and a clear
error when its interpreter cannot import sage-rl's dependencies."""

from __future__ import annotations

import time

import pytest
from test_sandbox_support import TEST_LIMITS, run

from sage_rl.sandbox import Sandbox, SandboxError


def test_template_is_restarted_when_it_dies():
    with Sandbox(TEST_LIMITS) as sb:
        assert run(sb, ["print(1)"])[0].observation == "1\n"
        sb._proc.kill()  # noqa: SLF001 - simulate the OOM killer taking the template
        sb._proc.wait()  # noqa: SLF001
        assert run(sb, ["print(2)"])[0].observation == "2\n"


def test_spares_of_a_dead_template_are_dropped_when_a_fork_restarts_it():
    """The spares thread can be the first to find the template dead (its fork fails and it
    restarts the template); the spares forked before that died with the old template and must
    not be handed to the next episode (a CI flake: "The code ended its interpreter process")."""
    with Sandbox(TEST_LIMITS) as sb:
        assert run(sb, ["print(1)"])[0].observation == "1\n"
        deadline = time.monotonic() + 30
        while not sb._spares and time.monotonic() < deadline:  # noqa: SLF001
            time.sleep(0.05)
        dead = list(sb._spares)  # noqa: SLF001
        assert dead, "the spares thread forked no spare"
        sb._proc.kill()  # noqa: SLF001
        sb._proc.wait()  # noqa: SLF001
        pid, sock = sb.fork_worker(sb.new_scratch())  # what the spares thread does next
        sock.close()
        assert not set(sb._spares) & set(dead)  # noqa: SLF001
        assert run(sb, ["print(2)"])[0].observation == "2\n"


def test_a_template_that_cannot_import_its_dependencies_names_the_cause(tmp_path, monkeypatch):
    """An interpreter without sage-rl's dependencies in its site-packages (as when they came in
    through PYTHONPATH only): the error names the module and where to install it."""
    import subprocess
    import sys

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bare" / "bin" / "python"))
    with pytest.raises(SandboxError, match=r"cannot import '\w+' in the sandbox.*site-packages"):
        Sandbox(TEST_LIMITS).start()
