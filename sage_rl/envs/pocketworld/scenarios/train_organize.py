"""Train templates over notes and todo (with music and email for cross-app tasks)."""

from __future__ import annotations

from sage_rl.envs.pocketworld.checks import Allow, Expect, Require
from sage_rl.envs.pocketworld.scenarios import helpers as h
from sage_rl.envs.pocketworld.scenarios.base import Template
from sage_rl.envs.pocketworld.scenarios.train_email import inbox, sender_name


def notes(db):
    return [n for n in db["notes"]["notes"].values() if n["owner"] == h.me(db)]


def used_tags(db):
    return sorted({t for n in notes(db) for t in n["tags"]})


def lists(db):
    return {k: v["name"] for k, v in db["todo"]["lists"].items() if v["owner"] == h.me(db)}


def items(db, list_name):
    lid = next(k for k, v in lists(db).items() if v == list_name)
    return [t for t in db["todo"]["items"].values() if t["list_id"] == lid]


# ---------------------------------------------------------------------------- count notes with a tag


def _tag_counts(db):
    return {tag: sum(tag in n["tags"] for n in notes(db)) for tag in used_tags(db)}


COUNT_TAG = Template(
    name="notes_count_tag",
    split="train",
    apps=("notes",),
    difficulty=1,
    phrasings=(
        "How many of my notes are tagged '{tag}'?",
        "Count my notes that carry the tag '{tag}'.",
        "What number of notes do I have with the '{tag}' tag?",
    ),
    sample=lambda rng, w: {"tag": h.spread(rng, h.COUNTS, _tag_counts(w.db))},
    expect=lambda db, p: Expect(answer=sum(p["tag"] in n["tags"] for n in notes(db))),
    skill_source='''
def notes_with_tag(tag: str) -> list:
    """Return all my notes (summaries) that have the tag `tag`."""
    token = login_to("notes")
    return fetch_all(apis.notes.show_notes, access_token=token, tag=tag)
''',
    skill_names=("notes_with_tag",),
    call="apis.supervisor.complete_task(answer=len(notes_with_tag({tag!r})))",
)

# ---------------------------------------------------------------------------- delete notes with a tag


def _del_expect(db, p):
    ids = {n["note_id"] for n in notes(db) if p["tag"] in n["tags"]}
    return Expect(
        requires=(Require("notes with the tag are gone", lambda f: not ids & set(f["notes"]["notes"])),),
        allow=(Allow("notes", "notes", lambda n: n["note_id"] in ids),),
    )


DELETE_TAG = Template(
    name="notes_delete_tag",
    split="train",
    apps=("notes",),
    difficulty=2,
    phrasings=(
        "Delete all my notes tagged '{tag}'.",
        "I don't need my '{tag}' notes anymore - remove every note with that tag.",
        "Get rid of each note that has the tag '{tag}'.",
    ),
    sample=lambda rng, w: {"tag": h.pick(rng, used_tags(w.db), "tag")},
    expect=_del_expect,
    skill_source='''
def delete_notes_with_tag(tag: str) -> int:
    """Delete every note of mine tagged `tag`; return how many were deleted."""
    token = login_to("notes")
    doomed = fetch_all(apis.notes.show_notes, access_token=token, tag=tag)
    for note in doomed:
        apis.notes.delete_note(access_token=token, note_id=note["note_id"])
    return len(doomed)
''',
    skill_names=("delete_notes_with_tag",),
    call="delete_notes_with_tag({tag!r})\napis.supervisor.complete_task()",
)

# ---------------------------------------------------------------------------- playlist to note


def _pl_note_expect(db, p):
    songs = db["music"]["songs"]
    lines = [songs[s]["title"] for s in h.playlists(db)[h.playlist_id(db, p["playlist"])]["song_ids"]]

    def written(f):
        mine = [n for n in notes(f) if n["title"] == p["title"]]
        return len(mine) == 1 and [x.strip() for x in mine[0]["content"].strip().splitlines()] == lines

    return Expect(
        requires=(Require("a note lists the playlist's song titles in order", written),),
        allow=(Allow("notes", "notes", lambda n: n["title"] == p["title"]),),
    )


def _pl_note_sample(rng, w):
    title = rng.choice(sorted(p["title"] for p in h.playlists(w.db).values()))
    return {"playlist": title, "title": f"{title} songs"}


PLAYLIST_NOTE = Template(
    name="notes_from_playlist",
    split="train",
    apps=("music", "notes"),
    difficulty=2,
    phrasings=(
        "Create a note titled '{title}' listing the song titles of my '{playlist}' playlist, one per line, in playlist order.",
        "Write down the songs of my '{playlist}' playlist in a new note called '{title}' (one title per line, same order).",
        "Make a note '{title}' whose content is the titles of the songs in my '{playlist}' playlist, one per line in order.",
    ),
    sample=_pl_note_sample,
    expect=_pl_note_expect,
    skill_source='''
def playlist_song_titles(playlist_title: str) -> list:
    """Return the titles of the songs in my playlist `playlist_title`, in playlist order."""
    token = login_to("music")
    playlist = next(p for p in fetch_all(apis.music.show_playlists, access_token=token) if p["title"] == playlist_title)
    return [s["title"] for s in apis.music.show_playlist(access_token=token, playlist_id=playlist["playlist_id"])["songs"]]


def note_from_playlist(playlist_title: str, note_title: str) -> int:
    """Create note `note_title` listing the song titles of playlist `playlist_title`, one per line; return its id."""
    token = login_to("notes")
    content = "\\n".join(playlist_song_titles(playlist_title))
    return apis.notes.create_note(access_token=token, title=note_title, content=content)["note_id"]
''',
    skill_names=("playlist_song_titles", "note_from_playlist"),
    call="note_from_playlist({playlist!r}, {title!r})\napis.supervisor.complete_task()",
)

# ---------------------------------------------------------------------------- count open tasks in a list


def _open(db, list_name):
    return sum(not t["completed"] for t in items(db, list_name))


COUNT_OPEN = Template(
    name="todo_count_open",
    split="train",
    apps=("todo",),
    difficulty=1,
    phrasings=(
        "How many unfinished tasks are in my '{list}' to-do list?",
        "Count the open items on my '{list}' list in the todo app.",
        "How many things are still left to do on my '{list}' list?",
    ),
    sample=lambda rng, w: {
        "list": h.spread(rng, h.COUNTS, {n: _open(w.db, n) for n in lists(w.db).values()})
    },
    expect=lambda db, p: Expect(answer=_open(db, p["list"])),
    skill_source='''
def open_tasks(list_name: str) -> list:
    """Return the unfinished tasks of my to-do list called `list_name`."""
    token = login_to("todo")
    todo_list = next(x for x in fetch_all(apis.todo.show_lists, access_token=token) if x["name"] == list_name)
    return fetch_all(apis.todo.show_tasks, access_token=token, list_id=todo_list["list_id"], completed=False)
''',
    skill_names=("open_tasks",),
    call="apis.supervisor.complete_task(answer=len(open_tasks({list!r})))",
)

# ---------------------------------------------------------------------------- complete overdue tasks


def _overdue_sample(rng, w):
    today = w.now.date().isoformat()
    ok = [
        n
        for n in sorted(lists(w.db).values())
        if any(not t["completed"] and t["due_date"] < today for t in items(w.db, n))
    ]
    return {"list": h.pick(rng, ok, "list with overdue tasks"), "today": today}


def _overdue_expect(db, p):
    ids = {t["task_id"] for t in items(db, p["list"]) if not t["completed"] and t["due_date"] < p["today"]}
    return Expect(
        requires=(
            Require("overdue tasks are done", lambda f: all(f["todo"]["items"][i]["completed"] for i in ids)),
        ),
        allow=(Allow("todo", "items", lambda t: t["task_id"] in ids),),
    )


COMPLETE_OVERDUE = Template(
    name="todo_complete_overdue",
    split="train",
    apps=("todo",),
    difficulty=2,
    phrasings=(
        "Mark every open task in my '{list}' list that was due before today as done.",
        "I've caught up on my '{list}' list: check off all the overdue tasks.",
        "In the todo app, complete all unfinished tasks of my '{list}' list whose due date has passed.",
    ),
    sample=_overdue_sample,
    expect=_overdue_expect,
    skill_source='''
def complete_overdue_tasks(list_name: str) -> int:
    """Mark done every open task of list `list_name` due before today; return how many."""
    token = login_to("todo")
    today = apis.supervisor.show_current_time()["date"]
    todo_list = next(x for x in fetch_all(apis.todo.show_lists, access_token=token) if x["name"] == list_name)
    count = 0
    for task in fetch_all(apis.todo.show_tasks, access_token=token, list_id=todo_list["list_id"], completed=False):
        if task["due_date"] is not None and task["due_date"] < today:
            apis.todo.mark_task_done(access_token=token, task_id=task["task_id"])
            count += 1
    return count
''',
    skill_names=("complete_overdue_tasks",),
    call="complete_overdue_tasks({list!r})\napis.supervisor.complete_task()",
)

# ---------------------------------------------------------------------------- unread emails to tasks


def _mail_task_sample(rng, w):
    names = sorted(
        {
            sender_name(w.db, m)
            for m in inbox(w.db)
            if not m["read"] and m["sender"] in w.db["payments"]["users"]
        }
    )
    return {"name": h.pick(rng, names, "unread person"), "list": rng.choice(sorted(lists(w.db).values()))}


def _mail_task_expect(db, p):
    want = sorted(
        f"Reply to: {m['subject']}" for m in inbox(db) if not m["read"] and sender_name(db, m) == p["name"]
    )
    old = set(db["todo"]["items"])
    lid = next(k for k, v in lists(db).items() if v == p["list"])

    def added(f):
        new = [t for k, t in f["todo"]["items"].items() if k not in old]
        return sorted(t["title"] for t in new if t["list_id"] == lid) == want and len(new) == len(want)

    return Expect(
        requires=(Require("one task per unread email, in the list", added),),
        allow=(Allow("todo", "items", lambda t: t["list_id"] == lid),),
    )


EMAILS_TO_TASKS = Template(
    name="todo_from_unread_emails",
    split="train",
    apps=("email", "todo"),
    difficulty=3,
    phrasings=(
        "For each unread email from {name}, add a task 'Reply to: <subject>' to my '{list}' list.",
        "Turn every unread email {name} sent me into a to-do in my '{list}' list titled 'Reply to: ' plus the subject.",
        "Add one task per unread email from {name} to the '{list}' list, named 'Reply to: <email subject>'.",
    ),
    sample=_mail_task_sample,
    expect=_mail_task_expect,
    skill_source='''
def email_address_of(name: str) -> str:
    """Return the email address of the person called `name` (from the mail address book)."""
    token = login_to("email")
    return next(u["email"] for u in fetch_all(apis.email.search_addresses, access_token=token, query=name) if u["name"] == name)


def tasks_from_unread_emails(name: str, list_name: str) -> int:
    """Add a task 'Reply to: <subject>' to list `list_name` for each unread email from `name`; return how many."""
    mail_token, todo_token = login_to("email"), login_to("todo")
    mails = fetch_all(apis.email.show_emails, access_token=mail_token, sender=email_address_of(name), unread_only=True)
    todo_list = next(x for x in fetch_all(apis.todo.show_lists, access_token=todo_token) if x["name"] == list_name)
    for mail in mails:
        apis.todo.add_task(access_token=todo_token, list_id=todo_list["list_id"], title="Reply to: " + mail["subject"])
    return len(mails)
''',
    skill_names=("email_address_of", "tasks_from_unread_emails"),
    call="tasks_from_unread_emails({name!r}, {list!r})\napis.supervisor.complete_task()",
)

TEMPLATES = (COUNT_TAG, DELETE_TAG, PLAYLIST_NOTE, COUNT_OPEN, COMPLETE_OVERDUE, EMAILS_TO_TASKS)
