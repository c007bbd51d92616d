"""The persisted high-water mark of each candle series (SQLite, WAL).

One row per partitionKey holds the close time of the last candle published.
The poller commits the mark right after ``publish()`` returns, so a restart
resumes after the last published close and a candle is never emitted twice,
except in one window: a kill between ``publish()`` and the commit re-emits that
one close on restart with the same eventId, which downstream dedupes.

Writes are tiny and rare (one per closed candle), so they run inline on the
event loop; WAL with ``synchronous=NORMAL`` survives a process kill.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from daemon.errors import StoreError
from daemon.events import now_ms
from daemon.sqlite import open_sqlite

_SCHEMA = """
CREATE TABLE IF NOT EXISTS candle_hwm (
    partition_key TEXT PRIMARY KEY,
    close_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL
)
"""

_UPSERT = """
INSERT INTO candle_hwm (partition_key, close_ms, updated_ms) VALUES (?, ?, ?)
ON CONFLICT (partition_key) DO UPDATE
SET close_ms = max(close_ms, excluded.close_ms), updated_ms = excluded.updated_ms
"""


class HighWaterStore:
    """Close time of the last published candle, per partitionKey."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._db = open_sqlite(path, "candle state", schema=_SCHEMA)

    def get(self, partition_key: str) -> int | None:
        """The last published close (epoch ms), or None if never published."""
        try:
            row = self._db.execute(
                "SELECT close_ms FROM candle_hwm WHERE partition_key = ?", (partition_key,)
            ).fetchone()
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot read {partition_key}: {exc}") from None
        return None if row is None else int(row[0])

    def advance(self, partition_key: str, close_ms: int) -> None:
        """Move the mark forward (never backward) and commit."""
        try:
            self._db.execute(_UPSERT, (partition_key, close_ms, now_ms()))
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot write {partition_key}: {exc}") from None

    def all(self) -> dict[str, int]:
        """Every mark, for status output and tests."""
        rows = self._db.execute("SELECT partition_key, close_ms FROM candle_hwm").fetchall()
        return {str(k): int(v) for k, v in rows}

    def close(self) -> None:
        """Close the database (idempotent)."""
        self._db.close()
