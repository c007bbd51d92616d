"""Persistent hook bookkeeping (SQLite, WAL): revisions, dedupe keys, cooldowns, pauses,
and what each agent has applied per market partition (so a restart re-delivers
without evaluating anything twice).

A restart must neither repeat an action (a dedupe key already acted on) nor
forget a cooldown, so both are written before the decision is acted on.
Cooldowns run on *event time*: replaying the same events gives the same
suppressions as the live run did. Dedupe keys are kept for ``dedupe_days``
(event time) and then pruned, which bounds the table; so are cooldowns that
ended that long ago (one row per hook and symbol: a signal feed's symbols are
the leaders' to choose).

``marketwake hooks resume`` is a separate process: it deletes the pause row and
leaves a resume request the daemon picks up on its next reload tick.
"""

from __future__ import annotations

import functools
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Concatenate, Literal, ParamSpec, TypeVar

from daemon.errors import StoreError
from daemon.sqlite import add_columns, open_sqlite

_SCHEMA = """
CREATE TABLE IF NOT EXISTS revisions (
    agent TEXT NOT NULL, hook TEXT NOT NULL, revision TEXT NOT NULL,
    path TEXT NOT NULL, first_seen REAL NOT NULL, compile_error TEXT,
    PRIMARY KEY (agent, hook, revision));
CREATE TABLE IF NOT EXISTS dedupe (
    agent TEXT NOT NULL, key TEXT NOT NULL, event_ms INTEGER NOT NULL,
    owner TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (agent, key));
CREATE INDEX IF NOT EXISTS dedupe_age ON dedupe (agent, event_ms);
CREATE TABLE IF NOT EXISTS cooldown (
    agent TEXT NOT NULL, hook TEXT NOT NULL, scope TEXT NOT NULL, until_ms INTEGER NOT NULL,
    owner TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (agent, hook, scope));
CREATE TABLE IF NOT EXISTS pauses (
    agent TEXT NOT NULL, hook TEXT NOT NULL, reason TEXT NOT NULL, since REAL NOT NULL,
    PRIMARY KEY (agent, hook));
CREATE TABLE IF NOT EXISTS applied (
    agent TEXT NOT NULL, partition TEXT NOT NULL, ts_ms INTEGER NOT NULL, event_id TEXT NOT NULL,
    PRIMARY KEY (agent, partition));
CREATE TABLE IF NOT EXISTS resume_requests (
    agent TEXT NOT NULL, hook TEXT NOT NULL, requested REAL NOT NULL,
    PRIMARY KEY (agent, hook));
"""

AGENT_WIDE = "*"  # the hook name of an agent-wide pause
PRUNE_EVERY = 512  # marks between retention sweeps
MAX_COOLDOWNS_CACHED = 65_536  # (agent, hook, scope) cooldowns held in memory


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _store_errors(
    fn: Callable[Concatenate[HookStore, _P], _R],
) -> Callable[Concatenate[HookStore, _P], _R]:
    """A method's SQLite failure (disk full, a corrupt file) as one :exc:`StoreError`
    naming the file and the method: callers handle that, not sqlite3's exceptions."""

    @functools.wraps(fn)
    def checked(self: HookStore, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return fn(self, *args, **kwargs)
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: hook store ({fn.__name__}): {exc}") from None

    return checked


class HookStore:
    """One SQLite file under the state dir; every method is a short transaction."""

    def __init__(
        self,
        path: Path,
        *,
        dedupe_days: float = 30.0,
        dedupe_max_keys: int = 100_000,
        synchronous: Literal["OFF", "NORMAL"] = "NORMAL",
    ) -> None:
        self._db = open_sqlite(
            path, "hook store", schema=_SCHEMA, synchronous=synchronous, batch=True
        )
        self.path = path
        self._add_owners()
        self.dedupe_ms = int(dedupe_days * 86_400_000)
        self.dedupe_max_keys = dedupe_max_keys
        self._marks = 0
        # Cooldowns as the table holds them (0: none), read once per (agent, hook,
        # scope) and written through: the daemon is their only writer (the state
        # dir's lock), and one is asked about every decision that would act.
        self._cooldowns: dict[tuple[str, str, str], tuple[int, str]] = {}

    def close(self) -> None:
        """Close the database."""
        self._db.close()

    @_store_errors
    def _add_owners(self) -> None:
        """Give a store written before owners existed its ``owner`` columns (empty in
        the old rows: they are nobody's own)."""
        for table in ("dedupe", "cooldown"):
            add_columns(self._db, table, {"owner": "TEXT NOT NULL DEFAULT ''"})

    # -- revisions -----------------------------------------------------------

    @_store_errors
    def record_revision(
        self, agent: str, hook: str, revision: str, path: str, compile_error: str | None
    ) -> bool:
        """Remember a revision the first time it is seen; True if it is new."""
        cur = self._db.execute(
            "INSERT OR IGNORE INTO revisions VALUES (?, ?, ?, ?, ?, ?)",
            (agent, hook, revision, path, time.time(), compile_error),
        )
        return cur.rowcount == 1

    @_store_errors
    def agents(self) -> list[str]:
        """Every agent some hook revision was recorded for (the agents that ran)."""
        return [str(a) for (a,) in self._db.execute("SELECT DISTINCT agent FROM revisions")]

    @_store_errors
    def compile_errors(self, agent: str) -> list[tuple[str, str, str]]:
        """(hook, revision, error) of the agent's revisions that did not compile."""
        rows = self._db.execute(
            "SELECT hook, revision, compile_error FROM revisions"
            " WHERE agent=? AND compile_error IS NOT NULL ORDER BY hook, first_seen",
            (agent,),
        )
        return [(str(h), str(r), str(e)) for h, r, e in rows]

    @_store_errors
    def revisions(self, agent: str, hook: str) -> list[tuple[str, float, str | None]]:
        """(revision, first_seen, compile_error) of one hook, oldest first."""
        rows = self._db.execute(
            "SELECT revision, first_seen, compile_error FROM revisions"
            " WHERE agent=? AND hook=? ORDER BY first_seen",
            (agent, hook),
        )
        return list(rows)

    # -- dedupe and cooldown ---------------------------------------------------

    @_store_errors
    def seen(self, agent: str, key: str, owner: str = "") -> bool:
        """Whether this agent already acted on ``key`` (other than as ``owner``)."""
        row = self._db.execute(
            "SELECT owner FROM dedupe WHERE agent=? AND key=?", (agent, key)
        ).fetchone()
        return row is not None and not (owner and row[0] == owner)

    @_store_errors
    def mark(self, agent: str, key: str, event_ms: int) -> None:
        """Record that the agent acted on ``key`` (see :meth:`claim`)."""
        self.claim(agent, key, event_ms)

    @_store_errors
    def claim(self, agent: str, key: str, event_ms: int, owner: str = "") -> bool:
        """Record that the agent acts on ``key``: False if it already had (nothing
        written), in one statement where ``seen`` then ``mark`` took two. A key held
        by the same ``owner`` (one hook's decision on one event) is still its own:
        that event was evaluated again after a crash took its audit rows, and acting
        is idempotent from here (see docs/daemon.md, "Delivery and restarts"). Now
        and then prunes: keys past retention first, then the oldest beyond
        ``dedupe_max_keys`` for this agent."""
        cur = self._db.execute(
            "INSERT OR IGNORE INTO dedupe (agent, key, event_ms, owner) VALUES (?, ?, ?, ?)",
            (agent, key, event_ms, owner),
        )
        self._marks += 1
        if self._marks % PRUNE_EVERY == 1:
            self.prune_dedupe(agent, event_ms)
        return cur.rowcount == 1 or (bool(owner) and not self.seen(agent, key, owner))

    @_store_errors
    def prune_dedupe(self, agent: str, event_ms: int) -> int:
        """Apply retention and the per-agent key cap; returns how many keys were dropped.
        The agent's cooldowns that ended longer than the retention ago go too."""
        with self._db:
            dropped = self._db.execute(
                "DELETE FROM dedupe WHERE agent=? AND event_ms < ?",
                (agent, event_ms - self.dedupe_ms),
            ).rowcount
            self._db.execute(
                "DELETE FROM cooldown WHERE agent=? AND until_ms < ?",
                (agent, event_ms - self.dedupe_ms),
            )
            (count,) = self._db.execute(
                "SELECT COUNT(*) FROM dedupe WHERE agent=?", (agent,)
            ).fetchone()
            excess = count - self.dedupe_max_keys
            if excess > 0:
                dropped += self._db.execute(
                    "DELETE FROM dedupe WHERE rowid IN (SELECT rowid FROM dedupe WHERE agent=?"
                    " ORDER BY event_ms LIMIT ?)",
                    (agent, excess),
                ).rowcount
        return dropped

    @_store_errors
    def cooling(self, agent: str, hook: str, scope: str, event_ms: int, owner: str = "") -> bool:
        """Whether a cooldown set by this hook for ``scope`` still runs at ``event_ms``;
        one that ``owner`` (the event) started is not in its own way (see :meth:`claim`)."""
        at = (agent, hook, scope)
        held = self._cooldowns.get(at)
        if held is None:
            if len(self._cooldowns) >= MAX_COOLDOWNS_CACHED:  # symbols from a signal feed
                self._cooldowns.clear()  # a cache of the table: read again as needed
            row = self._db.execute(
                "SELECT until_ms, owner FROM cooldown WHERE agent=? AND hook=? AND scope=?", at
            ).fetchone()
            held = self._cooldowns[at] = (int(row[0]), str(row[1])) if row else (0, "")
        until, started_by = held
        return event_ms < until and not (owner and started_by == owner)

    @_store_errors
    def start_cooldown(
        self, agent: str, hook: str, scope: str, until_ms: int, owner: str = ""
    ) -> None:
        """Suppress this hook's actions for ``scope`` until ``until_ms`` (event time);
        ``owner``: the event that started it."""
        self._db.execute(
            "INSERT OR REPLACE INTO cooldown (agent, hook, scope, until_ms, owner)"
            " VALUES (?, ?, ?, ?, ?)",
            (agent, hook, scope, until_ms, owner),
        )
        self._cooldowns[agent, hook, scope] = (until_ms, owner)

    # -- pauses ----------------------------------------------------------------

    @_store_errors
    def pause(self, agent: str, hook: str, reason: str) -> None:
        """Persist a pause (``hook`` = AGENT_WIDE pauses the whole agent)."""
        self._db.execute(
            "INSERT OR REPLACE INTO pauses VALUES (?, ?, ?, ?)", (agent, hook, reason, time.time())
        )

    @_store_errors
    def unpause(self, agent: str, hook: str) -> None:
        """Forget a persisted pause (a new revision of the hook starts fresh)."""
        self._db.execute("DELETE FROM pauses WHERE agent=? AND hook=?", (agent, hook))

    @_store_errors
    def pauses(self) -> list[tuple[str, str, str, float]]:
        """Every persisted pause: (agent, hook, reason, since)."""
        return list(self._db.execute("SELECT agent, hook, reason, since FROM pauses"))

    @_store_errors
    def request_resume(self, agent: str, hook: str) -> bool:
        """Lift a pause (CLI side); True if something was paused."""
        with self._db:
            cur = self._db.execute("DELETE FROM pauses WHERE agent=? AND hook=?", (agent, hook))
            self._db.execute(
                "INSERT OR REPLACE INTO resume_requests VALUES (?, ?, ?)",
                (agent, hook, time.time()),
            )
        return cur.rowcount > 0

    # -- applied marks ---------------------------------------------------------------

    @_store_errors
    def applied(self, agent: str) -> dict[str, tuple[int, str]]:
        """The last (event ms, event id) the agent finished, per partition."""
        rows = self._db.execute(
            "SELECT partition, ts_ms, event_id FROM applied WHERE agent = ?", (agent,)
        )
        return {str(p): (int(ts), str(eid)) for p, ts, eid in rows}

    def save_applied(self, rows: list[tuple[str, str, int, str]]) -> None:
        """Upsert ``(agent, partition, ts_ms, event_id)`` marks in one transaction."""
        if not rows:
            return
        try:
            with self._db:
                self._db.executemany("INSERT OR REPLACE INTO applied VALUES (?, ?, ?, ?)", rows)
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot save applied marks: {exc}") from None

    @_store_errors
    def reset_applied(self) -> int:
        """Forget every agent's marks (a replay started over). Returns rows deleted.

        The dedupe keys and cooldowns stay but become nobody's own: the events that
        come again are evaluated anew, and a decision must not pass its old key."""
        with self._db:
            self._db.execute("UPDATE dedupe SET owner='' WHERE owner != ''")
            self._db.execute("UPDATE cooldown SET owner='' WHERE owner != ''")
            self._cooldowns.clear()
            return self._db.execute("DELETE FROM applied").rowcount

    @_store_errors
    def take_resume_requests(self) -> list[tuple[str, str]]:
        """Pending resume requests (daemon side), removed as they are returned."""
        with self._db:
            rows = list(self._db.execute("SELECT agent, hook FROM resume_requests"))
            self._db.execute("DELETE FROM resume_requests")
        return rows
