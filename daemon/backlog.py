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
whenever everything in it has been read.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import msgspec
import structlog

from daemon.errors import StoreError
from daemon.events import FeedEvent, decode, encode

log = structlog.get_logger("backlog")


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
            except (msgspec.DecodeError, msgspec.ValidationError):
                self.unreadable += 1
                log.warning("backlog line unreadable", path=str(self.path), skipped=self.unreadable)
        self._read_at = fh.tell()
        if not self._count:
            fh.truncate(0)
            self._read_at = self._size = 0
        return out

    def close(self, *, delete: bool = False) -> None:
        """Close the file (idempotent); ``delete`` removes it too (the agent is gone)."""
        self._fh.close()
        if delete:
            self.path.unlink(missing_ok=True)
