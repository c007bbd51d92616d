"""The copy-trade inbox: every accepted signal on disk before its 2xx, and the
nonces that make a replayed request recognisable (SQLite, WAL, synchronous=FULL).

``accept`` decides a request in one transaction: a nonce seen before is a
replay; a signal id seen before (a leader retrying with a fresh nonce) is a
duplicate, answered 2xx but not published again; anything else is stored as
not yet published. The feed publishes in arrival order and marks each one;
a signal stored but not marked (a kill between the answer and the publish) is
published at the next start under the same event id, as are the signals of
the last minutes before the start (on the bus, perhaps not yet evaluated by
every agent when the daemon stopped): agents skip event ids they evaluated,
and a follower's order is keyed by the signal, so it is placed once.

Calls block (an fsync per accepted signal): the feed runs them in a worker
thread, one at a time (the lock).
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Literal

import msgspec

from daemon.errors import StoreError
from daemon.events import FeedEvent, decode, encode
from daemon.sqlite import open_sqlite

_SCHEMA = """
CREATE TABLE IF NOT EXISTS signals (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    leader TEXT NOT NULL,
    signal_id TEXT NOT NULL,
    event BLOB NOT NULL,
    received_ms INTEGER NOT NULL,
    published INTEGER NOT NULL DEFAULT 0,
    UNIQUE (leader, signal_id)
);
CREATE TABLE IF NOT EXISTS nonces (
    leader TEXT NOT NULL,
    nonce TEXT NOT NULL,
    sent_s INTEGER NOT NULL,
    PRIMARY KEY (leader, nonce)
);
CREATE INDEX IF NOT EXISTS nonces_by_time ON nonces (sent_s);
"""

Verdict = Literal["new", "duplicate", "replayed"]


class LeaderActivity(msgspec.Struct, frozen=True, kw_only=True):
    """One leader's signals in the inbox, for ``copytrade status``."""

    leader: str
    signals: int
    unpublished: int
    last: FeedEvent
    last_received_ms: int


class Inbox:
    """Accepted signals and recent nonces of the webhook feed (see the module doc)."""

    SCHEMA = _SCHEMA
    WHAT = "copy-trade inbox"

    def __init__(self, path: Path) -> None:
        self.path = path
        self._db = open_sqlite(path, self.WHAT, schema=self.SCHEMA, synchronous="FULL")
        self._lock = threading.Lock()

    def accept(
        self, leader: str, signal_id: str, nonce: str, sent_s: int, event: FeedEvent, now_ms: int
    ) -> Verdict:
        """Record one verified request (see the module doc); durable on return."""
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    self._db.execute(
                        "INSERT INTO nonces (leader, nonce, sent_s) VALUES (?, ?, ?)",
                        (leader, nonce, sent_s),
                    )
                except sqlite3.IntegrityError:
                    self._db.execute("ROLLBACK")
                    return "replayed"
                try:
                    self._db.execute(
                        "INSERT INTO signals (leader, signal_id, event, received_ms)"
                        " VALUES (?, ?, ?, ?)",
                        (leader, signal_id, encode(event), now_ms),
                    )
                    verdict: Verdict = "new"
                except sqlite3.IntegrityError:
                    verdict = "duplicate"
                self._db.execute("COMMIT")
                return verdict
            except sqlite3.Error as exc:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise StoreError(f"{self.path}: cannot record a signal: {exc}") from None

    def to_publish(self, since_ms: int) -> list[FeedEvent]:
        """At start: signals not yet published, and those published but received
        since ``since_ms`` (an agent may not have finished them when the daemon
        stopped; agents skip what they evaluated), oldest first."""
        with self._lock:
            try:
                rows = self._db.execute(
                    "SELECT event FROM signals WHERE published = 0 OR received_ms >= ?"
                    " ORDER BY seq",
                    (since_ms,),
                ).fetchall()
            except sqlite3.Error as exc:
                raise StoreError(f"{self.path}: cannot read signals: {exc}") from None
        return [decode(row[0]) for row in rows]

    def activity(self) -> list[LeaderActivity]:
        """Per leader: signals kept, not yet published, and the newest one."""
        with self._lock:
            try:
                rows = self._db.execute(
                    "SELECT leader, count(*), sum(published = 0), max(seq) FROM signals"
                    " GROUP BY leader ORDER BY leader"
                ).fetchall()
                out = []
                for leader, count, unpublished, seq in rows:
                    event, received = self._db.execute(
                        "SELECT event, received_ms FROM signals WHERE seq = ?", (seq,)
                    ).fetchone()
                    out.append(
                        LeaderActivity(
                            leader=leader,
                            signals=count,
                            unpublished=unpublished,
                            last=decode(event),
                            last_received_ms=received,
                        )
                    )
            except sqlite3.Error as exc:
                raise StoreError(f"{self.path}: cannot read signals: {exc}") from None
        return out

    def published(self, leader: str, signal_id: str) -> None:
        """Mark one signal as on the bus."""
        with self._lock:
            try:
                self._db.execute(
                    "UPDATE signals SET published = 1 WHERE leader = ? AND signal_id = ?",
                    (leader, signal_id),
                )
            except sqlite3.Error as exc:
                raise StoreError(f"{self.path}: cannot mark a signal: {exc}") from None

    def prune(self, older_than_s: int, keep_signals_after_ms: int) -> None:
        """Forget nonces sent before ``older_than_s`` (their timestamps are refused
        anyway) and published signals received before ``keep_signals_after_ms``."""
        with self._lock:
            try:
                self._db.execute("DELETE FROM nonces WHERE sent_s < ?", (older_than_s,))
                self._db.execute(
                    "DELETE FROM signals WHERE published = 1 AND received_ms < ?",
                    (keep_signals_after_ms,),
                )
            except sqlite3.Error as exc:
                raise StoreError(f"{self.path}: cannot prune: {exc}") from None

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._db.close()
