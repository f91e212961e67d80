"""The two skill-credit rules on hand-made records (skills/usage.py; issue 30, items 3 and 5).

Each row was worked out by hand from the rule's definition:
- ``paper``: some call of the skill returned (``calls > errors``);
- ``api``: some call returned after a successful API call (``with_api > 0``), and the parent served
  at least one successful API call in that cell (``api_ok`` is not 0).
"""

from __future__ import annotations

import pytest

from sage_rl.config import ConfigError, load_config
from sage_rl.settings import RunConfig
from sage_rl.skills import Library, SkillCredit, make_skill, used_skills
from sage_rl.types import CallRecord, ExecResult

LIB = Library(
    [
        make_skill("def fetch():\n    return apis.bank.balance()"),
        make_skill("def double():\n    return fetch() * 2"),  # an API call through another skill
        make_skill("def two():\n    return 2"),
    ]
)


def rec(name: str, calls: int, errors: int, with_api: int, effects: int = 0) -> CallRecord:
    return CallRecord(name, f"<skill:{name}>", calls, errors, with_api, effects)


CASES = [
    # (records, api_ok, used under paper, used under api, used under flow)
    ((rec("fetch", 1, 0, 1),), 1, {"fetch"}, {"fetch"}, set()),  # its work reached nothing
    ((rec("fetch", 1, 0, 1, 1),), 1, {"fetch"}, {"fetch"}, {"fetch"}),  # ... and here it did
    ((rec("fetch", 1, 1, 0, 1),), 1, set(), set(), set()),  # its only call raised (issue 30 item 3)
    ((rec("fetch", 2, 1, 1, 1),), 1, {"fetch"}, {"fetch"}, {"fetch"}),  # one raised, one returned after an API call
    ((rec("fetch", 2, 1, 0, 1),), 1, {"fetch"}, set(), set()),  # the call that returned made no API call
    ((rec("two", 3, 0, 0),), 0, {"two"}, set(), set()),  # trivial (item 5)
    ((rec("fetch", 1, 0, 1, 1),), 0, {"fetch"}, set(), set()),  # the parent served no successful API call
    ((rec("fetch", 1, 0, 1, 1),), None, {"fetch"}, {"fetch"}, {"fetch"}),  # nobody counted: the records decide
]


@pytest.mark.parametrize("records, api_ok, paper, api, flow", CASES)
def test_credit_rules_on_records(records, api_ok, paper, api, flow):
    code = "fetch()\ntwo()"
    result = ExecResult("", True, calls=records, api_ok=api_ok)
    assert used_skills([(code, result)], LIB, SkillCredit.PAPER) == paper
    assert used_skills([(code, result)], LIB, SkillCredit.API) == api
    assert used_skills([(code, result)], LIB, SkillCredit.FLOW) == flow
    assert used_skills([(code, result)], LIB) == flow  # the default is "flow"


def test_under_flow_the_effect_may_come_in_a_later_cell():
    """A value returned in cell 0 and used in cell 1: cell 1's record has ``calls`` 0 and the effect."""
    first = ExecResult("", True, calls=(rec("fetch", 1, 0, 1),), api_ok=1)
    later = ExecResult("", True, calls=(rec("fetch", 0, 0, 0, 1),), api_ok=1)
    cells = [("x = fetch()", first), ("apis.bank.pay(to=x)", later)]
    assert used_skills(cells, LIB, SkillCredit.FLOW) == {"fetch"}
    assert used_skills(cells[:1], LIB, SkillCredit.FLOW) == set()
    assert used_skills([cells[1]], LIB, SkillCredit.FLOW) == set()  # an effect alone: no call returned


def test_without_records_api_credits_skills_that_refer_to_apis():
    """AppWorld has no call records: static detection, and under "api" only skills whose code (or a
    library skill it calls) refers to ``apis``."""
    blind = ExecResult("", True, calls=None, defined=None)
    cells = [("print(fetch(), double(), two())", blind)]
    assert used_skills(cells, LIB, SkillCredit.PAPER) == {"fetch", "double", "two"}
    assert used_skills(cells, LIB, SkillCredit.API) == used_skills(cells, LIB, SkillCredit.FLOW) == {"fetch", "double"}


def test_without_records_a_skill_that_only_submits_or_reads_the_docs_is_not_credited():
    """The static stand-in for ``with_api`` (``usage.refers_to_work``): ``apis.api_docs`` and
    ``apis.supervisor.complete_task`` are no work; any other use of ``apis`` is."""
    lib = Library(
        [
            make_skill("def submit(a):\n    return apis.supervisor.complete_task(answer=a)"),
            make_skill("def docs(app):\n    return apis.api_docs.show_api_descriptions(app_name=app)"),
            make_skill("def finish(a):\n    apis.supervisor.show_profile()\n    return submit(a)"),
            make_skill("def via(a):\n    return submit(a)"),
            make_skill("def handle():\n    return apis.supervisor"),  # a handle to use elsewhere: work
        ]
    )
    blind = ExecResult("", True, calls=None, defined=None)
    cells = [("submit(1)\ndocs('x')\nfinish(1)\nvia(1)\nhandle()", blind)]
    assert used_skills(cells, lib, SkillCredit.PAPER) == {"submit", "docs", "finish", "via", "handle"}
    assert used_skills(cells, lib, SkillCredit.API) == {"finish", "handle"}


def test_credit_is_a_validated_setting():
    assert RunConfig().skills.credit is SkillCredit.FLOW
    assert load_config(RunConfig, None, ["skills.credit=paper"]).skills.credit is SkillCredit.PAPER
    with pytest.raises(ConfigError, match=r"skills\.credit: .*'api', 'paper' or 'flow'.*got 'papr'"):
        load_config(RunConfig, None, ["skills.credit=papr"])


def test_verl_runs_the_same_rule():
    """The verl adapter builds its ChainRunner from a RunConfig made of its own config: the same
    ``skills.credit``, the same default."""
    from sage_rl.integrations.verl.bridge import _run_config
    from sage_rl.integrations.verl.config import VerlRunConfig

    assert _run_config(VerlRunConfig()).skills.credit is SkillCredit.FLOW
    assert _run_config(VerlRunConfig(skills={"credit": "paper"})).skills.credit is SkillCredit.PAPER
