"""Dev templates: unseen scenarios over the train apps."""

from __future__ import annotations

import datetime as dt

from sage_rl.envs.pocketworld import pools
from sage_rl.envs.pocketworld.checks import Allow, Expect, Require
from sage_rl.envs.pocketworld.scenarios import helpers as h
from sage_rl.envs.pocketworld.scenarios.base import Template
from sage_rl.envs.pocketworld.scenarios.train_organize import items, lists, notes, used_tags

# ---------------------------------------------------------------------------- follow a playlist's artists


def _follow_expect(db, p):
    songs = db["music"]["songs"]
    artists = {songs[s]["artist_id"] for s in h.playlists(db)[h.playlist_id(db, p["playlist"])]["song_ids"]}

    def following(f):
        return artists <= {r["artist_id"] for r in f["music"]["follows"].values() if r["user"] == h.me(f)}

    return Expect(
        requires=(Require("every artist of the playlist is followed", following),),
        allow=(
            Allow("music", "follows", lambda r: r["artist_id"] in artists),
            Allow("music", "artists", lambda a: a["artist_id"] in artists),
        ),
    )


FOLLOW_ARTISTS = Template(
    name="music_follow_playlist_artists",
    split="dev",
    apps=("music",),
    difficulty=2,
    phrasings=(
        "Follow every artist who has a song in my '{playlist}' playlist, unless I already follow them.",
        "Make sure I follow all the artists that appear in my '{playlist}' playlist.",
        "Go through my '{playlist}' playlist and follow each of its artists I'm not following yet.",
    ),
    sample=lambda rng, w: {"playlist": rng.choice(sorted(p["title"] for p in h.playlists(w.db).values()))},
    expect=_follow_expect,
    skill_source='''
def follow_playlist_artists(playlist_title: str) -> int:
    """Follow every artist with a song in my playlist `playlist_title` that I don't follow yet; return how many."""
    token = login_to("music")
    playlist = next(p for p in fetch_all(apis.music.show_playlists, access_token=token) if p["title"] == playlist_title)
    songs = apis.music.show_playlist(access_token=token, playlist_id=playlist["playlist_id"])["songs"]
    followed = {a["artist_id"] for a in fetch_all(apis.music.show_following_artists, access_token=token)}
    new = sorted({s["artist_id"] for s in songs} - followed)
    for artist_id in new:
        apis.music.follow_artist(access_token=token, artist_id=artist_id)
    return len(new)
''',
    skill_names=("follow_playlist_artists",),
    call="follow_playlist_artists({playlist!r})\napis.supervisor.complete_task()",
)

# ---------------------------------------------------------------------------- largest payment recipient


def _largest(db):
    sent = [t for t in db["payments"]["transactions"].values() if t["sender"] == h.me(db)]
    if not sent:
        raise h.Unsuitable("no payments sent")
    best = max(t["amount"] for t in sent)
    if sum(t["amount"] == best for t in sent) != 1:
        raise h.Unsuitable("tie")
    return h.name_of(db, next(t["receiver"] for t in sent if t["amount"] == best))


def _largest_sample(rng, w):
    _largest(w.db)
    return {}


LARGEST_PAYMENT = Template(
    name="payments_largest_payment_recipient",
    split="dev",
    apps=("payments",),
    difficulty=1,
    phrasings=(
        "Who did I send my largest payment to on payments? Give their full name.",
        "What is the full name of the person who received the biggest payment I ever sent on payments?",
        "Find my single largest outgoing payment and tell me the recipient's full name.",
    ),
    sample=_largest_sample,
    expect=lambda db, p: Expect(answer=_largest(db)),
    skill_source='''
def largest_payment_recipient() -> str:
    """Return the full name of the receiver of my largest sent payment."""
    token = login_to("payments")
    sent = fetch_all(apis.payments.show_transactions, access_token=token, direction="sent")
    best = max(sent, key=lambda t: t["amount"])
    user = next(u for u in fetch_all(apis.payments.search_users, query=best["receiver"]) if u["email"] == best["receiver"])
    return user["name"]
''',
    skill_names=("largest_payment_recipient",),
    call="apis.supervisor.complete_task(answer=largest_payment_recipient())",
)

# ---------------------------------------------------------------------------- last text from a contact


def _last_text(db, name):
    c = next(c for c in h.contacts(db) if h.full_name(c) == name)
    got = sorted(
        (m["sent_at"], m["message_id"], m["message"])
        for m in db["phone"]["messages"].values()
        if m["sender"] == c["phone_number"]
    )
    if not got:
        raise h.Unsuitable("no texts")
    return got[-1][2]


def _last_text_sample(rng, w):
    senders = {m["sender"] for m in w.db["phone"]["messages"].values()}
    names = sorted(h.full_name(c) for c in h.contacts(w.db) if c["phone_number"] in senders)
    return {"name": h.spread(rng, pools.TEXT_LINES, {n: _last_text(w.db, n) for n in names})}


LAST_TEXT = Template(
    name="phone_last_text_from",
    split="dev",
    apps=("phone",),
    difficulty=1,
    phrasings=(
        "What did {name} last text me? Give me the exact message.",
        "Tell me the most recent text message {name} sent me, word for word.",
        "What was the latest message I received from {name} on my phone?",
    ),
    sample=_last_text_sample,
    expect=lambda db, p: Expect(answer=_last_text(db, p["name"])),
    skill_source='''
def find_contact(full_name: str) -> dict:
    """Return my phone contact whose 'first_name last_name' equals `full_name`."""
    token = login_to("phone")
    matches = fetch_all(apis.phone.search_contacts, access_token=token, query=full_name.split()[0])
    return next(c for c in matches if f"{c['first_name']} {c['last_name']}" == full_name)


def last_text_from(full_name: str) -> str:
    """Return the newest text message that the contact `full_name` sent me."""
    token = login_to("phone")
    number = find_contact(full_name)["phone_number"]
    messages = fetch_all(apis.phone.show_text_messages, access_token=token, phone_number=number)
    return next(m["message"] for m in messages if m["sender"] == number)
''',
    skill_names=("find_contact", "last_text_from"),
    call="apis.supervisor.complete_task(answer=last_text_from({name!r}))",
)

# ---------------------------------------------------------------------------- star emails by subject keyword

KEYWORDS = ("report", "trip", "invoice", "meeting", "dinner", "budget", "newsletter", "order")


def _star_ids(db, word):
    return {m["email_id"] for m in db["email"]["emails"].values()
            if m["folder"] == "inbox" and not m["deleted"] and word in m["subject"].lower() and not m["starred"]}  # fmt: skip


def _star_sample(rng, w):
    return {"keyword": h.pick(rng, [k for k in KEYWORDS if _star_ids(w.db, k)], "keyword")}


def _star_expect(db, p):
    ids = _star_ids(db, p["keyword"])
    return Expect(
        requires=(
            Require(
                "matching emails are starred", lambda f: all(f["email"]["emails"][i]["starred"] for i in ids)
            ),
        ),
        allow=(Allow("email", "emails", lambda m: m["email_id"] in ids),),
    )


STAR_KEYWORD = Template(
    name="email_star_subject_keyword",
    split="dev",
    apps=("email",),
    difficulty=2,
    phrasings=(
        "Star every email in my inbox whose subject mentions '{keyword}'.",
        "Put a star on all inbox emails with '{keyword}' in the subject line.",
        "Find the inbox emails whose subject contains the word '{keyword}' and star them.",
    ),
    sample=_star_sample,
    expect=_star_expect,
    skill_source='''
def star_emails_with_subject_word(word: str) -> int:
    """Star every inbox email whose subject contains `word` (case-insensitive); return how many."""
    token = login_to("email")
    count = 0
    for mail in fetch_all(apis.email.show_emails, access_token=token, query=word):
        if word.lower() in mail["subject"].lower() and not mail["starred"]:
            apis.email.mark_email(access_token=token, email_id=mail["email_id"], starred=True)
            count += 1
    return count
''',
    skill_names=("star_emails_with_subject_word",),
    call="star_emails_with_subject_word({keyword!r})\napis.supervisor.complete_task()",
)

# ---------------------------------------------------------------------------- pin notes with a tag


def _pin_expect(db, p):
    ids = {n["note_id"] for n in notes(db) if p["tag"] in n["tags"] and not n["pinned"]}
    return Expect(
        requires=(
            Require("tagged notes are pinned", lambda f: all(f["notes"]["notes"][i]["pinned"] for i in ids)),
        ),
        allow=(Allow("notes", "notes", lambda n: n["note_id"] in ids),),
    )


def _pin_sample(rng, w):
    ok = [t for t in used_tags(w.db) if any(t in n["tags"] and not n["pinned"] for n in notes(w.db))]
    return {"tag": h.pick(rng, ok, "tag with unpinned notes")}


PIN_TAG = Template(
    name="notes_pin_tag",
    split="dev",
    apps=("notes",),
    difficulty=1,
    phrasings=(
        "Pin every note tagged '{tag}' that isn't pinned yet.",
        "Make sure all my '{tag}' notes are pinned.",
        "Pin all of my notes that have the tag '{tag}'.",
    ),
    sample=_pin_sample,
    expect=_pin_expect,
    skill_source='''
def pin_notes_with_tag(tag: str) -> int:
    """Pin every unpinned note of mine tagged `tag`; return how many."""
    token = login_to("notes")
    unpinned = fetch_all(apis.notes.show_notes, access_token=token, tag=tag, pinned=False)
    for note in unpinned:
        apis.notes.pin_note(access_token=token, note_id=note["note_id"], pinned=True)
    return len(unpinned)
''',
    skill_names=("pin_notes_with_tag",),
    call="pin_notes_with_tag({tag!r})\napis.supervisor.complete_task()",
)

# ---------------------------------------------------------------------------- count open tasks by priority


def _prio_count(db, prio):
    return sum(not t["completed"] and t["priority"] == prio for n in lists(db).values() for t in items(db, n))


PRIORITY_COUNT = Template(
    name="todo_count_priority",
    split="dev",
    apps=("todo",),
    difficulty=2,
    phrasings=(
        "How many open {priority}-priority tasks do I have across all my to-do lists?",
        "Count my unfinished tasks with {priority} priority over every list.",
        "Across all of my lists, how many {priority}-priority items are not done yet?",
    ),
    sample=lambda rng, w: {
        "priority": h.spread(rng, h.COUNTS, {p: _prio_count(w.db, p) for p in ("low", "medium", "high")})
    },
    expect=lambda db, p: Expect(answer=_prio_count(db, p["priority"])),
    skill_source='''
def count_open_tasks_by_priority(priority: str) -> int:
    """Return how many unfinished tasks with `priority` I have across all my to-do lists."""
    token = login_to("todo")
    total = 0
    for todo_list in fetch_all(apis.todo.show_lists, access_token=token):
        tasks = fetch_all(apis.todo.show_tasks, access_token=token, list_id=todo_list["list_id"], completed=False)
        total += sum(t["priority"] == priority for t in tasks)
    return total
''',
    skill_names=("count_open_tasks_by_priority",),
    call="apis.supervisor.complete_task(answer=count_open_tasks_by_priority({priority!r}))",
)

# ---------------------------------------------------------------------------- postpone upcoming tasks


def _upcoming(db, list_name, today, days):
    end = (dt.date.fromisoformat(today) + dt.timedelta(days=days)).isoformat()
    return [t for t in items(db, list_name) if not t["completed"] and today <= t["due_date"] <= end]


def _post_sample(rng, w):
    today, days = w.now.date().isoformat(), rng.choice((3, 5, 7))
    ok = [n for n in sorted(lists(w.db).values()) if _upcoming(w.db, n, today, days)]
    return {"list": h.pick(rng, ok, "list with upcoming tasks"), "days": days, "today": today}


def _post_expect(db, p):
    want = {t["task_id"]: (dt.date.fromisoformat(t["due_date"]) + dt.timedelta(days=7)).isoformat()
            for t in _upcoming(db, p["list"], p["today"], p["days"])}  # fmt: skip
    return Expect(
        requires=(
            Require(
                "due dates moved by a week",
                lambda f: all(f["todo"]["items"][k]["due_date"] == d for k, d in want.items()),
            ),
        ),
        allow=(Allow("todo", "items", lambda t: t["task_id"] in want),),
    )


POSTPONE = Template(
    name="todo_postpone_upcoming",
    split="dev",
    apps=("todo",),
    difficulty=3,
    phrasings=(
        "Push back by one week the due date of every open task in my '{list}' list that is due within the next {days} days (today included).",
        "I'm swamped: postpone all unfinished '{list}' tasks due in the next {days} days (including today) by 7 days.",
        "For open tasks on my '{list}' list due between today and {days} days from now, move the due date a week later.",
    ),
    sample=_post_sample,
    expect=_post_expect,
    skill_source='''
def postpone_upcoming_tasks(list_name: str, days: int, by_days: int = 7) -> int:
    """Move by `by_days` the due date of open tasks in `list_name` due from today to `days` days ahead; return how many."""
    from datetime import date, timedelta

    token = login_to("todo")
    today = date.fromisoformat(apis.supervisor.show_current_time()["date"])
    end = today + timedelta(days=days)
    todo_list = next(x for x in fetch_all(apis.todo.show_lists, access_token=token) if x["name"] == list_name)
    count = 0
    for task in fetch_all(apis.todo.show_tasks, access_token=token, list_id=todo_list["list_id"], completed=False):
        due = date.fromisoformat(task["due_date"]) if task["due_date"] else None
        if due is not None and today <= due <= end:
            new_due = (due + timedelta(days=by_days)).isoformat()
            apis.todo.update_task(access_token=token, task_id=task["task_id"], due_date=new_due)
            count += 1
    return count
''',
    skill_names=("postpone_upcoming_tasks",),
    call="postpone_upcoming_tasks({list!r}, {days})\napis.supervisor.complete_task()",
)

# ---------------------------------------------------------------------------- total of pending requests


def _pending_total(db):
    pend = [
        r["amount"]
        for r in db["payments"]["requests"].values()
        if r["payer"] == h.me(db) and r["status"] == "pending"
    ]
    if not pend:
        raise h.Unsuitable("no pending requests")
    return round(sum(pend), 2)


def _pt_sample(rng, w):
    _pending_total(w.db)
    return {}


PENDING_TOTAL = Template(
    name="payments_pending_requests_total",
    split="dev",
    apps=("payments",),
    difficulty=1,
    phrasings=(
        "How much would I pay in total if I approved all pending payment requests addressed to me?",
        "What's the sum of all the pending money requests people sent me on payments?",
        "Add up the amounts of every pending payment request I have received. What is the total?",
    ),
    sample=_pt_sample,
    expect=lambda db, p: Expect(answer=_pending_total(db)),
    skill_source='''
def pending_requests_total() -> float:
    """Return the total amount of pending payment requests addressed to me."""
    token = login_to("payments")
    pending = fetch_all(apis.payments.show_payment_requests, access_token=token, direction="received", status="pending")
    return round(sum(r["amount"] for r in pending), 2)
''',
    skill_names=("pending_requests_total",),
    call="apis.supervisor.complete_task(answer=pending_requests_total())",
)

TEMPLATES = (
    FOLLOW_ARTISTS,
    LARGEST_PAYMENT,
    LAST_TEXT,
    STAR_KEYWORD,
    PIN_TAG,
    PRIORITY_COUNT,
    POSTPONE,
    PENDING_TOTAL,
)
