"""The seeded world generator: ``build_world(seed)`` -> a full World, deterministic and fast.

Everything comes from one ``random.Random(seed)`` drawn in a fixed order over fixed tuples, never
the global RNG, the wall clock or set iteration order, so the same seed gives a byte-identical
``canonical_json``. Building one world takes a few milliseconds (see benchmarks/env_bench.py).

What templates count varies from world to world over a wide range (how many contacts of each
relationship, unread emails per sender, liked songs per genre, notes per tag, open to-dos per list
and priority, files per folder and extension), so that target-first samplers
(``scenarios.helpers.spread``) find a world for any answer they draw (issue 30: no constant answer
may solve more than a tenth of a template's tasks).
"""

from __future__ import annotations

import datetime as dt
import random
from dataclasses import dataclass
from typing import Any

from sage_rl.envs.pocketworld import pools
from sage_rl.envs.pocketworld.apps import APPS
from sage_rl.envs.pocketworld.world import Db, World

BASE_DAY = dt.datetime(2026, 1, 5, 9, 0)
SONGS = 90
APP_ACCOUNTS = ("music", "payments", "phone", "email", "files", "notes", "todo", "shopping", "splitwise")


@dataclass(frozen=True)
class Person:
    first_name: str
    last_name: str
    email: str
    phone_number: str
    birthday: str
    relationship: str  # to the supervisor; "self" for the supervisor

    @property
    def name(self) -> str:
        return f"{self.first_name} {self.last_name}"


def build_world(seed: int) -> World:
    """A complete, deterministic world for ``seed``."""
    rng = random.Random(seed)
    now = BASE_DAY + dt.timedelta(days=_ri(rng, 300), hours=_ri(rng, 10), minutes=5 * _ri(rng, 12))
    me, people = _people(rng)
    t = _Clock(rng, now)
    db: Db = {
        "supervisor": _supervisor(rng, me),
        "api_docs": {},
        "music": _music(rng, t, me, people),
        "payments": _payments(rng, t, me, people),
        "phone": _phone(rng, t, me, people),
        "email": _email(rng, t, me, people),
        "files": _files(rng, t),
        "notes": _notes(rng, t, me),
        "todo": _todo(rng, t, me),
        "shopping": _shopping(rng, t, me),
        "splitwise": _splitwise(rng, t, me, people),
    }
    return World(db, now, seed, APPS)


class _Clock:
    """ISO timestamps in the past relative to the world's frozen ``now``."""

    def __init__(self, rng: random.Random, now: dt.datetime) -> None:
        self.rng, self.now = rng, now

    def ago(self, max_days: int) -> str:
        minutes = _ri(self.rng, 60, max_days * 24 * 60)
        return (self.now - dt.timedelta(minutes=minutes)).isoformat(timespec="seconds")

    def day(self, offset_lo: int, offset_hi: int) -> str:
        return (self.now + dt.timedelta(days=_ri(self.rng, offset_lo, offset_hi))).date().isoformat()


def _people(rng: random.Random) -> tuple[Person, list[Person]]:
    counts = [(r, _ri(rng, lo, hi + 1)) for r, lo, hi in pools.RELATIONSHIP_RANGES]
    n = 1 + sum(c for _, c in counts)
    firsts = rng.sample(pools.FIRST_NAMES, n)
    lasts = [_pick(rng, pools.LAST_NAMES) for _ in range(n)]
    phones = rng.sample(range(100, 1000), n)
    rest = [r for r, c in counts for _ in range(c)]
    rng.shuffle(rest)
    out = []
    for i, rel in enumerate(["self", *rest]):
        f, la = firsts[i], lasts[i]
        email = f"{f.lower()}.{la.lower()}@{_pick(rng, pools.DOMAINS)}"
        bday = f"{_ri(rng, 1960, 2005)}-{_ri(rng, 1, 13):02d}-{_ri(rng, 1, 29):02d}"
        out.append(Person(f, la, email, f"+1-555-0{phones[i]}", bday, rel))
    return out[0], out[1:]


def _supervisor(rng: random.Random, me: Person) -> dict[str, Any]:
    letters = "abcdefghijkmnpqrstuvwxyz23456789"
    profile = {k: getattr(me, k) for k in ("first_name", "last_name", "email", "phone_number", "birthday")}
    pw = {
        a: {"account_name": a, "password": "".join(_pick(rng, letters) for _ in range(10))}
        for a in APP_ACCOUNTS
    }
    cards = {
        i: {
            "card_id": i,
            "card_name": name,
            "owner_name": me.name,
            "last_four": f"{_ri(rng, 10000):04d}",
            "expiry": f"{_ri(rng, 1, 13):02d}/{_ri(rng, 27, 31)}",
            "balance": float(_ri(rng, 500, 5000)),
        }  # fmt: skip
        for i, name in enumerate(("Visa", "Mastercard", "Amex")[: _ri(rng, 2, 4)], start=1)
    }
    cities = (("Portland", "OR"), ("Austin", "TX"), ("Denver", "CO"), ("Boston", "MA"))
    addresses = {}
    for i, name in enumerate(("home", "work"), start=1):
        city, state = _pick(rng, cities)
        street = f"{_ri(rng, 10, 999)} {_pick(rng, pools.SONG_NOUN)} {_pick(rng, ('St', 'Ave', 'Rd'))}"
        addresses[i] = {
            "address_id": i, "name": name, "street": street, "city": city, "state": state,
            "zip_code": f"{_ri(rng, 10000, 99999)}",
        }  # fmt: skip
    return {"profile": {"me": profile}, "passwords": pw, "payment_cards": cards, "addresses": addresses}


def _music(rng: random.Random, t: _Clock, me: Person, people: list[Person]) -> dict[str, Any]:
    names = rng.sample(pools.ARTIST_NAMES, 12)
    main_genres = rng.sample(pools.GENRES, 3)  # a world's artists favour a few genres: big genres
    artists = {i: {"artist_id": i, "name": n, "genre": _pick(rng, main_genres), "follower_count": _ri(rng, 100, 90000)}
               for i, n in enumerate(names, start=1)}  # fmt: skip
    titles = rng.sample([f"{a} {n}" for a in pools.SONG_ADJ for n in pools.SONG_NOUN], SONGS)
    songs = {}
    for i, title in enumerate(titles, start=1):
        aid = _ri(rng, 1, 13)
        songs[i] = {
            "song_id": i, "title": title, "artist_id": aid, "artist_name": artists[aid]["name"],
            "album": f"{_pick(rng, pools.SONG_NOUN)} of {_pick(rng, pools.SONG_NOUN)}",
            "genre": artists[aid]["genre"] if rng.random() < 0.8 else _pick(rng, pools.GENRES),
            "duration_s": _ri(rng, 120, 360), "release_year": _ri(rng, 1985, 2026),
            "play_count": _ri(rng, 1000, 5_000_000),
        }  # fmt: skip
    fondness = {g: min(1.0, 1.2 * rng.random()) for g in pools.GENRES}  # likes per genre: none to all
    liked = [i for i, song in songs.items() if rng.random() < fondness[song["genre"]]]
    likes = {
        i: {"user": me.email, "song_id": s, "liked_at": t.ago(200)} for i, s in enumerate(liked, start=1)
    }
    rated = sorted(rng.sample(range(1, SONGS + 1), 18))
    ratings = {i: {"user": me.email, "song_id": s, "rating": _ri(rng, 1, 6), "rated_at": t.ago(200)}
               for i, s in enumerate(rated, start=1)}  # fmt: skip
    playlists = {}
    for i, title in enumerate(rng.sample(pools.PLAYLIST_TITLES, 5), start=1):
        playlists[i] = {"owner": me.email, "title": title, "song_ids": rng.sample(range(1, SONGS + 1), _ri(rng, 4, 31)),
                        "is_public": rng.random() < 0.5, "created_at": t.ago(300)}  # fmt: skip
    playlists[6] = {"owner": people[0].email, "title": "Shared Vibes", "song_ids": rng.sample(range(1, SONGS + 1), 8),
                    "is_public": True, "created_at": t.ago(300)}  # fmt: skip
    follows = {i: {"user": me.email, "artist_id": a, "followed_at": t.ago(300)}
               for i, a in enumerate(sorted(rng.sample(range(1, 13), 4)), start=1)}  # fmt: skip
    history = {
        i: {"user": me.email, "song_id": _ri(rng, 1, SONGS + 1), "played_at": t.ago(14)} for i in range(1, 41)
    }
    users = {p.email: {"email": p.email, "name": p.name} for p in [me, *people]}
    return {"users": users, "artists": artists, "songs": songs, "likes": likes, "ratings": ratings,
            "playlists": playlists, "follows": follows, "history": history}  # fmt: skip


def _payments(rng: random.Random, t: _Clock, me: Person, people: list[Person]) -> dict[str, Any]:
    users = {
        p.email: {"email": p.email, "name": p.name, "balance": float(_ri(rng, 50, 900))}
        for p in [me, *people]
    }
    close = [p for p in people if p.relationship != "coworker" or rng.random() < 0.5]
    friends = {i: {"user": me.email, "friend": p.email} for i, p in enumerate(close, start=1)}
    transactions = {}
    for i in range(1, 46):
        other = _pick(rng, people).email
        sender, receiver = (me.email, other) if rng.random() < 0.5 else (other, me.email)
        transactions[i] = {
            "transaction_id": i, "sender": sender, "receiver": receiver, "amount": _ri(rng, 500, 15000) / 100,
            "description": _pick(rng, pools.PAYMENT_NOTES), "created_at": t.ago(90),
        }  # fmt: skip
    requests = {}
    for i in range(1, 15):
        other = _pick(rng, people).email
        requester, payer = (other, me.email) if i <= 10 else (me.email, other)
        requests[i] = {
            "payment_request_id": i, "requester": requester, "payer": payer, "amount": _ri(rng, 500, 8000) / 100,
            "description": _pick(rng, pools.PAYMENT_NOTES),
            "status": _pick(rng, ("pending", "pending", "approved", "denied")), "created_at": t.ago(30),
        }  # fmt: skip
    return {"users": users, "friends": friends, "transactions": transactions, "requests": requests}


def _phone(rng: random.Random, t: _Clock, me: Person, people: list[Person]) -> dict[str, Any]:
    contacts = {
        i: {"contact_id": i, "owner": me.email, "first_name": p.first_name, "last_name": p.last_name, "email": p.email,
            "phone_number": p.phone_number, "relationship": p.relationship, "birthday": p.birthday}
        for i, p in enumerate(people, start=1)
    }  # fmt: skip
    messages = {}
    for i in range(1, 51):
        other = _pick(rng, people).phone_number
        sender, receiver = (me.phone_number, other) if rng.random() < 0.4 else (other, me.phone_number)
        messages[i] = {"message_id": i, "sender": sender, "receiver": receiver,
                       "message": _pick(rng, pools.TEXT_LINES), "sent_at": t.ago(30)}  # fmt: skip
    days = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
    alarms = {
        i: {"alarm_id": i, "owner": me.email, "time": f"{_ri(rng, 5, 22):02d}:{_pick(rng, (0, 15, 30, 45)):02d}",
            "label": _pick(rng, pools.ALARM_LABELS), "enabled": rng.random() < 0.7,
            "repeat_days": sorted(rng.sample(days, _ri(rng, 0, 6)), key=days.index)}
        for i in range(1, 8)
    }  # fmt: skip
    return {"contacts": contacts, "messages": messages, "alarms": alarms}


def _email(rng: random.Random, t: _Clock, me: Person, people: list[Person]) -> dict[str, Any]:
    users = {p.email: {"email": p.email, "name": p.name} for p in [me, *people]}
    users.update({e: {"email": e, "name": n} for e, n in pools.SERVICE_SENDERS})
    senders = [p.email for p in people] + [e for e, _ in pools.SERVICE_SENDERS]
    # A few busy senders with up to 20 unread emails each, the others with a few or none.
    busy = set(rng.sample(senders, 5))
    inbox = []
    for sender in senders:
        if sender in busy:
            unread, read = _ri(rng, 1, 21), _ri(rng, 0, 4)
        else:
            unread, read = (_ri(rng, 0, 3), _ri(rng, 0, 3)) if rng.random() < 0.5 else (0, 0)
        inbox += [(sender, False)] * unread + [(sender, True)] * read
    rng.shuffle(inbox)
    sent = [(_pick(rng, people).email, True) for _ in range(13)]
    emails = {}
    for i, (other, read) in enumerate(inbox + sent, start=1):
        is_inbox = i <= len(inbox)
        subject = _pick(rng, pools.EMAIL_SUBJECTS).replace("{n}", str(_ri(rng, 100, 999)))
        emails[i] = {
            "email_id": i, "folder": "inbox" if is_inbox else "sent", "sender": other if is_inbox else me.email,
            "recipients": [me.email] if is_inbox else [other], "subject": subject, "body": _pick(rng, pools.EMAIL_BODIES),
            "sent_at": t.ago(60), "read": read, "starred": rng.random() < 0.15, "deleted": False, "reply_to": None,
        }  # fmt: skip
    return {"users": users, "emails": emails}


def _files(rng: random.Random, t: _Clock) -> dict[str, Any]:
    files, seen = {}, set()
    for directory, exts in pools.FILE_DIRS.items():
        # some folders are crowded, and some extensions common in them
        weighted = [e for e in exts for _ in range(_ri(rng, 1, 6))]
        for _ in range(_ri(rng, 2, 28)):
            path = f"{directory}/{_pick(rng, pools.FILE_STEMS)}_{_ri(rng, 1, 40)}.{_pick(rng, weighted)}"
            if path in seen:
                continue
            seen.add(path)
            i = len(files) + 1
            content = f"{path.rsplit('/', 1)[1]}: {_pick(rng, pools.EMAIL_BODIES)}"
            stamp = t.ago(365)
            files[i] = {"file_id": i, "path": path, "content": content, "size": len(content), "created_at": stamp,
                        "updated_at": stamp}  # fmt: skip
    return {"files": files}


def _notes(rng: random.Random, t: _Clock, me: Person) -> dict[str, Any]:
    notes = {}
    use = {tag: 0.6 * rng.random() for tag in pools.NOTE_TAGS}  # some tags on many notes, some on few
    for i, title in enumerate(rng.sample(pools.NOTE_TITLES, _ri(rng, 12, 46)), start=1):
        stamp = t.ago(120)
        tags = [tag for tag in pools.NOTE_TAGS if rng.random() < use[tag]] or [_pick(rng, pools.NOTE_TAGS)]
        notes[i] = {
            "note_id": i, "owner": me.email, "title": title, "content": f"{title}: {_pick(rng, pools.EMAIL_BODIES)}",
            "tags": sorted(tags), "pinned": rng.random() < 0.25, "created_at": stamp, "updated_at": stamp,
        }  # fmt: skip
    return {"notes": notes}


def _todo(rng: random.Random, t: _Clock, me: Person) -> dict[str, Any]:
    names = rng.sample(pools.TODO_LISTS, 4)
    lists = {i: {"owner": me.email, "name": n} for i, n in enumerate(names, start=1)}
    items = {}
    # Lists and priorities of uneven size, and a world-wide share of finished tasks.
    list_ids = [k for k in lists for _ in range(_ri(rng, 1, 16))]
    priorities = [p for p in ("low", "medium", "high") for _ in range(_ri(rng, 1, 11))]
    finished = 0.3 * rng.random()
    for i, title in enumerate(rng.sample(pools.TODO_TITLES, _ri(rng, 30, 57)), start=1):
        done = rng.random() < finished
        items[i] = {
            "task_id": i, "list_id": _pick(rng, list_ids), "title": title, "due_date": t.day(-10, 20),
            "priority": _pick(rng, priorities), "completed": done, "completed_at": t.ago(10) if done else None,
        }  # fmt: skip
    return {"lists": lists, "items": items}


def _shopping(rng: random.Random, t: _Clock, me: Person) -> dict[str, Any]:
    products, i = {}, 0
    for cat in pools.PRODUCT_CATEGORIES:
        for name in rng.sample(pools.PRODUCT_WORDS[cat], 5):
            i += 1
            products[i] = {"product_id": i, "name": name, "category": cat, "price": _ri(rng, 499, 9999) / 100,
                           "rating": _ri(rng, 25, 50) / 10, "stock": _ri(rng, 0, 30)}  # fmt: skip
    orders = {}
    for oid in range(1, 10):
        picks = rng.sample(range(1, i + 1), _ri(rng, 1, 4))
        items = [{"product_id": p, "name": products[p]["name"], "price": products[p]["price"],
                  "quantity": _ri(rng, 1, 3)} for p in picks]  # fmt: skip
        orders[oid] = {
            "order_id": oid, "user": me.email, "items": items,
            "total": round(sum(x["price"] * x["quantity"] for x in items), 2),
            "status": _pick(rng, ("delivered", "delivered", "placed", "cancelled")), "address_id": 1,
            "payment_card_id": 1, "placed_at": t.ago(120),
        }  # fmt: skip
    wishlist = {
        k: {"user": me.email, "product_id": p} for k, p in enumerate(rng.sample(range(1, i + 1), 5), start=1)
    }
    reviewed = sorted({p["product_id"] for o in orders.values() for p in o["items"]})[:2]
    reviews = {k: {"user": me.email, "product_id": p, "rating": _ri(rng, 1, 6), "text": "", "created_at": t.ago(60)}
               for k, p in enumerate(reviewed, start=1)}  # fmt: skip
    return {"products": products, "cart": {}, "orders": orders, "reviews": reviews, "wishlist": wishlist}


def _splitwise(rng: random.Random, t: _Clock, me: Person, people: list[Person]) -> dict[str, Any]:
    by_rel = {r: [p.email for p in people if p.relationship == r] for r, _, _ in pools.RELATIONSHIP_RANGES}
    members = (by_rel["roommate"], rng.sample(by_rel["friend"], 4), rng.sample(by_rel["coworker"], 4))
    groups = {i: {"group_id": i, "name": n, "members": sorted([me.email, *m])}
              for i, (n, m) in enumerate(zip(pools.GROUP_NAMES, members, strict=True), start=1)}  # fmt: skip
    expenses, settlements = {}, {}
    for gid, g in groups.items():
        for _ in range(_ri(rng, 4, 9)):
            eid = len(expenses) + 1
            expenses[eid] = {
                "expense_id": eid, "group_id": gid, "description": _pick(rng, pools.EXPENSE_ITEMS),
                "amount": _ri(rng, 1000, 30000) / 100, "paid_by": _pick(rng, g["members"]),
                "split_among": list(g["members"]), "created_at": t.ago(60),
            }  # fmt: skip
        payer = _pick(rng, [m for m in g["members"] if m != me.email])
        sid = len(settlements) + 1
        settlements[sid] = {"settlement_id": sid, "group_id": gid, "payer": payer, "payee": me.email,
                            "amount": _ri(rng, 500, 3000) / 100, "created_at": t.ago(20)}  # fmt: skip
    users = {p.email: {"email": p.email, "name": p.name} for p in [me, *people]}
    return {"users": users, "groups": groups, "expenses": expenses, "settlements": settlements}


def _ri(rng: random.Random, lo: int, hi: int | None = None) -> int:
    """An int in [lo, hi) (or [0, lo)): ``random()``-based because ``randrange`` dominated build time."""
    if hi is None:
        lo, hi = 0, lo
    return lo + int(rng.random() * (hi - lo))


def _pick(rng: random.Random, seq: Any) -> Any:
    return seq[int(rng.random() * len(seq))]
