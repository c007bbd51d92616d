"""One way to open the daemon's SQLite stores (hooks, wake runs, paper broker, candles).

Every store wants the same thing: the parent directory created, WAL (readers never
block the writer), a busy timeout (``status`` and the CLI read while the daemon
writes), autocommit unless a store opens its own transactions, and one clear
:exc:`StoreError` that names the file and what it holds when any of it fails.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from daemon.errors import StoreError
from daemon.walkeeper import KEEPER

#: Statements per transaction of a store opened with ``batch`` (see :class:`Connection`).
BATCH_STATEMENTS = 256


class Connection(sqlite3.Connection):
    """A store's connection. Opened with ``batch`` (stores that skip syncing anyway:
    a backtest's scratch state), its statements share one transaction, committed
    every ``batch`` statements and at close, where a commit per statement cost
    ~20 us of WAL writing against ~2 us batched; a crash loses the uncommitted
    statements, which is what ``durable = false`` allows. ``batch`` = 0 (while
    opening, and for every durable store) passes through."""

    batch = 0
    _pending = 0
    _depth = 0  # atomic() blocks open: the batch may not commit inside one

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

    @contextmanager
    def atomic(self) -> Iterator[None]:
        """One atomic write: its own transaction, or, while batching or inside another
        transaction, a savepoint in that one (committed with it). An exception rolls
        it back."""
        if not self.batch and not self.in_transaction:
            super().execute("BEGIN IMMEDIATE")
            try:
                yield
            except BaseException:
                if self.in_transaction:  # (an error may have rolled it back already)
                    super().execute("ROLLBACK")
                raise
            super().execute("COMMIT")
            return
        self._begin()
        super().execute("SAVEPOINT atomic")
        self._depth += 1
        try:
            yield
        except BaseException:
            if self.in_transaction:
                super().execute("ROLLBACK TO atomic")
                super().execute("RELEASE atomic")
            raise
        finally:
            self._depth -= 1
        super().execute("RELEASE atomic")
        self._wrote()

    def _begin(self) -> None:
        if self.batch and not self.in_transaction:
            super().execute("BEGIN")

    def _wrote(self) -> None:
        if not self.batch:
            return
        self._pending += 1
        if self._pending >= self.batch and not self._depth:
            self._pending = 0
            if self.in_transaction:
                super().execute("COMMIT")

    def close(self) -> None:
        KEEPER.forget(self)
        if self.batch and self.in_transaction and not self._depth:
            super().execute("COMMIT")  # what batching held (an unfinished atomic() is not)
        super().close()


def add_columns(db: sqlite3.Connection, table: str, columns: dict[str, str]) -> None:
    """Add each of ``columns`` (name: declaration) that ``table`` lacks: a store an
    older version wrote gets them, with their defaults in its old rows."""
    have = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
    for name, declaration in columns.items():
        if name not in have:
            db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {declaration}")


def open_sqlite(
    path: Path,
    what: str,
    *,
    schema: str = "",
    synchronous: Literal["OFF", "NORMAL", "FULL"] = "NORMAL",
    threads: bool = True,
    batch: bool = False,
) -> Connection:
    """Open (creating it if needed) the ``what`` store at ``path`` and apply ``schema``.

    ``threads`` allows use from worker threads (callers serialize access).
    ``batch``: with ``synchronous`` OFF only (scratch state), group statements into
    transactions (see :class:`Connection`) and hold the file for this process alone
    (EXCLUSIVE locking: no lock taken and released per statement; nothing else may
    open the store while the daemon runs). A store that syncs is given to the WAL
    keeper (:mod:`daemon.walkeeper`), which checkpoints it from a worker thread while
    the service runs.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(
            path, isolation_level=None, check_same_thread=not threads, factory=Connection
        )
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(f"PRAGMA synchronous={synchronous}")
        db.execute("PRAGMA busy_timeout=5000")
        if schema:
            db.executescript(schema)
    except (OSError, sqlite3.Error) as exc:
        raise StoreError(f"{path}: cannot open {what}: {exc}") from None
    if not isinstance(db, Connection):  # the factory's class, for mypy
        raise TypeError(f"unexpected connection {type(db).__name__}")
    if batch and synchronous == "OFF":
        try:
            db.execute("PRAGMA locking_mode=EXCLUSIVE")
        except sqlite3.Error as exc:
            raise StoreError(f"{path}: cannot open {what}: {exc}") from None
        db.batch = BATCH_STATEMENTS
    elif synchronous != "OFF":
        KEEPER.register(db, path, synchronous)  # its WAL checkpoints off this thread
    return db
