"""Train templates over payments (with phone contacts for relationships)."""

from __future__ import annotations

import datetime as dt

from sage_rl.envs.pocketworld.checks import Allow, Expect, Require
from sage_rl.envs.pocketworld.scenarios import helpers as h
from sage_rl.envs.pocketworld.scenarios.base import Template

RELS = ("roommate", "family", "friend", "coworker")
NOTES = ("utilities", "pizza night", "concert tickets", "groceries", "cab ride", "brunch")


def _emails(db, rel):
    return {c["email"] for c in h.contacts(db, rel)}


def _txs(db):
    return db["payments"]["transactions"].values()


# ---------------------------------------------------------------------------- send money to a relationship


def _send_sample(rng, w):
    rel, amount = rng.choice(RELS), rng.randrange(5, 31)
    if w.db["payments"]["users"][h.me(w.db)]["balance"] < amount * len(_emails(w.db, rel)):
        raise h.Unsuitable("balance too low")
    return {**h.rel(rel), "amount": amount, "note": rng.choice(NOTES)}


def _send_expect(db, p):
    people, me = _emails(db, p["relationship"]), h.me(db)
    old = set(db["payments"]["transactions"])

    def paid(f):
        new = [t for k, t in f["payments"]["transactions"].items() if k not in old and t["sender"] == me]
        hits = {
            t["receiver"]
            for t in new
            if abs(t["amount"] - p["amount"]) < 0.005 and t["description"] == p["note"]
        }
        return hits == people and len(new) == len(people)

    return Expect(
        requires=(Require("each person got exactly one payment with the note", paid),),
        allow=(
            Allow("payments", "transactions", lambda t: t["sender"] == me and t["receiver"] in people),
            Allow("payments", "users", lambda u: u["email"] in people | {me}),
        ),
    )


SEND_RELATION = Template(
    name="payments_send_to_relationship",
    split="train",
    apps=("phone", "payments"),
    difficulty=2,
    phrasings=(
        "Send ${amount} to each of my {people} on payments with the note '{note}'.",
        "Pay every {person} in my contacts ${amount} on the payments app, description '{note}'.",
        "Use payments to send ${amount} to all my {people}, with '{note}' as the note.",
    ),
    sample=_send_sample,
    expect=_send_expect,
    skill_source='''
def contact_emails(relationship: str) -> list:
    """Return the email addresses of my phone contacts with the given relationship."""
    token = login_to("phone")
    return [c["email"] for c in fetch_all(apis.phone.search_contacts, access_token=token, relationship=relationship)]


def send_money_to_relationship(relationship: str, amount: float, note: str) -> int:
    """Send `amount` dollars with description `note` to each contact with `relationship`; return how many."""
    token = login_to("payments")
    emails = contact_emails(relationship)
    for email in emails:
        apis.payments.send_money(access_token=token, receiver_email=email, amount=amount, description=note)
    return len(emails)
''',
    skill_names=("contact_emails", "send_money_to_relationship"),
    call="send_money_to_relationship({relationship!r}, {amount}, {note!r})\napis.supervisor.complete_task()",
)

# ---------------------------------------------------------------------------- total received from someone


def _recv_sample(rng, w):
    me = h.me(w.db)
    senders = sorted({t["sender"] for t in _txs(w.db) if t["receiver"] == me})
    return {"name": h.name_of(w.db, h.pick(rng, senders, "sender"))}


def _recv_expect(db, p):
    me = h.me(db)
    total = sum(
        t["amount"] for t in _txs(db) if t["receiver"] == me and h.name_of(db, t["sender"]) == p["name"]
    )
    return Expect(answer=round(total, 2))


TOTAL_RECEIVED = Template(
    name="payments_total_received_from",
    split="train",
    apps=("payments",),
    difficulty=1,
    phrasings=(
        "How much money has {name} sent me in total on payments?",
        "Add up every payment {name} has sent me on the payments app. What's the total?",
        "What is the total amount I have received from {name} on payments?",
    ),
    sample=_recv_sample,
    expect=_recv_expect,
    skill_source='''
def find_payments_user(name: str) -> str:
    """Return the payments email of the user whose full name is `name`."""
    return next(u["email"] for u in fetch_all(apis.payments.search_users, query=name) if u["name"] == name)


def total_received_from(name: str) -> float:
    """Return the total amount the user named `name` has sent me on payments."""
    token = login_to("payments")
    email = find_payments_user(name)
    txs = fetch_all(apis.payments.show_transactions, access_token=token, direction="received", user_email=email)
    return round(sum(t["amount"] for t in txs), 2)
''',
    skill_names=("find_payments_user", "total_received_from"),
    call="apis.supervisor.complete_task(answer=total_received_from({name!r}))",
)

# ---------------------------------------------------------------------------- approve requests from a relationship


def _pending(db):
    return [
        r for r in db["payments"]["requests"].values() if r["payer"] == h.me(db) and r["status"] == "pending"
    ]


def _approve_sample(rng, w):
    rel = rng.choice(RELS)
    pend = _pending(w.db)
    ok = [r for r in pend if r["requester"] in _emails(w.db, rel)]
    if not ok or len(ok) == len(pend):
        raise h.Unsuitable("need requests both from and not from the relationship")
    if sum(r["amount"] for r in ok) > w.db["payments"]["users"][h.me(w.db)]["balance"]:
        raise h.Unsuitable("balance too low")
    return h.rel(rel)


def _approve_expect(db, p):
    people, me = _emails(db, p["relationship"]), h.me(db)
    want = {
        r["payment_request_id"]: "approved" if r["requester"] in people else "denied" for r in _pending(db)
    }
    payees = {r["requester"] for r in _pending(db) if r["requester"] in people}

    def done(f):
        return all(f["payments"]["requests"][k]["status"] == s for k, s in want.items())

    return Expect(
        requires=(Require("pending requests approved or denied by requester", done),),
        allow=(
            Allow("payments", "requests", lambda r: r["payment_request_id"] in want),
            Allow("payments", "transactions", lambda t: t["sender"] == me and t["receiver"] in payees),
            Allow("payments", "users", lambda u: u["email"] in payees | {me}),
        ),
    )


APPROVE_RELATION = Template(
    name="payments_approve_requests_from_relationship",
    split="train",
    apps=("phone", "payments"),
    difficulty=3,
    phrasings=(
        "Approve all my pending payment requests that come from my {people}, and deny every other pending request.",
        "Go through my pending payments requests: pay the ones from {people} and decline the rest.",
        "Accept pending money requests from my {people} on payments; reject all other pending ones.",
    ),
    sample=_approve_sample,
    expect=_approve_expect,
    skill_source='''
def contact_emails(relationship: str) -> list:
    """Return the email addresses of my phone contacts with the given relationship."""
    token = login_to("phone")
    return [c["email"] for c in fetch_all(apis.phone.search_contacts, access_token=token, relationship=relationship)]


def settle_pending_requests(relationship: str) -> int:
    """Approve pending payment requests from contacts with `relationship`, deny the others; return approvals."""
    token = login_to("payments")
    trusted = set(contact_emails(relationship))
    approved = 0
    for r in fetch_all(apis.payments.show_payment_requests, access_token=token, direction="received", status="pending"):
        if r["requester"] in trusted:
            apis.payments.approve_payment_request(access_token=token, payment_request_id=r["payment_request_id"])
            approved += 1
        else:
            apis.payments.deny_payment_request(access_token=token, payment_request_id=r["payment_request_id"])
    return approved
''',
    skill_names=("contact_emails", "settle_pending_requests"),
    call="settle_pending_requests({relationship!r})\napis.supervisor.complete_task()",
)

# ---------------------------------------------------------------------------- request money from a relationship


def _req_sample(rng, w):
    return {**h.rel(rng.choice(RELS)), "amount": rng.randrange(8, 60), "note": rng.choice(NOTES)}


def _req_expect(db, p):
    people, me = _emails(db, p["relationship"]), h.me(db)
    old = set(db["payments"]["requests"])

    def asked(f):
        new = [r for k, r in f["payments"]["requests"].items() if k not in old]
        ok = {
            r["payer"]
            for r in new
            if abs(r["amount"] - p["amount"]) < 0.005 and r["description"] == p["note"]
        }
        return ok == people and len(new) == len(people)

    return Expect(
        requires=(Require("one request to each person with amount and note", asked),),
        allow=(Allow("payments", "requests", lambda r: r["requester"] == me and r["payer"] in people),),
    )


REQUEST_RELATION = Template(
    name="payments_request_from_relationship",
    split="train",
    apps=("phone", "payments"),
    difficulty=2,
    phrasings=(
        "Request ${amount} from each of my {people} on payments for '{note}'.",
        "Ask every {person} in my contacts for ${amount} on payments, with the description '{note}'.",
        "Send a ${amount} payment request to all my {people}; the note should be '{note}'.",
    ),
    sample=_req_sample,
    expect=_req_expect,
    skill_source='''
def contact_emails(relationship: str) -> list:
    """Return the email addresses of my phone contacts with the given relationship."""
    token = login_to("phone")
    return [c["email"] for c in fetch_all(apis.phone.search_contacts, access_token=token, relationship=relationship)]


def request_money_from_relationship(relationship: str, amount: float, note: str) -> int:
    """Request `amount` dollars with description `note` from each contact with `relationship`; return how many."""
    token = login_to("payments")
    emails = contact_emails(relationship)
    for email in emails:
        apis.payments.request_money(access_token=token, user_email=email, amount=amount, description=note)
    return len(emails)
''',
    skill_names=("contact_emails", "request_money_from_relationship"),
    call="request_money_from_relationship({relationship!r}, {amount}, {note!r})\napis.supervisor.complete_task()",
)

# ---------------------------------------------------------------------------- thank recent senders by text


def _thank_sample(rng, w):
    days = rng.choice((7, 14, 21, 30))
    since = (w.now - dt.timedelta(days=days)).isoformat(timespec="seconds")
    me = h.me(w.db)
    if not [t for t in _txs(w.db) if t["receiver"] == me and t["created_at"] >= since]:
        raise h.Unsuitable("no recent senders")
    return {
        "days": days,
        "since": since,
        "message": rng.choice(("Thanks for the money!", "Got your payment, thank you!")),
    }


def _thank_expect(db, p):
    me = h.me(db)
    emails = {t["sender"] for t in _txs(db) if t["receiver"] == me and t["created_at"] >= p["since"]}
    phones = {c["phone_number"] for c in h.contacts(db) if c["email"] in emails}
    old = set(db["phone"]["messages"])

    def texted(f):
        new = [m for k, m in f["phone"]["messages"].items() if k not in old]
        return {m["receiver"] for m in new if m["message"] == p["message"]} == phones and len(new) == len(
            phones
        )

    return Expect(
        requires=(Require("each recent sender got one thank-you text", texted),),
        allow=(Allow("phone", "messages", lambda m: m["receiver"] in phones),),
    )


THANK_SENDERS = Template(
    name="payments_thank_recent_senders",
    split="train",
    apps=("payments", "phone"),
    difficulty=3,
    phrasings=(
        "Text everyone who sent me money on payments in the last {days} days: '{message}'",
        "For each person who paid me on payments during the past {days} days, send them a text saying '{message}'",
        "Send the text '{message}' to every person that sent me a payment in the last {days} days (once per person).",
    ),
    sample=_thank_sample,
    expect=_thank_expect,
    skill_source='''
def days_ago(days: int) -> str:
    """Return the ISO date-time `days` days before the world's current time."""
    from datetime import datetime, timedelta

    now = datetime.fromisoformat(apis.supervisor.show_current_time()["now"])
    return (now - timedelta(days=days)).isoformat()


def recent_payment_senders(days: int) -> list:
    """Return the emails of everyone who sent me money on payments in the last `days` days."""
    token = login_to("payments")
    since = days_ago(days)
    txs = fetch_all(apis.payments.show_transactions, access_token=token, direction="received", min_created_at=since)
    return sorted({t["sender"] for t in txs})


def text_people_by_email(emails: list, message: str) -> int:
    """Text `message` to the phone number of each contact whose email is in `emails`; return how many."""
    token = login_to("phone")
    wanted = set(emails)
    sent = 0
    for c in fetch_all(apis.phone.search_contacts, access_token=token):
        if c["email"] in wanted:
            apis.phone.send_text_message(access_token=token, phone_number=c["phone_number"], message=message)
            sent += 1
    return sent
''',
    skill_names=("days_ago", "recent_payment_senders", "text_people_by_email"),
    call="text_people_by_email(recent_payment_senders({days}), {message!r})\napis.supervisor.complete_task()",
)

TEMPLATES = (SEND_RELATION, TOTAL_RECEIVED, APPROVE_RELATION, REQUEST_RELATION, THANK_SENDERS)
