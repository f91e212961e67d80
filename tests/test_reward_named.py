"""A skill is paid only for API calls the library's code names (session 40).

A trampoline, ``def call(f, **kw): return f(**kw)``, made in task 1, let task 2 solve the task
inline and route each write through ``call(apis.x.y, ...)``: the write was made by the skill's code,
so it was the skill's effect and it lasted, and the chain paid (2.0, 2.0). The rule since: a call
counts for the open library skills only when one of them names the API (``tracking.record_api_call``);
a call made for the task is the task's, and what it returned is not the skill's to provide.
"""

from __future__ import annotations

import pytest
from test_skill_flow import SKILLS, _effects, in_both_executors

from sage_rl.sandbox.tracking import CallTracker
from sage_rl.types import skill_origin

HANDED = (
    "def call(f, **kw):\n    return f(**kw)\n"
    "def by_name(app, api, **kw):\n    return getattr(getattr(apis, app), api)(**kw)\n"
    "def via_global(**kw):\n    return F(**kw)\n"
    "def make():\n    f = apis.shop.buy\n    return lambda **kw: f(**kw)\n"
    "def buy_it(item_id):\n    return getattr(apis.shop, 'buy')(item_id=item_id)\n"
    "def login_as(app):\n    return getattr(apis, app).login()['token']\n"
    "def fetch(api, **kw):\n    return api(**kw)\n"
    "def find2(name):\n    return [i for i in fetch(apis.shop.search, token=token()) if i['name'] == name][0]['id']\n"
    "def rows(t):\n    for row in apis.shop.search(token=t):\n        yield row\n"
    "def find_g(name):\n    return next(i for i in rows(token()) if i['name'] == name)['id']\n"
    "def act(kind, item_id):\n    if kind not in ['buy', 'sell']:\n        raise ValueError(kind)\n"
    "    return getattr(apis.shop, kind)(item_id=item_id)\n"
    # one API call each, then a value the task handed over: in a function, past the walk, small
    "def run_f(f):\n    apis.shop.login()\n    return f()\n"
    "def last(xs):\n    apis.shop.login()\n    return xs[-1]\n"
    "def buy_where(pred):\n    for i in apis.shop.search(token=token()):\n        if pred(i):\n"
    "            apis.shop.buy(item_id=i['id'])\n"
    # state kept between calls: what one call was given, a later call gives back
    "def box(v=None, _kept=[0]):\n    apis.shop.login()\n    if v is not None:\n        _kept[0] = v\n"
    "    return _kept[0]\n"
)

#: the task's object, handed to ``buy`` (which names ``buy``), runs the task's code inside it: its
#: ``__eq__`` routes the task's own write through ``call`` (review of session 40, t2_dunder.py)
EQ = (
    "class N:\n    def __eq__(self, other):\n        call(apis.shop.buy, item_id=4712)\n        return False\n"
    "try:\n    buy(N())\nexcept IndexError:\n    pass"
)

#: cell -> the skills with effects, worked by hand
CASES = {
    # handed the API by value, by name, through a global, through another skill's closure: not paid
    "call(apis.shop.buy, item_id=4711)": set(),
    "by_name('shop', 'buy', item_id=4711)": set(),
    "g = make()\ncall(g, item_id=4711)": set(),
    EQ: set(),  # ``buy`` names the API, but the task's __eq__ is between it and the call
    # a handed read is the task's read: its rows are the token's provider's, not call's
    "rows = call(apis.shop.search, token=token())\napis.shop.buy(item_id=rows[0]['id'])": {"token"},
    "apis.supervisor.complete_task(answer=call(apis.shop.search, token=token())[1]['id'])": {"token"},
    # the skill's code names the API (a literal name, an app given by name): paid
    "buy_it(4711)": {"buy_it"},
    "apis.shop.buy(item_id=apis.shop.search(token=login_as('shop'))[0]['id'])": {"login_as"},
    # a helper handed the API by a skill that names it serves that skill: both paid
    "apis.shop.buy(item_id=find2('lamp'))": {"find2", "fetch", "token"},
    # a generator that names the API, run by a skill; names in a list constant
    "apis.shop.buy(item_id=find_g('lamp'))": {"find_g", "token"},
    "act('buy', 4711)": {"act"},
    # a value the task's code made, returned by a skill that made a call (the review's thunk: it paid
    # (2.0, 2.0) for the answer and for any write that takes a token), one past the 4,096 items flow
    # reads of an argument, a small one inside a list: the task's
    "apis.shop.buy(item_id=run_f(lambda: 4711))": set(),
    "apis.shop.buy(item_id=last([0] * 5000 + [4711]))": set(),
    "apis.supervisor.complete_task(answer=last([3, 7]))": set(),
    "box(4711)\napis.shop.buy(item_id=box())": set(),
    # a skill given a callable still makes its own writes
    "buy_where(lambda i: i['name'] == 'desk')": {"buy_where", "token"},
}


@pytest.mark.parametrize("cell", list(CASES))
def test_a_skill_is_paid_only_for_calls_the_library_names(sandbox, cell):
    for name, result in in_both_executors(sandbox, SKILLS + HANDED, skill_origin("buy"), cell).items():
        assert result.ok, result.observation
        assert _effects(result) == CASES[cell], name


@pytest.mark.parametrize(
    ("cell", "with_api"),
    [("call(apis.shop.login)", 0), ("by_name('shop', 'login')", 0), ("login_as('shop')", 1)],
)
def test_with_api_counts_only_calls_the_skill_names(sandbox, cell, with_api):
    """The ``api`` credit rule reads ``with_api``: a handed call does not make it."""
    for name, result in in_both_executors(sandbox, HANDED, skill_origin("buy"), cell).items():
        assert result.ok, result.observation
        [record] = [r for r in result.calls if r.calls]
        assert record.with_api == with_api, name


def test_what_a_skills_code_names():
    tracker = CallTracker()
    ns = {"apis": None}
    exec(tracker.compile(HANDED + "def nested():\n    return [apis.x.deep() for _ in ()]\n", "<skill:t>"), ns)
    names = {n: tracking_names(ns[n]) for n in ("call", "by_name", "buy_it", "login_as", "nested")}
    assert "buy" not in names["call"] and "buy" not in names["by_name"]
    assert "buy" in names["buy_it"] and "login" in names["login_as"]
    assert "deep" in names["nested"]  # inside a comprehension's own code


def tracking_names(fn) -> frozenset[str]:
    from sage_rl.sandbox.tracking import _code_names

    return _code_names(fn.__wrapped__.__code__)


def test_a_trampoline_made_in_task_1_is_not_paid_for_task_2s_writes():
    """The review's case (``/tmp/review_reward/r8_trampoline.py``): through PocketWorld, the sandbox
    and the ChainRunner, under ``flow``; it paid (2.0, 2.0)."""
    from test_reward_credit import chain

    from sage_rl.envs.pocketworld import tasks
    from sage_rl.envs.pocketworld.scenarios import BY_NAME

    pair = tasks.scenario_tasks(BY_NAME["music_like_artist_songs"], 1, 2)
    first = (
        "def call(f, **kw):\n    return f(**kw)\nprint(call(apis.supervisor.show_profile)['email'])\n"
        + tasks.reference_solution(pair[0])
    )
    direct = 'apis.music.like_song(access_token=token, song_id=song["song_id"])'
    assert direct in tasks.reference_solution(pair[1])
    second = tasks.reference_solution(pair[1]).replace(
        direct, 'call(apis.music.like_song, access_token=token, song_id=song["song_id"])'
    )
    c, r = chain(second, "flow", first=first, pair=pair)
    assert "call" in c.trajectories[0].skills_saved
    assert c.trajectories[1].skills_used == () and r == (1.0, 1.0)


def test_a_skill_that_returns_the_tasks_variable_is_not_saved_nor_paid():
    """``def run(): apis.supervisor.show_profile(); return V``: task 2 set ``V`` to its own answer
    and submitted ``run()``: (2.0, 2.0) (``/tmp/s40/attacks/globals_channel.py``)."""
    from test_reward_credit import chain

    first = (
        "V = 0\ndef run():\n    apis.supervisor.show_profile()\n    return V\nprint(run())\n"
        "apis.supervisor.complete_task(answer={answer})"
    )
    c, r = chain("V = {answer}\napis.supervisor.complete_task(answer=run())", "flow", first=first)
    assert c.trajectories[0].skills_saved == () and r == (1.0, 1.0)


@pytest.mark.parametrize("where", ["run", "json", "apis"])
def test_a_skill_that_returns_what_the_task_stored_on_a_shared_object_is_not_paid(where):
    """``run.v = <answer>`` (or on a module, or on ``apis``), then ``complete_task(answer=run())``
    with a skill that returns ``run.v``: (2.0, 2.0) (``/tmp/s40/attacks/attr_stash.py``). The store
    is refused now (sandbox/stores.py), and the task completes on its next turn."""
    from test_reward_credit import chain

    first = (
        "import json\ndef run():\n    import json\n    apis.supervisor.show_profile()\n"
        f"    try:\n        return {where}.v\n    except AttributeError:\n        return 0\n"
        "print(run())\napis.supervisor.complete_task(answer={answer})"
    )
    second = f"import json\n{where}.v = {{answer}}\napis.supervisor.complete_task(answer=run())"
    c, r = chain(second, "flow", first=first)
    assert (
        c.trajectories[0].skills_saved == ("run",)
        and "is read-only" in c.trajectories[1].turns[0].observation
    )
    assert c.trajectories[1].skills_used == () and r == (1.0, 1.0)
