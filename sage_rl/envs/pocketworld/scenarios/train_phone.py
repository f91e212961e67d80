"""Train templates over the phone app (contacts, texts, alarms)."""

from __future__ import annotations

from sage_rl.envs.pocketworld.checks import Allow, Expect, Require
from sage_rl.envs.pocketworld.scenarios import helpers as h
from sage_rl.envs.pocketworld.scenarios.base import Template

RELS = ("roommate", "family", "friend", "coworker")

# ---------------------------------------------------------------------------- count contacts by relationship


COUNT_RELATION = Template(
    name="phone_count_relationship",
    split="train",
    apps=("phone",),
    difficulty=1,
    phrasings=(
        "How many {people} do I have in my phone contacts?",
        "Count the contacts on my phone whose relationship is {relationship}.",
        "What's the number of {people} saved in my contacts?",
    ),
    sample=lambda rng, w: h.rel(h.spread(rng, h.COUNTS, {r: len(h.contacts(w.db, r)) for r in RELS})),
    expect=lambda db, p: Expect(answer=len(h.contacts(db, p["relationship"]))),
    skill_source='''
def count_contacts(relationship: str) -> int:
    """Return how many of my phone contacts have the given relationship."""
    token = login_to("phone")
    return len(fetch_all(apis.phone.search_contacts, access_token=token, relationship=relationship))
''',
    skill_names=("count_contacts",),
    call="apis.supervisor.complete_task(answer=count_contacts({relationship!r}))",
)

# ---------------------------------------------------------------------------- text a relationship


def _text_expect(db, p):
    phones = {c["phone_number"] for c in h.contacts(db, p["relationship"])}
    old = set(db["phone"]["messages"])

    def texted(f):
        new = [m for k, m in f["phone"]["messages"].items() if k not in old]
        return {m["receiver"] for m in new if m["message"] == p["message"]} == phones and len(new) == len(
            phones
        )

    return Expect(
        requires=(Require("each person got the text once", texted),),
        allow=(
            Allow("phone", "messages", lambda m: m["receiver"] in phones and m["sender"] == h.my_phone(db)),
        ),
    )


MESSAGES = (
    "Dinner at my place on Friday?",
    "Happy holidays!",
    "I'm back in town, let's catch up.",
    "Game night this Saturday!",
)

TEXT_RELATION = Template(
    name="phone_text_relationship",
    split="train",
    apps=("phone",),
    difficulty=2,
    phrasings=(
        "Text all my {people}: '{message}'",
        "Send the message '{message}' by text to every {person} in my contacts.",
        "Every contact of mine who is a {person} should get a text saying '{message}'",
    ),
    sample=lambda rng, w: {**h.rel(rng.choice(RELS)), "message": rng.choice(MESSAGES)},
    expect=_text_expect,
    skill_source='''
def text_relationship(relationship: str, message: str) -> int:
    """Text `message` to every phone contact with the given relationship; return how many texts were sent."""
    token = login_to("phone")
    people = fetch_all(apis.phone.search_contacts, access_token=token, relationship=relationship)
    for person in people:
        apis.phone.send_text_message(access_token=token, phone_number=person["phone_number"], message=message)
    return len(people)
''',
    skill_names=("text_relationship",),
    call="text_relationship({relationship!r}, {message!r})\napis.supervisor.complete_task()",
)

# ---------------------------------------------------------------------------- birthday of a contact


def _bday_sample(rng, w):
    return {"name": h.full_name(rng.choice(h.contacts(w.db)))}


BIRTHDAY = Template(
    name="phone_contact_birthday",
    split="train",
    apps=("phone",),
    difficulty=1,
    phrasings=(
        "When is {name}'s birthday? Answer as YYYY-MM-DD.",
        "Look up {name}'s date of birth in my contacts (format YYYY-MM-DD).",
        "What birthday do I have saved for {name}? Reply in YYYY-MM-DD format.",
    ),
    sample=_bday_sample,
    expect=lambda db, p: Expect(
        answer=next(c["birthday"] for c in h.contacts(db) if h.full_name(c) == p["name"])
    ),
    skill_source='''
def find_contact(full_name: str) -> dict:
    """Return my phone contact whose 'first_name last_name' equals `full_name`."""
    token = login_to("phone")
    matches = fetch_all(apis.phone.search_contacts, access_token=token, query=full_name.split()[0])
    return next(c for c in matches if f"{c['first_name']} {c['last_name']}" == full_name)
''',
    skill_names=("find_contact",),
    call="apis.supervisor.complete_task(answer=find_contact({name!r})['birthday'])",
)

# ---------------------------------------------------------------------------- disable early alarms


def _alarms(db):
    return [a for a in db["phone"]["alarms"].values() if a["owner"] == h.me(db)]


def _alarm_sample(rng, w):
    cut = f"{rng.randrange(7, 13):02d}:00"
    if not [a for a in _alarms(w.db) if a["enabled"] and a["time"] < cut]:
        raise h.Unsuitable("no enabled early alarm")
    return {"time": cut}


def _alarm_expect(db, p):
    ids = {a["alarm_id"] for a in _alarms(db) if a["enabled"] and a["time"] < p["time"]}
    return Expect(
        requires=(
            Require(
                "early alarms are off", lambda f: not any(f["phone"]["alarms"][i]["enabled"] for i in ids)
            ),
        ),
        allow=(Allow("phone", "alarms", lambda a: a["alarm_id"] in ids),),
    )


DISABLE_ALARMS = Template(
    name="phone_disable_early_alarms",
    split="train",
    apps=("phone",),
    difficulty=1,
    phrasings=(
        "Turn off all my enabled alarms that are set before {time}.",
        "Disable every alarm of mine that rings earlier than {time}.",
        "I'm on holiday: switch off my alarms before {time}.",
    ),
    sample=_alarm_sample,
    expect=_alarm_expect,
    skill_source='''
def disable_alarms_before(time: str) -> int:
    """Disable every enabled alarm set earlier than `time` (HH:MM); return how many."""
    token = login_to("phone")
    count = 0
    for alarm in fetch_all(apis.phone.show_alarms, access_token=token):
        if alarm["enabled"] and alarm["time"] < time:
            apis.phone.update_alarm(access_token=token, alarm_id=alarm["alarm_id"], enabled=False)
            count += 1
    return count
''',
    skill_names=("disable_alarms_before",),
    call="disable_alarms_before({time!r})\napis.supervisor.complete_task()",
)

TEMPLATES = (COUNT_RELATION, TEXT_RELATION, BIRTHDAY, DISABLE_ALARMS)
