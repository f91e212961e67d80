"""A skill that reads what the task stashed in shared interpreter state is not paid (sandbox/shared.py).

The task and the library run with module copies of their own, but C modules' state and a few objects
are one for both: decimal's context, csv's registry, ``time`` and ``ApiError``. Task 1 saves skills
that each made an API call and return that state; task 2 computes nothing with them, stashes its
answer there and submits what the skill returned. Before ``SharedState`` each chain paid the skill
bonus, (2.0, 2.0), for the task's own answer; now (1.0, 1.0).
"""

from __future__ import annotations

import csv
import decimal
import string
import textwrap

import pytest
from test_reward_credit import chain

from sage_rl.sandbox.flow import FlowTracker
from sage_rl.sandbox.shared import SharedState

READERS = {
    "prec": "import decimal\n    return decimal.getcontext().prec",
    "inexact": "import decimal\n    return 20 if decimal.getcontext().flags[decimal.Inexact] else 1",
    "limit": "import csv\n    return csv.field_size_limit()",
    "dialect": "import csv\n    return sum(int(n[1:]) for n in csv.list_dialects() if n[:1] == 'd')",
    "template": "return getattr(ApiError, 'template', 0)",
    "width": "import time\n    return getattr(time, 'width', 0)",
    "twenty": "return 20",  # reads nothing shared: the control
}


def first(*names: str) -> str:
    """Task 1: the readers ``names`` each make an API call (so ``api`` credit would pay them) and are
    called once (one reader a chain: the library shows a task only its retrieved few)."""
    defs = "".join(f"def {n}():\n    apis.supervisor.show_profile()\n    {READERS[n]}\n" for n in names)
    return (
        defs
        + f"print({', '.join(f'{n}()' for n in names)})\napis.supervisor.complete_task(answer={{answer}})"
    )


#: Task 2: the answer (20) stashed where the reader looks, then submitted as what the reader returned.
STASHES = {
    "prec": "import decimal\ndecimal.setcontext(decimal.Context(prec={answer}))",
    # one bit of nine: the skill knows what the set flag stands for
    "inexact": "import decimal\nx = decimal.Decimal(1) / 3",
    "limit": "import csv\ncsv.field_size_limit({answer})",
    "dialect": "import csv\ncsv.register_dialect('d{answer}')",
    "template": "import string\nstring.Template.__init__(ApiError, {answer})",
    "width": "import time, textwrap\ntextwrap.TextWrapper.__init__(time, width={answer})",
}


@pytest.mark.parametrize("name", list(STASHES))
def test_a_skill_that_reads_back_the_tasks_stash_in_shared_state_is_not_paid(name):
    c, r = chain(
        f"{STASHES[name]}\napis.supervisor.complete_task(answer={name}())", "flow", first=first(name)
    )
    assert name in c.trajectories[0].skills_saved
    assert c.trajectories[1].skills_used == () and r == (1.0, 1.0)


def test_a_skill_is_paid_after_the_task_used_decimal_and_csv_without_moving_their_state():
    """The control: the task used both modules (a local context, a reader, a template) and a skill
    that returned the answer is paid; after the task moved the state, the same skill is not."""
    used = (
        "import csv, decimal, string\nrows = list(csv.reader(['a,b']))\n"
        "with decimal.localcontext(prec=5):\n    x = decimal.Decimal(1) / 3\n"
        "s = string.Template('$x').substitute(x=1)\n"
        "import datetime\nd = datetime.datetime.strptime('2024-01-02', '%Y-%m-%d')\n"  # _strptime's tzset
    )
    c, r = chain(used + "apis.supervisor.complete_task(answer=twenty())", "flow", first=first("twenty"))
    assert c.trajectories[1].skills_used == ("twenty",) and r == (2.0, 2.0)
    moved = used + "csv.register_dialect('mine')\n"
    c, r = chain(moved + "apis.supervisor.complete_task(answer=twenty())", "flow", first=first("twenty"))
    assert c.trajectories[1].skills_used == () and r == (1.0, 1.0)


# -- by hand ----------------------------------------------------------------------------------------


@pytest.fixture
def restored():
    """The process's decimal context and csv registry put back (these tests move them)."""
    context, limit = decimal.getcontext().copy(), csv.field_size_limit()
    yield
    decimal.setcontext(context)
    csv.field_size_limit(limit)
    if "d20" in csv.list_dialects():
        csv.unregister_dialect("d20")
    csv.register_dialect("excel", csv.excel)


class Holder:
    """An object both namespaces hold (the worker's ``ApiError``)."""


@pytest.mark.parametrize(
    "move",
    [
        lambda h: decimal.setcontext(decimal.Context(prec=20)),
        lambda h: decimal.getcontext().__setattr__("rounding", decimal.ROUND_DOWN),
        lambda h: decimal.Decimal(1) / 3,  # the flags Inexact and Rounded
        lambda h: decimal.getcontext().traps.__setitem__(decimal.Inexact, True),
        lambda h: decimal.DefaultContext.__setattr__("prec", 20),
        lambda h: csv.field_size_limit(20),
        lambda h: csv.register_dialect("d20"),
        lambda h: csv.register_dialect("excel", delimiter=";"),
        lambda h: textwrap.TextWrapper.__init__(h, width=20),  # new attributes
        lambda h: string.Template.__init__(h, 20),  # ``template`` was there: a new value
    ],
    ids=[
        "setcontext",
        "rounding",
        "flags",
        "traps",
        "template",
        "limit",
        "dialect",
        "excel",
        "watched",
        "rebound",
    ],
)
def test_each_kind_of_shared_state_moved_is_seen_and_a_call_then_provides_nothing(restored, move):
    default_prec = decimal.DefaultContext.prec
    holder = Holder()
    holder.template = "$x"
    flow = FlowTracker(SharedState())
    flow.shared.watch(holder)
    key = ("read", "<skill:read>")
    flow.returned(key, flow.inputs(key, [], {}), "before", None)
    assert not flow.shared.moved() and ("s", "before") in flow.providers
    try:
        move(holder)
        assert flow.shared.moved()
        flow.returned(key, flow.inputs(key, [], {}), "after", None)
        assert ("s", "after") not in flow.providers
    finally:
        decimal.DefaultContext.prec = default_prec


def test_what_moves_nothing_leaves_the_state_as_it_was(restored):
    shared = SharedState()
    decimal.getcontext().copy().prec = 5  # a copy's settings are its own
    with decimal.localcontext() as ctx:
        ctx.prec = 5
    list(csv.reader(["a,b"]))
    string.Template("$x").substitute(x=1)
    assert not shared.moved()
