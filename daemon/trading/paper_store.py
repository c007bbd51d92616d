"""SQLite persistence of the paper broker: orders, fills, positions, marks.

One file, WAL mode, ``synchronous=FULL`` by default so a committed order
survives a crash of the process or the machine. Orders are stored as their
JSON body plus the few columns we query by. All methods are synchronous and
short; callers group writes with :meth:`PaperStore.transaction` so a fill,
its position change and its bracket children commit together or not at all.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

import msgspec

from daemon.errors import StoreError
from daemon.trading.portfolio import Order, Position

_SCHEMA = """
CREATE TABLE IF NOT EXISTS orders (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    client_order_id TEXT NOT NULL UNIQUE,
    symbol TEXT NOT NULL,
    role TEXT NOT NULL,
    status TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS orders_status ON orders(status);
CREATE TABLE IF NOT EXISTS fills (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    client_order_id TEXT NOT NULL,
    symbol TEXT NOT NULL,
    signed_qty REAL NOT NULL,
    price REAL NOT NULL,
    ts_ms INTEGER NOT NULL,
    realized REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS fills_ts ON fills(ts_ms);
CREATE TABLE IF NOT EXISTS positions (symbol TEXT PRIMARY KEY, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS marks (symbol TEXT PRIMARY KEY, price REAL NOT NULL);
"""

_order_dec = msgspec.json.Decoder(Order)
_pos_dec = msgspec.json.Decoder(Position)
_enc = msgspec.json.Encoder()


class PaperStore:
    """The paper broker's database at ``path`` (created if missing)."""

    def __init__(self, path: Path, synchronous: Literal["NORMAL", "FULL"] = "FULL") -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(path, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={synchronous}")
            self._db.executescript(_SCHEMA)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"{path}: cannot open paper broker store: {exc}") from None
        self.path = path

    def close(self) -> None:
        """Close the connection (idempotent)."""
        self._db.close()

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One atomic write; any exception rolls it back."""
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot begin transaction: {exc}") from None
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        try:
            self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: commit failed: {exc}") from None

    def _exec(self, sql: str, params: tuple[object, ...] = ()) -> sqlite3.Cursor:
        try:
            return self._db.execute(sql, params)
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: {exc}") from None

    # --- orders -------------------------------------------------------------

    def get_order(self, client_order_id: str) -> Order | None:
        """The stored order with this id, or None."""
        row = self._exec(
            "SELECT body FROM orders WHERE client_order_id = ?", (client_order_id,)
        ).fetchone()
        return _order_dec.decode(row[0]) if row else None

    def put_order(self, order: Order) -> None:
        """Insert or update ``order`` (keyed by client order id)."""
        self._exec(
            "INSERT INTO orders (client_order_id, symbol, role, status, created_ms, body) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(client_order_id) DO UPDATE SET "
            "status = excluded.status, body = excluded.body",
            (
                order.client_order_id,
                order.symbol,
                order.role,
                order.status,
                order.created_ms,
                _enc.encode(order),
            ),
        )

    def working_orders(self) -> list[Order]:
        """PENDING_SUBMIT and OPEN orders, oldest first."""
        rows = self._exec(
            "SELECT body FROM orders WHERE status IN ('PENDING_SUBMIT', 'OPEN') ORDER BY seq"
        ).fetchall()
        return [_order_dec.decode(r[0]) for r in rows]

    def all_orders(self) -> list[Order]:
        """Every order ever recorded, oldest first (small paper accounts only)."""
        rows = self._exec("SELECT body FROM orders ORDER BY seq").fetchall()
        return [_order_dec.decode(r[0]) for r in rows]

    def order_times_since(self, since_ms: int) -> list[int]:
        """Creation times of entry/close orders created at or after ``since_ms``.

        Bracket children are not counted: they come with their entry.
        """
        rows = self._exec(
            "SELECT created_ms FROM orders WHERE created_ms >= ? AND role IN ('entry', 'close') "
            "ORDER BY created_ms",
            (since_ms,),
        ).fetchall()
        return [int(r[0]) for r in rows]

    # --- fills, positions, marks -------------------------------------------

    def add_fill(
        self,
        order_id: str,
        symbol: str,
        signed_qty: float,
        price: float,
        ts_ms: int,
        realized: float,
    ) -> None:
        """Append one execution."""
        self._exec(
            "INSERT INTO fills (client_order_id, symbol, signed_qty, price, ts_ms, realized) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (order_id, symbol, signed_qty, price, ts_ms, realized),
        )

    def realized_since(self, since_ms: int) -> float:
        """Realized PnL of fills at or after ``since_ms``."""
        row = self._exec("SELECT SUM(realized) FROM fills WHERE ts_ms >= ?", (since_ms,)).fetchone()
        return float(row[0] or 0.0)

    def positions(self) -> dict[str, Position]:
        """Open positions by symbol."""
        rows = self._exec("SELECT body FROM positions").fetchall()
        return {p.symbol: p for p in (_pos_dec.decode(r[0]) for r in rows)}

    def put_position(self, symbol: str, position: Position | None) -> None:
        """Store ``position``; None deletes it (flat)."""
        if position is None:
            self._exec("DELETE FROM positions WHERE symbol = ?", (symbol,))
        else:
            self._exec(
                "INSERT OR REPLACE INTO positions (symbol, body) VALUES (?, ?)",
                (symbol, _enc.encode(position)),
            )

    def marks(self) -> dict[str, float]:
        """Last saved prices by symbol."""
        return {str(s): float(p) for s, p in self._exec("SELECT symbol, price FROM marks")}

    def put_marks(self, marks: dict[str, float]) -> None:
        """Save last prices."""
        for symbol, price in marks.items():
            self._exec(
                "INSERT OR REPLACE INTO marks (symbol, price) VALUES (?, ?)", (symbol, price)
            )
