"""A bus subscriber's overflow on disk: what its queue could not hold, in order.

Live, one slow agent must not slow the others: when its bus queue is full,
the bus would make every publisher wait for it. With a backlog, the events
that do not fit go to a file instead, and the agent reads them back, in
order, once it has emptied its queue; nobody else waits. The file is bounded
(``max_bytes``; past it the bus falls back to waiting) and survives a
restart: what is still in it is delivered first next time, and what the
agent had already finished is skipped by its applied marks (at least once,
applied once).

One JSON line per event, appended with a write per event (spilling is the
rare path); the read position is kept in memory, and the file is truncated
whenever everything in it has been read. Events read back but not yet
finished when the daemon stops are written back in front at :meth:`close`
(``put_back``), so a cut stop loses nothing that reached the agent's queue.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path

import msgspec
import structlog

from daemon.errors import NOT_JSON, StoreError
from daemon.events import FeedEvent, decode, encode

log = structlog.get_logger("backlog")


def open_backlog(path: Path, max_bytes: int, owner: str) -> Backlog | None:
    """The backlog at ``path``, or None (logged) when it cannot be opened: ``owner``
    then runs without one, and publishers wait for it when its queue is full."""
    try:
        return Backlog(path, max_bytes)
    except StoreError as exc:
        log.error("backlog unavailable; publishers will wait", owner=owner, error=str(exc))
        return None


class Backlog:
    """An append-only FIFO of events in one file (see the module docstring)."""

    def __init__(self, path: Path, max_bytes: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # A regular file only, never through a link: a FIFO would block the loop,
            # a link could point anywhere.
            flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(path, flags | os.O_NONBLOCK, 0o600)
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise StoreError(f"{path}: the backlog is not a regular file")
            os.set_blocking(fd, True)
            self._fh = os.fdopen(fd, "a+b")
        except OSError as exc:
            raise StoreError(f"{path}: cannot open the backlog: {exc}") from None
        self._fh.seek(0)
        self._count = sum(1 for line in self._fh if line.strip())
        self._size = self._fh.tell()
        self._read_at = 0
        self.unreadable = 0
        if self._count:
            log.info("backlog carried over", path=str(path), events=self._count)

    def __len__(self) -> int:
        return self._count

    @property
    def full(self) -> bool:
        """True once the file holds ``max_bytes`` or is closed (the bus then waits)."""
        return self._size >= self.max_bytes or self._fh.closed

    def append(self, event: FeedEvent) -> None:
        """Add ``event`` at the end (written through: it survives a crash of ours)."""
        line = encode(event) + b"\n"
        if self._fh.closed:
            raise StoreError(f"{self.path}: the backlog is closed")
        try:
            self._fh.write(line)
            self._fh.flush()
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot append to the backlog: {exc}") from None
        self._size += len(line)
        self._count += 1

    def take(self, n: int) -> list[FeedEvent]:
        """Up to ``n`` of the oldest events, removed from the backlog (none once closed)."""
        out: list[FeedEvent] = []
        fh = self._fh
        if fh.closed:
            return out
        fh.seek(self._read_at)
        while len(out) < n and self._count:
            line = fh.readline()
            if not line:
                self._count = 0  # a torn last line (a crash mid-write) ends the file
                break
            if not line.strip():
                continue
            self._count -= 1
            try:
                out.append(decode(line))
            except (*NOT_JSON, msgspec.ValidationError):
                self.unreadable += 1
                log.warning("backlog line unreadable", path=str(self.path), skipped=self.unreadable)
        self._read_at = fh.tell()
        if not self._count:
            fh.truncate(0)
            self._read_at = self._size = 0
        return out

    def close(self, *, delete: bool = False, put_back: Sequence[FeedEvent] = ()) -> None:
        """Close the file (idempotent); ``delete`` removes it too (the agent is gone).

        ``put_back``: events taken (or queued in memory) but not finished, oldest
        first; they go in front of what is still unread, for the next start."""
        if put_back and not delete and not self._fh.closed:
            self._rewrite(put_back)
        self._fh.close()
        if delete:
            self.path.unlink(missing_ok=True)

    def _rewrite(self, first: Sequence[FeedEvent]) -> None:
        """The file becomes ``first`` then the unread rest (a temp file renamed over)."""
        fh = self._fh
        try:
            fh.seek(self._read_at)
            rest = fh.read() if self._count else b""
            tmp = self.path.with_name(self.path.name + ".tmp")
            # as the backlog itself: a regular file, never a FIFO or through a link
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(tmp, flags | os.O_NONBLOCK, 0o600)
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise OSError(f"{tmp} is not a regular file")
            os.set_blocking(fd, True)
            with os.fdopen(fd, "wb") as out:
                out.writelines(encode(e) + b"\n" for e in first)
                out.write(rest)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.path)
        except OSError as exc:
            log.error("backlog: unfinished events not kept", path=str(self.path), error=str(exc))
            return
        self._count += len(first)
        log.info("backlog: unfinished events kept for the next start", events=len(first))
