"""The persistent skill store: one SQLite file in WAL mode (issue 4, "The store").

- Versioned: every distinct code saved under a name is a row ``(name, version)``; the newest is
  marked ``current``. Same name and same code updates the current row (tier raised, counters kept).
  Identical code under a new name is refused as a duplicate (the existing name is reported).
- Provenance and counters are columns, so they can be queried and incremented atomically.
- Concurrency: WAL lets several readers work while one writer writes; every write is one
  ``BEGIN IMMEDIATE`` transaction (writers queue on the lock for up to ``timeout_s``).
- Durability: ``synchronous=FULL``, so a committed transaction survives a crash of the process
  (and of the machine); a writer killed mid-transaction leaves nothing of that transaction.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import urllib.parse
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sage_rl.skills.library import AddResult, AddStatus, Library
from sage_rl.skills.record import Skill, SkillError, Tier, check_field

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS skills (
    name TEXT NOT NULL,
    version INTEGER NOT NULL,
    current INTEGER NOT NULL,
    content_hash TEXT NOT NULL,
    tier INTEGER NOT NULL,
    uses INTEGER NOT NULL DEFAULT 0,
    successes INTEGER NOT NULL DEFAULT 0,
    task_id TEXT NOT NULL DEFAULT '',
    scenario_id TEXT NOT NULL DEFAULT '',
    policy TEXT NOT NULL DEFAULT '',
    step INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL DEFAULT 0,
    record TEXT NOT NULL,
    PRIMARY KEY (name, version)
);
CREATE INDEX IF NOT EXISTS skills_current ON skills (current, name);
CREATE INDEX IF NOT EXISTS skills_hash ON skills (content_hash, current);
"""

_COLUMNS = "name, version, current, content_hash, tier, uses, successes, record"


class StoreError(RuntimeError):
    """The store file cannot be used (wrong schema, not a sage-rl store, locked too long)."""


@dataclass(frozen=True)
class StoreStats:
    skills: int
    versions: int
    by_tier: dict[str, int]
    scenarios: int
    uses: int
    successes: int


class SkillStore:
    """A SQLite skill store. One instance per thread; open as many readers as you like."""

    def __init__(self, path: str | Path, *, readonly: bool = False, timeout_s: float = 30.0) -> None:
        """Open (and, unless ``readonly``, create) a store. Refuses, with ``StoreError`` and before
        writing anything to it, a file that is not a sage-rl store of this schema (another SQLite
        database, another schema version, not SQLite at all) and a file with corrupt pages."""
        self.path = Path(path)
        self.skipped: list[str] = []  # corrupt stored records left out of the last listing
        if readonly and not self.path.is_file():
            raise StoreError(f"skill store not found: {self.path}")
        fresh = not self.path.exists() or self.path.stat().st_size == 0
        try:
            if not fresh:
                _inspect(self.path, timeout_s)  # read-only: a foreign file is refused untouched
            uri = _uri(self.path) + ("?mode=ro" if readonly else "")
            self._db = sqlite3.connect(uri, uri=True, timeout=timeout_s, isolation_level=None)
            self._db.execute(f"PRAGMA busy_timeout = {int(timeout_s * 1000)}")
            if not readonly:
                self._db.execute("PRAGMA journal_mode = WAL")
                self._db.execute("PRAGMA synchronous = FULL")
                with self._write():
                    for statement in filter(str.strip, _SCHEMA.split(";")):
                        self._db.execute(statement)
                    self._db.execute(
                        "INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),)
                    )
            self._check_schema()
        except sqlite3.DatabaseError as e:
            raise StoreError(
                f"{self.path} is not a usable skill store (corrupt, or not SQLite): {e}"
            ) from None

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> SkillStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing ---------------------------------------------------------------------------
    def put(self, skill: Skill) -> AddResult:
        """Save one skill (see the module docstring for the versioning rules)."""
        return self.put_many([skill])[0]

    def put_many(self, skills: Iterable[Skill]) -> list[AddResult]:
        """Save several skills in one transaction: all of them or none survive a crash."""
        with self._write():
            return [self._put(s) for s in skills]

    def add_counts(self, name: str, uses: int, successes: int) -> None:
        """Atomically add to the usage counters of the current version of ``name``."""
        with self._write():
            cur = self._db.execute(
                "UPDATE skills SET uses = uses + ?, successes = successes + ? WHERE name = ? AND current = 1",
                (uses, successes, name),
            )
            if cur.rowcount == 0:
                raise KeyError(f"no skill called {name!r} in {self.path}")

    def save_library(self, library: Library) -> list[AddResult]:
        return self.put_many(library)

    def _put(self, skill: Skill) -> AddResult:
        row = self._db.execute(
            "SELECT version, content_hash, tier FROM skills WHERE name = ? AND current = 1", (skill.name,)
        ).fetchone()
        if row and row[1] == skill.content_hash:
            self._db.execute(
                "UPDATE skills SET tier = max(tier, ?), uses = max(uses, ?), successes = max(successes, ?) "
                "WHERE name = ? AND current = 1",
                (int(skill.tier), skill.uses, skill.successes, skill.name),
            )
            return AddResult(AddStatus.UNCHANGED, skill.name, row[0])
        twin = self._db.execute(
            "SELECT name, version FROM skills WHERE content_hash = ? AND current = 1 AND name != ?",
            (skill.content_hash, skill.name),
        ).fetchone()
        if twin and not row:
            return AddResult(AddStatus.DUPLICATE, twin[0], twin[1])
        version = max(skill.version, row[0] + 1) if row else skill.version
        self._db.execute("UPDATE skills SET current = 0 WHERE name = ?", (skill.name,))
        self._insert(replace(skill, version=version))
        return AddResult(AddStatus.REPLACED if row else AddStatus.ADDED, skill.name, version)

    def _insert(self, s: Skill) -> None:
        p = s.provenance
        self._db.execute(
            "INSERT OR REPLACE INTO skills VALUES (?, ?, 1, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (s.name, s.version, s.content_hash, int(s.tier), s.uses, s.successes,
             p.task_id, p.scenario_id, p.policy, p.step, p.created_at, s.to_json()),
        )  # fmt: skip

    @contextlib.contextmanager
    def _write(self) -> Iterator[None]:
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as e:
            raise StoreError(f"cannot write to {self.path}: {e}") from None
        try:
            yield
            self._db.execute("COMMIT")
        except BaseException as e:
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("ROLLBACK")
            if isinstance(e, sqlite3.DatabaseError):
                raise StoreError(f"cannot write to {self.path}: {e}") from None
            raise

    # -- reading ---------------------------------------------------------------------------
    def get(self, name: str, version: int | None = None) -> Skill | None:
        """The current version of ``name``, or the given ``version``; None when absent."""
        if version is None:
            sql, args = f"SELECT {_COLUMNS} FROM skills WHERE name = ? AND current = 1", (name,)
        else:
            sql, args = f"SELECT {_COLUMNS} FROM skills WHERE name = ? AND version = ?", (name, version)
        rows = self._query(sql, args)
        return _skill(rows[0]) if rows else None

    def history(self, name: str) -> list[Skill]:
        """Every stored version of ``name``, oldest first."""
        rows = self._query(f"SELECT {_COLUMNS} FROM skills WHERE name = ? ORDER BY version", (name,))
        return [_skill(r) for r in rows]

    def current(self) -> list[Skill]:
        """The current version of every skill, by name. A corrupt stored record is left out, logged
        and listed in ``skipped``: one poisoned row must not break search or loading."""
        self.skipped = []
        out = []
        for row in self._query(f"SELECT {_COLUMNS} FROM skills WHERE current = 1 ORDER BY name"):
            try:
                out.append(_skill(row))
            except StoreError as e:
                self.skipped.append(str(e))
                log.warning("%s (skipped)", e)
        return out

    def latest(self) -> list[Skill]:
        """Same as ``current``."""
        return self.current()

    def all_versions(self) -> list[Skill]:
        rows = self._query(f"SELECT {_COLUMNS} FROM skills ORDER BY name, version")
        return [_skill(r) for r in rows]

    def names(self) -> list[str]:
        return [r[0] for r in self._query("SELECT name FROM skills WHERE current = 1 ORDER BY name")]

    def __len__(self) -> int:
        return self._query("SELECT count(*) FROM skills WHERE current = 1")[0][0]

    def load_library(self, min_tier: Tier = Tier.PARSED) -> Library:
        """The current skills at ``min_tier`` or above as a new in-memory library (oldest first)."""
        skills = sorted(self.current(), key=lambda s: (s.provenance.created_at, s.name))
        return Library(s for s in skills if s.tier >= min_tier)

    def stats(self) -> StoreStats:
        q = self._query
        tiers = dict(q("SELECT tier, count(*) FROM skills WHERE current = 1 GROUP BY tier"))
        uses, successes = q(
            "SELECT coalesce(sum(uses), 0), coalesce(sum(successes), 0) FROM skills WHERE current = 1"
        )[0]
        return StoreStats(
            skills=len(self),
            versions=q("SELECT count(*) FROM skills")[0][0],
            by_tier={t.label: tiers.get(int(t), 0) for t in Tier},
            scenarios=q("SELECT count(DISTINCT scenario_id) FROM skills WHERE current = 1")[0][0],
            uses=uses,
            successes=successes,
        )

    def _query(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """All rows of a read; a damaged file is a ``StoreError`` naming it, not a raw DatabaseError."""
        try:
            return self._db.execute(sql, args).fetchall()
        except sqlite3.DatabaseError as e:
            raise StoreError(
                f"{self.path} cannot be read ({e}); run `PRAGMA integrity_check` on it"
            ) from None

    def integrity_ok(self) -> bool:
        return self._db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"

    def _check_schema(self) -> None:
        try:
            row = self._db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
        except sqlite3.OperationalError:
            row = None
        if row is None or row[0] != str(SCHEMA_VERSION):
            raise StoreError(
                f"{self.path} is not a sage-rl skill store of schema {SCHEMA_VERSION} (found {row})"
            )


def _skill(row: tuple[Any, ...]) -> Skill:
    """The stored record, with the columns that change in place (version, tier, counters) checked
    like the record's own fields. Raises ``StoreError`` naming the record."""
    name, version, _current, _hash, tier, uses, successes, record = row
    try:
        s = Skill.from_json(record if isinstance(record, str) else "")
        return replace(
            s,
            version=check_field(s.name, "version", version),
            tier=Tier.parse(tier),
            uses=check_field(s.name, "uses", uses),
            successes=check_field(s.name, "successes", successes),
        )
    except SkillError as e:
        raise StoreError(f"stored record {name!r} v{version} is corrupt: {e}") from None


def _uri(path: Path) -> str:
    return "file:" + urllib.parse.quote(str(path.absolute()))


def _inspect(path: Path, timeout_s: float) -> None:
    """Refuse an existing file that is not an intact sage-rl store of this schema, opening it read
    only (so nothing is written to a file that is refused: no tables, no WAL switch)."""
    db = sqlite3.connect(_uri(path) + "?mode=ro", uri=True, timeout=timeout_s)
    try:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not tables:
            return  # an empty SQLite database: it becomes a store
        row = (
            db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone() if "meta" in tables else None
        )
        if row is None or row[0] != str(SCHEMA_VERSION) or "skills" not in tables:
            found = f"schema {row[0]}" if row else f"tables {sorted(tables)[:8]}"
            raise StoreError(
                f"{path} is not a sage-rl skill store of schema {SCHEMA_VERSION} (it holds {found}); "
                "it was left untouched"
            )
        problems = [r[0] for r in db.execute("PRAGMA quick_check(5)")]
        if problems != ["ok"]:
            raise StoreError(f"{path} is corrupt (SQLite quick_check: {'; '.join(problems)[:300]})")
    finally:
        db.close()
