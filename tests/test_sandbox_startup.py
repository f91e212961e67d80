"""The sandbox fails closed, with one line naming the field or file, when it cannot keep its promise
(issue 30, items 9 and 11): a ``drop_user`` that is not a user, an ``address_space_bytes`` the
interpreter cannot live in (or setrlimit cannot take), a config file that is not UTF-8. Through the
command itself: exit code, the one line, no exception escaping."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest
from typer.testing import CliRunner

from sage_rl.cli import _register, app
from sage_rl.sandbox import IsolationReport, Sandbox, SandboxError, SandboxLimits, isolation
from sage_rl.sandbox.scratch import remove_stale_scratch, scratch_tag

as_root = pytest.mark.skipif(os.getuid() != 0, reason="drop_user applies only when the trainer is root")
_register("eval")


class _Run:
    def __init__(self, exit_code: int, stderr: str) -> None:
        self.returncode, self.stderr = exit_code, stderr


def _eval(*args: str) -> _Run:
    """``sage-rl eval`` with the sandbox on, in this process (a fresh one imports for 15 s on a
    loaded machine); every case here fails before a model is loaded. An exception escaping the
    command (what a user sees as a traceback) fails the test."""
    with tempfile.TemporaryDirectory(prefix="sage-rl-startup-") as scratch:  # not under / (CI runs as root)
        res = CliRunner().invoke(app, ["eval", *args, f"out_dir={scratch}/never-written"])
    assert isinstance(res.exception, SystemExit), res.exc_info
    return _Run(res.exit_code, res.stderr)


def _one_error_line(r: _Run) -> str:
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert "Traceback" not in r.stderr and len(lines) == 1, r.stderr[-3000:]
    assert lines[0].startswith("error: ")
    return lines[0]


@as_root
def test_a_misspelt_drop_user_fails_closed():
    """Before: the worker stayed root with most capabilities and the report said "strong". Now the
    sandbox refuses to start, and a worker that cannot switch exits instead of serving."""
    with pytest.raises(SandboxError, match=r"^sandbox.drop_user = 'nobdy' is not a user on this machine"):
        Sandbox(SandboxLimits(drop_user="nobdy"), spares=0).start()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker's own layers, as if the parent's check had been raced
        try:
            try:
                rep = isolation.apply_worker_layers(SandboxLimits(drop_user="nobdy"), "/tmp", "none", [])
                out = {"served_as": rep.user, "level": rep.level}
            except PermissionError as e:
                out = {"refused": str(e)}
            os.write(write_end, json.dumps(out).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    out = json.loads(os.read(read_end, 4096))
    os.waitpid(pid, 0)
    assert out == {"refused": "sandbox.drop_user: cannot switch workers to user 'nobdy' (no such user)"}
    r = _eval("sandbox.drop_user=nobdy")
    assert r.returncode == 1
    assert "sandbox.drop_user = 'nobdy' is not a user on this machine" in _one_error_line(r)


def test_a_root_worker_is_never_reported_strong():
    held = dict(network="netns", filesystem="landlock", seccomp=True, landlock=("fs-write",))
    assert IsolationReport(**held, user="nobody").level == "strong"
    assert IsolationReport(**held, user="root").level == "partial"


def test_an_address_space_too_small_for_the_interpreter_is_named():
    """Below what the template already maps, a worker could not allocate anything."""
    r = _eval(f"sandbox.address_space_bytes={32 << 20}")
    assert r.returncode == 1
    line = _one_error_line(r)
    assert "sandbox.address_space_bytes = 32 MiB is too small: the sandbox's interpreter maps" in line


def test_an_address_space_setrlimit_cannot_take_is_a_config_error():
    """Before: setrlimit raised OverflowError in the worker: "sandbox worker exited during start-up"."""
    r = _eval(f"sandbox.address_space_bytes={1 << 64}")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    field = "  sandbox.address_space_bytes: Input should be less than or equal to"
    assert field in r.stderr, r.stderr[-2000:]


def test_a_config_file_that_is_not_utf8_is_named(tmp_path):
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes("env: pocketworld\nsplit: dev  # café\n".encode("latin-1"))
    r = _eval(str(bad))
    assert r.returncode == 2
    assert _one_error_line(r) == (
        f"error: config file {bad} is not UTF-8 text (byte 0xe9 at offset 34); save it as UTF-8"
    )


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_scratch_folders_of_dead_runs_are_removed_at_start(tmp_path):
    """A run killed at once (SIGKILL, the end of a session) leaves its episodes' scratch folders,
    and what agent code wrote there, in the temp folder. A sandbox's start removes those whose maker
    is gone; a live run's, a name without a pid, and a plain file stay."""
    dead = _dead_pid()
    stale = tmp_path / f"sage-sandbox-{scratch_tag(dead)}-abc123"
    (stale / "sub").mkdir(parents=True)
    (stale / "sub" / "written.bin").write_bytes(b"x" * 4096)
    live = tmp_path / f"sage-sandbox-{scratch_tag()}-def456"
    elsewhere = tmp_path / f"sage-sandbox-1.{dead}-ghi789"  # another pid namespace: its pids are not ours
    live.mkdir()
    old_style, plain_file, other = (
        tmp_path / "sage-sandbox-q9w8e7",
        tmp_path / f"sage-sandbox-{scratch_tag(dead)}-f",
        tmp_path / "keep",
    )
    old_style.mkdir()
    elsewhere.mkdir()
    plain_file.write_text("not a folder")
    other.mkdir()
    assert remove_stale_scratch(str(tmp_path)) == [str(stale)]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [live.name, elsewhere.name, old_style.name, plain_file.name, other.name]
    )

    root = tempfile.mkdtemp(prefix="sage-rl-scratch-root-")  # not under pytest's 0700 folders
    os.chmod(root, 0o755)
    try:
        again = os.path.join(root, f"sage-sandbox-{scratch_tag(dead)}-zzz")
        os.mkdir(again)
        with Sandbox(SandboxLimits(scratch_root=root), spares=0) as sandbox:
            assert not os.path.exists(again)
            scratch = sandbox.new_scratch()
            assert scratch.name.startswith(f"sage-sandbox-{scratch_tag()}-")
            assert scratch_tag().endswith(f".{os.getpid()}") and scratch_tag()[0].isdigit()
            assert remove_stale_scratch(root) == []  # its own run's folder is alive
    finally:
        shutil.rmtree(root, ignore_errors=True)
