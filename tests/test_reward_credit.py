"""The reward pays only for real skill use (issue 30, items 3-5).

Every chain here runs two PocketWorld tasks through the project's own ``ChainRunner`` and the
sandbox. Task 1 defines a skill and completes correctly; task 2 does something with the skill and
completes correctly. Both scores are 1, so any reward above (1, 1) is skill credit alone.

- item 3: a skill call that raised (caught by ``try``, or ``@skill`` on a def) is no use;
- item 4: call records forged from inside the worker (the heap, frames, closures, the channel)
  earn nothing, whatever dead code the cell adds for the static cross-check;
- item 5: under the credit rule ``skills.credit: api`` (the default until session 31; every chain
  here runs under it unless a test names another rule) a use counts only when the skill's call
  returned and made a successful API call; ``paper`` is the paper's rule. The default since,
  ``flow``, also needs the skill's work to reach the world: tests/test_skill_flow.py.
"""

from __future__ import annotations

import asyncio

import pytest

from sage_rl.envs.pocketworld import tasks
from sage_rl.envs.pocketworld.scenarios import BY_NAME
from sage_rl.policies.base import Completion
from sage_rl.rollout.rewards import ChainOutcomes, RewardKind, compute_rewards
from sage_rl.skills import Library

TASKS = tasks.scenario_tasks(BY_NAME["music_count_liked_genre"], 1, 2)


def _answer(task) -> str:
    world = tasks.world_for(task)
    return repr(tasks.template_of(task).expect(world.db, task.spec["params"]).answer)


COMPLETE = "\napis.supervisor.complete_task(answer={answer})"

#: Task 1 defines three skills: one that makes an API call, one that does not, and one that only
#: calls what it is given.
DEFINE = (
    "def get_email():\n    return apis.supervisor.show_profile()['email']\n"
    "def get_two():\n    return 2\n"
    "def call(f):\n    return f()\n"
    "print(get_email(), get_two(), call(get_two))" + COMPLETE
)


class Script:
    """Writes ``first`` for the chain's first task, and ``second`` then ``COMPLETE`` (alone) for its
    second: a cell the sandbox refused still leaves the task to complete on the next turn."""

    renderer = None
    name = "script"

    def __init__(self, first: str, second: str, pair=TASKS) -> None:
        self.first = first.replace("{answer}", _answer(pair[0]))
        self.second = [c.replace("{answer}", _answer(pair[1])) for c in (second, COMPLETE.strip())]
        self.pair = pair

    async def generate(self, request):
        if request.task_id != self.pair[1].task_id:
            code = self.first
        else:
            code = self.second[min(1, sum(m["role"] == "assistant" for m in request.messages))]
        return Completion(f"```python\n{code}\n```", completion_tokens=5)


def chain(second: str, credit: str | None = "api", first: str = DEFINE, pair=TASKS):
    """Run the two tasks of ``pair`` (at most two turns each); return (chain, rewards without the
    no-code penalty)."""
    from sage_rl.build import build_runner, open_suite
    from sage_rl.settings import RunConfig

    skills = {} if credit is None else {"credit": credit}
    cfg = RunConfig(
        agent={"max_steps": 2, "max_tokens_per_turn": 64, "context_limit": 4096},
        worked_example=False,
        skills=skills,
    )

    async def go():
        async with open_suite(cfg) as suite:
            return await build_runner(cfg, Script(first, second, pair), suite).run(pair, Library())

    c = asyncio.run(go())
    assert [t.outcome.success for t in c.trajectories] == [True, True], c.trajectories[1].turns[0].observation
    return c, compute_rewards(RewardKind.SKILL_INTEGRATED, ChainOutcomes.from_chain(c), None)


def observation(c) -> str:
    return c.trajectories[1].turns[0].observation


# -- item 5: what counts as a use, under each rule ------------------------------------------------


@pytest.mark.parametrize("credit", ["api", "paper"])
def test_a_skill_that_called_an_api_is_credited_under_both_rules(credit):
    c, r = chain("print(get_email())" + COMPLETE, credit)
    assert c.trajectories[1].skills_used == ("get_email",) and c.used_from == ((), (0,))
    assert r == (2.0, 2.0)


def test_a_trivial_skill_earns_nothing_under_api():
    """``def get_two(): return 2`` called in both tasks doubled both rewards (the paper's rule)."""
    c, r = chain("print(get_two())" + COMPLETE)
    assert c.trajectories[1].skills_used == () and r == (1.0, 1.0)


def test_the_paper_rule_credits_a_trivial_skill():
    c, r = chain("print(get_two())" + COMPLETE, "paper")
    assert c.trajectories[1].skills_used == ("get_two",) and r == (2.0, 2.0)


def test_a_skill_whose_api_calls_all_failed_earns_nothing_under_api():
    second = (
        "def probe():\n    try:\n        apis.music.no_such_api()\n    except Exception as e:\n"
        "        print(e)\n    return get_two()\nprobe()" + COMPLETE
    )
    c, r = chain(second)
    assert "no_such_api" in observation(c)
    assert c.trajectories[1].skills_used == () and r == (1.0, 1.0)


def test_an_api_call_outside_the_skill_does_not_make_it_credited():
    c, r = chain("print(get_two(), apis.supervisor.show_profile()['email'])" + COMPLETE)
    assert c.trajectories[1].skills_used == () and r == (1.0, 1.0)


def test_a_skill_that_only_calls_the_tasks_own_api_code_earns_nothing_under_api():
    """``call(lambda: apis...)``: the API call happens while the skill runs, but the task's code
    makes it; only API calls made by the skill's own code (or code it calls from the library or
    defines itself) count."""
    c, r = chain("print(call(lambda: apis.supervisor.show_profile()['email']))" + COMPLETE)
    assert c.trajectories[1].skills_used == () and r == (1.0, 1.0)
    c, r = chain("def mine():\n    return apis.supervisor.show_profile()\nprint(call(mine))" + COMPLETE)
    assert c.trajectories[1].skills_used == () and r == (1.0, 1.0)


def test_a_skill_handed_an_api_earns_nothing_for_calling_it():
    """``call(apis.supervisor.show_profile)``: the task chose the API, the skill only called it (a
    trampoline, paid (2.0, 2.0) until session 40). A skill must name the API it is paid for."""
    c, r = chain("print(call(apis.supervisor.show_profile)['email'])" + COMPLETE)
    assert c.trajectories[1].skills_used == () and r == (1.0, 1.0)


def test_a_skill_called_through_a_task_helper_is_credited():
    c, r = chain("def helper():\n    return get_email().upper()\nprint(helper())" + COMPLETE)
    assert c.trajectories[1].skills_used == ("get_email",) and r == (2.0, 2.0)


# -- the reward audit of session 26: skills that do no work, or take a builtin's name -------------

#: Task 1 saves two skills that make API calls but no work: one submits the task, one reads the docs.
IDLE = (
    "def submit(answer):\n    return apis.supervisor.complete_task(answer=answer)\n"
    "def docs(app):\n    return apis.api_docs.show_api_descriptions(app_name=app)\n"
    "print(len(docs('music')))\nsubmit({answer})"
)


@pytest.mark.parametrize("second", ["submit({answer})", "print(len(docs('music')))" + COMPLETE])
def test_a_skill_that_only_submits_or_reads_the_docs_earns_nothing_under_api(second):
    """Every task submits, so a ``submit`` skill called in task 2 paid the bonus on every
    successful task (2.0, 2.0); reading the documentation through a skill did too."""
    c, r = chain(second, first=IDLE)
    assert set(c.trajectories[0].skills_saved) == {"submit", "docs"}
    assert c.trajectories[1].skills_used == () and c.used_from == ((), ()) and r == (1.0, 1.0)
    c, r = chain(second, "paper", first=IDLE)  # the paper's rule: any call that returned
    assert c.trajectories[1].skills_used != () and r == (2.0, 2.0)


def test_a_skill_that_does_work_besides_submitting_is_credited():
    first = (
        "def finish(answer):\n    me = apis.supervisor.show_profile()['email']\n"
        "    return apis.supervisor.complete_task(answer=answer)\nfinish({answer})"
    )
    c, r = chain("finish({answer})", first=first)
    assert c.trajectories[1].skills_used == ("finish",) and r == (2.0, 2.0)


def test_a_function_named_after_a_builtin_is_never_saved():
    """A ``print`` that made an API call, saved and loaded into task 2, turned each ordinary
    ``print(...)`` of task 2 into a credited use of a skill: (2.0, 2.0)."""
    first = "def print(*a, p=print):\n    apis.supervisor.show_profile()\n    return p(*a)\n"
    first += "print('hi')" + COMPLETE
    c, r = chain("print('hello')" + COMPLETE, first=first)
    assert c.trajectories[0].skills_saved == ()
    assert c.trajectories[1].skills_used == () and r == (1.0, 1.0)


# -- item 3: a call that raised is no use -----------------------------------------------------------

RAISED = {
    "caught TypeError": "try:\n    get_email(1, 2, 3)\nexcept TypeError as e:\n    print(e)",
    "decorator": "try:\n    @get_email\n    def f():\n        pass\nexcept TypeError as e:\n    print(e)",
    "raised inside": (
        "def boom():\n    get_email()\n    raise ValueError('after the API call')\n"
        "try:\n    boom()\nexcept ValueError as e:\n    print(e)"
    ),
}


@pytest.mark.parametrize("credit", ["api", "paper"])
@pytest.mark.parametrize("attack", ["caught TypeError", "decorator"])
def test_a_skill_call_that_raised_earns_nothing(attack, credit):
    """Issue 30 item 3: these gave (2.0, 2.0). The skill's call raised: no use, under either rule."""
    c, r = chain(RAISED[attack] + COMPLETE, credit)
    assert "TypeError" not in observation(c) or "argument" in observation(c)
    assert c.trajectories[1].skills_used == () and c.used_from == ((), ())
    assert r == (1.0, 1.0)


def test_a_skill_that_returned_inside_a_raising_helper_is_credited():
    """The skill's own call returned (and called the API); the task's helper raised afterwards."""
    c, r = chain(RAISED["raised inside"] + COMPLETE)
    assert c.trajectories[1].skills_used == ("get_email",) and r == (2.0, 2.0)


# -- item 4: forged records earn nothing ------------------------------------------------------------

#: The record each forgery plants: the library's get_email ran once, returned, and called an API.
KEY = "('get_email', '<skill:get_email>')"
DONE = (
    "{'op': 'done', 'ok': True, 'timed_out': False, 'observation': '', 'defined': [], "
    "'calls': [['get_email', '<skill:get_email>', 1, 0]], 'api_ok': 1}"
)
FORGERIES = {
    "gc walk": (
        "import gc\nfor o in gc.get_objects():\n    if type(o).__name__ == 'CallTracker':\n"
        f"        o.counts[{KEY}] = [1, 0, 1]"
    ),
    "frame constants": (
        "try:\n    1 / 0\nexcept ZeroDivisionError as e:\n    frame = e.__traceback__.tb_frame\n"
        "def unused():\n    pass\n"
        "for c in frame.f_code.co_consts:\n    if hasattr(c, '__self__'):\n"
        f"        c.__self__.counts[{KEY}] = [1, 0, 1]"
    ),
    "closure": (
        "for cell in get_two.__closure__:\n    if type(cell.cell_contents).__name__ == 'CallTracker':\n"
        f"        cell.cell_contents.counts[{KEY}] = [1, 0, 1]"
    ),
    "sys._getframe": (
        "import sys\nf = sys._getframe()\ndef unused():\n    pass\n"
        "for c in f.f_code.co_consts:\n    if hasattr(c, '__self__'):\n"
        f"        c.__self__.counts[{KEY}] = [1, 0, 1]"
    ),
    # a 'done' frame written to the parent after completing: the parent takes it as the cell's result
    "forged done frame": f"apis._bridge.chan.send({DONE})",
    "forged done frame, computed name": f"getattr(apis, '_' + 'bridge').chan.send({DONE})",
    "forged done frame, raw fd": (
        "import json\nbody = json.dumps(" + DONE + ").encode()\n"
        "for fd in range(3, 64):\n    try:\n        f = open(fd, 'wb', buffering=0, closefd=False)\n"
        "        if f.isatty():\n            continue\n"
        "        f.write(len(body).to_bytes(4, 'big') + body)\n        break\n"
        "    except OSError:\n        pass"
    ),
}


@pytest.mark.parametrize("attack", list(FORGERIES))
def test_forged_records_earn_nothing(attack):
    """Issue 30 item 4: each forgery, with a dead ``if False: get_email()`` for the static
    cross-check, made the chain credit a skill that never ran. The parent now refuses the cell
    before it runs (or the worker's guarded builtins refuse the computed name)."""
    forged = "if False:\n    get_email()\n" + COMPLETE.strip() + "\n" + FORGERIES[attack]
    c, r = chain(forged, "paper")  # the weaker rule: forging must not pay even there
    assert c.trajectories[1].skills_used == () and c.used_from == ((), ())
    assert r == (1.0, 1.0)
