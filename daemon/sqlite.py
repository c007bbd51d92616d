"""One way to open the daemon's SQLite stores (hooks, wake runs, paper broker, candles).

Every store wants the same thing: the parent directory created, WAL (readers never
block the writer), a busy timeout (``status`` and the CLI read while the daemon
writes), autocommit unless a store opens its own transactions, and one clear
:exc:`StoreError` that names the file and what it holds when any of it fails.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Literal

from daemon.errors import StoreError


def open_sqlite(
    path: Path,
    what: str,
    *,
    schema: str = "",
    synchronous: Literal["OFF", "NORMAL", "FULL"] = "NORMAL",
    threads: bool = True,
) -> sqlite3.Connection:
    """Open (creating it if needed) the ``what`` store at ``path`` and apply ``schema``.

    ``threads`` allows use from worker threads (callers serialize access).
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=not threads)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(f"PRAGMA synchronous={synchronous}")
        db.execute("PRAGMA busy_timeout=5000")
        if schema:
            db.executescript(schema)
    except (OSError, sqlite3.Error) as exc:
        raise StoreError(f"{path}: cannot open {what}: {exc}") from None
    return db
