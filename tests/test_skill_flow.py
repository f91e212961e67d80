"""The ``flow`` skill credit: a skill is paid only when its work reached the world (sandbox/flow.py).

Worked by hand: the FlowTracker alone, then both executors (the sandbox's worker and the in-process
one) over a small shop world whose state has a fingerprint, then whole chains of PocketWorld tasks
through the project's ``ChainRunner``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from sage_rl.sandbox.flow import MAX_ATOMS, FlowTracker, atoms
from sage_rl.types import ExecResult, skill_origin

# -- atoms -------------------------------------------------------------------------------------------


def test_atoms_are_the_identifying_leaves_of_plain_values():
    value = {
        "id": 4711,
        "name": "Ann",
        "tags": ["x", "ok", "vip", 1, 0, True, None, 2.5, 999, 1000.0],
        "n": (7, {}),
    }
    # strings of 3+ characters, integers of 1000+, other finite numbers; small ids and counts are not
    assert atoms(value) == {("n", 4711.0), ("s", "Ann"), ("s", "vip"), ("n", 2.5), ("n", 1000.0)}
    assert atoms(3) == set() and atoms(3, whole=True) == {("n", 3.0)} and atoms(-1500) == {("n", -1500.0)}
    assert atoms(True) == set() and atoms(False, whole=True) == {("b", False)}
    assert atoms("a", whole=True) == {("s", "a")} and atoms(float("nan"), whole=True) == set()


def test_atoms_walk_only_builtin_containers_and_stop_at_the_cap():
    class Sneaky(dict):
        def values(self):  # never called: agent-defined methods must not run
            raise AssertionError("ran agent code")

    class Text(str):
        pass

    assert atoms([Sneaky(a="hidden"), Text("sub"), "kept"]) == {("s", "kept")}
    big = [f"item-{i}" for i in range(3 * MAX_ATOMS)]
    assert 0 < len(atoms(big)) < MAX_ATOMS


# -- the tracker, by hand ----------------------------------------------------------------------------

S, T, U = ("find", "<skill:find>"), ("token", "<skill:token>"), ("other", "<skill:other>")


def test_a_returned_value_counts_when_it_reaches_a_write_or_the_answer():
    f = FlowTracker()
    f.returned(S, f.inputs(S, ["lamp"], {}), {"id": 4711, "name": "lamp"}, None)
    f.api_call([], "shop", "search", {"query": "x"}, [], changed=0, works=True)  # a read: no sink
    assert f.effects == {}
    f.api_call([], "shop", "buy", {"item_id": 4711}, None, changed=1, works=True)
    assert f.effects == {S: {1}}
    f.start_cell()  # effects are per cell; providers are not
    f.api_call([], "supervisor", "complete_task", {"answer": "4711"}, None, changed=0, works=False)
    assert f.effects == {}  # the answer "4711" is a string: not the number 4711
    f.api_call([], "supervisor", "complete_task", {"answer": 4711}, None, changed=0, works=False)
    assert f.effects == {S: {0}}


def test_a_returned_argument_is_not_the_skills_to_provide():
    f = FlowTracker()
    f.returned(S, f.inputs(S, ["lamp"], {"k": 9999}), {"name": "lamp", "k": 9999, "id": 1212, "n": 12}, None)
    f.api_call([], "shop", "buy", {"name": "lamp", "k": 9999, "n": 12}, None, changed=1, works=True)
    assert f.effects == {}
    f.api_call([], "shop", "buy", {"item_id": 1212}, None, changed=1, works=True)
    assert f.effects == {S: {1}}


def test_a_small_scalar_counts_only_as_a_whole_returned_value_and_strings_match_inside_text():
    f = FlowTracker()
    f.returned(S, set(), 1, None)
    f.api_call([], "shop", "buy", {"qty": 1}, None, changed=1, works=True)
    assert f.effects == {}  # 1 inside arguments identifies nothing
    f.api_call([], "supervisor", "complete_task", {"answer": 1}, None, changed=0, works=False)
    assert f.effects == {S: {0}}  # the whole answer
    f.start_cell()
    f.returned(T, set(), "Ann Lee", None)
    f.api_call([], "mail", "send", {"body": "Dear Ann Lee, hello"}, None, changed=1, works=True)
    assert f.effects == {T: {1}}


def test_a_change_made_by_a_skill_is_its_effect_and_its_servers():
    f = FlowTracker()
    f.returned(T, set(), "tok-123", S)  # token returned inside find: token served find
    f.api_call([S], "shop", "buy", {"item_id": 5}, None, changed=1, works=True)
    assert f.effects == {S: {1}, T: {1}}
    f.start_cell()
    f.api_call([S], "shop", "touch", {}, None, changed=0, works=True)  # a call that changed nothing
    assert f.effects == {}


def test_values_flow_through_the_tasks_own_reads_and_through_a_skills_reads():
    f = FlowTracker()
    f.returned(T, set(), "tok-123", None)
    # the task logs in through the skill and reads with the token: the ids it gets carry the token's provider
    f.api_call([], "shop", "search", {"token": "tok-123"}, [{"id": 7700}], changed=0, works=True)
    f.api_call([], "shop", "buy", {"item_id": 7700}, None, changed=1, works=True)
    assert f.effects == {T: {1}}
    f.start_cell()
    f.returned(U, set(), "tok-999", None)
    f.api_call([S], "shop", "search", {"token": "tok-999"}, [{"id": 8800}], changed=0, works=True)
    assert f.effects == {} and f.served[S] == {U}  # find's read used other's token
    f.returned(S, set(), 88, None)
    f.api_call([], "supervisor", "complete_task", {"answer": 88}, None, changed=0, works=False)
    assert f.effects == {S: {0}, U: {0}}


def test_the_last_source_of_a_value_owns_it():
    """A listing skill called and ignored while the task reads the same data itself: the task's read
    takes the values back; a skill called after the task's read takes them again (a stated limit)."""
    f = FlowTracker()
    listing = [{"email": "ann@x.com", "id": 1}, {"email": "bo@x.com", "id": 2}]
    f.returned(S, set(), listing, None)
    f.api_call([], "mail", "contacts", {}, listing, changed=0, works=True)  # the task's own read
    f.api_call([], "mail", "send", {"to": "ann@x.com"}, None, changed=1, works=True)
    assert f.effects == {}
    f.returned(S, set(), listing, None)
    f.api_call([], "mail", "send", {"to": "bo@x.com"}, None, changed=1, works=True)
    assert f.effects == {S: {1}}


def test_without_a_fingerprint_every_working_call_is_a_sink_and_an_effect():
    f = FlowTracker()
    f.returned(T, set(), "tok-123", None)
    f.api_call([], "shop", "search", {"token": "tok-123"}, [], changed=None, works=True)
    f.api_call([S], "shop", "search", {}, [], changed=None, works=True)
    f.api_call([U], "api_docs", "show", {}, [], changed=None, works=False)
    assert f.effects == {T: {0}, S: {0}}


# -- both executors ----------------------------------------------------------------------------------


@dataclass
class Shop:
    """A world with reads (``login``, ``search``), a write (``buy``), a write that changes nothing
    when the item is already bought (``buy`` again), and the answer."""

    bought: list[int] = field(default_factory=list)
    answer: Any = None

    def dispatch(self, app: str, api: str, kwargs: dict[str, Any]) -> Any:
        if (app, api) == ("shop", "login"):
            return {"token": "tok-5f3a"}
        if (app, api) == ("shop", "search"):
            if kwargs.get("token") != "tok-5f3a":
                raise ValueError("401: bad token")
            return [{"id": 4711, "name": "lamp"}, {"id": 4712, "name": "desk"}]
        if (app, api) == ("shop", "buy"):
            if kwargs.get("item_id") not in self.bought:
                self.bought.append(kwargs.get("item_id"))
            return {"ok": True}
        if (app, api) == ("supervisor", "complete_task"):
            self.answer = kwargs.get("answer")
            return None
        raise ValueError(f"404: {app}.{api}")

    def fingerprint(self) -> tuple[int, ...]:
        return tuple(self.bought)


SKILLS = (
    "def token():\n    return apis.shop.login()['token']\n"
    "def find(name):\n    return [i for i in apis.shop.search(token=token()) if i['name'] == name][0]['id']\n"
    "def buy(name):\n    return apis.shop.buy(item_id=find(name))\n"
    "def run(f):\n    return f()\n"
)

#: cell -> skills with effects (the value of each skill's ``effects`` record > 0), worked by hand
CASES = {
    "find('desk')\napis.shop.buy(item_id=4711)": set(),  # called and ignored; the task buys by a literal
    # values match by value: a literal equal to what the skill returned counts (a stated limit)
    "find('lamp')\napis.shop.buy(item_id=4711)": {"find", "token"},
    "x = find('lamp')\napis.shop.buy(item_id=x)": {"find", "token"},  # its value bought; token served find
    "buy('lamp')": {"buy", "find", "token"},  # a change made inside buy
    "apis.shop.buy(item_id=4711)\nbuy('lamp')": set(),  # buy's call changed nothing: bought already
    "t = token()\nids = apis.shop.search(token=t)\napis.shop.buy(item_id=ids[0]['id'])": {"token"},
    "apis.supervisor.complete_task(answer=find('desk'))": {"find", "token"},
    "print(find('lamp'))": set(),  # shown, never used
    "run(lambda: apis.shop.buy(item_id=4711))": set(),  # the task's code changed the world, not run's
    # buy's code made the change while run was open (run called the task's lambda, which called buy):
    # both are paid, as ``with_api`` passes buy's API call on to run
    "run(lambda: buy('desk'))": {"run", "buy", "find", "token"},
}


def _effects(result) -> set[str]:
    return {r.name for r in result.calls if r.effects > 0}


def in_both_executors(sandbox, skills: str, origin: str, cell: str) -> dict[str, ExecResult]:
    """``skills`` loaded as a library cell (``origin``), then ``cell``, each in a fresh ``Shop``:
    through the sandbox and through the in-process executor (``{"sandboxed": ..., "in_process": ...}``)."""
    from sage_rl.envs.pocketworld.executor import InProcessExecutor

    async def sandboxed(world: Shop) -> ExecResult:
        session = await sandbox.acquire(world.dispatch, world.fingerprint)
        try:
            await session.execute(skills, origin)
            return await session.execute(cell, "<cell-0>")
        finally:
            await session.close()

    async def in_process(world: Shop) -> ExecResult:
        ex = InProcessExecutor(world.dispatch, world.fingerprint)
        await ex.execute(skills, origin)
        return await ex.execute(cell, "<cell-0>")

    return {run.__name__: asyncio.run(run(Shop())) for run in (sandboxed, in_process)}


@pytest.mark.parametrize("cell", list(CASES))
def test_both_executors_follow_the_values_the_same_way(sandbox, cell):
    changes = []
    for name, result in in_both_executors(sandbox, SKILLS, skill_origin("buy"), cell).items():
        assert result.ok, result.observation
        assert _effects(result) == CASES[cell], name
        changes.append({r.name: r.changes for r in result.calls})
    assert changes[0] == changes[1]  # the same world changes, numbered alike


def test_a_value_returned_in_one_cell_counts_when_a_later_cell_uses_it(sandbox):
    world = Shop()

    async def go():
        session = await sandbox.acquire(world.dispatch, world.fingerprint)
        try:
            await session.execute(SKILLS, skill_origin("buy"))
            first = await session.execute("x = find('desk')\nprint(x)", "<cell-0>")
            return first, await session.execute("apis.shop.buy(item_id=x)", "<cell-1>")
        finally:
            await session.close()

    first, second = asyncio.run(go())
    assert _effects(first) == set() and _effects(second) == {"find", "token"}
    assert {r.name: r.calls for r in second.calls} == {"find": 0, "token": 0}  # rows for effects alone
    assert world.bought == [4712]


# -- whole chains: PocketWorld, the sandbox, the ChainRunner ------------------------------------------


def _expert_first() -> str:
    """Task 1 as the scripted expert writes it: the shared helpers, the template's skill, the answer."""
    from sage_rl.envs.pocketworld.scenarios import BY_NAME
    from sage_rl.envs.pocketworld.scenarios.base import COMMON_SOURCE

    skill = BY_NAME["music_count_liked_genre"].skill_source
    return f"{COMMON_SOURCE}\n{skill}\napis.supervisor.complete_task(answer=count_liked_songs_by_genre('hip-hop'))"


HELPERS = ("count_liked_songs_by_genre", "fetch_all", "login_to")


@pytest.mark.parametrize(
    ("second", "api_used", "flow_used"),
    [
        # the skill's value is the answer: paid, with the helpers that served it
        ("apis.supervisor.complete_task(answer=count_liked_songs_by_genre('classical'))", HELPERS, HELPERS),
        # printed, then typed again as the answer on the next turn: the same value, paid
        ("print(count_liked_songs_by_genre('classical'))", HELPERS, HELPERS),
        # called with arguments that make it useless (0 songs), ignored, the answer typed in: not paid
        ("print('checking')\ncount_liked_songs_by_genre('no-such-genre')", HELPERS, ()),
        # a token fetched and shown, the answer typed in: not paid
        ("print(login_to('music')[:4])", ("login_to",), ()),
    ],
)
def test_a_chain_pays_under_flow_only_when_the_skills_work_reached_the_world(second, api_used, flow_used):
    from test_reward_credit import chain

    first = _expert_first()
    for credit, used in (("api", api_used), ("flow", flow_used)):
        c, r = chain(second, credit, first=first)
        assert set(c.trajectories[0].skills_saved) >= set(HELPERS)
        assert c.trajectories[1].skills_used == used, credit
        assert r == ((2.0, 2.0) if used else (1.0, 1.0)), credit


def test_a_skill_called_for_nothing_pays_under_api_but_not_under_flow():
    from test_reward_credit import COMPLETE, chain

    c, r = chain("print(get_email())" + COMPLETE, "api")
    assert c.trajectories[1].skills_used == ("get_email",) and r == (2.0, 2.0)
    c, r = chain("print(get_email())" + COMPLETE, "flow")
    assert c.trajectories[1].skills_used == () and r == (1.0, 1.0)


def test_the_length_of_a_returned_container_counts_whole():
    """``len(notes_with_tag('health'))`` submitted as the answer: the expert's commonest use of a
    listing skill (12 of 120 expert chains went unpaid before lengths counted)."""
    f = FlowTracker()
    f.returned(S, set(), [{"id": 1}, {"id": 2}, {"id": 3}], None)
    f.api_call([], "supervisor", "complete_task", {"answer": 2}, None, changed=0, works=False)
    assert f.effects == {}
    f.api_call([], "supervisor", "complete_task", {"answer": 3}, None, changed=0, works=False)
    assert f.effects == {S: {0}}


def test_a_read_made_with_a_skills_token_passes_its_results_length_on():
    """The SFT model's ``answer = len(open_tasks('Work'))``, ``open_tasks`` its own function reading
    ``show_tasks(access_token=get_access_token('todo'), completed=False)``: the answer is the length
    of a read the library's token helper made possible (2 of 244 bonuses in runs/laptop30 before)."""
    f = FlowTracker()
    f.returned(T, set(), "tok-123", None)
    f.api_call([], "todo", "show_tasks", {"access_token": "tok-123"}, [{"id": 1}] * 8, changed=0, works=True)
    f.api_call([], "supervisor", "complete_task", {"answer": 8}, None, changed=0, works=False)
    assert f.effects == {T: {0}}
    f.start_cell()
    f.api_call([], "todo", "show_tasks", {"access_token": "tok-own"}, [{"id": 1}] * 8, changed=0, works=True)
    f.api_call([], "supervisor", "complete_task", {"answer": 8}, None, changed=0, works=False)
    assert f.effects == {}  # read again with a token of the task's own: the 8 is the task's


def test_a_value_passed_to_a_skill_that_changes_the_world_counts():
    """``text_people_by_email(recent_payment_senders(3), msg)`` (a reference solution): the senders'
    emails choose whom the second skill texts, by phone number, so they never reach the write
    itself; the second skill's change is the first one's effect too."""
    f = FlowTracker()
    f.returned(T, set(), ["ann@x.com", "bo@x.com"], None)
    f.inputs(S, [["ann@x.com", "bo@x.com"], "Thanks!"], {})
    f.api_call([S], "phone", "send_text", {"phone": "+1-555-0101"}, None, changed=1, works=True)
    assert f.effects == {S: {1}, T: {1}}


def test_what_api_pays_for_and_flow_does_not():
    """A submit wrapper that also reads the profile: the answer is the task's own, the read changes
    nothing."""
    from test_reward_credit import chain

    first = (
        "def finish(answer):\n    me = apis.supervisor.show_profile()['email']\n"
        "    return apis.supervisor.complete_task(answer=answer)\nfinish({answer})"
    )
    second = "finish({answer})"
    c, r = chain(second, "api", first=first)
    assert c.trajectories[1].skills_used != () and r == (2.0, 2.0)
    c, r = chain(second, "flow", first=first)
    assert c.trajectories[1].skills_used == () and r == (1.0, 1.0)


def test_hostile_values_cost_bounded_work_and_never_raise():
    """Agent code decides what skills return and what API calls carry: numbers past the float range,
    huge and self-containing containers, subclasses with methods of their own."""
    loop: list = []
    loop.append(loop)
    assert atoms(10**400) == set() and atoms(10**400, whole=True) == set() and atoms(-(2**60)) == set()
    assert atoms(loop) == set() and atoms(float("inf"), whole=True) == set()
    assert len(atoms(list(range(10**6)))) < MAX_ATOMS  # a million ints: at most MAX_ATOMS looked at
    f = FlowTracker()
    f.returned(S, f.inputs(S, [10**400, loop], {"x": 10**500}), [10**400, loop, "x" * 10**6], None)
    f.api_call([], "shop", "buy", {"n": 10**400, "t": "y" * 10**6}, None, changed=1, works=True)
    assert f.effects == {}
