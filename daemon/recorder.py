"""Append every bus event to a JSONL file, so a live session can be replayed.

Each line is exactly :func:`daemon.events.encode` of one FeedEvent, the format
the replay feed reads. Every line but a tick is handed to the OS as soon as it
is written (a candle close, an order, a signal is never lost to a crash of the
process); ticks are best-effort: buffered and flushed at least once a second
(also when no new event comes) and on close, so a crash loses at most a second
of ticks.
"""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import structlog

from daemon.appendfile import open_append
from daemon.bus import Subscription
from daemon.events import MARKET_PRICE_TICK, encode

log = structlog.get_logger("recorder")
FLUSH_SECONDS = 1.0


async def record(sub: Subscription, path: Path) -> int:
    """Write events from ``sub`` until the bus closes; returns how many were written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    dirty = False
    last_flush = time.monotonic()
    with open_append(path, "truncate", buffering=1 << 16) as fh:
        log.info("recording events", path=str(path))
        while True:
            with anyio.move_on_after(FLUSH_SECONDS):
                try:
                    event = await sub.receive()
                except anyio.EndOfStream:
                    break
                fh.write(encode(event) + b"\n")
                written += 1
                dirty = True
                if event.topic != MARKET_PRICE_TICK:
                    fh.flush()
                    dirty, last_flush = False, time.monotonic()
            now = time.monotonic()
            if dirty and now - last_flush >= FLUSH_SECONDS:
                fh.flush()
                dirty, last_flush = False, now
    log.info("recording closed", path=str(path), events=written)
    return written
