"""Four doors the skill bonus left open under ``skills.credit: flow`` (the review of 2026-12-06), each
shut and each checked on the real path: the sandbox, PocketWorld, the ``ChainRunner`` and
``compute_rewards`` (``test_reward_credit.chain``), next to an honest use that is still paid.

- D2: a skill's value submitted, then the right answer submitted again: the first answer was
  counted as the skill's effect, the second is what the checker scores (both AppWorld's
  ``complete_task`` and PocketWorld's keep the last answer). Only the last submission counts now;
- D3: a skill's value passed as the answer of a task that asks for none (the checker ignores it).
  The environment now says whether an answer was scored (``Outcome.answer_scored``);
- D4: an identity skill (``echo(x)``: one idle read, then ``return x``) laundered the task's own
  answer: a small int argument was no atom, and ``x.upper()`` / ``x + 0.001`` escaped the
  exact-match exclusion of a call's arguments. Arguments now count whole, compared as the checker
  compares answers;
- D6 (K > 2): a task that re-saved a library skill with only a new docstring took the credit for
  making it (``rollout/makers.py``).
"""

from __future__ import annotations

import asyncio

import pytest
from test_reward_credit import COMPLETE, chain

from sage_rl.envs.pocketworld import checks, tasks
from sage_rl.envs.pocketworld.scenarios import BY_NAME
from sage_rl.envs.pocketworld.scenarios.base import COMMON_SOURCE
from sage_rl.policies.base import Completion
from sage_rl.rollout.makers import Makers, code_hash
from sage_rl.rollout.rewards import ChainOutcomes, RewardKind, compute_rewards
from sage_rl.sandbox.flow import FlowTracker, input_keys
from sage_rl.skills import Library, make_skill
from sage_rl.types import Outcome

PAID, UNPAID = (2.0, 2.0), (1.0, 1.0)


def expert(name: str, length: int = 2):
    """(tasks, task 1's cell as the scripted expert writes it, the call that solves task k)."""
    tpl = BY_NAME[name]
    seq = tasks.scenario_tasks(tpl, 1, length)

    def call(k: int) -> str:
        return tpl.call_code(seq[k].spec["params"])

    return seq, f"{COMMON_SOURCE}\n{tpl.skill_source}\n{call(0)}", call


GET_EMAIL = "def get_email():\n    return apis.supervisor.show_profile()['email']\nprint(get_email())\n"


# -- D2: the last answer submitted is the one that counts ----------------------------------------------


def test_a_skill_value_submitted_before_the_real_answer_is_not_paid():
    """``complete_task(answer=get_email())`` then ``complete_task(answer=20)`` paid (2, 2)."""
    c, r = chain("apis.supervisor.complete_task(answer=get_email())" + COMPLETE, "flow")
    assert c.trajectories[1].outcome.success  # the world kept the last answer, as AppWorld's does
    assert c.trajectories[1].skills_used == () and c.used_from == ((), ()) and r == UNPAID


def test_a_skill_value_submitted_last_is_still_paid():
    pair, first, call = expert("music_count_liked_genre")
    second = "apis.supervisor.complete_task(answer=0)\n" + call(1)  # a wrong guess, then the skill's
    c, r = chain(second, "flow", first=first, pair=pair)
    assert "count_liked_songs_by_genre" in c.trajectories[1].skills_used and r == PAID


def test_a_later_answer_takes_the_answer_event_but_not_a_change():
    S, T = ("s", "<skill:s>"), ("t", "<skill:t>")
    f = FlowTracker()
    f.returned(S, set(), "ann@x.com", None)
    f.returned(T, set(), "tok-123", None)
    f.api_call([], "supervisor", "complete_task", {"answer": "ann@x.com"}, None, changed=0, works=False)
    assert f.effects == {S: {0}}
    f.api_call([], "supervisor", "complete_task", {"answer": "bo@x.com"}, None, changed=0, works=False)
    assert f.effects == {}
    # where changes cannot be numbered a write is event 0 too: a later answer leaves it alone
    f.api_call([], "shop", "buy", {"token": "tok-123"}, None, changed=None, works=True)
    f.api_call([], "supervisor", "complete_task", {"answer": "ann@x.com"}, None, changed=None, works=False)
    f.api_call([], "supervisor", "complete_task", {"answer": 7}, None, changed=None, works=False)
    assert f.effects == {T: {0}}


# -- D3: an answer counts only where the checks score one ----------------------------------------------

ACTION = tasks.scenario_tasks(BY_NAME["music_like_artist_songs"], 1, 2)


def test_a_skill_value_passed_as_an_unasked_answer_is_not_paid():
    """The task asks for no answer; solved inline (the cell redefines every helper), with the
    library's ``get_email()`` handed to ``complete_task`` as an answer nobody checks: paid (2, 2)."""
    first = GET_EMAIL + tasks.reference_solution(ACTION[0])
    inline = tasks.reference_solution(ACTION[1]).replace(
        "apis.supervisor.complete_task()", "apis.supervisor.complete_task(answer=get_email())"
    )
    assert "get_email()" in inline
    c, r = chain(inline, "flow", first=first, pair=ACTION)
    assert c.trajectories[1].outcome.answer_scored is False
    assert c.trajectories[1].skills_used == () and c.used_from == ((), ()) and r == UNPAID


def test_a_skill_that_does_an_action_task_is_still_paid():
    pair, first, call = expert("music_like_artist_songs")
    c, r = chain(call(1), "flow", first=first, pair=pair)
    assert "like_all_songs_by_artist" in c.trajectories[1].skills_used and r == PAID


def test_the_outcome_says_whether_an_answer_was_scored():
    import json

    from sage_rl.text import to_jsonable

    for name, scored in (("music_like_artist_songs", False), ("music_count_liked_genre", True)):
        task = tasks.scenario_tasks(BY_NAME[name], 1, 1)[0]
        world = tasks.world_for(task)
        outcome = tasks.evaluate_task(task, world.snapshot(), world)
        assert outcome.answer_scored is scored
        assert Outcome.from_dict(json.loads(json.dumps(to_jsonable(outcome)))) == outcome
    assert Outcome.from_dict({"score": 1.0, "success": True}).answer_scored is None  # an old record


# -- D4: a skill that hands back its argument provides nothing -----------------------------------------

ECHO = "def echo(x):\n    apis.supervisor.show_profile()\n    return x{how}\n"


@pytest.mark.parametrize(
    ("template", "how"),
    [
        ("music_count_liked_genre", ""),  # a small int: no atom inside an argument list
        ("music_count_liked_genre", " + 0.001"),  # within the checker's tolerance
        ("music_most_played_artist", ".upper()"),  # the checker lower-cases
        ("music_most_played_artist", " + '.'"),  # the checker strips " ."
    ],
)
def test_an_echoed_answer_is_not_paid(template, how):
    pair = tasks.scenario_tasks(BY_NAME[template], 1, 2)
    submit = "apis.supervisor.complete_task(answer=echo({answer}))"
    c, r = chain(submit, "flow", first=ECHO.format(how=how) + submit, pair=pair)
    assert c.trajectories[0].skills_saved == ("echo",)
    assert c.trajectories[1].skills_used == () and c.used_from == ((), ()) and r == UNPAID


def test_a_skill_whose_answer_is_its_own_is_still_paid():
    pair, first, call = expert("music_most_played_artist")
    c, r = chain(call(1), "flow", first=first, pair=pair)
    assert "most_played_artist" in c.trajectories[1].skills_used and r == PAID


def test_arguments_count_whole_and_as_the_checker_reads_them():
    S = ("echo", "<skill:echo>")
    cases = [
        (20, 20),
        (20, "20"),
        (20, "$20.00"),
        (4711, 4711.009),
        (59.38, 59.381),
        (True, "True"),
        ("Mira Solis", " MIRA  SOLIS. "),
        (["ann@x.com", "bo@x.com"], ["ANN@X.COM", "BO@X.COM"]),
        (["ann@x.com", "bo@x.com"], "ann@x.com, BO@x.com"),
        (["ann@x.com", "bo@x.com"], 2),  # the length of a list argument
    ]
    for given, returned in cases:
        f = FlowTracker()
        f.returned(S, f.inputs(S, [given], {}), returned, None)
        f.api_call([], "supervisor", "complete_task", {"answer": returned}, None, changed=0, works=False)
        assert f.effects == {}, (given, returned)
        # the checker takes each for the argument: the mirror of checks.normalize has not drifted
        assert checks.answers_match(returned, given) or returned == len(given), (given, returned)
    for given, returned in [(20, 21), (20, 20.02), ("Mira Solis", "Mira Solis Band"), (["a1@x.com"], 7)]:
        f = FlowTracker()
        f.returned(S, f.inputs(S, [], {"x": given}), returned, None)
        f.api_call([], "supervisor", "complete_task", {"answer": returned}, None, changed=0, works=False)
        assert f.effects == {S: {0}}, (given, returned)
    # hostile arguments: numbers past the float range, huge texts and lists cost bounded work
    assert input_keys([10**400, float("nan"), "x" * 10**6, [[1]] * 10**5], {}) == {("n", 10**7), ("n", 100)}


def test_both_executors_exclude_star_arguments(sandbox):
    """The in-process executor reads a call's arguments from its frame: ``*args`` unpacked as the
    sandbox's wrapper sees them (and no closure variables)."""
    from test_skill_flow import in_both_executors

    from sage_rl.types import skill_origin

    skills = (
        "def first(*xs, **kw):\n    apis.shop.login()\n    return xs[0]\n"
        "def named(**kw):\n    apis.shop.login()\n    return kw['v']\n"
        "def pick(i):\n    apis.shop.login()\n    return [5, 6, 7][i]\n"
    )
    cells = {
        "apis.supervisor.complete_task(answer=first(20, 30))": set(),
        "apis.supervisor.complete_task(answer=named(v=20))": set(),
        "apis.supervisor.complete_task(answer=pick(1))": {"pick"},  # 6 is not among its arguments
    }

    for cell, paid in cells.items():
        for name, result in in_both_executors(sandbox, skills, skill_origin("first"), cell).items():
            assert result.ok, result.observation
            assert {r.name for r in result.calls if r.effects} == paid, (name, cell)


# -- D6: a new docstring makes nothing -----------------------------------------------------------------


def trio(cells) -> tuple[tuple[float, ...], tuple[tuple[int, ...], ...]]:
    """Run a K = 3 chain of ``music_count_liked_genre`` with one cell per task; (rewards, used_from)."""
    from sage_rl.build import build_runner, open_suite
    from sage_rl.settings import RunConfig

    seq = tasks.scenario_tasks(BY_NAME["music_count_liked_genre"], 1, 3)
    by_task = {t.task_id: cell for t, cell in zip(seq, cells, strict=True)}

    class Script:
        renderer, name = None, "script"

        async def generate(self, request):
            return Completion(f"```python\n{by_task[request.task_id]}\n```", completion_tokens=5)

    cfg = RunConfig(
        agent={"max_steps": 1, "max_tokens_per_turn": 64, "context_limit": 4096}, worked_example=False
    )

    async def go():
        async with open_suite(cfg) as suite:
            return await build_runner(cfg, Script(), suite).run(seq, Library())

    c = asyncio.run(go())
    assert [t.outcome.success for t in c.trajectories] == [True, True, True]
    return compute_rewards(RewardKind.SKILL_INTEGRATED, ChainOutcomes.from_chain(c), None), c.used_from


SKILL = BY_NAME["music_count_liked_genre"].skill_source.strip()


def _trio(second_skill: str):
    _, first, call = expert("music_count_liked_genre", 3)
    return trio([first, f"{second_skill}\n{call(1)}", call(2)])


def test_a_skill_resaved_with_a_new_docstring_was_not_made_by_the_resaving_task():
    """Task 2 pastes task 1's skill with another docstring (and a comment, a ``pass``, another
    annotation); task 3 uses it. Task 2 was taken for its maker: task 3's use was ``(0, 1)``."""
    paste = SKILL.replace('"""Return how many', '"""Count how many').replace(
        "-> int:", "-> float:  # counted"
    )
    paste += "\n    pass"
    assert paste != SKILL and code_hash(make_skill(paste)) == code_hash(make_skill(SKILL))
    r, used_from = _trio(paste)
    # task 3's use pays task 1 alone; task 2 is paid as a user of task 1's ``login_to`` (its
    # token read the rows the answer came from), not as a maker
    assert used_from == ((), (0,), (0,)) and r == (2.0, 2.0, 2.0)


def test_a_skill_rewritten_for_real_was_made_by_the_rewriting_task():
    rewrite = SKILL.replace('"""\n', '"""\n    genre = genre.strip()\n', 1)
    assert code_hash(make_skill(rewrite)) != code_hash(make_skill(SKILL))
    r, used_from = _trio(rewrite)
    assert used_from == ((), (0,), (0, 1)) and r == (2.0, 3.0, 2.0)  # task 2: a user and a maker


def test_who_made_a_skill():
    a = make_skill('def a(x):\n    """A."""\n    return apis.m.f(x=x)')
    a_doc = make_skill('def a(x: int):\n    """Another."""\n    return apis.m.f(x=x)  # same')
    b_doc = make_skill('def b(x):\n    """B."""\n    return apis.m.f(x=x)')
    a_new = make_skill('def a(x):\n    """A."""\n    return apis.m.g(x=x)')
    start = make_skill('def s():\n    """S."""\n    return apis.m.h()')
    m = Makers([start])
    m.saved(a, 0)
    m.saved(a_doc, 1)  # a new docstring: still task 0's
    m.saved(b_doc, 2)  # the same code under another name and docstring: task 0's
    m.saved(make_skill('def s():\n    """Said again."""\n    return apis.m.h()'), 1)  # the start's: nobody's
    assert m.of(["a", "b", "s"]) == (0,)
    m.saved(a_new, 2)
    assert m.of(["a"]) == (2,) and m.of(["b"]) == (0,)
    m.saved(a, 3)  # task 0's code back
    assert m.of(["a"]) == (0,)


#: the template's skill with its locals spelled otherwise (and a docstring of its own)
RENAMED = '''def count_liked_songs_by_genre(g: str) -> int:
    """Count my liked songs of a genre."""
    t = login_to("music")
    return sum(x["genre"] == g for x in fetch_all(apis.music.show_liked_songs, access_token=t))'''


@pytest.mark.parametrize(
    ("other", "same"),
    [
        (RENAMED, True),
        # the roles of two locals swapped: other code
        (
            SKILL.replace("== genre for", "== token for").replace("access_token=token", "access_token=genre"),
            False,
        ),
        # a global (another skill) named instead of a local: other code
        (SKILL.replace('login_to("music")', 'log_in("music")'), False),
        (
            "def count_liked_songs_by_genre(genre):\n    import json as j\n    try:\n        pass\n"
            "    except ValueError as e:\n        raise e\n    return j",
            False,
        ),
    ],
)
def test_a_local_renamed_is_the_same_code(other, same):
    """A re-save that renames the skill's locals made nothing (K >= 3: it took the maker's bonus)."""
    assert (code_hash(make_skill(other)) == code_hash(make_skill(SKILL))) is same
    m = Makers([])
    m.saved(make_skill(SKILL), 0)
    m.saved(make_skill(other), 1)
    assert m.of(["count_liked_songs_by_genre"]) == ((0,) if same else (1,))


def test_locals_of_every_kind_are_spelled_by_their_order():
    a = (
        "def f(p, *rest, k=1, **kw):\n    import json as j\n    from os import path as q\n"
        "    def inner(z):\n        return z + p\n    try:\n        v = [w for w in rest]\n"
        "    except ValueError as err:\n        raise err\n    match kw:\n"
        "        case {'a': av, **others}:\n            return av, others\n        case [first, *more]:\n"
        "            return first, more\n    return j, q, inner(k), v, len, (lambda y: y)\n"
    )
    names = ["p", "rest", "k", "kw", "j", "q", "inner", "z"] + [
        "v",
        "w",
        "err",
        "av",
        "others",
        "first",
        "more",
        "y",
    ]
    b = a
    for i, n in enumerate(names):  # whole words only: the names do not occur inside one another here
        b = __import__("re").sub(rf"\b{n}\b", f"n{i}", b)
    assert b != a and code_hash(make_skill(a)) == code_hash(make_skill(b))
    # a global (``len``) is not a local: naming another global is other code
    other = a.replace("inner(k), v, len", "inner(k), v, max")
    assert code_hash(make_skill(a)) != code_hash(make_skill(other))
