"""The World: PocketWorld's state as plain data, and the one door through which it changes.

``World.db`` is ``{app: {table: {key: row}}}`` made of dicts, lists, str, int, float, bool and None
only, so it can be snapshot, diffed and dumped as canonical JSON. ``World.call(app, api, kwargs)``
is the only way agent code reaches it: the sandbox carries ``(app, api, kwargs)`` over a pipe and
the parent calls ``world.call``. Sessions (access tokens) live outside ``db`` on purpose: logging in
is not a state change a task is judged on.
"""

from __future__ import annotations

import datetime as dt
import difflib
import hashlib
import json
import pickle
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sage_rl.envs.pocketworld import bounds
from sage_rl.envs.pocketworld.api import ApiError, App, plain, validate

Db = dict[str, dict[str, dict[Any, dict[str, Any]]]]

#: How long an access token stays valid, in world time.
TOKEN_TTL = dt.timedelta(hours=1)


@dataclass(frozen=True)
class Session:
    app: str
    username: str
    expires_at: dt.datetime


class World:
    """One world: its data, its frozen "now", its sessions and the episode's completion state."""

    def __init__(self, db: Db, now: dt.datetime, seed: int, apps: Mapping[str, App]) -> None:
        self.db = db
        self.now = now
        self.seed = seed
        self.apps = apps
        self.sessions: dict[str, Session] = {}
        self._next_ids = {
            (a, t): max(rows) + 1 for a, tables in db.items() for t, rows in tables.items()
            if rows and isinstance(next(iter(rows)), int)
        }  # fmt: skip
        self.completed = False
        self.answer: Any = None
        self.input_chars = 0  # characters of API arguments received this episode (bounds.py)

    # ---------------------------------------------------------------- dispatch

    def call(self, app: str, api: str, kwargs: Mapping[str, Any]) -> Any:
        """Run ``apps[app].apis[api]`` with ``kwargs``; return a JSON-able copy of its result.

        Raises ApiError: 404 for an unknown app or API, 413/422 for arguments past the caps of
        ``bounds`` (checked first, in linear time: nothing agent code sends can hold the trainer
        long), 422 for bad arguments, and whatever the API raises. Arguments are validated before
        the API runs, so a bad call changes nothing.
        """
        try:
            spec, fn = self._lookup(app, api)
            if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
                raise ApiError(422, f"{app}.{api}: arguments must be passed as keywords")
            size = bounds.measure(f"{app}.{api}", dict(kwargs))
        except bounds.InputError as e:
            raise ApiError(e.status, str(e)) from None
        if self.input_chars + size > bounds.MAX_EPISODE_CHARS:
            raise ApiError(
                413,
                f"{app}.{api}: this episode has sent {self.input_chars} characters of arguments to the "
                f"apps; the limit is {bounds.MAX_EPISODE_CHARS}, so the world accepts no more data",
            )
        self.input_chars += size
        args = validate(fn, dict(kwargs))
        return plain(fn.fn(self, **args))

    def _lookup(self, app: str, api: str) -> tuple[App, Any]:
        bounds.check_name("app", app)
        spec = self.apps.get(app)
        if spec is None:
            raise ApiError(
                404, f"unknown app {app!r}{_suggest(app, self.apps)}; apps are {sorted(self.apps)}"
            )
        bounds.check_name("API", api)
        fn = spec.apis.get(api)
        if fn is None:
            hint = _suggest(api, spec.apis)
            raise ApiError(
                404,
                f"app {app!r} has no API {api!r}{hint}; list them with "
                f"apis.api_docs.show_api_descriptions(app_name={app!r})",
            )
        return spec, fn

    # ---------------------------------------------------------------- helpers for APIs

    def now_iso(self) -> str:
        return self.now.isoformat(timespec="seconds")

    @property
    def me(self) -> str:
        """The supervisor's email address (the username of every app account)."""
        return self.db["supervisor"]["profile"]["me"]["email"]

    def login(self, app: str, username: str, password: str) -> dict[str, Any]:
        """Check the supervisor's password for ``app`` and open a session."""
        account = self.db["supervisor"]["passwords"].get(app)
        if username != self.me or account is None or account["password"] != password:
            raise ApiError(401, f"{app}.login: invalid username or password for username {username!r}")
        digest = hashlib.sha256(f"{self.seed}|{app}|{len(self.sessions)}".encode()).hexdigest()[:24]
        token = f"{app}-{digest}"
        expires = self.now + TOKEN_TTL
        self.sessions[token] = Session(app, username, expires)
        return {"access_token": token, "token_type": "Bearer", "expires_at": expires.isoformat()}

    def user(self, app: str, access_token: str) -> str:
        """The username behind ``access_token`` for ``app``; ApiError(401) if invalid or expired."""
        s = self.sessions.get(access_token)
        if s is None:
            raise ApiError(
                401, f"{app}: invalid access_token {access_token[:32]!r}; call apis.{app}.login first"
            )
        if s.app != app:
            raise ApiError(401, f"{app}: this access_token was issued by {s.app!r}; log in to {app!r}")
        if self.now >= s.expires_at:
            raise ApiError(401, f"{app}: access_token expired at {s.expires_at.isoformat()}; log in again")
        return s.username

    def logout(self, app: str, access_token: str) -> dict[str, Any]:
        self.user(app, access_token)
        del self.sessions[access_token]
        return {"message": "logged out"}

    def table(self, app: str, name: str) -> dict[Any, dict[str, Any]]:
        return self.db[app][name]

    def new_id(self, app: str, name: str) -> int:
        """The next integer key of an int-keyed table. Monotonic per world, so a deleted row's id
        is never reused (a diff would otherwise see "changed" where a row was removed and added)."""
        key = (app, name)
        n = self._next_ids.get(key, 1)
        self._next_ids[key] = n + 1
        return n

    def get(self, app: str, name: str, key: Any, what: str) -> dict[str, Any]:
        """Row ``key`` of ``app.name``; ApiError(404) naming ``what`` if absent."""
        row = self.db[app][name].get(key)
        if row is None:
            raise ApiError(404, f"{app}: no {what} with id {key!r}")
        return row

    # ---------------------------------------------------------------- snapshots

    def fingerprint(self) -> bytes:
        """The data's state as bytes: equal bytes, the same data (what an API call changed:
        ``sandbox/flow.py``; ~0.4 ms for a task's world)."""
        return pickle.dumps(self.db, protocol=pickle.HIGHEST_PROTOCOL)

    def snapshot(self) -> Db:
        """A deep copy of ``db`` (pickle round-trip: much faster than copy.deepcopy)."""
        return pickle.loads(pickle.dumps(self.db, protocol=pickle.HIGHEST_PROTOCOL))


def canonical_json(db: Db, now: dt.datetime) -> str:
    """The canonical dump of a world: sorted keys, no whitespace. Same seed => same bytes."""
    return json.dumps({"now": now.isoformat(), "db": db}, sort_keys=True, separators=(",", ":"))


def world_hash(world: World) -> str:
    return hashlib.sha256(canonical_json(world.db, world.now).encode()).hexdigest()


def _suggest(name: str, options: Mapping[str, Any]) -> str:
    close = difflib.get_close_matches(name, list(options), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
