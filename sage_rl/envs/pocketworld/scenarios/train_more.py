"""More train templates over the train apps: unlike a genre, payment friends, alarms, email clean-up, priorities."""

from __future__ import annotations

import datetime as dt

from sage_rl.envs.pocketworld.checks import Allow, Expect, Require
from sage_rl.envs.pocketworld.scenarios import helpers as h
from sage_rl.envs.pocketworld.scenarios.base import Template
from sage_rl.envs.pocketworld.scenarios.train_email import inbox, sender_name
from sage_rl.envs.pocketworld.scenarios.train_organize import items, lists

RELS = ("roommate", "family", "friend", "coworker")

# ---------------------------------------------------------------------------- unlike a genre


def _genre_liked(db, genre):
    return {s for s in h.liked(db) if db["music"]["songs"][s]["genre"] == genre}


def _unlike_sample(rng, w):
    genres = sorted({w.db["music"]["songs"][s]["genre"] for s in h.liked(w.db)})
    return {"genre": h.pick(rng, genres, "liked genre")}


def _unlike_expect(db, p):
    gone = _genre_liked(db, p["genre"])
    return Expect(
        requires=(Require("no liked song of the genre remains", lambda f: not gone & h.liked(f)),),
        allow=(Allow("music", "likes", lambda r: r["user"] == h.me(db) and r["song_id"] in gone),),
    )


UNLIKE_GENRE = Template(
    name="music_unlike_genre",
    split="train",
    apps=("music",),
    difficulty=2,
    phrasings=(
        "Remove every {genre} song from my liked songs.",
        "I'm tired of {genre}: unlike all the {genre} songs I have liked.",
        "Take all {genre} tracks out of my liked songs.",
    ),
    sample=_unlike_sample,
    expect=_unlike_expect,
    skill_source='''
def unlike_genre(genre: str) -> int:
    """Unlike every liked song whose genre is `genre`; return how many."""
    token = login_to("music")
    doomed = [s for s in fetch_all(apis.music.show_liked_songs, access_token=token) if s["genre"] == genre]
    for song in doomed:
        apis.music.unlike_song(access_token=token, song_id=song["song_id"])
    return len(doomed)
''',
    skill_names=("unlike_genre",),
    call="unlike_genre({genre!r})\napis.supervisor.complete_task()",
)

# ---------------------------------------------------------------------------- befriend a relationship on payments


def _friends(db):
    return {f["friend"] for f in db["payments"]["friends"].values() if f["user"] == h.me(db)}


def _missing(db, rel):
    return {c["email"] for c in h.contacts(db, rel)} - _friends(db)


def _friend_sample(rng, w):
    ok = [r for r in RELS if _missing(w.db, r)]
    return h.rel(h.pick(rng, ok, "relationship with non-friends"))


def _friend_expect(db, p):
    people = {c["email"] for c in h.contacts(db, p["relationship"])}
    return Expect(
        requires=(Require("all of them are payment friends", lambda f: people <= _friends(f)),),
        allow=(Allow("payments", "friends", lambda r: r["user"] == h.me(db) and r["friend"] in people),),
    )


BEFRIEND = Template(
    name="payments_befriend_relationship",
    split="train",
    apps=("phone", "payments"),
    difficulty=2,
    phrasings=(
        "Add all my {people} as friends on payments, if they aren't already.",
        "Make sure every {person} in my contacts is my friend on the payments app.",
        "On payments, befriend each of my {people} that I'm not friends with yet.",
    ),
    sample=_friend_sample,
    expect=_friend_expect,
    skill_source='''
def contact_emails(relationship: str) -> list:
    """Return the email addresses of my phone contacts with the given relationship."""
    token = login_to("phone")
    return [c["email"] for c in fetch_all(apis.phone.search_contacts, access_token=token, relationship=relationship)]


def befriend_relationship(relationship: str) -> int:
    """Add as payments friends all contacts with `relationship` who are not friends yet; return how many."""
    token = login_to("payments")
    friends = {f["email"] for f in fetch_all(apis.payments.show_friends, access_token=token)}
    added = 0
    for email in contact_emails(relationship):
        if email not in friends:
            apis.payments.add_friend(access_token=token, email=email)
            added += 1
    return added
''',
    skill_names=("contact_emails", "befriend_relationship"),
    call="befriend_relationship({relationship!r})\napis.supervisor.complete_task()",
)

# ---------------------------------------------------------------------------- create a weekday alarm

WEEKDAYS = ["mon", "tue", "wed", "thu", "fri"]


def _alarm_sample(rng, w):
    return {
        "time": f"{rng.randrange(5, 10):02d}:{rng.choice((0, 15, 30, 45)):02d}",
        "label": rng.choice(("Run", "Yoga", "Study")),
    }


def _alarm_expect(db, p):
    old = set(db["phone"]["alarms"])

    def made(f):
        new = [a for k, a in f["phone"]["alarms"].items() if k not in old]
        return (
            len(new) == 1
            and (new[0]["time"], new[0]["label"], new[0]["enabled"]) == (p["time"], p["label"], True)
            and sorted(new[0]["repeat_days"]) == sorted(WEEKDAYS)
        )

    return Expect(
        requires=(Require("one enabled weekday alarm with the label", made),),
        allow=(Allow("phone", "alarms", lambda a: a["time"] == p["time"]),),
    )


WEEKDAY_ALARM = Template(
    name="phone_weekday_alarm",
    split="train",
    apps=("phone",),
    difficulty=1,
    phrasings=(
        "Set an alarm for {time} labelled '{label}' that repeats every weekday (Monday to Friday).",
        "Create a '{label}' alarm at {time} on weekdays, Monday through Friday.",
        "I need a {time} alarm called '{label}' repeating Monday-Friday.",
    ),
    sample=_alarm_sample,
    expect=_alarm_expect,
    skill_source='''
def create_weekday_alarm(time: str, label: str) -> int:
    """Create an enabled alarm at `time` (HH:MM) labelled `label`, repeating Monday-Friday; return its id."""
    token = login_to("phone")
    days = ["mon", "tue", "wed", "thu", "fri"]
    return apis.phone.create_alarm(access_token=token, time=time, label=label, repeat_days=days)["alarm_id"]
''',
    skill_names=("create_weekday_alarm",),
    call="create_weekday_alarm({time!r}, {label!r})\napis.supervisor.complete_task()",
)

# ---------------------------------------------------------------------------- delete emails from a sender


def _del_sample(rng, w):
    return {"name": h.pick(rng, sorted({sender_name(w.db, m) for m in inbox(w.db)}), "sender")}


def _del_expect(db, p):
    ids = {m["email_id"] for m in inbox(db) if sender_name(db, m) == p["name"]}
    return Expect(
        requires=(
            Require(
                "their emails are deleted", lambda f: all(f["email"]["emails"][i]["deleted"] for i in ids)
            ),
        ),
        allow=(Allow("email", "emails", lambda m: m["email_id"] in ids),),
    )


DELETE_FROM = Template(
    name="email_delete_from_sender",
    split="train",
    apps=("email",),
    difficulty=1,
    phrasings=(
        "Delete every email from {name} in my inbox.",
        "Clear out my inbox: remove all emails sent by {name}.",
        "Get rid of all the emails {name} has sent me.",
    ),
    sample=_del_sample,
    expect=_del_expect,
    skill_source='''
def email_address_of(name: str) -> str:
    """Return the email address of the person called `name` (from the mail address book)."""
    token = login_to("email")
    return next(u["email"] for u in fetch_all(apis.email.search_addresses, access_token=token, query=name) if u["name"] == name)


def delete_emails_from(name: str) -> int:
    """Delete every inbox email sent by the person called `name`; return how many."""
    token = login_to("email")
    mails = fetch_all(apis.email.show_emails, access_token=token, sender=email_address_of(name))
    for mail in mails:
        apis.email.delete_email(access_token=token, email_id=mail["email_id"])
    return len(mails)
''',
    skill_names=("email_address_of", "delete_emails_from"),
    call="delete_emails_from({name!r})\napis.supervisor.complete_task()",
)

# ---------------------------------------------------------------------------- raise priority of tasks due soon


def _soon(db, list_name, today, days):
    end = (dt.date.fromisoformat(today) + dt.timedelta(days=days)).isoformat()
    return [
        t
        for t in items(db, list_name)
        if not t["completed"] and t["due_date"] <= end and t["priority"] != "high"
    ]


def _prio_sample(rng, w):
    today, days = w.now.date().isoformat(), rng.choice((3, 5, 7))
    ok = [n for n in sorted(lists(w.db).values()) if _soon(w.db, n, today, days)]
    return {"list": h.pick(rng, ok, "list with tasks due soon"), "days": days, "today": today}


def _prio_expect(db, p):
    ids = {t["task_id"] for t in _soon(db, p["list"], p["today"], p["days"])}
    return Expect(
        requires=(
            Require(
                "those tasks are high priority",
                lambda f: all(f["todo"]["items"][i]["priority"] == "high" for i in ids),
            ),
        ),
        allow=(Allow("todo", "items", lambda t: t["task_id"] in ids),),
    )


PRIORITIZE = Template(
    name="todo_prioritize_due_soon",
    split="train",
    apps=("todo",),
    difficulty=2,
    phrasings=(
        "Set every open task in my '{list}' list that is due within the next {days} days (or overdue) to high priority.",
        "Anything unfinished on my '{list}' list due in {days} days or less, overdue ones included, should be high priority.",
        "Raise to high priority all open '{list}' tasks whose due date is at most {days} days from today.",
    ),
    sample=_prio_sample,
    expect=_prio_expect,
    skill_source='''
def prioritize_due_soon(list_name: str, days: int) -> int:
    """Set to high priority every open task of `list_name` due at most `days` days from today; return how many."""
    from datetime import date, timedelta

    token = login_to("todo")
    end = (date.fromisoformat(apis.supervisor.show_current_time()["date"]) + timedelta(days=days)).isoformat()
    todo_list = next(x for x in fetch_all(apis.todo.show_lists, access_token=token) if x["name"] == list_name)
    count = 0
    for task in fetch_all(apis.todo.show_tasks, access_token=token, list_id=todo_list["list_id"], completed=False):
        if task["due_date"] is not None and task["due_date"] <= end and task["priority"] != "high":
            apis.todo.update_task(access_token=token, task_id=task["task_id"], priority="high")
            count += 1
    return count
''',
    skill_names=("prioritize_due_soon",),
    call="prioritize_due_soon({list!r}, {days})\napis.supervisor.complete_task()",
)

TEMPLATES = (UNLIKE_GENRE, BEFRIEND, WEEKDAY_ALARM, DELETE_FROM, PRIORITIZE)
