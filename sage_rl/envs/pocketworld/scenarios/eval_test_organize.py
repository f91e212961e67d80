"""test_normal templates over email, notes and todo (with phone): unseen scenarios over the train apps."""

from __future__ import annotations

import datetime as dt

from sage_rl.envs.pocketworld.checks import Allow, Expect, Require
from sage_rl.envs.pocketworld.scenarios import helpers as h
from sage_rl.envs.pocketworld.scenarios.base import Template
from sage_rl.envs.pocketworld.scenarios.train_email import inbox, sender_name
from sage_rl.envs.pocketworld.scenarios.train_organize import lists, notes

# ---------------------------------------------------------------------------- reply to unread emails


def _reply_sample(rng, w):
    names = sorted(
        {
            sender_name(w.db, m)
            for m in inbox(w.db)
            if not m["read"] and m["sender"] in w.db["payments"]["users"]
        }
    )
    return {
        "name": h.pick(rng, names, "unread person"),
        "body": rng.choice(("Thanks, got it!", "Will get back to you soon.")),
    }


def _reply_expect(db, p):
    ids = {m["email_id"] for m in inbox(db) if not m["read"] and sender_name(db, m) == p["name"]}
    old = set(db["email"]["emails"])

    def done(f):
        new = [m for k, m in f["email"]["emails"].items() if k not in old]
        return sorted(m["reply_to"] for m in new if m["body"] == p["body"]) == sorted(ids) and len(
            new
        ) == len(ids)

    return Expect(
        requires=(
            Require("each unread email got the reply", done),
            Require(
                "those emails are marked read", lambda f: all(f["email"]["emails"][i]["read"] for i in ids)
            ),
        ),
        allow=(Allow("email", "emails", lambda m: m["email_id"] in ids or m.get("reply_to") in ids),),
    )


REPLY_UNREAD = Template(
    name="email_reply_unread_from",
    split="test_normal",
    apps=("email",),
    difficulty=2,
    phrasings=(
        "Reply '{body}' to every unread email from {name}, then mark those emails as read.",
        "Answer each unread email {name} sent me with '{body}' and mark them read.",
        "For all unread emails from {name}: reply with the text '{body}' and set them to read.",
    ),
    sample=_reply_sample,
    expect=_reply_expect,
    skill_source='''
def email_address_of(name: str) -> str:
    """Return the email address of the person called `name` (from the mail address book)."""
    token = login_to("email")
    return next(u["email"] for u in fetch_all(apis.email.search_addresses, access_token=token, query=name) if u["name"] == name)


def reply_to_unread_from(name: str, body: str) -> int:
    """Reply `body` to every unread email from `name` and mark each read; return how many."""
    token = login_to("email")
    mails = fetch_all(apis.email.show_emails, access_token=token, sender=email_address_of(name), unread_only=True)
    for mail in mails:
        apis.email.reply_to_email(access_token=token, email_id=mail["email_id"], body=body)
        apis.email.mark_email(access_token=token, email_id=mail["email_id"], read=True)
    return len(mails)
''',
    skill_names=("email_address_of", "reply_to_unread_from"),
    call="reply_to_unread_from({name!r}, {body!r})\napis.supervisor.complete_task()",
)

# ---------------------------------------------------------------------------- tag notes by title word


def _tag_targets(db, word, tag):
    return {n["note_id"] for n in notes(db) if word in n["title"].lower() and tag not in n["tags"]}


def _tag_sample(rng, w):
    words = sorted({x for n in notes(w.db) for x in n["title"].lower().split() if len(x) > 3})
    word, tag = h.pick(rng, words, "title word"), rng.choice(("review", "archive", "important"))
    if not _tag_targets(w.db, word, tag):
        raise h.Unsuitable("nothing to tag")
    return {"word": word, "tag": tag}


def _tag_expect(db, p):
    ids = _tag_targets(db, p["word"], p["tag"])
    before = {i: db["notes"]["notes"][i]["tags"] for i in ids}

    def tagged(f):
        return all(sorted(f["notes"]["notes"][i]["tags"]) == sorted([*before[i], p["tag"]]) for i in ids)

    return Expect(
        requires=(Require("the tag was added, other tags kept", tagged),),
        allow=(Allow("notes", "notes", lambda n: n["note_id"] in ids),),
    )


TAG_BY_TITLE = Template(
    name="notes_tag_by_title_word",
    split="test_normal",
    apps=("notes",),
    difficulty=2,
    phrasings=(
        "Add the tag '{tag}' to every note whose title contains the word '{word}', keeping their other tags.",
        "Tag all my notes with '{word}' in the title as '{tag}' (don't remove existing tags).",
        "Every note with '{word}' in its title should also get the '{tag}' tag.",
    ),
    sample=_tag_sample,
    expect=_tag_expect,
    skill_source='''
def tag_notes_by_title_word(word: str, tag: str) -> int:
    """Add `tag` to every note whose title contains `word` (case-insensitive), keeping other tags; return how many."""
    token = login_to("notes")
    count = 0
    for note in fetch_all(apis.notes.show_notes, access_token=token, query=word):
        if word.lower() in note["title"].lower() and tag not in note["tags"]:
            apis.notes.update_note(access_token=token, note_id=note["note_id"], tags=note["tags"] + [tag])
            count += 1
    return count
''',
    skill_names=("tag_notes_by_title_word",),
    call="tag_notes_by_title_word({word!r}, {tag!r})\napis.supervisor.complete_task()",
)

# ---------------------------------------------------------------------------- family birthday reminders


def _next_birthday(bday, today):
    b, t = dt.date.fromisoformat(bday), dt.date.fromisoformat(today)
    nxt = b.replace(year=t.year)
    return (nxt if nxt >= t else b.replace(year=t.year + 1)).isoformat()


def _bday_expect(db, p):
    want = sorted(
        (f"Call {c['first_name']}", _next_birthday(c["birthday"], p["today"]))
        for c in h.contacts(db, p["relationship"])
    )
    lid, old = next(k for k, v in lists(db).items() if v == p["list"]), set(db["todo"]["items"])

    def added(f):
        new = [t for k, t in f["todo"]["items"].items() if k not in old]
        return (
            all(t["list_id"] == lid for t in new) and sorted((t["title"], t["due_date"]) for t in new) == want
        )

    return Expect(
        requires=(Require("one 'Call <name>' task per person, due on the next birthday", added),),
        allow=(Allow("todo", "items", lambda t: t["list_id"] == lid),),
    )


BIRTHDAY_TASKS = Template(
    name="todo_birthday_calls",
    split="test_normal",
    apps=("phone", "todo"),
    difficulty=3,
    phrasings=(
        "For each of my {relationship} contacts, add a task 'Call <first name>' to my '{list}' list, due on their next birthday.",
        "Remind me to call every {person} on their birthday: add 'Call <first name>' tasks to '{list}', due on the upcoming birthday.",
        "Put a task named 'Call <first name>' in my '{list}' list for each {person}, with the due date set to their next birthday.",
    ),
    sample=lambda rng, w: {
        **h.rel(rng.choice(("family", "roommate"))),
        "list": rng.choice(sorted(lists(w.db).values())),
        "today": w.now.date().isoformat(),
    },  # fmt: skip
    expect=_bday_expect,
    skill_source='''
def next_birthday(birthday: str, today: str) -> str:
    """Return the next date (today or later) on which a YYYY-MM-DD `birthday` falls."""
    from datetime import date

    b, t = date.fromisoformat(birthday), date.fromisoformat(today)
    nxt = b.replace(year=t.year)
    return (nxt if nxt >= t else b.replace(year=t.year + 1)).isoformat()


def add_birthday_call_tasks(relationship: str, list_name: str) -> int:
    """Add 'Call <first name>' to `list_name`, due on the next birthday, for each contact with `relationship`."""
    phone_token, todo_token = login_to("phone"), login_to("todo")
    today = apis.supervisor.show_current_time()["date"]
    todo_list = next(x for x in fetch_all(apis.todo.show_lists, access_token=todo_token) if x["name"] == list_name)
    people = fetch_all(apis.phone.search_contacts, access_token=phone_token, relationship=relationship)
    for c in people:
        due = next_birthday(c["birthday"], today)
        apis.todo.add_task(access_token=todo_token, list_id=todo_list["list_id"], title="Call " + c["first_name"], due_date=due)
    return len(people)
''',
    skill_names=("next_birthday", "add_birthday_call_tasks"),
    call="add_birthday_call_tasks({relationship!r}, {list!r})\napis.supervisor.complete_task()",
)

# ---------------------------------------------------------------------------- unread emails from a relationship


#: Unread emails from a whole relationship: sums over several senders, so a wider range than COUNTS.
UNREAD_TOTALS = tuple(range(1, 31))


def _unread_rel(db, rel):
    people = {c["email"] for c in h.contacts(db, rel)}
    return sum(not m["read"] and m["sender"] in people for m in inbox(db))


UNREAD_RELATION = Template(
    name="email_unread_from_relationship",
    split="test_normal",
    apps=("phone", "email"),
    difficulty=2,
    phrasings=(
        "How many unread emails from my {people} are in my inbox?",
        "Count the unread inbox emails sent by people who are my {people}.",
        "What's the total number of unread emails I have from {people}?",
    ),
    sample=lambda rng, w: h.rel(
        h.spread(rng, UNREAD_TOTALS, {r: _unread_rel(w.db, r) for r in ("family", "friend", "coworker")})
    ),
    expect=lambda db, p: Expect(answer=_unread_rel(db, p["relationship"])),
    skill_source='''
def contact_emails(relationship: str) -> list:
    """Return the email addresses of my phone contacts with the given relationship."""
    token = login_to("phone")
    return [c["email"] for c in fetch_all(apis.phone.search_contacts, access_token=token, relationship=relationship)]


def count_unread_from_relationship(relationship: str) -> int:
    """Return how many unread inbox emails come from contacts with `relationship`."""
    token = login_to("email")
    people = set(contact_emails(relationship))
    return sum(m["sender"] in people for m in fetch_all(apis.email.show_emails, access_token=token, unread_only=True))
''',
    skill_names=("contact_emails", "count_unread_from_relationship"),
    call="apis.supervisor.complete_task(answer=count_unread_from_relationship({relationship!r}))",
)

TEMPLATES = (REPLY_UNREAD, TAG_BY_TITLE, BIRTHDAY_TASKS, UNREAD_RELATION)
