"""Checkpoint the durable stores' write-ahead logs from a worker thread.

SQLite checkpoints a WAL inside whichever commit takes it past 1,000 pages
(``fdatasync`` of the WAL, then of the database), and the first commit after a
complete checkpoint restarts the WAL and syncs its new header: three syncs taken
by the thread that commits, which for the hook, wake, paper and alert stores is
the event loop's. On a loaded disk each took 67-363 ms, and the whole daemon
stood still meanwhile (docs/daemon.md, "Event loop stalls").

The keeper takes that work off the store's own connection. While it runs, the
connections it was given do not checkpoint (up to a backstop far past SQLite's
default, should the keeper fall behind), and every ``interval`` seconds in
which another connection committed, its own connection per store, in a worker
thread:

* checkpoints PASSIVE (it never waits for a writer, and no writer waits for it);
* if that left nothing of the WAL to copy, at once writes one page (the
  ``user_version`` it reads) so that the WAL restarts there, its header synced
  in the keeper's thread. A store commit that comes in between restarts it
  itself, as before; one that comes during that write waits for its sync (the
  only wait left, once per interval at most).

A checkpoint that does not restart the WAL must not be left for the store's
next commit to restart, so the keeper checkpoints only when it can restart too:
it skips a store nothing else wrote since its last pass (``data_version``).
Stores that never sync (scratch state) are never given to it: they hold their
file alone.
"""

from __future__ import annotations

import sqlite3
import stat
import threading
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import msgspec
import structlog

from daemon.logs import Outage

log = structlog.get_logger("walkeeper")

#: Pages a store's own connection lets its WAL reach while the keeper runs
#: (SQLite's default is 1,000): only a keeper far behind leaves it a checkpoint.
BACKSTOP_PAGES = 50_000
SQLITE_DEFAULT_PAGES = 1_000
#: What happens to a store the keeper cannot checkpoint (the log line and ``status``).
FALLBACK = "the store checkpoints itself, on its own thread, past the backstop"
CHECKPOINT_FAILED = f"WAL checkpoint failed: {FALLBACK}"
#: Seconds between passes.
INTERVAL = 5.0


@dataclass
class _Side:
    """The keeper's own connection to one store, used from its worker thread only."""

    db: sqlite3.Connection
    inode: int  # of the file it opened: a store made anew at the same path is reopened
    version: int = -1  # data_version at the last pass: unchanged, nobody else wrote


class WalStatus(msgspec.Struct, frozen=True, kw_only=True):
    """The keeper in ``status``: what it did, and the stores it cannot checkpoint
    (path: error), which checkpoint themselves, on their own thread, past the
    backstop."""

    checkpoints: int = 0
    restarts: int = 0
    failing: dict[str, str] = {}


@dataclass
class KeeperStats:
    """What the keeper did, for tests and benchmarks."""

    checkpoints: int = 0  # complete checkpoints
    restarts: int = 0  # WALs restarted by the keeper's own write
    busy: int = 0  # restarts left to a store's commit (it was writing)
    errors: int = 0


@dataclass
class WalKeeper:
    """The process's durable stores (registered by ``daemon.sqlite.open_sqlite``)
    and the task that checkpoints them (run by the service)."""

    interval: float = INTERVAL
    stats: KeeperStats = field(default_factory=KeeperStats)
    _stores: weakref.WeakKeyDictionary[sqlite3.Connection, tuple[Path, str]] = field(
        default_factory=weakref.WeakKeyDictionary
    )
    _sides: dict[Path, _Side] = field(default_factory=dict)
    _outages: dict[Path, Outage] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)  # the registry
    _pass_lock: threading.Lock = field(default_factory=threading.Lock)  # one pass at a time
    _runners: int = 0

    def register(self, db: sqlite3.Connection, path: Path, synchronous: str) -> None:
        """Keep ``db``'s WAL from now on (while a keeper runs); called as a store opens.
        (``db`` is held weakly: a subclass of the plain connection, as stores use.)"""
        with self._lock:
            self._stores[db] = (path, synchronous)
            running = self._runners > 0
        if running:
            _autocheckpoint(db, BACKSTOP_PAGES)

    def status(self) -> WalStatus:
        """For ``status``: counts, and the stores whose checkpoints fail now."""
        failing = {str(p): o.error for p, o in list(self._outages.items()) if o.error}
        return WalStatus(
            checkpoints=self.stats.checkpoints, restarts=self.stats.restarts, failing=failing
        )

    def forget(self, db: sqlite3.Connection) -> None:
        """``db`` is closing: the next pass closes the keeper's connection to it."""
        with self._lock:
            self._stores.pop(db, None)

    def targets(self) -> dict[Path, str]:
        """The stores to keep, by path (synchronous setting)."""
        with self._lock:
            return dict(self._stores.values())

    async def run(self) -> None:
        """Keep the registered stores until cancelled (then their connections check
        point themselves again, and the keeper's connections close)."""
        with self._lock:
            self._runners += 1
            held = list(self._stores)
        for db in held:
            _autocheckpoint(db, BACKSTOP_PAGES)
        try:
            while True:
                await anyio.sleep(self.interval)
                await anyio.to_thread.run_sync(self.keep, self.targets())
        finally:
            with self._lock:
                self._runners -= 1
                last = self._runners == 0
                held = list(self._stores) if last else []
            for db in held:
                _autocheckpoint(db, SQLITE_DEFAULT_PAGES)
            if last:
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(self.keep, {})

    def keep(self, targets: dict[Path, str]) -> None:
        """One pass over ``targets`` (in a worker thread); closes the keeper's
        connections to stores no longer among them."""
        with self._pass_lock:
            for path in [p for p in self._sides if p not in targets]:
                self._sides.pop(path).db.close()
            for path in [p for p in self._outages if p not in targets]:
                del self._outages[path]
            for path, synchronous in targets.items():
                outage = self._outages.get(path)
                if outage is None:
                    outage = self._outages[path] = Outage(
                        log, CHECKPOINT_FAILED, "WAL checkpoints work again", level="warning"
                    )
                try:
                    self._keep_one(path, synchronous)
                except (OSError, sqlite3.Error) as exc:
                    self.stats.errors += 1
                    side = self._sides.pop(path, None)
                    if side is not None:
                        side.db.close()
                    outage.failed(str(exc), store=str(path))
                else:
                    outage.worked(store=str(path))

    def _keep_one(self, path: Path, synchronous: str) -> None:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):  # (a FIFO: said so, not SQLite's 'disk I/O error')
            raise OSError(f"{path} is not a regular file")
        inode = st.st_ino
        side = self._sides.get(path)
        if side is not None and side.inode != inode:
            self._sides.pop(path).db.close()
            side = None
        if side is None:
            side = self._sides[path] = _Side(_open_side(path, synchronous), inode)
        db = side.db
        (version,) = db.execute("PRAGMA data_version").fetchone()
        if version == side.version:
            return
        side.version = version
        busy, log_frames, copied = db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        if busy or log_frames <= 0 or copied < log_frames:
            return  # a writer came meanwhile: its frames wait for the next pass
        self.stats.checkpoints += 1
        try:
            db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError:  # a store is writing: it restarted the WAL
            self.stats.busy += 1
            return
        try:
            (user_version,) = db.execute("PRAGMA user_version").fetchone()
            db.execute(f"PRAGMA user_version={int(user_version)}")
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        self.stats.restarts += 1


def _open_side(path: Path, synchronous: str) -> sqlite3.Connection:
    # (mode=rw: a store gone since it registered is not made again, empty, here)
    db = sqlite3.connect(
        f"{path.resolve().as_uri()}?mode=rw",
        uri=True,
        isolation_level=None,
        check_same_thread=False,
    )
    try:
        db.execute(f"PRAGMA synchronous={synchronous}")
        db.execute("PRAGMA busy_timeout=0")  # never wait for a store: skip instead
        db.execute(f"PRAGMA wal_autocheckpoint={BACKSTOP_PAGES}")
    except sqlite3.Error:
        db.close()
        raise
    return db


def _autocheckpoint(db: sqlite3.Connection, pages: int) -> None:
    try:
        db.execute(f"PRAGMA wal_autocheckpoint={pages}")
    except sqlite3.Error as exc:  # (a closed connection; a store's own errors are its own)
        log.debug("autocheckpoint not set", error=str(exc))


#: The daemon's keeper: stores register with it as they open, the service runs it.
KEEPER = WalKeeper()

__all__ = [
    "BACKSTOP_PAGES",
    "CHECKPOINT_FAILED",
    "FALLBACK",
    "INTERVAL",
    "KEEPER",
    "KeeperStats",
    "WalKeeper",
    "WalStatus",
]
