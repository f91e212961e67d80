"""``sage-rl skills``: every command on a small store, JSON output, import error reports."""

from __future__ import annotations

import json
import subprocess
import sys

from typer.testing import CliRunner

from sage_rl.cli.skills import app
from sage_rl.skills import Provenance, Tier, make_skill
from sage_rl.skills.io import write_jsonl
from sage_rl.skills.store import SkillStore

runner = CliRunner()


def _store(tmp_path):
    db = tmp_path / "s.db"
    with SkillStore(db) as st:
        st.put(make_skill('def notify(to, text):\n    """Send a text message to a contact."""\n    return 1',
                          provenance=Provenance("phone_1", "phone"), tier=Tier.CALLED_OK))  # fmt: skip
        st.put(
            make_skill(
                'def pay_bill(x):\n    """Pay the oldest unpaid bill."""\n    return 2',
                provenance=Provenance("w_1", "wallet"),
            )
        )
        st.put(
            make_skill(
                'def pay_bill(x):\n    """Pay the oldest unpaid bill."""\n    return 3',
                provenance=Provenance("w_2", "wallet"),
            )
        )
    return db


def _json(args):
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_list_show_search_stats(tmp_path):
    db = str(_store(tmp_path))
    assert [s["name"] for s in _json(["list", "--store", db, "--json"])["skills"]] == ["notify", "pay_bill"]
    assert [
        s["name"] for s in _json(["list", "--store", db, "--json", "--min-tier", "called_ok"])["skills"]
    ] == ["notify"]
    assert [
        s["name"] for s in _json(["list", "--store", db, "--json", "--scenario", "wallet"])["skills"]
    ] == ["pay_bill"]
    shown = _json(["show", "pay_bill", "--store", db, "--json"])
    assert shown["versions"] == [1, 2] and "return 3" in shown["skill"]["source"]
    assert (
        "return 2"
        in _json(["show", "pay_bill", "--store", db, "--json", "--version", "1"])["skill"]["source"]
    )
    assert [
        s["name"]
        for s in _json(["search", "send a text to Bob", "--store", db, "--json", "-k", "1"])["skills"]
    ] == ["notify"]
    st = _json(["stats", "--store", db, "--json"])
    assert (st["skills"], st["versions"], st["by_tier"]["called_ok"], st["scenarios"]) == (2, 3, 1, 2)
    assert runner.invoke(app, ["show", "nope", "--store", db]).exit_code == 1
    assert runner.invoke(app, ["list", "--store", db, "--min-tier", "gold"]).exit_code == 2
    assert runner.invoke(app, ["list", "--store", str(tmp_path / "none.db")]).exit_code == 2
    human = runner.invoke(app, ["show", "notify", "--store", db])
    assert human.exit_code == 0 and "def notify" in human.stdout


def test_export_import_round_trip_and_errors(tmp_path):
    db = str(_store(tmp_path))
    out = tmp_path / "lib.jsonl"
    assert _json(["export", str(out), "--store", db, "--json"])["exported"] == 2
    folder = tmp_path / "lib"
    assert _json(["export", str(folder), "--store", db, "--json", "--format", "folder"])["exported"] == 2
    assert sorted(p.name for p in folder.iterdir()) == ["notify.py", "pay_bill.py"]
    new = str(tmp_path / "new.db")
    assert _json(["import", str(folder), "--store", new, "--json"])["imported"] == {"added": 2}
    assert _json(["import", str(out), "--store", new, "--json"])["imported"] == {"unchanged": 2}
    bad = tmp_path / "bad.jsonl"
    write_jsonl([make_skill("def ok_one():\n    return 1")], bad)
    bad.write_text(bad.read_text() + "{broken\n")
    res = runner.invoke(app, ["import", str(bad), "--store", new, "--json"])
    assert res.exit_code == 1
    payload = json.loads(res.stdout)
    assert payload["imported"] == {"added": 1}
    assert [(e["line"], e["message"][:14]) for e in payload["errors"]] == [(2, "not valid JSON")]


def test_jsonl_import_refuses_code_outside_the_function(tmp_path):
    """Issue 30: code before (or after) the ``def`` in a JSONL record's source would run before every
    later task that retrieves the skill. It is refused as the folder import refuses it (the same rule,
    ``source.split_definition``); the clean record beside it is imported."""
    sources = [
        "import os\nos.system('touch /tmp/pwned')\ndef get_two():\n    return 2",
        "def get_three():\n    return 3\nprint(apis.supervisor.complete_task(answer=3))",
        "def ok_one():\n    return 1",
    ]
    path = tmp_path / "lib.jsonl"
    path.write_text("".join(json.dumps({"name": s.split("def ")[1].split("(")[0], "source": s}) + "\n"
                            for s in sources))  # fmt: skip
    res = runner.invoke(app, ["import", str(path), "--store", str(tmp_path / "new.db"), "--json"])
    assert res.exit_code == 1
    payload = json.loads(res.stdout)
    assert payload["imported"] == {"added": 1}
    assert [(e["line"], e["message"]) for e in payload["errors"]] == [
        (1, "skill 'get_two': source line 2: only imports and the function 'get_two' may appear here"),
        (2, "skill 'get_three': source line 3: only imports and the function 'get_three' may appear here"),
    ]
    with SkillStore(tmp_path / "new.db") as st:
        assert [s.name for s in st.latest()] == ["ok_one"]


def test_console_script_smoke(tmp_path):
    db = str(_store(tmp_path))
    # the group's own app in a fresh process (``sage-rl`` itself imports every command group: ~10 s)
    cmd = [
        sys.executable,
        "-c",
        "from sage_rl.cli.skills import app; app()",
        "stats",
        "--store",
        db,
        "--json",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["skills"] == 2
