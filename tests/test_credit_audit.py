"""benchmarks/credit_audit.py: which paid skill uses did nothing with the skill's result."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("credit_audit", ROOT / "benchmarks" / "credit_audit.py")
audit = importlib.util.module_from_spec(spec)
spec.loader.exec_module(audit)

TASK1 = """
def token(app):
    return apis.supervisor.show_account_passwords()[0]["password"]

def find_id(name):
    return apis.phone.search_contacts(access_token=token("phone"), query=name)[0]["contact_id"]

def befriend(name):
    return apis.payments.add_friend(access_token=token("payments"), email=name)
"""


def _traj(cells, used, success=True):
    turns = [{"code": c} for c in cells]
    return {"task": {"task_id": "t"}, "turns": turns, "skills_used": used, "outcome": {"success": success}}


def _chain(cells2, used, success=True, paid=True):
    trajs = [_traj([TASK1], []), _traj(cells2, used, success)]
    return {"trajectories": trajs, "used_from": [[], [0] if paid else []]}


def _row(cells2, used, **kw):
    (row,) = audit.audit_chain(_chain(cells2, used, **kw))
    return row


@pytest.mark.parametrize(
    ("cells", "kind"),
    [
        (["find_id('Ann')\napis.supervisor.complete_task(answer=3)"], "discarded"),
        (["x = find_id('Ann')\nprint('done')"], "discarded"),  # bound, never read again
        (["x = find_id('Ann')", "apis.phone.show_contact(contact_id=x)"], "used"),  # read in a later cell
        (["apis.supervisor.complete_task(answer=find_id('Ann'))"], "used"),
        (["print(find_id('Ann'))"], "printed"),
        (["a, b = find_id('Ann'), 1"], "used"),  # a tuple target: not followed, counted as used
        (["x = 1\nprint(x)\nx = find_id('Ann')"], "discarded"),  # read only before it was bound
        (
            ["print(find_id('Ann'))", "find_id('Bo')", "apis.y.z(a=find_id('Cy'))"],
            "used",
        ),  # the best site counts
        (["print(find_id('Ann'))", "find_id('Bo')"], "printed"),
        (["print(1)"], "helper"),  # paid, never called by the task's own code
    ],
)
def test_a_call_site_is_classed_by_what_the_task_does_with_its_value(cells, kind):
    row = _row(cells, ["find_id"])
    assert row["skills"]["find_id"] == {"class": kind, "writes": False}
    assert row["suspect"] is (kind != "used")


def test_a_skill_that_changes_the_world_is_real_use_even_when_its_value_is_ignored():
    row = _row(["befriend('a@b.c')\napis.supervisor.complete_task()"], ["befriend", "token"])
    assert row["skills"]["befriend"] == {"class": "discarded", "writes": True}
    assert row["skills"]["token"] == {"class": "helper", "writes": False}
    assert not row["suspect"]


def test_writes_follow_the_skills_a_skill_calls_by_name():
    defs = audit.function_defs(
        [TASK1, "def outer():\n    return befriend('x')\n", "def idle():\n    return token('x')\n"]
    )
    assert audit.writes("outer", defs) and audit.writes("befriend", defs)
    assert (
        not audit.writes("idle", defs)
        and not audit.writes("find_id", defs)
        and not audit.writes("nope", defs)
    )
    assert "send_money" in audit.WRITE_APIS and "show_contact" not in audit.WRITE_APIS
    assert "login" not in audit.WRITE_APIS and "complete_task" not in audit.WRITE_APIS


def test_only_a_paid_successful_task_can_be_suspect():
    cells = ["find_id('Ann')"]
    assert not _row(cells, ["find_id"], success=False)["suspect"]
    assert not _row(cells, ["find_id"], paid=False)["suspect"]
    assert _row(cells, ["find_id"])["suspect"]


def test_the_report_counts_over_files(tmp_path, capsys):
    chains = [
        _chain(["find_id('Ann')"], ["find_id"]),
        _chain(["apis.x.y(z=find_id('A'))"], ["find_id", "token"]),
    ]
    chains.append({"trajectories": [_traj(["print(1)"], [])], "used_from": [[]]})  # nothing credited
    path = tmp_path / "step_000001.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in chains) + "\n")
    report = audit.main([str(path), "--json", str(tmp_path / "out.json")])
    assert report["credited_tasks"] == 2 and report["paid_successful_tasks"] == 2
    assert report["skill_credits_by_class"] == {"discarded": 1, "used": 1, "helper": 1}
    assert report["suspect"] == 1 and report["suspect_fraction"] == 0.5
    assert report["examples"][0]["cells"] == ["find_id('Ann')"]
    assert json.loads((tmp_path / "out.json").read_text()) == json.loads(capsys.readouterr().out)


def test_a_line_that_is_not_json_is_named(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"trajectories": []}\n{oops\n')
    with pytest.raises(SystemExit, match=r"bad.jsonl:2: not a JSON line"):
        audit.main([str(path)])
