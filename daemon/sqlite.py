"""One way to open the daemon's SQLite stores (hooks, wake runs, paper broker, candles).

Every store wants the same thing: the parent directory created, WAL (readers never
block the writer), a busy timeout (``status`` and the CLI read while the daemon
writes), autocommit unless a store opens its own transactions, and one clear
:exc:`StoreError` that names the file and what it holds when any of it fails.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from daemon.errors import StoreError

#: Statements per transaction of a store opened with ``batch`` (see :class:`_Batched`).
BATCH_STATEMENTS = 256


class _Batched(sqlite3.Connection):
    """A connection whose statements share one transaction, committed every
    ``batch`` statements and at close: for stores that skip syncing anyway (a
    backtest's scratch state), where a commit per statement cost ~20 us of WAL
    writing against ~2 us batched. A crash loses the uncommitted statements, which
    is what ``durable = false`` allows. ``batch`` = 0 (while opening) passes through."""

    batch = 0
    _pending = 0

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        self._begin()
        cur = super().execute(sql, parameters)
        self._wrote()
        return cur

    def executemany(self, sql: str, parameters: Iterable[Any], /) -> sqlite3.Cursor:
        self._begin()
        cur = super().executemany(sql, parameters)
        self._wrote()
        return cur

    def _begin(self) -> None:
        if self.batch and not self.in_transaction:
            super().execute("BEGIN")

    def _wrote(self) -> None:
        if not self.batch:
            return
        self._pending += 1
        if self._pending >= self.batch:
            self._pending = 0
            if self.in_transaction:
                super().execute("COMMIT")

    def close(self) -> None:
        if self.batch and self.in_transaction:  # a store's own open transaction is
            super().execute("COMMIT")  # not committed by closing (as sqlite3 does)
        super().close()


def open_sqlite(
    path: Path,
    what: str,
    *,
    schema: str = "",
    synchronous: Literal["OFF", "NORMAL", "FULL"] = "NORMAL",
    threads: bool = True,
    batch: bool = False,
) -> sqlite3.Connection:
    """Open (creating it if needed) the ``what`` store at ``path`` and apply ``schema``.

    ``threads`` allows use from worker threads (callers serialize access).
    ``batch``: group statements into transactions (only for a store that does not
    open its own, and only with ``synchronous`` OFF; see :class:`_Batched`).
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(
            path, isolation_level=None, check_same_thread=not threads, factory=_Batched
        )
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(f"PRAGMA synchronous={synchronous}")
        db.execute("PRAGMA busy_timeout=5000")
        if schema:
            db.executescript(schema)
    except (OSError, sqlite3.Error) as exc:
        raise StoreError(f"{path}: cannot open {what}: {exc}") from None
    if batch and synchronous == "OFF":
        db.batch = BATCH_STATEMENTS
    return db
