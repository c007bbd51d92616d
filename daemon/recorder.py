"""Append every bus event to a JSONL file, so a live session can be replayed.

Each line is exactly :func:`daemon.events.encode` of one FeedEvent, the format
the replay feed reads. Every line but a tick is handed to the OS as soon as it
is written (a candle close, an order, a signal is never lost to a crash of the
process); ticks are best-effort: buffered and flushed at least once a second
(also when no new event comes) and on close, so a crash loses at most a second
of ticks.

Bounded: once the file reaches ``max_bytes`` it is renamed to ``<name>.1``
(replacing the previous one) and a new file starts, so a recording left on for
months holds at most twice the bound on disk; replay ``<name>.1`` then
``<name>`` (``[feeds.replay] files``) for the whole of what is kept.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import BinaryIO

import anyio
import structlog

from daemon.appendfile import open_append
from daemon.bus import Subscription
from daemon.events import MARKET_PRICE_TICK, encode

log = structlog.get_logger("recorder")
FLUSH_SECONDS = 1.0


async def record(sub: Subscription, path: Path, max_bytes: int = 0) -> int:
    """Write events from ``sub`` until the bus closes; returns how many were written.
    ``max_bytes`` (0 = no bound): the size at which the file moves to ``<name>.1``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    dirty = False
    last_flush = time.monotonic()
    fh = _open(path)
    size = fh.seek(0, os.SEEK_END)
    log.info("recording events", path=str(path))
    try:
        while True:
            with anyio.move_on_after(FLUSH_SECONDS):
                try:
                    event = await sub.receive()
                except anyio.EndOfStream:
                    break
                line = encode(event) + b"\n"
                fh.write(line)
                written += 1
                size += len(line)
                dirty = True
                if event.topic != MARKET_PRICE_TICK:
                    fh.flush()
                    dirty, last_flush = False, time.monotonic()
                if max_bytes and size >= max_bytes:
                    fh, size, dirty = _rotate(fh, path, size)
            now = time.monotonic()
            if dirty and now - last_flush >= FLUSH_SECONDS:
                fh.flush()
                dirty, last_flush = False, now
    finally:
        fh.close()
    log.info("recording closed", path=str(path), events=written)
    return written


def _open(path: Path) -> BinaryIO:
    return open_append(path, "truncate", buffering=1 << 16)


def kept_part(path: Path) -> Path:
    """Where a full recording at ``path`` is moved: ``<name>.1``."""
    return path.with_name(path.name + ".1")


def _rotate(fh: BinaryIO, path: Path, size: int) -> tuple[BinaryIO, int, bool]:
    """Keep the full recording as ``<name>.1`` and start ``path`` anew: the new file,
    the bytes counted towards the bound, and whether it has unflushed lines. A rename
    that fails (permissions) is logged and the recording goes on in the same file,
    tried again once as much more is written (one error per bound, not per line)."""
    fh.flush()
    kept = kept_part(path)
    try:
        os.replace(path, kept)  # the open file moves with its name
    except OSError as exc:
        log.error("recording not rotated", path=str(path), error=str(exc), size=size)
        return fh, 0, False
    fh.close()
    log.info("recording rotated", path=str(path), kept=str(kept))
    return _open(path), 0, False
