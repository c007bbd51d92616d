"""SQLite persistence of the paper broker: orders, fills, positions per account; marks.

Every order, fill and position belongs to an account (an agent's own by
default). A store written before accounts existed (schema version 0) is
migrated in one transaction: its rows move to :data:`LEGACY_ACCOUNT`
(``paper``, the id its events carried), which no agent trades unless its
``agent.toml`` names ``account = "paper"``.

One file, WAL mode, ``synchronous=FULL`` by default so a committed order
survives a crash of the process or the machine. The daemon opens it NORMAL
instead and calls :meth:`PaperStore.sync` from a worker thread before anyone
hears of what it committed (``PaperBroker(sync_before_emit=True)``): the same
guarantee to everyone outside, without a sync in the event loop's thread.
Orders are stored as their JSON body plus the few columns we query by. All
methods are synchronous and short; callers group writes with
:meth:`PaperStore.transaction` so a fill, its position change and its bracket
children commit together or not at all.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

import msgspec

from daemon.errors import StoreError
from daemon.sqlite import open_sqlite
from daemon.trading.portfolio import FillTotals, Order, Position

LEGACY_ACCOUNT = "paper"
SCHEMA_VERSION = 2
_SCHEMA = """
CREATE TABLE IF NOT EXISTS orders (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    client_order_id TEXT NOT NULL UNIQUE,
    account TEXT NOT NULL DEFAULT 'paper',
    symbol TEXT NOT NULL,
    role TEXT NOT NULL,
    status TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS orders_status ON orders(status);
-- The risk engine's order-rate check reads an account's last minute of orders on
-- every intent: without this it scanned the whole table (quadratic in a backtest).
CREATE INDEX IF NOT EXISTS orders_recent ON orders(account, created_ms);
CREATE TABLE IF NOT EXISTS fills (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    client_order_id TEXT NOT NULL,
    account TEXT NOT NULL DEFAULT 'paper',
    symbol TEXT NOT NULL,
    signed_qty REAL NOT NULL,
    price REAL NOT NULL,
    ts_ms INTEGER NOT NULL,
    realized REAL NOT NULL,
    fee REAL NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS fills_ts ON fills(account, ts_ms);
CREATE TABLE IF NOT EXISTS positions (
    account TEXT NOT NULL,
    symbol TEXT NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (account, symbol)
);
CREATE TABLE IF NOT EXISTS marks (symbol TEXT PRIMARY KEY, price REAL NOT NULL);
-- The price an order was recorded at, until it is opened (recovery on event time).
CREATE TABLE IF NOT EXISTS arrivals (client_order_id TEXT PRIMARY KEY, price REAL NOT NULL);
"""
# Version 0 -> 1: accounts. Old rows belong to the single account they had.
_MIGRATE_V1 = """
ALTER TABLE orders ADD COLUMN account TEXT NOT NULL DEFAULT 'paper';
ALTER TABLE fills ADD COLUMN account TEXT NOT NULL DEFAULT 'paper';
DROP INDEX IF EXISTS fills_ts;
ALTER TABLE positions RENAME TO positions_v0;
CREATE TABLE positions (
    account TEXT NOT NULL,
    symbol TEXT NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (account, symbol)
);
INSERT INTO positions (account, symbol, body) SELECT 'paper', symbol, body FROM positions_v0;
DROP TABLE positions_v0;
"""

# Version 1 -> 2: a fee per fill (none before).
_MIGRATE_V2 = "ALTER TABLE fills ADD COLUMN fee REAL NOT NULL DEFAULT 0"

# The risk engine's order-rate input (an index on account, created_ms serves it).
RECENT_ORDERS = (
    "SELECT created_ms FROM orders WHERE account = ? AND created_ms >= ? "
    "AND role IN ('entry', 'close') ORDER BY created_ms"
)
_order_dec = msgspec.json.Decoder(Order)
_pos_dec = msgspec.json.Decoder(Position)
_enc = msgspec.json.Encoder()


class FillRow(msgspec.Struct, frozen=True, kw_only=True):
    """One fill as the store keeps it: ``qty`` signed (a sell is negative),
    ``realized`` the PnL it closed before fees, ``fee`` what it paid."""

    ts_ms: int
    symbol: str
    price: float
    qty: float
    realized: float
    fee: float


class PaperStore:
    """The paper broker's database at ``path`` (created if missing)."""

    def __init__(self, path: Path, synchronous: Literal["OFF", "NORMAL", "FULL"] = "FULL") -> None:
        self._db = open_sqlite(
            path, "paper broker store", synchronous=synchronous, threads=False, batch=True
        )
        try:
            self._migrate()
            # One transaction: a kill between the tables and the version left a
            # current store marked version 0, which no start could open again
            # (its migration added a column the store already had).
            self._db.executescript(
                f"BEGIN;\n{_SCHEMA}\nPRAGMA user_version={SCHEMA_VERSION};\nCOMMIT;"
            )
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"{path}: cannot open paper broker store: {exc}") from None
        self.path = path

    def _migrate(self) -> None:
        """Bring an older store (0: no accounts; 1: no fees) to the current schema,
        atomically."""
        (version,) = self._db.execute("PRAGMA user_version").fetchone()
        has_orders = self._db.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'orders'"
        ).fetchone()
        if version >= SCHEMA_VERSION or not has_orders:
            return
        fills = {row[1] for row in self._db.execute("PRAGMA table_info(fills)")}
        if {"account", "fee"} <= fills:  # current tables, their version never written
            self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            return
        steps = ([] if version >= 1 else _MIGRATE_V1.split(";")) + [_MIGRATE_V2]
        with self._db.atomic():
            for stmt in filter(str.strip, steps):
                self._db.execute(stmt)
            self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def close(self) -> None:
        """Close the connection (idempotent)."""
        self._db.close()

    def sync(self) -> None:
        """Make every transaction committed so far durable: ``fdatasync`` the WAL, as
        ``synchronous=FULL`` does inside each commit (the file's data whatever handle
        wrote it). Blocks: the broker calls it from a worker thread."""
        try:
            # (O_NONBLOCK: a FIFO in the WAL's place fails the sync, never hangs it)
            fd = os.open(f"{self.path}-wal", os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
            try:
                os.fdatasync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot sync the orders: {exc}") from None

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One atomic write; any exception rolls it back (not durable: a savepoint in
        the store's batch, see :meth:`daemon.sqlite.Connection.atomic`)."""
        try:
            with self._db.atomic():
                yield
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: transaction failed: {exc}") from None

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
            "INSERT INTO orders (client_order_id, account, symbol, role, status, created_ms, body)"
            " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(client_order_id) DO UPDATE SET "
            "status = excluded.status, body = excluded.body",
            (
                order.client_order_id,
                order.account_id,
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

    def order_times_since(self, account: str, since_ms: int) -> list[int]:
        """Creation times of the account's entry/close orders at or after ``since_ms``.

        Bracket children are not counted: they come with their entry.
        """
        rows = self._exec(RECENT_ORDERS, (account, since_ms)).fetchall()
        return [int(r[0]) for r in rows]

    # --- fills, positions, marks -------------------------------------------

    def add_fill(
        self,
        account: str,
        order_id: str,
        symbol: str,
        signed_qty: float,
        price: float,
        ts_ms: int,
        realized: float,
        fee: float = 0.0,
    ) -> None:
        """Append one execution (``realized``: the trade's PnL, before ``fee``)."""
        self._exec(
            "INSERT INTO fills (account, client_order_id, symbol, signed_qty, price, ts_ms, "
            "realized, fee) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (account, order_id, symbol, signed_qty, price, ts_ms, realized, fee),
        )

    def realized_since(self, account: str, since_ms: int) -> float:
        """Realized PnL of the account's fills at or after ``since_ms``, net of fees."""
        row = self._exec(
            "SELECT SUM(realized - fee) FROM fills WHERE account = ? AND ts_ms >= ?",
            (account, since_ms),
        ).fetchone()
        return float(row[0] or 0.0)

    def fill_totals(self, account: str) -> FillTotals:
        """The account's fills summed (for ``status``: one indexed scan of its fills)."""
        n, realized, fees, last = self._exec(
            "SELECT COUNT(*), SUM(realized - fee), SUM(fee), MAX(ts_ms) FROM fills "
            "WHERE account = ?",
            (account,),
        ).fetchone()
        return FillTotals(
            fills=int(n),
            realized=float(realized or 0.0),
            fees=float(fees or 0.0),
            last_ms=None if last is None else int(last),
        )

    def fills(self, account: str) -> list[FillRow]:
        """The account's fills, oldest first (backtest reports, the demo's summary)."""
        rows = self._exec(
            "SELECT ts_ms, symbol, price, signed_qty, realized, fee FROM fills WHERE account = ?"
            " ORDER BY id",
            (account,),
        )
        return [
            FillRow(ts_ms=int(t), symbol=str(s), price=float(p), qty=float(q),
                    realized=float(r), fee=float(f))
            for t, s, p, q, r, f in rows
        ]  # fmt: skip

    def positions(self) -> dict[str, dict[str, Position]]:
        """Open positions by account, then symbol."""
        out: dict[str, dict[str, Position]] = {}
        for account, body in self._exec("SELECT account, body FROM positions"):
            pos = _pos_dec.decode(body)
            out.setdefault(str(account), {})[pos.symbol] = pos
        return out

    def put_position(self, account: str, symbol: str, position: Position | None) -> None:
        """Store the account's ``position``; None deletes it (flat)."""
        if position is None:
            self._exec("DELETE FROM positions WHERE account = ? AND symbol = ?", (account, symbol))
        else:
            self._exec(
                "INSERT OR REPLACE INTO positions (account, symbol, body) VALUES (?, ?, ?)",
                (account, symbol, _enc.encode(position)),
            )

    def marks(self) -> dict[str, float]:
        """Last saved prices by symbol."""
        return {str(s): float(p) for s, p in self._exec("SELECT symbol, price FROM marks")}

    def put_arrival(self, client_order_id: str, price: float) -> None:
        """The market price as an order was recorded (before it is opened)."""
        self._exec(
            "INSERT OR REPLACE INTO arrivals (client_order_id, price) VALUES (?, ?)",
            (client_order_id, price),
        )

    def take_arrival(self, client_order_id: str) -> float | None:
        """The price :meth:`put_arrival` kept for the order, forgotten as it is read."""
        row = self._exec(
            "SELECT price FROM arrivals WHERE client_order_id = ?", (client_order_id,)
        ).fetchone()
        if row is None:
            return None
        self._exec("DELETE FROM arrivals WHERE client_order_id = ?", (client_order_id,))
        return float(row[0])

    def put_marks(self, marks: dict[str, float]) -> None:
        """Save last prices."""
        for symbol, price in marks.items():
            self._exec(
                "INSERT OR REPLACE INTO marks (symbol, price) VALUES (?, ?)", (symbol, price)
            )
