"""Shortcuts RL would find before the skill (issue 30, items 6-7): a no-op, a constant answer, and
acting on every item of an action task.

Every template of every split is enumerated. The no-op is played through the environment (doing
nothing; ``complete_task()`` without an answer) on every listed task of every split, and scored on
the oracle at other scenario seeds. The constant answer is measured on the oracle (``audit``)
over 21 scenarios per template (its listed one and seeds 1-20): an evaluation split lists only one
scenario (3 tasks) of each template, too few for a share.
"""

from __future__ import annotations

import pytest
from pocket import SyncEnv

from sage_rl.envs.pocketworld import tasks
from sage_rl.envs.pocketworld.audit import MAX_GUESS_SHARE, MAX_NOOP_SCORE, audit_template, best_constant
from sage_rl.envs.pocketworld.scenarios import BY_NAME, TEMPLATES
from sage_rl.envs.pocketworld.scenarios.base import COMMON_SOURCE, TaskRandom, Unsuitable
from sage_rl.envs.pocketworld.scenarios.helpers import spread
from sage_rl.types import Task


def _noop_scores(env: SyncEnv, task: Task) -> tuple[float, float]:
    """The scores of doing nothing, then of only ``complete_task()`` (no answer), on ``task``."""
    env.reset(task)
    nothing = env.evaluate().score
    assert env.execute("apis.supervisor.complete_task()", "<cell-1>").ok
    return nothing, env.evaluate().score


@pytest.mark.parametrize("split", tasks.split_names())
def test_a_noop_scores_at_most_a_tenth_on_every_task(split):
    """Every listed task (train: its seed-0 scenarios). Before issue 30 "no collateral changes"
    was half of a one-check task: 0.5 on every task."""
    env = SyncEnv()
    scores = {task.task_id: _noop_scores(env, task) for task in tasks.split_tasks(split)}
    bad = {k: v for k, v in scores.items() if max(v) > MAX_NOOP_SCORE}
    assert not bad, f"{len(bad)} tasks pay a no-op more than {MAX_NOOP_SCORE}: {sorted(bad.items())[:5]}"


#: Scenario seeds measured per template, besides the one its split lists (seed 0, or the held-out
#: seed of a train template): 63 tasks, where a constant right 1 time in 20 scores about 3.
SEEDS = range(1, 21)


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda t: f"{t.split}-{t.name}")
def test_no_constant_answer_solves_more_than_a_tenth_of_a_template(template):
    """Before issue 30 ``complete_task(answer=1)`` solved 65% of email_count_unread_from, and a
    fixed count 25-34% of seven other counting templates."""
    listed = tasks.HELDOUT_SEEDS.start if template.split == "train" else 0
    audit = audit_template(template, [listed])
    if audit.answer_tasks:  # an action template has nothing to guess; its no-op is checked below
        audit = audit_template(template, [listed, *SEEDS])
        assert audit.answer_tasks == audit.tasks == 3 * (len(SEEDS) + 1)
        assert audit.guess_share <= MAX_GUESS_SHARE, (audit.guess, audit.guess_share)
    assert audit.noop_score <= MAX_NOOP_SCORE  # on the oracle, at other seeds than the listed tasks


def test_best_constant_counts_normalised_matches():
    assert best_constant([]) == (None, 0.0)
    assert best_constant([3, "3", 4.0, "$4.00", 4, "x"]) == (4.0, 0.5)
    assert best_constant([["a", "b"], ["B", "A"], ["a"]])[1] == pytest.approx(2 / 3)


def test_spread_draws_its_target_from_the_stratum_and_the_last_resort_takes_any_answer():
    answer_of = {"a": 1, "b": 2, "c": 2, "d": 7}
    assert spread(TaskRandom(0, 0.0), (1, 2), answer_of) == "a"
    assert spread(TaskRandom(0, 0.99), (1, 2), answer_of) in ("b", "c")
    with pytest.raises(Unsuitable, match="answer 3"):
        spread(TaskRandom(0, 0.0), (3, 4), answer_of)
    assert spread(TaskRandom(0, None), (2, 5), answer_of) in ("b", "c")  # never d: outside the support


#: Cells that act on every item of an app where the task asks for some of them (audit of session 26).
BLANKET = {
    "music_like_artist_songs": "t = login_to('music')\nfor s in fetch_all(apis.music.search_songs):\n"
    "    if not apis.music.show_song(access_token=t, song_id=s['song_id'])['liked']:\n"
    "        apis.music.like_song(access_token=t, song_id=s['song_id'])",
    "email_delete_from_sender": "t = login_to('email')\nfor m in fetch_all(apis.email.show_emails, access_token=t):\n"
    "    apis.email.delete_email(access_token=t, email_id=m['email_id'])",
    "email_mark_read_from": "t = login_to('email')\nfor m in fetch_all(apis.email.show_emails, access_token=t):\n"
    "    apis.email.mark_email(access_token=t, email_id=m['email_id'], read=True)",
}


@pytest.mark.parametrize("template", sorted(BLANKET))
def test_acting_on_every_item_scores_nothing(template):
    """Liking every song, deleting every email, marking every email read meets the task's
    requirement along with everything else; it scored 0.5 (the requirement passed, only the gated
    collateral check failed), above a careful attempt that missed one target (0). Now 0."""
    env = SyncEnv()
    task = tasks.scenario_tasks(BY_NAME[template], 1, 1)[0]
    env.reset(task)
    assert env.execute(tasks.reference_solution(task), "<cell-1>").ok
    assert (env.evaluate().score, env.evaluate().success) == (1.0, True)
    env.reset(task)
    cell = f"{COMMON_SOURCE}\n{BLANKET[template]}\napis.supervisor.complete_task()"
    assert env.execute(cell, "<cell-1>").ok
    o = env.evaluate()
    assert [c.name for c in o.checks if c.passed] == [c.name for c in o.checks[:-1]]  # every requirement met
    assert not o.checks[-1].passed and "no collateral" in o.checks[-1].name
    assert (o.score, o.success) == (0.0, False)
