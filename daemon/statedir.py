"""The state dir's well-known files, and the lock that makes it one daemon's.

One daemon per state dir: an exclusive ``flock`` on ``<state_dir>/lock``.

Two daemons on one state dir would interleave the audit log, race on the
SQLite stores and overwrite each other's status. The lock is held for the
whole run and released by the kernel when the process dies (even kill -9),
so a stale lock file never blocks a restart. The holder's pid is written into
the file for the error message and for ``status``; liveness is decided by the
lock itself, never by a pid file another process may have overwritten.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from pathlib import Path
from typing import Self

from daemon.errors import StateDirInUse, StoreError

LOCK_FILE = "lock"
STATUS_FILE = "status.json"
SNAPSHOT_FILE = "state_cache.json"
REPLAY_FILE = "replay_source"  # which replay file the state dir has seen


def _read_pid(fd: int) -> int | None:
    try:
        raw = os.pread(fd, 32, 0)
    except OSError:
        return None
    text = raw.decode("ascii", "replace").strip()
    return int(text) if text.isdigit() else None


def _open(state_dir: Path, name: str) -> int:
    """The lock file, opened without following a link or blocking on a FIFO; a
    regular file only (the pid is written into it)."""
    path = state_dir / name
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        raise StoreError(f"cannot open the state dir lock {path}: {exc.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise StoreError(f"cannot open the state dir lock {path}: not a regular file")
    return fd


class StateDirLock:
    """Held while the daemon runs; use as a context manager or acquire/release.
    (``name`` and ``what``: the same lock on another directory a run owns, e.g. a
    backtest's ``--out``.)"""

    def __init__(self, state_dir: Path, name: str = LOCK_FILE, what: str = "") -> None:
        self.state_dir = Path(state_dir)
        self.name = name
        self.what = what or f"state dir {self.state_dir}"
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise :exc:`StateDirInUse` naming the holder's pid."""
        fd = _open(self.state_dir, self.name)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            pid = _read_pid(fd)
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise StoreError(f"cannot lock {self.state_dir}: {exc.strerror}") from None
            who = f"pid {pid}" if pid is not None else "another process"
            raise StateDirInUse(f"{self.what} is in use by {who}") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Drop the lock (the file stays; an unlocked file means no daemon)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def __enter__(self) -> Self:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def holder(state_dir: Path) -> int | None:
    """The pid of the live daemon holding ``state_dir`` (0 if its pid file is
    unreadable), or None when no daemon holds it.

    Probes with a non-blocking shared lock on a separate open file, so it
    works from another process and from inside the holder alike."""
    path = Path(state_dir) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return _read_pid(fd) or 0
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
