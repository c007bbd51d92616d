"""Alerts the webhook has not taken yet, kept on disk, so that neither a restart nor an
outage longer than the retries loses them.

An alert for the webhook is written here as it is raised, before its first
attempt, and deleted once the webhook has it (or refuses it for good: a 4xx
would refuse it again). What is left is posted again, marked ``redelivered``:
at the next start, and after an outage once the endpoint takes an alert again.
Only alerts raised less than ``keep_seconds`` ago go out again; older ones are
dropped, counted and logged, since an alert about the market of hours ago is
noise. Delivery is at least once: a kill between the endpoint's answer and the
delete posts that alert again (``eventId`` and ``hookId`` identify it).

Writes are single small statements in WAL mode, run inline; alerts are rare.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Container
from pathlib import Path
from typing import Any, NamedTuple

import structlog

from daemon.errors import StoreError
from daemon.sqlite import open_sqlite

log = structlog.get_logger("alerts")
FILE_NAME = "alerts.sqlite3"
MAX_ROWS = 10_000  # kept at most; past it the oldest go first (counted as expired)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS alert_outbox (
    id INTEGER PRIMARY KEY,
    raised_at REAL NOT NULL,
    body BLOB NOT NULL
);
"""


class Kept(NamedTuple):
    """An alert the outbox holds: its row, the alert as posted (JSON), and when it was
    raised."""

    row: int
    body: bytes
    raised_at: float


class AlertOutbox:
    """The alerts not delivered yet, in ``alerts.sqlite3`` under the state dir. It
    keeps each alert's JSON body; reading it is the sender's business."""

    def __init__(
        self,
        path: Path,
        *,
        keep_seconds: float,
        max_rows: int = MAX_ROWS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(path)
        self.keep_seconds = keep_seconds
        self.max_rows = max_rows
        self.expired = 0  # dropped unposted: older than keep_seconds, or past max_rows
        self._clock = clock
        self._db = open_sqlite(self.path, "alert outbox", schema=_SCHEMA)

    def _exec(self, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
        try:
            return self._db.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"alert outbox {self.path}: {exc}") from None

    def add(self, body: bytes) -> int:
        """Keep an alert's ``body`` until :meth:`done`; returns its row."""
        rows = self._exec(
            "INSERT INTO alert_outbox (raised_at, body) VALUES (?, ?) RETURNING id",
            (self._clock(), body),
        )
        row = int(rows[0][0])
        over = self.count() - self.max_rows
        if over > 0:
            self._exec(
                "DELETE FROM alert_outbox WHERE id IN"
                " (SELECT id FROM alert_outbox ORDER BY id LIMIT ?)",
                (over,),
            )
            self._expired(over, f"more than {self.max_rows} kept")
        return row

    def done(self, row: int) -> None:
        """The webhook has the alert of ``row`` (or refused it for good)."""
        self._exec("DELETE FROM alert_outbox WHERE id = ?", (row,))

    def due(self, skip: Container[int], limit: int) -> tuple[list[Kept], list[bytes]]:
        """Up to ``limit`` kept alerts not in ``skip`` (those already queued), oldest
        first; and the bodies of the ones too old to post, dropped on the way."""
        cutoff = self._clock() - self.keep_seconds
        old = self._exec("DELETE FROM alert_outbox WHERE raised_at < ? RETURNING body", (cutoff,))
        if old:
            self._expired(len(old), f"raised over {self.keep_seconds:g} s ago")
        expired = [bytes(r[0]) for r in old]
        out: list[Kept] = []
        if limit <= 0:
            return out, expired
        for row, raised_at, body in self._exec(
            "SELECT id, raised_at, body FROM alert_outbox ORDER BY id"
        ):
            if row in skip:
                continue
            out.append(Kept(row, bytes(body), raised_at))
            if len(out) >= limit:
                break
        return out, expired

    def count(self) -> int:
        """How many alerts are kept."""
        return int(self._exec("SELECT count(*) FROM alert_outbox")[0][0])

    def _expired(self, n: int, why: str) -> None:
        self.expired += n
        log.warning("kept alerts dropped unposted (in the log and the audit)", alerts=n, why=why)

    def close(self) -> None:
        self._db.close()
