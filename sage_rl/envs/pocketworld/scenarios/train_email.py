"""Train templates over the email app."""

from __future__ import annotations

from sage_rl.envs.pocketworld.checks import Allow, Expect, Require
from sage_rl.envs.pocketworld.scenarios import helpers as h
from sage_rl.envs.pocketworld.scenarios.base import Template

RELS = ("roommate", "family", "friend", "coworker")


def inbox(db):
    return [m for m in db["email"]["emails"].values() if m["folder"] == "inbox" and not m["deleted"]]


def sender_name(db, m):
    return db["email"]["users"][m["sender"]]["name"]


# ---------------------------------------------------------------------------- count unread from a person


def _unread_sample(rng, w):
    names = sorted({sender_name(w.db, m) for m in inbox(w.db) if not m["read"]})
    return {"name": h.pick(rng, names, "unread sender")}


def _unread_counts(db):
    counts = {}
    for m in inbox(db):
        if not m["read"]:
            counts[sender_name(db, m)] = counts.get(sender_name(db, m), 0) + 1
    return counts


def _count_unread_sample(rng, w):
    return {"name": h.spread(rng, h.COUNTS, _unread_counts(w.db))}


COUNT_UNREAD = Template(
    name="email_count_unread_from",
    split="train",
    apps=("email",),
    difficulty=1,
    phrasings=(
        "How many unread emails do I have from {name}?",
        "Count the emails from {name} in my inbox that I haven't read yet.",
        "What's the number of unread messages from {name} in my email inbox?",
    ),
    sample=_count_unread_sample,
    expect=lambda db, p: Expect(
        answer=sum(not m["read"] and sender_name(db, m) == p["name"] for m in inbox(db))
    ),
    skill_source='''
def email_address_of(name: str) -> str:
    """Return the email address of the person called `name` (from the mail address book)."""
    token = login_to("email")
    return next(u["email"] for u in fetch_all(apis.email.search_addresses, access_token=token, query=name) if u["name"] == name)


def count_unread_from(name: str) -> int:
    """Return how many unread inbox emails I have from the person called `name`."""
    token = login_to("email")
    sender = email_address_of(name)
    return len(fetch_all(apis.email.show_emails, access_token=token, sender=sender, unread_only=True))
''',
    skill_names=("email_address_of", "count_unread_from"),
    call="apis.supervisor.complete_task(answer=count_unread_from({name!r}))",
)

# ---------------------------------------------------------------------------- email a relationship

SUBJECTS = (("Party on Saturday", "Come over at 7pm!"), ("Quick update", "I moved to a new apartment."),
            ("Hiking trip", "Who is in for a hike next weekend?"))  # fmt: skip


def _mail_rel_expect(db, p):
    people, old = {c["email"] for c in h.contacts(db, p["relationship"])}, set(db["email"]["emails"])

    def sent(f):
        new = [m for k, m in f["email"]["emails"].items() if k not in old]
        good = [m for m in new if m["subject"] == p["subject"] and m["body"] == p["body"]]
        got = [r for m in good for r in m["recipients"]]
        return len(good) == len(new) and sorted(got) == sorted(people)

    return Expect(
        requires=(Require("each person received the email exactly once", sent),),
        allow=(Allow("email", "emails", lambda m: m["folder"] == "sent" and set(m["recipients"]) <= people),),
    )


def _mail_rel_sample(rng, w):
    subject, body = rng.choice(SUBJECTS)
    return {**h.rel(rng.choice(RELS)), "subject": subject, "body": body}


EMAIL_RELATION = Template(
    name="email_relationship",
    split="train",
    apps=("phone", "email"),
    difficulty=2,
    phrasings=(
        "Email all my {people} with the subject '{subject}' and the message '{body}'.",
        "Send an email titled '{subject}' saying '{body}' to every {person} in my contacts.",
        "Write to my {people} by email: subject '{subject}', body '{body}'.",
    ),
    sample=_mail_rel_sample,
    expect=_mail_rel_expect,
    skill_source='''
def contact_emails(relationship: str) -> list:
    """Return the email addresses of my phone contacts with the given relationship."""
    token = login_to("phone")
    return [c["email"] for c in fetch_all(apis.phone.search_contacts, access_token=token, relationship=relationship)]


def email_relationship(relationship: str, subject: str, body: str) -> int:
    """Send one email with `subject` and `body` to all contacts with `relationship`; return how many recipients."""
    token = login_to("email")
    recipients = contact_emails(relationship)
    apis.email.send_email(access_token=token, recipients=recipients, subject=subject, body=body)
    return len(recipients)
''',
    skill_names=("contact_emails", "email_relationship"),
    call="email_relationship({relationship!r}, {subject!r}, {body!r})\napis.supervisor.complete_task()",
)

# ---------------------------------------------------------------------------- forward an email to a relationship


def _fwd_sample(rng, w):
    by_key = {}
    for m in inbox(w.db):
        by_key.setdefault((m["subject"], m["sender"]), []).append(m)
    unique = sorted(k for k, v in by_key.items() if len(v) == 1 and k[1] in w.db["payments"]["users"])
    subject, sender = h.pick(rng, unique, "unique email")
    return {
        "subject": subject,
        "sender_name": w.db["email"]["users"][sender]["name"],
        **h.rel(rng.choice(RELS)),
    }


def _fwd_expect(db, p):
    people, old = {c["email"] for c in h.contacts(db, p["relationship"])}, set(db["email"]["emails"])
    want = f"Fwd: {p['subject']}"

    def sent(f):
        new = [m for k, m in f["email"]["emails"].items() if k not in old]
        got = [r for m in new if m["subject"] == want for r in m["recipients"]]
        return len(new) == len([m for m in new if m["subject"] == want]) and sorted(got) == sorted(people)

    return Expect(
        requires=(Require("the email was forwarded to each person once", sent),),
        allow=(Allow("email", "emails", lambda m: m["folder"] == "sent" and set(m["recipients"]) <= people),),
    )


FORWARD_RELATION = Template(
    name="email_forward_to_relationship",
    split="train",
    apps=("phone", "email"),
    difficulty=3,
    phrasings=(
        "Forward the email '{subject}' from {sender_name} to all my {people}.",
        "My {people} should see the '{subject}' email {sender_name} sent me - forward it to them.",
        "Find the email with subject '{subject}' from {sender_name} and forward it to every {person} of mine.",
    ),
    sample=_fwd_sample,
    expect=_fwd_expect,
    skill_source='''
def contact_emails(relationship: str) -> list:
    """Return the email addresses of my phone contacts with the given relationship."""
    token = login_to("phone")
    return [c["email"] for c in fetch_all(apis.phone.search_contacts, access_token=token, relationship=relationship)]


def email_address_of(name: str) -> str:
    """Return the email address of the person called `name` (from the mail address book)."""
    token = login_to("email")
    return next(u["email"] for u in fetch_all(apis.email.search_addresses, access_token=token, query=name) if u["name"] == name)


def forward_email_to_relationship(subject: str, sender_name: str, relationship: str) -> int:
    """Forward the inbox email with `subject` from `sender_name` to all contacts with `relationship`."""
    token = login_to("email")
    sender = email_address_of(sender_name)
    mails = fetch_all(apis.email.show_emails, access_token=token, sender=sender)
    mail = next(m for m in mails if m["subject"] == subject)
    recipients = contact_emails(relationship)
    apis.email.forward_email(access_token=token, email_id=mail["email_id"], recipients=recipients)
    return len(recipients)
''',
    skill_names=("contact_emails", "email_address_of", "forward_email_to_relationship"),
    call="forward_email_to_relationship({subject!r}, {sender_name!r}, {relationship!r})\napis.supervisor.complete_task()",
)

# ---------------------------------------------------------------------------- mark all from a sender read


def _read_expect(db, p):
    ids = {m["email_id"] for m in inbox(db) if sender_name(db, m) == p["name"] and not m["read"]}
    return Expect(
        requires=(
            Require("those emails are read", lambda f: all(f["email"]["emails"][i]["read"] for i in ids)),
        ),
        allow=(Allow("email", "emails", lambda m: m["email_id"] in ids),),
    )


MARK_READ = Template(
    name="email_mark_read_from",
    split="train",
    apps=("email",),
    difficulty=1,
    phrasings=(
        "Mark all the emails from {name} in my inbox as read.",
        "I've dealt with everything {name} emailed me; mark those emails read.",
        "Set every inbox email from {name} to read.",
    ),
    sample=_unread_sample,
    expect=_read_expect,
    skill_source='''
def email_address_of(name: str) -> str:
    """Return the email address of the person called `name` (from the mail address book)."""
    token = login_to("email")
    return next(u["email"] for u in fetch_all(apis.email.search_addresses, access_token=token, query=name) if u["name"] == name)


def mark_read_from(name: str) -> int:
    """Mark every unread inbox email from the person called `name` as read; return how many."""
    token = login_to("email")
    mails = fetch_all(apis.email.show_emails, access_token=token, sender=email_address_of(name), unread_only=True)
    for mail in mails:
        apis.email.mark_email(access_token=token, email_id=mail["email_id"], read=True)
    return len(mails)
''',
    skill_names=("email_address_of", "mark_read_from"),
    call="mark_read_from({name!r})\napis.supervisor.complete_task()",
)

TEMPLATES = (COUNT_UNREAD, EMAIL_RELATION, FORWARD_RELATION, MARK_READ)
