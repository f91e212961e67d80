"""A skill's world change pays under ``flow`` only if it lasted to the end of the task.

``Outcome.lasting`` (PocketWorld: ``checks.lasting``) names the episode's changes that touched a
row still different at the end from the start; ``CallRecord.reached`` reads it. Worked by hand,
then whole chains through PocketWorld, the sandbox and the ``ChainRunner``.
"""

from __future__ import annotations

import pytest

from sage_rl.envs.pocketworld import checks, tasks
from sage_rl.envs.pocketworld.scenarios import BY_NAME
from sage_rl.types import CallRecord, Outcome

# -- which changes lasted, by hand -------------------------------------------------------------------


def test_a_change_lasts_when_a_field_still_holds_what_it_put_there():
    """Five changes of a notes table, worked by hand (each state a fresh copy, as the env keeps them)."""
    s0 = {"notes": {"notes": {1: {"t": "a", "p": 1}, 2: {"t": "b", "p": 1}}}}
    s1 = {"notes": {"notes": {1: {"t": "A", "p": 1}, 2: {"t": "b", "p": 1}}}}  # 1: note 1's title edited
    s2 = {"notes": {"notes": {1: {"t": "A", "p": 1}, 2: {"t": "b", "p": 5}}}}  # 2: note 2's priority set to 5
    s3 = {
        "notes": {"notes": {1: {"t": "a", "p": 1}, 2: {"t": "b", "p": 5}, 3: {"t": "c"}}}
    }  # 3: 1 back, 3 made
    s4 = {"notes": {"notes": {1: {"t": "a", "p": 1}, 2: {"t": "b", "p": 9}, 3: {"t": "c"}, 4: {"t": "d"}}}}
    s5 = {
        "notes": {"notes": {1: {"t": "a", "p": 1}, 2: {"t": "b", "p": 9}, 3: {"t": "c"}}}
    }  # 5: note 4 deleted
    # 4: note 2's priority set again (to 9) and note 4 made
    states = [s0, s1, s2, s3, s4, s5]
    steps = [checks.touched(a, b) for a, b in zip(states, states[1:], strict=False)]
    assert steps[0] == {("notes", "notes", 1, "t"): "A"}
    assert steps[4] == {("notes", "notes", 4, "t"): checks.ABSENT}
    # 1: title changed back by 3 -> no; 2: priority 5 overwritten by 9 -> no; 3: note 3 still there -> yes;
    # 4: priority 9 still there -> yes (note 4 is gone, one field is enough); 5: deleted what the start lacked -> no
    assert checks.lasting(steps, s0, s5) == (3, 4)
    assert checks.lasting([], s0, s5) == ()
    assert checks.lasting(steps, s0, s0) == ()
    # deleting what the start had lasts
    gone = {"notes": {"notes": {2: {"t": "b", "p": 1}}}}
    assert checks.lasting([checks.touched(s0, gone)], s0, gone) == (1,)


def test_a_record_reached_the_world_for_good_only_through_a_lasting_change_or_the_answer():
    write = CallRecord("s", "<skill:s>", 1, 0, 1, effects=2, changes=(2, 5))
    answer = CallRecord("s", "<skill:s>", 1, 0, 1, effects=2, changes=(2,))  # event 0 too: the answer
    assert write.reached(None) and write.reached((5,)) and write.reached((1, 2))
    assert not write.reached(()) and not write.reached((1, 3, 4))
    assert answer.reached(()) and answer.reached(None)
    assert not CallRecord("s", "<skill:s>", 1, 0, 1).reached(None)  # no effects at all
    # written before lasting changes: effects without changes, which count whatever lasted
    old = CallRecord.from_dict(
        {"name": "s", "origin": "<skill:s>", "calls": 1, "errors": 0, "with_api": 1, "effects": 3}
    )
    assert old.changes == () and old.reached(())
    assert CallRecord.from_dict({**write.__dict__, "changes": [2, 5]}) == write


def test_an_outcome_keeps_its_lasting_changes_through_json():
    import json

    from sage_rl.text import to_jsonable

    for outcome in (Outcome(1.0, True, (), (1, 3)), Outcome(1.0, True, (), ()), Outcome(0.5, False)):
        assert Outcome.from_dict(json.loads(json.dumps(to_jsonable(outcome)))) == outcome
    assert Outcome.from_dict({"score": 1.0, "success": True}).lasting is None  # an old record


# -- whole chains -----------------------------------------------------------------------------------

LIKE = tasks.scenario_tasks(BY_NAME["music_like_artist_songs"], 1, 2)
ARTIST = LIKE[1].spec["params"]["artist"]
#: another artist of task 2's world, with songs not liked yet: liking theirs there is collateral
OTHER = "Echo Valley"

#: The task's own login and listing (no library skill in them).
OWN = (
    "email = apis.supervisor.show_profile()['email']\n"
    "pw = {p['account_name']: p['password'] for p in apis.supervisor.show_account_passwords()}['music']\n"
    "t = apis.music.login(username=email, password=pw)['access_token']\n"
    "def songs(name):\n"
    "    a = [x for x in apis.music.search_artists(query=name, page_limit=20) if x['name'] == name][0]\n"
    "    return [s['song_id'] for s in apis.music.search_songs(artist_id=a['artist_id'], page_limit=20)]\n"
    "def liked(sid):\n"
    "    return apis.music.show_song(access_token=t, song_id=sid)['liked']\n"
)
INLINE = (
    f"for sid in songs({ARTIST!r}):\n"
    "    if not liked(sid):\n"
    "        apis.music.like_song(access_token=t, song_id=sid)\n"
    "apis.supervisor.complete_task()"
)
SKILL = "like_all_songs_by_artist"
SKILL_AND_HELPERS = ("fetch_all", SKILL, "login_to")


@pytest.mark.parametrize(
    ("second", "api_used", "flow_used"),
    [
        # the skill does the task: its likes last
        (
            f"like_all_songs_by_artist({ARTIST!r})\napis.supervisor.complete_task()",
            SKILL_AND_HELPERS,
            SKILL_AND_HELPERS,
        ),
        # the skill likes the other artist's songs, the task unlikes them again and does its own work
        # inline: the task succeeds, the skill's changes did not last
        (
            OWN
            + f"before = {{sid: liked(sid) for sid in songs({OTHER!r})}}\n"
            + f"like_all_songs_by_artist({OTHER!r})\n"
            + "for sid, was in before.items():\n"
            + "    if not was:\n"
            + "        apis.music.unlike_song(access_token=t, song_id=sid)\n"
            + INLINE,
            SKILL_AND_HELPERS,
            (),
        ),
    ],
)
def test_a_chain_pays_under_flow_only_for_changes_that_lasted(second, api_used, flow_used):
    from test_reward_credit import chain

    first = tasks.reference_solution(LIKE[0])
    for credit, used in (("api", api_used), ("flow", flow_used)):
        c, r = chain(second, credit, first=first, pair=LIKE)
        assert c.trajectories[1].skills_used == used, credit
        assert r == ((2.0, 2.0) if used else (1.0, 1.0)), credit
        second_task = c.trajectories[1]
        made = {
            e for t in second_task.turns for r in t.result.calls or () for e in r.changes if r.name == SKILL
        }
        assert made, "the skill changed nothing"
        lasting = set(second_task.outcome.lasting)
        assert made <= lasting if flow_used else made.isdisjoint(lasting), (made, lasting)


def test_a_workers_event_list_is_checked_before_it_becomes_a_record():
    from sage_rl.sandbox.protocol import ProtocolError
    from sage_rl.sandbox.session import MAX_EVENTS, _record

    row = ["f", "<skill:f>", 1, 0, 1]
    assert _record([*row, [3, 0, 3]]) == CallRecord("f", "<skill:f>", 1, 0, 1, effects=2, changes=(3,))
    assert _record([*row, []]) == CallRecord("f", "<skill:f>", 1, 0, 1)
    for events in (2, [-1], [1.0], [True], ["1"], [0] * (MAX_EVENTS + 1), None):
        with pytest.raises(ProtocolError, match="malformed call record"):
            _record([*row, events])
