"""What the task put in the world, or in a skill's keeping, stays the task's (session 41's review).

A third adversarial review of the ``flow`` credit (``/tmp/rev41``) found five ways for a two-task
chain to pay (2.0, 2.0) where task 2's own code did the work; each is run here through PocketWorld,
the sandbox and the ``ChainRunner`` and now pays (1.0, 1.0):

- **the world as a stash**: the task writes its own answer into a note, a library skill reads the
  note back and the task submits what the skill returned (``FlowTracker.api_call``: the scalars of the
  task's own writes that no skill provided are the task's, as what it hands a skill is);
- **a token named after its app**: a skill that returned ``'music'`` was found by substring inside
  every ``access_token='music-...'``, so it served every write and read the task made (``flow._texts``:
  credentials are not searched; ``flow._holds``: whole words only);
- **a callback**: ``call(lambda: box(v))`` took ``box``'s call for a skill's helper call, so ``v`` was
  not remembered and ``box()`` gave it back as the skill's (``tracking.by_task``: the caller's frame
  decides);
- **saturation**: 50,000 junk values handed to a skill filled ``given``, past which it stopped
  growing (``FlowTracker``: past the cap nothing is provided any more);
- **a time stamp**: a skill's no-op update of a note (its own title) changed only ``updated_at``,
  which the task's real update then wrote again, so the skill's change "lasted" (``checks.lasting``
  skips stamp fields).
"""

from __future__ import annotations

import pytest
from test_reward_credit import chain

from sage_rl.envs.pocketworld import checks, tasks
from sage_rl.envs.pocketworld.scenarios import BY_NAME
from sage_rl.sandbox.flow import FlowTracker, _holds, _texts

# -- by hand ----------------------------------------------------------------------------------------


def test_a_provided_string_matches_as_whole_words_and_never_inside_a_credential():
    assert _holds("Hi Mira, see you", "Mira") and _holds("Mira", "Mira") and _holds("x-Mira.", "Mira")
    assert not _holds("Hi Miranda", "Mira") and not _holds("AMira", "Mira") and not _holds("", "Mira")
    assert _holds("Miranda and Mira", "Mira")  # the second occurrence is a whole word
    texts = _texts({"access_token": "music-0af3", "password": "music pw 1", "body": "play music now"})
    assert texts == ["play music now"]


def test_the_tasks_own_write_is_the_tasks_in_later_calls():
    """A skill provides what it returns, except what the task wrote into the world itself."""
    key = ("note_text", "<skill:note_text>")
    flow = FlowTracker()
    flow.api_call([], "notes", "create_note", {"content": "17", "title": "tmp"}, {"note_id": 5}, 1, True)
    inputs = flow.inputs(key, [5], {})
    flow.returned(key, inputs, "17", None)  # the note's content read back: the task's
    flow.returned(key, inputs, "Groceries", None)  # something the task never wrote: the skill's
    assert flow.providers == {("s", "Groceries"): {key}}


def test_past_the_cap_nothing_is_provided_any_more(monkeypatch):
    import sage_rl.sandbox.flow as flow_module

    monkeypatch.setattr(flow_module, "MAX_PROVIDED", 3)
    key = ("box", "<skill:box>")
    flow = FlowTracker()
    flow.returned(key, flow.inputs(key, [["a1", "b22", "c333"]], {}), "fresh", None)
    assert ("s", "fresh") in flow.providers
    flow.inputs(key, [["d4444"]], {})  # one value more than it can remember
    flow.returned(key, flow.inputs(key, [], {}), "other", None)
    assert ("s", "other") not in flow.providers


def test_a_change_that_only_moved_a_time_stamp_does_not_last():
    s0 = {"notes": {"notes": {1: {"title": "a", "tags": [], "updated_at": "t0"}}}}
    s1 = {"notes": {"notes": {1: {"title": "a", "tags": [], "updated_at": "t1"}}}}  # a no-op title update
    s2 = {"notes": {"notes": {1: {"title": "a", "tags": ["x"], "updated_at": "t1"}}}}  # the real update
    steps = [checks.touched(s0, s1), checks.touched(s1, s2)]
    assert steps[0] == {("notes", "notes", 1, "updated_at"): "t1"}
    assert checks.lasting(steps, s0, s2) == (2,)


# -- whole chains ---------------------------------------------------------------------------------

LOGIN = (
    "email = apis.supervisor.show_profile()['email']\n"
    "pw = {p['account_name']: p['password'] for p in apis.supervisor.show_account_passwords()}\n"
    "ntok = apis.notes.login(username=email, password=pw['notes'])['access_token']\n"
    "mtok = apis.music.login(username=email, password=pw['music'])['access_token']\n"
    "songs, i = [], 0\n"
    "while True:\n"
    "    b = apis.music.show_liked_songs(access_token=mtok, page_index=i, page_limit=20)\n"
    "    songs += b\n    i += 1\n"
    "    if len(b) < 20:\n        break\n"
)
NOTE_TEXT = "def note_text(token, note_id):\n    return apis.notes.show_note(access_token=token, note_id=note_id)['content']\n"
BOX = (
    "import html\n"
    "def box(v=None):\n    apis.supervisor.show_profile()\n    kept = html.entities.html5\n"
    "    if v is not None:\n        kept['kept;'] = v\n    return kept.get('kept;')\n"
    "def call(f):\n    return f()\n"
    "def size(xs):\n    apis.supervisor.show_profile()\n    return len(xs)\n"
    "print(box(5), box(), call(box), size([1, 2]))\napis.supervisor.complete_task(answer={answer})"
)


def _genre() -> str:
    return repr(tasks.scenario_tasks(BY_NAME["music_count_liked_genre"], 1, 2)[1].spec["params"]["genre"])


def test_a_skill_that_reads_back_the_tasks_own_note_is_not_paid():
    first = (
        NOTE_TEXT + LOGIN + "first = apis.notes.show_notes(access_token=ntok)[0]['note_id']\n"
        "print(note_text(ntok, first)[:40])\napis.supervisor.complete_task(answer={answer})"
    )
    second = (
        LOGIN + f"n = sum(s['genre'] == {_genre()} for s in songs)\n"  # the task's own work
        "nid = apis.notes.create_note(access_token=ntok, title='tmp', content=str(n))['note_id']\n"
        "v = note_text(ntok, nid)\napis.notes.delete_note(access_token=ntok, note_id=nid)\n"
        "apis.supervisor.complete_task(answer=v)"
    )
    c, r = chain(second, "flow", first=first)
    assert c.trajectories[0].skills_saved == ("note_text",)
    assert c.trajectories[1].skills_used == () and r == (1.0, 1.0)


def _inline(template: str, skill: str, after: str) -> tuple[tuple, str, str]:
    """The pair of ``template``; task 1's reference solution with ``skill`` defined and called first;
    task 2's own solution (its functions renamed, so no library skill does its work) calling the
    skill right ``after`` that line."""
    pair = tasks.scenario_tasks(BY_NAME[template], 1, 2)
    ref1, ref2 = (tasks.reference_solution(t) for t in pair)
    name = skill.split("(")[0].removeprefix("def ")
    first = f"{skill}\nprint({name}())\n" + ref1
    own = ref2
    for fn in ("login_to", "fetch_all", "like_all_songs_by_artist", "most_played_artist"):
        own = own.replace(fn, f"my_{fn}")
    assert after in own
    return pair, first, own.replace(after, f"{after}\n    {name}()", 1)


@pytest.mark.parametrize(
    ("template", "skill"),
    [
        (
            "music_like_artist_songs",
            "def app_name():\n    apis.supervisor.show_profile()\n    return 'music'",
        ),
        ("music_like_artist_songs", "def accounts():\n    return apis.supervisor.show_account_passwords()"),
        (
            "music_most_played_artist",
            "def app_name():\n    apis.supervisor.show_profile()\n    return 'music'",
        ),
    ],
)
def test_a_skill_that_returned_an_apps_name_does_not_serve_the_calls_made_with_its_token(template, skill):
    """``'music'`` (a literal, or an account name in a listing) is inside every ``music-...`` token:
    the writes (like_song) and the reads the answer came from (most played) paid the skill."""
    pair, first, second = _inline(template, skill, '    token = my_login_to("music")')
    c, r = chain(second, "flow", first=first, pair=pair)
    assert c.trajectories[1].skills_used == () and r == (1.0, 1.0)


@pytest.mark.parametrize(
    "cell",
    [
        "call(lambda: box({answer}))\napis.supervisor.complete_task(answer=box())",
        "for i in range(13):\n    size(['j%d' % (i * 4096 + k) for k in range(4096)])\n"
        "box({answer})\napis.supervisor.complete_task(answer=box())",
    ],
    ids=["callback", "saturated"],
)
def test_what_the_task_gave_a_skill_is_the_tasks_however_it_was_given(cell):
    c, r = chain(cell, "flow", first=BOX)
    assert "box" in c.trajectories[0].skills_saved
    assert c.trajectories[1].skills_used == () and r == (1.0, 1.0)


TAG = '            apis.notes.update_note(access_token=token, note_id=note["note_id"], tags=note["tags"] + [tag])\n'
TOUCH = '            touch_note(token, note["note_id"], note["title"])\n'


def test_a_skills_no_op_update_before_the_tasks_real_one_is_not_paid():
    pair = tasks.scenario_tasks(BY_NAME["notes_tag_by_title_word"], 1, 2)
    ref1, ref2 = (tasks.reference_solution(t) for t in pair)
    skill = "def touch_note(token, note_id, title):\n    return apis.notes.update_note(access_token=token, note_id=note_id, title=title)\n"
    assert TAG in ref1 and TAG in ref2
    first = skill + ref1.replace(TAG, TOUCH + TAG)
    own = ref2
    for fn in ("login_to", "fetch_all", "tag_notes_by_title_word"):
        own = own.replace(fn, f"my_{fn}")
    c, r = chain(own.replace(TAG, TOUCH + TAG), "flow", first=first, pair=pair)
    assert "touch_note" in c.trajectories[0].skills_saved
    assert c.trajectories[1].skills_used == () and r == (1.0, 1.0)


KEEPER = (
    "KEPT = []\n"
    "def box(v=None):\n    apis.shop.login()\n    if v is not None:\n        KEPT.append(v)\n"
    "    return KEPT[-1] if KEPT else 0\n"
)


@pytest.mark.parametrize(
    ("cell", "paid"),
    [
        ("run(lambda: box(4711))\napis.shop.buy(item_id=box())", set()),  # the task's value, through run
        ("box(4711)\napis.shop.buy(item_id=box())", set()),
    ],
)
def test_a_value_the_task_hands_a_skill_through_a_callback_is_the_tasks_in_both_executors(
    sandbox, cell, paid
):
    from test_skill_flow import SKILLS, _effects, in_both_executors

    from sage_rl.types import skill_origin

    for name, result in in_both_executors(sandbox, SKILLS + KEEPER, skill_origin("box"), cell).items():
        assert _effects(result) == paid, (name, result.observation)
