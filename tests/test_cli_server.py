"""The test harness's command server (cli_server.py): a command forked from it answers as the same
command in a fresh ``python -m sage_rl.cli`` process does, in its own folder and environment."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_server import run_cli

ROOT = Path(__file__).resolve().parents[1]


def _plain(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sage_rl.cli", *args], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def test_a_forked_command_answers_as_a_fresh_process_does(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SAGE_RL_APPWORLD_ROOT": str(tmp_path / "aw-root")}
    cases = [
        ["world", "show", "music_follow_playlist_artists_1"],  # stdout
        ["appworld", "status", "--json"],  # reads the environment: the root named above
        ["eval", "split=nonsense"],  # an error: its exit code and its line on stderr
    ]
    forked = [run_cli(args, tmp_path, env) for args in cases]
    for args, ours in zip(cases, forked, strict=True):
        plain = _plain(args, tmp_path, env)
        assert (ours.returncode, ours.stdout) == (plain.returncode, plain.stdout), args
        assert ours.stderr.strip().splitlines()[-1:] == plain.stderr.strip().splitlines()[-1:], args
    assert str(tmp_path / "aw-root") in forked[1].stdout and forked[2].returncode == 2
    # the working folder: a relative out_dir lands there
    done = run_cli(
        ["eval", "policy.kind=scripted", "limit_scenarios=1", "split=dev", "out_dir=rel"], tmp_path, env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "rel" / "metrics.json").is_file()


def test_a_command_past_its_timeout_is_killed_and_the_server_goes_on(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):  # a whole evaluation of 630 tasks: minutes
        run_cli(
            ["eval", "policy.kind=scripted", "split=train_heldout", "out_dir=long"], tmp_path, env, timeout=2
        )
    assert time.monotonic() - t0 < 20  # killed, not waited for
    again = run_cli(["world", "show", "music_follow_playlist_artists_1"], tmp_path, env)
    assert again.returncode == 0 and "music_follow_playlist_artists_1" in again.stdout  # the server goes on
