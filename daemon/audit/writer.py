"""AuditWriter: batched, rotated, disk-bounded JSONL without blocking the event loop.

``write()`` only encodes the record and appends it to an in-memory batch. A
flusher task (:meth:`AuditWriter.run`) writes the batch from a worker thread
every ``flush_interval`` seconds, or as soon as ``flush_every`` records are
waiting. :meth:`AuditWriter.aclose` (or leaving :func:`open_audit`) writes
what is left and fsyncs, so a clean stop loses nothing.

Before a decision acts, :meth:`AuditWriter.write_ahead` writes the queued rows
in the event loop's thread (no await), so a restart finds the rows of every event
that acted. Rows leave the queue in order whoever writes them: one drainer at a
time takes all that is queued. Checking the disk bounds (compressing a closed
part takes a while) holds a lock of its own, so a write-ahead never waits for it;
nor for the fsync of a part a rollover closed (up to 179 ms measured in a soak
here, the event loop waiting meanwhile), which comes with that check, before
the part is compressed.

Memory stays bounded: if ``max_pending`` records are waiting (the disk is
slower than the producers), ``write()`` flushes inline rather than dropping
records; ``inline_flushes`` counts how often that happened.

A failed write (disk full, directory gone) never takes the daemon down: the
flusher counts it in ``errors``, keeps the batch and retries after a second,
then after twice as long each time up to 30 s (no inline write meanwhile);
only beyond ``max_pending`` are the oldest records dropped (``dropped``). The
log says so once when the writes start failing, then once a minute, and once
when they work again. A batch that failed halfway may be written twice on retry.

Disk stays bounded: files are ``audit-YYYY-MM-DD[.N].jsonl`` (the day of the
record's ``ts``); a part rolls over at ``max_file_bytes``; a part the writer
has moved on from is gzip-compressed (``.jsonl.gz``, in the worker thread), with
the index of the ids its rows name (``index_ids``; ``why`` reads only the parts
that may hold the id it is asked about; indexes count in ``max_total_bytes``);
after a write that opened a file, or once ``max_file_bytes / 16`` were written
since the last check, the oldest files are deleted while the total exceeds
``max_total_bytes`` or their day is more than ``max_days`` before the newest
day. The file being written is never deleted, so the worst case is
``max_total_bytes`` plus 17/16 of ``max_file_bytes`` (and one batch).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import date, timedelta
from pathlib import Path
from typing import Any, BinaryIO

import anyio
import msgspec
import structlog
from anyio.abc import TaskStatus

from daemon.appendfile import open_append
from daemon.audit.files import compress, day_of, discard, file_name, list_files
from daemon.audit.ids import SUFFIX as ID_INDEX
from daemon.audit.ids import index_path
from daemon.audit.records import AuditRecord, encode_line, now_ts
from daemon.errors import StoreError

MiB = 1024 * 1024
log = structlog.get_logger("audit")


class AuditWriter:
    """Appends audit records under ``directory`` (created on first write)."""

    # A failing disk: the first retry after this many seconds, doubling up to the most;
    # the log repeats the failure once per ``failure_log_every`` seconds.
    retry_first = 1.0
    retry_most = 30.0
    failure_log_every = 60.0

    def __init__(
        self,
        directory: Path,
        *,
        flush_every: int = 256,
        flush_interval: float = 0.2,
        max_pending: int = 50_000,
        max_total_bytes: int = 512 * MiB,
        max_file_bytes: int | None = None,
        max_days: int = 30,
        run_id: str | None = None,
        index_ids: bool = True,
    ) -> None:
        if flush_every < 1 or max_pending < flush_every or max_total_bytes < 1 or max_days < 1:
            raise ValueError("flush_every >= 1, max_pending >= flush_every, bounds >= 1")
        self.directory = Path(directory)
        self.flush_every = flush_every
        self.flush_interval = flush_interval
        self.max_pending = max_pending
        self.max_total_bytes = max_total_bytes
        self.max_file_bytes = max_file_bytes or max(1, max_total_bytes // 8)
        self.max_days = max_days
        # The bounds are checked (a directory listing) when a file was opened, else once
        # this many bytes were written since the last check, not after every batch.
        self.check_every_bytes = max(1, self.max_file_bytes // 16)
        self._unchecked = 0
        self._opened = False
        self.run_id = run_id  # stamped on every record that has none
        self.index_ids = index_ids
        self.written = 0
        self.accepted = 0  # records given to write(), in order: a record's sequence number
        self.inline_flushes = 0
        self.errors = 0
        self.dropped = 0
        self.last_error = ""
        self.deleted_files = 0
        self.compressed_files = 0
        self._pending: list[tuple[str, bytes]] = []
        self._day = ""  # the last row's UTC day, once checked to be one
        self._wake: anyio.Event | None = None
        self._flushed: anyio.Event | None = None
        # Rows are taken from ``_pending`` only under both locks, and by one drainer at
        # a time (``_io_lock``): whoever writes (the flusher's thread, write_ahead, a
        # flush) writes the oldest rows first. ``_queue_lock`` is held for list
        # operations only, so ``write()`` never waits for a disk.
        self._io_lock = threading.Lock()
        self._queue_lock = threading.Lock()
        self._bounds_lock = threading.Lock()  # compressing and deleting closed parts
        # While writes fail: when the streak began, the next retry and the next log.
        self._failing_since: float | None = None
        self._retry_delay = 0.0
        self._retry_at = 0.0
        self._next_log = 0.0
        self._fh: BinaryIO | None = None
        self._fh_key: tuple[str, int] | None = None
        # Parts a rollover moved on from, their rows with the OS, not yet fsynced and
        # closed (that waits for the bounds check, outside ``_io_lock``).
        self._retired: list[BinaryIO] = []
        self._closed = False
        self.write_aheads = 0  # rows handed to the OS ahead of an action, in its thread

    # --- producer side (event loop, never blocks for long) -----------------

    def write(self, record: AuditRecord) -> None:
        """Queue one record; returns at once (except under back-pressure, see above)."""
        if self.run_id is not None and record.daemon_run is None:
            record = msgspec.structs.replace(record, daemon_run=self.run_id)
        line = encode_line(record)
        self.accepted += 1
        day = record.ts[:10]
        if day != self._day:  # the file a row goes to: checked once a day, not per row
            self._day = day if day_of(record.ts) else ""
        with self._queue_lock:
            self._pending.append((self._day or now_ts()[:10], line))
            waiting = len(self._pending)
        if self._closed:
            self.flush_sync()
        elif waiting >= self.max_pending:
            if self._backing_off():  # the disk failed a moment ago: drop, do not block
                self._drop_beyond(self.max_pending - 1)
                return
            self.inline_flushes += 1
            try:
                self._drain()
                self._check_bounds()
            except StoreError as exc:
                self._failed(exc)
            else:
                self._recovered()
        elif waiting >= self.flush_every and self._wake is not None:
            self._wake.set()

    @property
    def durable(self) -> int:
        """Records 1..durable are settled: handed to the OS (or dropped after a disk
        failure). Batches go out in order, so a checkpoint taken at sequence n may
        move once ``durable >= n``."""
        return self.written + self.dropped

    @property
    def pending(self) -> int:
        """Records queued but not yet written."""
        return len(self._pending)

    # --- flusher ------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Flush batches until cancelled; the final flush is :meth:`aclose`'s job."""
        self._wake = anyio.Event()
        task_status.started()
        try:
            while True:
                backoff = self._retry_at - time.monotonic()
                if backoff > 0:  # a failing disk is not hammered on every full batch
                    await anyio.sleep(backoff)
                else:
                    with anyio.move_on_after(self.flush_interval):
                        await self._wake.wait()
                self._wake = anyio.Event()
                if self._pending:
                    try:
                        await anyio.to_thread.run_sync(self._drain)
                    except StoreError as exc:
                        self._failed(exc)
                    else:
                        self._recovered()
                if self._flushed is not None:  # (also after a cycle with nothing to write)
                    self._flushed.set()
                    self._flushed = None
                if self._bounds_due():  # after the waiters go: compressing takes a while
                    try:
                        await anyio.to_thread.run_sync(self._check_bounds)
                    except StoreError as exc:
                        self._failed(exc)
        finally:  # nobody waits on a flusher that is gone (write_ahead)
            self._wake = None
            if self._flushed is not None:
                self._flushed.set()
                self._flushed = None

    def _drop_beyond(self, keep: int) -> None:
        """Drop the oldest queued rows beyond ``keep`` (counted in ``dropped``)."""
        with self._queue_lock:
            overflow = max(0, len(self._pending) - keep)
            del self._pending[:overflow]
        self.dropped += overflow

    def _failed(self, exc: StoreError) -> None:
        """A write failed (its rows are back in the queue): drop the oldest beyond
        max_pending, retry later, and log it when the failures start (then once a
        minute)."""
        self.errors += 1
        self.last_error = str(exc)
        self._drop_beyond(self.max_pending)
        now = time.monotonic()
        self._retry_delay = min(self.retry_most, self._retry_delay * 2 or self.retry_first)
        self._retry_at = now + self._retry_delay
        if self._failing_since is None:
            self._failing_since = now
            what = "audit writes failing; rows are kept in memory and retried"
        elif now >= self._next_log:
            what = "audit writes still failing"
        else:
            return
        self._next_log = now + self.failure_log_every
        log.warning(
            what,
            error=str(exc),
            failing_for_s=round(now - self._failing_since),
            pending=len(self._pending),
            dropped=self.dropped,
            retry_in_s=self._retry_delay,
        )

    def _backing_off(self) -> bool:
        return self._failing_since is not None and time.monotonic() < self._retry_at

    def _recovered(self) -> None:
        """A write worked: after a failing streak, say so once."""
        if self._failing_since is None:
            return
        log.info(
            "audit writes recovered",
            failed_for_s=round(time.monotonic() - self._failing_since),
            dropped=self.dropped,
        )
        self._failing_since, self._retry_delay, self._retry_at = None, 0.0, 0.0

    def write_ahead(self) -> None:
        """Hand every row queued so far to the OS, in this thread, before the caller
        acts on them.

        A restart recognises an evaluated event by its rows in the log (see
        ``daemon/agents/checkpoints.py``); an action taken while they still wait
        here would, after a kill -9, be evaluated again and meet its own dedupe
        claim, or wake a second time. No await, so nothing else runs between the
        caller's decision and the write. It waits only for a batch the flusher's
        thread is writing (rows stay in order), or a rollover's fsync. While the
        disk is failing it does not try (the flusher retries; rows stay queued).
        """
        if not self._pending or self._failing_since is not None:
            return
        try:
            self.write_aheads += self._drain()
        except StoreError as exc:
            self._failed(exc)
            return
        if self._bounds_due() and self._wake is not None:
            self._wake.set()  # the disk bounds: checked in the flusher's thread, soon

    def _bounds_due(self) -> bool:
        """A file was opened, or enough was written since the last check of the bounds."""
        return self._opened or self._unchecked >= self.check_every_bytes

    async def next_flush(self) -> None:
        """Wait for the flusher task's next write attempt (health checks, tests)."""
        if self._flushed is None:
            self._flushed = anyio.Event()
        await self._flushed.wait()

    async def flush(self) -> None:
        """Write everything queued so far, from a worker thread; on return a batch the
        flusher was writing meanwhile is written too (``durable`` counts it: the
        checkpoints' stop relies on that). Rows that cannot be written stay queued. One
        that works ends a failing streak (the flusher, backing off, may find nothing
        left to write: write_ahead stayed off until its next retry)."""
        await anyio.to_thread.run_sync(self._drain_and_check)
        self._recovered()

    def flush_sync(self) -> None:
        """Write everything queued so far in this thread (shutdown, back-pressure)."""
        self._drain_and_check()
        self._recovered()
        if self._closed:
            with self._io_lock:
                self._close_file()

    def close(self) -> None:
        """Synchronous :meth:`aclose` for code without an event loop."""
        self._closed = True
        self.flush_sync()

    async def aclose(self) -> None:
        """Write what is left, fsync and close; later writes go straight to disk. What
        cannot be written (a full disk) raises, saying how many rows are lost."""
        self._closed = True
        with anyio.CancelScope(shield=True):
            try:
                await self.flush()
            except StoreError as exc:
                lost = self.accepted - self.written - self.dropped
                self.dropped += lost
                with contextlib.suppress(OSError):  # (what it still buffers fails alike)
                    await anyio.to_thread.run_sync(self._close_file)
                raise StoreError(f"{exc}: {lost} audit rows were not written") from None
            await anyio.to_thread.run_sync(self._close_file)

    # --- file I/O (worker thread, serialized) -------------------------------

    def _drain_and_check(self) -> None:
        self._drain()
        self._check_bounds()

    def _drain(self) -> int:
        """Write every queued row, oldest first, in the calling thread; returns how
        many. Rows that fail go back to the front of the queue (StoreError)."""
        with self._io_lock:
            with self._queue_lock:
                rows, self._pending = self._pending, []
            if not rows:
                return 0
            try:
                self._write_rows(rows)
            except StoreError:
                with self._queue_lock:
                    self._pending[:0] = rows
                raise
            return len(rows)

    def _write_rows(self, batch: list[tuple[str, bytes]]) -> None:
        """Append ``batch`` in order (the caller holds ``_io_lock``)."""
        try:
            start = 0
            while start < len(batch):
                day = batch[start][0]
                end = start
                while end < len(batch) and batch[end][0] == day:
                    end += 1
                self._append(day, b"".join(line for _, line in batch[start:end]))
                start = end
        except OSError as exc:
            raise StoreError(f"{self.directory}: cannot write audit log: {exc}") from None
        self.written += len(batch)  # under the lock: a waiting flush() sees it counted

    def _check_bounds(self) -> None:
        """Compress closed parts and delete the oldest, if due. It holds its own lock:
        :meth:`write_ahead` appends to the open part meanwhile, and what it opens or
        writes meanwhile makes the next check due (the marks are cleared first; a
        check that fails is due again)."""
        if not self._bounds_due():
            return
        with self._bounds_lock:
            with self._io_lock:  # (set under it: by _open_for and _append)
                self._opened, self._unchecked = False, 0
            try:
                self._sync_retired()
                self._enforce_bounds()
            except OSError as exc:
                self._opened = True
                raise StoreError(f"{self.directory}: cannot apply audit bounds: {exc}") from None

    def _append(self, day: str, data: bytes) -> None:
        fh = self._open_for(day)
        fh.write(data)
        fh.flush()
        self._unchecked += len(data)

    def _open_for(self, day: str) -> BinaryIO:
        """The handle to append ``day`` to, rolling to a new part when full."""
        if self._fh is not None and self._fh_key is not None and self._fh_key[0] == day:
            if self._fh.tell() < self.max_file_bytes:
                return self._fh
            part = self._fh_key[1] + 1
        else:
            # After a restart: the day's last part, unless it is already compressed.
            parts = [f.part + f.compressed for f in list_files(self.directory) if f.day == day]
            part = max(parts, default=0)
        self._retire_file()
        self.directory.mkdir(parents=True, exist_ok=True)  # (made again if removed)
        while True:
            path = self.directory / file_name(day, part)
            if not path.exists() or path.stat().st_size < self.max_file_bytes:
                break
            part += 1
        self._fh = open_append(path, "terminate")
        self._fh_key = (day, part)
        self._opened = True
        return self._fh

    def _retire_file(self) -> None:
        """Move on from the open part: its rows to the OS now, its fsync later
        (:meth:`_sync_retired`), so that no writer waits for it."""
        if self._fh is not None:
            self._fh.flush()
            with self._queue_lock:
                self._retired.append(self._fh)
            self._fh = None

    def _sync_retired(self) -> None:
        """fsync and close the parts rollovers moved on from (each is closed even if
        its fsync fails: that raises once all are)."""
        with self._queue_lock:
            retired, self._retired = self._retired, []
        failed: OSError | None = None
        for fh in retired:
            try:
                os.fsync(fh.fileno())
            except OSError as exc:
                failed = failed or exc
            finally:
                fh.close()
        if failed is not None:
            raise failed

    def _close_file(self) -> None:
        self._sync_retired()
        if self._fh is not None:
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()
            self._fh = None

    def _compress_closed(self) -> None:
        """gzip every plain part older than the one being appended to (the writer never
        goes back to it): rotated days and parts, and leftovers of a crash."""
        if self._fh_key is None:
            return
        for f in list_files(self.directory):
            if f.key >= self._fh_key:
                break
            if not f.compressed:
                compress(f.path, index=self.index_ids)
                self.compressed_files += 1
        try:
            names = set(os.listdir(self.directory))  # (one listing: hundreds of parts)
        except FileNotFoundError:
            return  # the directory went (the next write says so)
        for name in names:
            if not name.startswith("audit-"):
                continue
            if name.endswith(".gz.tmp") or (name.endswith(".jsonl") and name + ".gz" in names):
                discard(self.directory / name)  # a compression cut short
            elif name.endswith(ID_INDEX):
                part = name.removesuffix(ID_INDEX) + ".jsonl"
                if part not in names and part + ".gz" not in names:
                    # its part was deleted (a kill in between)
                    discard(self.directory / name)

    def _enforce_bounds(self) -> None:
        self._compress_closed()
        files = list_files(self.directory)
        if not files:
            return
        oldest_kept = (
            date.fromisoformat(files[-1].day) - timedelta(days=self.max_days - 1)
        ).isoformat()
        current = self.directory / file_name(*self._fh_key) if self._fh_key else None
        sizes = {f.path: f.path.stat().st_size + _size(index_path(f.path)) for f in files}
        total = sum(sizes.values())
        for f in files:
            if f.path == current:
                continue
            if f.day >= oldest_kept and total <= self.max_total_bytes:
                break
            f.path.unlink(missing_ok=True)
            discard(index_path(f.path))
            total -= sizes[f.path]
            self.deleted_files += 1


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


@asynccontextmanager
async def open_audit(directory: Path, **options: Any) -> AsyncIterator[AuditWriter]:
    """An :class:`AuditWriter` with its flusher running; flushed and closed on exit."""
    writer = AuditWriter(directory, **options)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(writer.run)
            try:
                yield writer
            finally:
                tg.cancel_scope.cancel()
    finally:
        await writer.aclose()
