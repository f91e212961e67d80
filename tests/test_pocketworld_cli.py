"""``sage-rl world`` commands, run in-process with typer's CliRunner."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from sage_rl.cli.world import app

runner = CliRunner()


def _json(*args: str) -> dict:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_stats_list_show():
    s = _json("stats", "--json")
    assert (
        s["num_apis"] >= 100
        and s["scenarios"]["train"] >= 24
        and s["tasks"]["dev"] == 3 * s["scenarios"]["dev"]
    )
    listing = _json("list", "--split", "test_challenge", "--json")
    assert len(listing["tasks"]) == s["tasks"]["test_challenge"]
    shown = runner.invoke(app, ["show", listing["tasks"][0]["task_id"]])
    assert shown.exit_code == 0 and "instruction:" in shown.stdout and "supervisor:" in shown.stdout


def test_run_solution_noop_and_code_file(tmp_path):
    ok = _json("run", "phone_last_text_from_1", "--solution", "--json")
    assert ok["outcome"]["success"] and ok["completed"]
    noop = _json("run", "phone_last_text_from_1", "--noop", "--json")
    assert not noop["outcome"]["success"]
    code = tmp_path / "cell.py"
    code.write_text("print(apis.supervisor.show_profile()['first_name'])\n")
    out = _json("run", "phone_last_text_from_1", "--code", str(code), "--json")
    assert out["observation"].strip() and not out["completed"]
    bad = runner.invoke(app, ["run", "phone_last_text_from_1"])
    assert bad.exit_code != 0


def test_verify_and_play():
    v = _json("verify", "--split", "dev", "--json")
    assert v["reference_pass_rate"] == 1.0 and v["noop_pass_rate"] == 0.0
    cells = "print(1 + 1)\n%%\napis.supervisor.complete_task(answer='nope')\n%%\nprint('never')\n"
    played = runner.invoke(app, ["play", "phone_last_text_from_1"], input=cells)
    assert played.exit_code == 0 and "2" in played.stdout and "never" not in played.stdout
    assert "success False" in played.stdout
