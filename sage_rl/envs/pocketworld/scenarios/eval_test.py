"""test_normal templates over music, payments and phone: unseen scenarios over the train apps."""

from __future__ import annotations

import datetime as dt
from collections import Counter

from sage_rl.envs.pocketworld.checks import Allow, Expect, Require
from sage_rl.envs.pocketworld.scenarios import helpers as h
from sage_rl.envs.pocketworld.scenarios.base import Template

# ---------------------------------------------------------------------------- remove low-rated songs from a playlist


def _low(db, title, max_rating):
    rated = h.my_ratings(db)
    return [
        s for s in h.playlists(db)[h.playlist_id(db, title)]["song_ids"] if rated.get(s, 99) <= max_rating
    ]


def _low_sample(rng, w):
    r = rng.randrange(1, 4)
    ok = [p["title"] for p in h.playlists(w.db).values() if _low(w.db, p["title"], r)]
    return {"playlist": h.pick(rng, sorted(ok), "playlist with low-rated songs"), "max_rating": r}


def _low_expect(db, p):
    pid = h.playlist_id(db, p["playlist"])
    drop = set(_low(db, p["playlist"], p["max_rating"]))
    keep = [s for s in h.playlists(db)[pid]["song_ids"] if s not in drop]
    return Expect(
        requires=(
            Require(
                "low-rated songs removed, others kept in order",
                lambda f: f["music"]["playlists"][pid]["song_ids"] == keep,
            ),
        ),
        allow=(
            Allow("music", "playlists", lambda r: r["owner"] == h.me(db) and r["title"] == p["playlist"]),
        ),
    )


REMOVE_LOW = Template(
    name="music_remove_low_rated",
    split="test_normal",
    apps=("music",),
    difficulty=2,
    phrasings=(
        "Remove every song I have rated {max_rating} stars or lower from my '{playlist}' playlist.",
        "Clean up my '{playlist}' playlist: take out the songs my rating is at most {max_rating} stars for.",
        "Drop from the '{playlist}' playlist all songs that I gave {max_rating} or fewer stars.",
    ),
    sample=_low_sample,
    expect=_low_expect,
    skill_source='''
def remove_low_rated_from_playlist(playlist_title: str, max_rating: int) -> int:
    """Remove from playlist `playlist_title` every song I rated `max_rating` stars or lower; return how many."""
    token = login_to("music")
    ratings = {r["song_id"]: r["rating"] for r in fetch_all(apis.music.show_my_ratings, access_token=token)}
    playlist = next(p for p in fetch_all(apis.music.show_playlists, access_token=token) if p["title"] == playlist_title)
    songs = apis.music.show_playlist(access_token=token, playlist_id=playlist["playlist_id"])["songs"]
    removed = 0
    for song in songs:
        if song["song_id"] in ratings and ratings[song["song_id"]] <= max_rating:
            apis.music.remove_song_from_playlist(access_token=token, playlist_id=playlist["playlist_id"], song_id=song["song_id"])
            removed += 1
    return removed
''',
    skill_names=("remove_low_rated_from_playlist",),
    call="remove_low_rated_from_playlist({playlist!r}, {max_rating})\napis.supervisor.complete_task()",
)

# ---------------------------------------------------------------------------- playlist of top-rated songs


def _top_sample(rng, w):
    r = rng.choice((4, 5))
    if not [s for s, v in h.my_ratings(w.db).items() if v >= r]:
        raise h.Unsuitable("no top-rated songs")
    return {"min_rating": r, "title": f"My {r}+ Stars"}


def _top_expect(db, p):
    want = {s for s, v in h.my_ratings(db).items() if v >= p["min_rating"]}

    def made(f):
        mine = [x for x in h.playlists(f).values() if x["title"] == p["title"]]
        return len(mine) == 1 and sorted(mine[0]["song_ids"]) == sorted(want)

    return Expect(
        requires=(Require("a playlist with exactly the top-rated songs", made),),
        allow=(Allow("music", "playlists", lambda r: r["owner"] == h.me(db) and r["title"] == p["title"]),),
    )


TOP_RATED = Template(
    name="music_top_rated_playlist",
    split="test_normal",
    apps=("music",),
    difficulty=2,
    phrasings=(
        "Create a playlist named '{title}' with every song I have rated {min_rating} stars or more.",
        "Collect all songs that I rated at least {min_rating} stars into a new playlist called '{title}'.",
        "Make a new playlist '{title}' containing the songs with my rating of {min_rating} or higher.",
    ),
    sample=_top_sample,
    expect=_top_expect,
    skill_source='''
def playlist_of_rated_songs(title: str, min_rating: int) -> int:
    """Create playlist `title` with every song I rated `min_rating` stars or more; return its playlist_id."""
    token = login_to("music")
    ratings = fetch_all(apis.music.show_my_ratings, access_token=token)
    playlist_id = apis.music.create_playlist(access_token=token, title=title)["playlist_id"]
    for r in ratings:
        if r["rating"] >= min_rating:
            apis.music.add_song_to_playlist(access_token=token, playlist_id=playlist_id, song_id=r["song_id"])
    return playlist_id
''',
    skill_names=("playlist_of_rated_songs",),
    call="playlist_of_rated_songs({title!r}, {min_rating})\napis.supervisor.complete_task()",
)

# ---------------------------------------------------------------------------- refund recent payments


def _refunds(db, name, since):
    return [t for t in db["payments"]["transactions"].values()
            if t["receiver"] == h.me(db) and h.name_of(db, t["sender"]) == name and t["created_at"] >= since]  # fmt: skip


def _refund_sample(rng, w):
    days = rng.choice((30, 45, 60))
    since = (w.now - dt.timedelta(days=days)).isoformat(timespec="seconds")
    names = sorted({h.name_of(w.db, t["sender"]) for t in w.db["payments"]["transactions"].values()
                    if t["receiver"] == h.me(w.db) and t["created_at"] >= since})  # fmt: skip
    name = h.pick(rng, names, "recent sender")
    if (
        sum(t["amount"] for t in _refunds(w.db, name, since))
        > w.db["payments"]["users"][h.me(w.db)]["balance"]
    ):
        raise h.Unsuitable("balance too low")
    return {"name": name, "days": days, "since": since}


def _refund_expect(db, p):
    want = sorted(t["amount"] for t in _refunds(db, p["name"], p["since"]))
    email = next(e for e, u in db["payments"]["users"].items() if u["name"] == p["name"])
    old, me = set(db["payments"]["transactions"]), h.me(db)

    def refunded(f):
        new = [t for k, t in f["payments"]["transactions"].items() if k not in old]
        ok = all(t["receiver"] == email and t["sender"] == me and t["description"] == "refund" for t in new)
        return ok and sorted(t["amount"] for t in new) == want

    return Expect(
        requires=(Require("each recent payment was sent back with note 'refund'", refunded),),
        allow=(
            Allow("payments", "transactions", lambda t: t["receiver"] == email),
            Allow("payments", "users", lambda u: u["email"] in (email, me)),
        ),
    )


REFUND = Template(
    name="payments_refund_recent",
    split="test_normal",
    apps=("payments",),
    difficulty=3,
    phrasings=(
        "Send back every payment {name} made to me in the last {days} days: same amounts, note 'refund'.",
        "Refund {name}: return each payment they sent me during the past {days} days, one payment each, with the description 'refund'.",
        "For every payment from {name} in the last {days} days, pay the same amount back with the note 'refund'.",
    ),
    sample=_refund_sample,
    expect=_refund_expect,
    skill_source='''
def find_payments_user(name: str) -> str:
    """Return the payments email of the user whose full name is `name`."""
    return next(u["email"] for u in fetch_all(apis.payments.search_users, query=name) if u["name"] == name)


def refund_recent_payments(name: str, days: int) -> int:
    """Pay back, one by one with note 'refund', each payment `name` sent me in the last `days` days; return how many."""
    from datetime import datetime, timedelta

    token = login_to("payments")
    since = (datetime.fromisoformat(apis.supervisor.show_current_time()["now"]) - timedelta(days=days)).isoformat()
    email = find_payments_user(name)
    txs = fetch_all(apis.payments.show_transactions, access_token=token, direction="received", user_email=email, min_created_at=since)
    for t in txs:
        apis.payments.send_money(access_token=token, receiver_email=email, amount=t["amount"], description="refund")
    return len(txs)
''',
    skill_names=("find_payments_user", "refund_recent_payments"),
    call="refund_recent_payments({name!r}, {days})\napis.supervisor.complete_task()",
)

# ---------------------------------------------------------------------------- contact who texts most


def _top_texter(db):
    counts = Counter(m["sender"] for m in db["phone"]["messages"].values() if m["sender"] != h.my_phone(db))
    phone = h.unique_max(counts)
    return h.full_name(next(c for c in h.contacts(db) if c["phone_number"] == phone))


def _tt_sample(rng, w):
    _top_texter(w.db)
    return {}


TOP_TEXTER = Template(
    name="phone_top_texter",
    split="test_normal",
    apps=("phone",),
    difficulty=2,
    phrasings=(
        "Which of my contacts has sent me the most text messages? Give their full name.",
        "Who texts me the most? Answer with the contact's first and last name.",
        "Find the contact with the largest number of text messages sent to me and tell me their full name.",
    ),
    sample=_tt_sample,
    expect=lambda db, p: Expect(answer=_top_texter(db)),
    skill_source='''
def top_texter() -> str:
    """Return the full name of the contact who sent me the most text messages."""
    token = login_to("phone")
    me = apis.supervisor.show_profile()["phone_number"]
    counts = {}
    for m in fetch_all(apis.phone.show_text_messages, access_token=token):
        if m["sender"] != me:
            counts[m["sender"]] = counts.get(m["sender"], 0) + 1
    best = max(counts, key=counts.get)
    c = next(c for c in fetch_all(apis.phone.search_contacts, access_token=token, query=best) if c["phone_number"] == best)
    return c["first_name"] + " " + c["last_name"]
''',
    skill_names=("top_texter",),
    call="apis.supervisor.complete_task(answer=top_texter())",
)

TEMPLATES = (REMOVE_LOW, TOP_RATED, REFUND, TOP_TEXTER)
