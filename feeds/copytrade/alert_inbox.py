"""The TradingView inbox: each accepted alert on disk before its 200, mapped to
signals after (SQLite, WAL, synchronous=FULL).

TradingView cancels a request after 3 seconds, so the answer waits only for
the alert's own commit; :class:`~feeds.copytrade.tradingview.TvMapper` maps
alerts in arrival order afterwards. One transaction stores an alert's signals
(in the ``signals`` table of :class:`~feeds.copytrade.inbox.Inbox`, published
and re-delivered as the signed webhook's are), marks the alert mapped and
keeps the mapper's open positions: a kill between two alerts maps the next
one against the right positions, and a kill before the commit maps the alert
again, to the same signal ids.
"""

from __future__ import annotations

import sqlite3
from typing import Literal

from daemon.errors import StoreError
from daemon.events import FeedEvent, encode
from feeds.copytrade.inbox import Inbox

_ALERTS = """
CREATE TABLE IF NOT EXISTS alerts (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    leader TEXT NOT NULL,
    alert_id TEXT NOT NULL,
    alert BLOB NOT NULL,
    received_ms INTEGER NOT NULL,
    mapped INTEGER NOT NULL DEFAULT 0,
    UNIQUE (leader, alert_id)
);
CREATE TABLE IF NOT EXISTS mapper (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    state BLOB NOT NULL
);
"""


class AlertInbox(Inbox):
    """Accepted alerts, the signals they became, and the mapper's state."""

    SCHEMA = Inbox.SCHEMA + _ALERTS
    WHAT = "TradingView inbox"

    def accept_alert(
        self, leader: str, alert_id: str, alert: bytes, now_ms: int
    ) -> Literal["new", "duplicate"]:
        """Store one alert (durable on return); a known alert id is a duplicate."""
        with self._lock:
            try:
                self._db.execute(
                    "INSERT INTO alerts (leader, alert_id, alert, received_ms) VALUES (?, ?, ?, ?)",
                    (leader, alert_id, alert, now_ms),
                )
                return "new"
            except sqlite3.IntegrityError:
                return "duplicate"
            except sqlite3.Error as exc:
                raise StoreError(f"{self.path}: cannot record an alert: {exc}") from None

    def unmapped(self) -> list[tuple[int, str, bytes]]:
        """(seq, leader, alert) of the alerts not mapped yet, oldest first."""
        with self._lock:
            try:
                rows = self._db.execute(
                    "SELECT seq, leader, alert FROM alerts WHERE mapped = 0 ORDER BY seq"
                ).fetchall()
            except sqlite3.Error as exc:
                raise StoreError(f"{self.path}: cannot read alerts: {exc}") from None
        return [(seq, leader, bytes(alert)) for seq, leader, alert in rows]

    def mapper_state(self) -> bytes | None:
        """What the mapper kept at its last alert."""
        with self._lock:
            try:
                row = self._db.execute("SELECT state FROM mapper WHERE id = 1").fetchone()
            except sqlite3.Error as exc:
                raise StoreError(f"{self.path}: cannot read the mapper: {exc}") from None
        return bytes(row[0]) if row else None

    def mapped(self, seq: int, signals: list[FeedEvent], state: bytes, now_ms: int) -> None:
        """One transaction: the alert's signals (unpublished), the alert marked, the
        mapper's state kept."""
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                for event in signals:
                    self._db.execute(
                        "INSERT OR IGNORE INTO signals (leader, signal_id, event, received_ms)"
                        " VALUES (?, ?, ?, ?)",
                        (
                            str(event.payload["leader"]),
                            str(event.payload["signalId"]),
                            encode(event),
                            now_ms,
                        ),
                    )
                self._db.execute("UPDATE alerts SET mapped = 1 WHERE seq = ?", (seq,))
                self._db.execute(
                    "INSERT INTO mapper (id, state) VALUES (1, ?)"
                    " ON CONFLICT(id) DO UPDATE SET state = excluded.state",
                    (state,),
                )
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise StoreError(f"{self.path}: cannot store a mapped alert: {exc}") from None

    def prune_alerts(self, before_ms: int) -> None:
        """Forget mapped alerts received before ``before_ms`` (a redelivery after
        that is a new alert)."""
        with self._lock:
            try:
                self._db.execute(
                    "DELETE FROM alerts WHERE mapped = 1 AND received_ms < ?", (before_ms,)
                )
            except sqlite3.Error as exc:
                raise StoreError(f"{self.path}: cannot prune alerts: {exc}") from None
