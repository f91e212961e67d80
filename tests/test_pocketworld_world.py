"""PocketWorld's world and API layer: determinism, validation, auth, pagination, generated docs."""

from __future__ import annotations

import datetime as dt
import inspect

import pytest

from sage_rl.envs.pocketworld.api import ApiError
from sage_rl.envs.pocketworld.apps import APPS
from sage_rl.envs.pocketworld.generator import build_world
from sage_rl.envs.pocketworld.world import canonical_json, world_hash


def _login(w, app="music"):
    pw = w.call("supervisor", "show_account_passwords", {})
    password = next(p["password"] for p in pw if p["account_name"] == app)
    return w.call(app, "login", {"username": w.me, "password": password})["access_token"]


def _error(w, app, api, kwargs) -> ApiError:
    before = canonical_json(w.db, w.now)
    with pytest.raises(ApiError) as info:
        w.call(app, api, kwargs)
    assert canonical_json(w.db, w.now) == before, "a failing call must not change the world"
    return info.value


def test_same_seed_gives_byte_identical_world_and_different_seeds_differ():
    a, b = build_world(123), build_world(123)
    assert canonical_json(a.db, a.now) == canonical_json(b.db, b.now)
    assert world_hash(a) == world_hash(b)
    assert world_hash(build_world(124)) != world_hash(a)


def test_world_has_people_with_relationships_and_data_for_every_app():
    w = build_world(7)
    contacts = list(w.db["phone"]["contacts"].values())
    assert len(contacts) >= 20
    assert {c["relationship"] for c in contacts} == {"friend", "family", "coworker", "roommate"}
    for app in ("music", "payments", "phone", "email", "files", "notes", "todo", "shopping", "splitwise"):
        assert any(len(t) for t in w.db[app].values()), app
    assert sum(len(a.apis) for a in APPS.values()) >= 100
    assert len([a for a in APPS if a not in ("supervisor", "api_docs")]) >= 8


def test_unknown_app_and_api_are_404_with_suggestions():
    w = build_world(1)
    assert "unknown app 'musik'" in _error(w, "musik", "login", {}).message
    e = _error(w, "music", "show_playlist_songs", {})
    assert e.status == 404 and "show_playlist_songs" in e.message and "show_api_descriptions" in e.message


def test_missing_unknown_and_ill_typed_parameters_name_the_parameter():
    w = build_world(1)
    token = _login(w)
    e = _error(w, "music", "rate_song", {"access_token": token, "song_id": 3})
    assert e.status == 422 and "missing required parameter 'rating'" in e.message
    e = _error(w, "music", "rate_song", {"access_token": token, "song_id": "3", "rating": 4})
    assert e.status == 422 and "'song_id' must be int, got str '3'" in e.message
    e = _error(w, "music", "rate_song", {"access_token": token, "song_id": 3, "rating": 7})
    assert "'rating' must be <= 5, got 7" in e.message
    e = _error(w, "music", "rate_song", {"access_token": token, "song_id": 3, "rating": 4, "stars": 4})
    assert "no parameter 'stars'" in e.message
    e = _error(w, "music", "rate_song", {"access_token": token, "song_id": 3, "rating": True})
    assert "'rating' must be int" in e.message  # bools are not ints here


def test_bad_tokens_are_401_and_change_nothing():
    w = build_world(2)
    e = _error(w, "music", "show_liked_songs", {"access_token": "nope"})
    assert e.status == 401 and "invalid access_token" in e.message
    payments = _login(w, "payments")
    e = _error(w, "music", "show_liked_songs", {"access_token": payments})
    assert e.status == 401 and "issued by 'payments'" in e.message
    token = _login(w)
    w.now = w.now + dt.timedelta(hours=2)  # tokens live 1 hour of world time
    e = _error(w, "music", "like_song", {"access_token": token, "song_id": 1})
    assert e.status == 401 and "expired" in e.message
    e = _error(w, "music", "login", {"username": w.me, "password": "wrong"})
    assert e.status == 401 and "invalid username or password" in e.message


def test_failed_mutation_midway_leaves_state_unchanged():
    w = build_world(3)
    token = _login(w, "payments")
    balance = w.call("payments", "show_account", {"access_token": token})["balance"]
    receiver = next(c["email"] for c in w.db["phone"]["contacts"].values())
    e = _error(
        w,
        "payments",
        "send_money",
        {"access_token": token, "receiver_email": receiver, "amount": balance + 1},
    )
    assert e.status == 409 and "exceeds your balance" in e.message


def test_pagination_default_limit_max_and_full_coverage():
    w = build_world(4)
    token = _login(w, "phone")
    first = w.call("phone", "search_contacts", {"access_token": token})
    assert len(first) == 5
    e = _error(w, "phone", "search_contacts", {"access_token": token, "page_limit": 21})
    assert "'page_limit' must be <= 20" in e.message
    pages, i = [], 0
    while batch := w.call(
        "phone", "search_contacts", {"access_token": token, "page_index": i, "page_limit": 7}
    ):
        pages += batch
        i += 1
    assert [c["contact_id"] for c in pages] == sorted(w.db["phone"]["contacts"])


def test_results_are_copies_not_views_of_the_world():
    w = build_world(5)
    profile = w.call("supervisor", "show_profile", {})
    profile["email"] = "hacker@example.com"
    assert w.me != "hacker@example.com"
    token = _login(w)
    pl = w.call("music", "show_playlist", {"access_token": token, "playlist_id": 1})
    pl["songs"].clear()
    assert w.db["music"]["playlists"][1]["song_ids"]


def test_api_docs_are_generated_from_signatures():
    w = build_world(6)
    apps = {a["name"] for a in w.call("api_docs", "show_app_descriptions", {})}
    assert apps == set(APPS)
    for app in APPS.values():
        listed = [a["name"] for a in w.call("api_docs", "show_api_descriptions", {"app_name": app.name})]
        assert listed == list(app.apis)
        for api in app.apis.values():
            doc = w.call("api_docs", "show_api_doc", {"app_name": app.name, "api_name": api.name})
            params = list(inspect.signature(api.fn).parameters)[1:]
            assert [p["name"] for p in doc["parameters"]] == params
            assert doc["description"], f"{app.name}.{api.name} has no description"
    doc = w.call("api_docs", "show_api_doc", {"app_name": "music", "api_name": "rate_song"})
    rating = next(p for p in doc["parameters"] if p["name"] == "rating")
    assert rating == {"name": "rating", "type": "int", "required": True, "default": None, "description": "stars",
                      "constraints": {"ge": 1, "le": 5}}  # fmt: skip
    e = _error(w, "api_docs", "show_api_doc", {"app_name": "music", "api_name": "nope"})
    assert "api_name 'nope'" in e.message


def test_complete_task_records_answer_and_state_changes_persist():
    w = build_world(8)
    token = _login(w)
    liked_before = len(w.db["music"]["likes"])
    song = next(
        s for s in range(1, 61) if not any(r["song_id"] == s for r in w.db["music"]["likes"].values())
    )
    w.call("music", "like_song", {"access_token": token, "song_id": song})
    assert len(w.db["music"]["likes"]) == liked_before + 1
    assert _error(w, "music", "like_song", {"access_token": token, "song_id": song}).status == 409
    w.call("supervisor", "complete_task", {"answer": [1, "x"]})
    assert w.completed and w.answer == [1, "x"]


def test_complete_task_rejects_a_non_json_answer_without_completing():
    w = build_world(9)
    e = _error(w, "supervisor", "complete_task", {"answer": [{1, 2}]})
    assert e.status == 422 and "'answer' must be JSON-able" in e.message
    assert not w.completed


def test_ids_of_deleted_rows_are_not_reused():
    w = build_world(10)
    token = _login(w, "notes")
    last = max(w.db["notes"]["notes"])
    w.call("notes", "delete_note", {"access_token": token, "note_id": last})
    new = w.call("notes", "create_note", {"access_token": token, "title": "fresh"})["note_id"]
    assert new == last + 1
