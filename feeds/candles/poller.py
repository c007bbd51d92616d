"""The Coinbase public candles poller: ``market.candle.closed`` exactly once.

Each poll reads the exchange clock (``GET /time``), then for every product and
timeframe fetches the buckets from the series' high-water mark (the last close
published, kept in SQLite) up to the forming bucket, in pages of at most 300,
oldest first. Candles whose close (plus a settle margin) has passed on the
server clock are published in order and the mark is committed after each
``publish()`` returns; anything at or below the mark is a duplicate from an
overlapping window and is skipped. After downtime the same rule backfills the
missed closes in order before live ones, capped at ``max_backfill``.

The poller's mark says what reached the bus, not what the agents finished: at
start the service hands it the agents' own marks (:meth:`CandlesFeed.resume_after`)
and the first poll of a series starts from the older of the two, so a close
that was on the bus but not yet evaluated when the process died is fetched and
delivered again (agents skip what they already finished).

429 and 5xx responses (and transport errors) are retried with exponential
backoff and jitter, honouring Retry-After; malformed bodies are recorded errors
(``health.error()`` + a log line) and the series is retried on the next poll.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import quote

import aiohttp
import anyio
import structlog
from anyio.abc import TaskStatus

from daemon.backoff import backoff_delay
from daemon.errors import FeedError, FeedProtocolError
from daemon.events import Candle, now_ms
from feeds.base import FeedHealth, Publish
from feeds.candles import protocol as p
from feeds.candles.store import HighWaterStore
from feeds.config import CandlesSection
from feeds.http import MAX_REST_BYTES, read_capped

log = structlog.get_logger("feeds.candles")

# Never wait longer than this for a Retry-After, whatever the server says.
_MAX_RETRY_AFTER = 300.0
# While idle between polls, beat at least this often (if the last poll was clean).
_IDLE_BEAT_SECONDS = 15.0


class _GaveUp(FeedError):
    """A request failed every attempt (each attempt was already recorded)."""


class CandlesFeed:
    """Polls public candles for configured products and timeframes."""

    def __init__(
        self,
        config: CandlesSection,
        state_dir: Path,
        *,
        name: str = "candles",
        source: str = "coinbase",
        backoff_initial: float = 1.0,
        backoff_max: float = 60.0,
        max_attempts: int = 4,
        min_request_interval: float = 0.2,
        settle_ms: int = p.SETTLE_MS,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self.name = name
        self.source = source
        self.config = config
        self.db_path = Path(state_dir) / "candles.sqlite3"
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.max_attempts = max(1, max_attempts)
        self.min_request_interval = min_request_interval
        self.settle_ms = settle_ms
        self.clock = clock
        # server clock minus local clock; None until /time has answered once
        self.offset_ms: int | None = None
        self.last_poll_ok = False
        self.polls = 0
        self.closes_published = 0
        self._last_request = 0.0
        self._last_updated: dict[str, str] = {}
        self._session: aiohttp.ClientSession | None = None
        self._store: HighWaterStore | None = None
        self._resume: dict[str, int] = {}
        self.redelivered = 0

    def resume_after(self, marks: Mapping[str, int]) -> None:
        """The agents' marks (close ms per partition): re-deliver what follows them."""
        self._resume = dict(marks)

    @property
    def poll_seconds(self) -> float:
        """Configured interval, or derived from the shortest timeframe."""
        if self.config.poll_seconds > 0:
            return self.config.poll_seconds
        return min((p.derive_poll_seconds(tf) for tf in self.config.timeframes), default=60.0)

    @asynccontextmanager
    async def open(self) -> AsyncIterator[CandlesFeed]:
        """HTTP session and state store for :meth:`poll_once` (``run`` uses this)."""
        timeout = aiohttp.ClientTimeout(total=self.config.request_timeout_seconds)
        headers = {"cache-control": "no-cache", "user-agent": "marketwake"}
        self._store = HighWaterStore(self.db_path)
        try:
            async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:
                self._session = session
                yield self
        finally:
            self._session = None
            self._store.close()
            self._store = None

    async def run(
        self,
        publish: Publish,
        health: FeedHealth,
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Poll until cancelled; ``started()`` once the state store and session are open.

        Not after the first poll: with the exchange down that poll can take
        minutes of retries, and startup (READY=1) should not wait on Coinbase.
        """
        async with self.open():
            task_status.started()
            while True:
                await self.poll_once(publish, health)
                await self._idle(self.next_sleep(), health)

    async def _idle(self, seconds: float, health: FeedHealth) -> None:
        """Sleep until the next poll, beating meanwhile only if the last poll was clean.

        Polls can be minutes apart (1h candles: 300 s), longer than the
        service's stall limit; a poller that is waiting as scheduled after a
        good poll is alive, one whose last poll failed is not.
        """
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            await anyio.sleep(min(left, _IDLE_BEAT_SECONDS))
            if self.last_poll_ok:
                health.beat()

    def next_sleep(self) -> float:
        """Until the next poll: the interval, or sooner if a close settles before it."""
        interval = self.poll_seconds
        if self.offset_ms is None:
            return interval
        now = self.clock() + self.offset_ms
        until = min(
            (p.forming_start(now, tf_ms) + tf_ms + self.settle_ms - now) / 1000
            for tf_ms in (p.timeframe_ms(tf) for tf in self.config.timeframes)
        )
        return min(interval, max(until, 0.5))

    async def poll_once(self, publish: Publish, health: FeedHealth) -> int:
        """One pass over every series; returns how many closes were published."""
        errors = health.errors
        self.last_poll_ok = False
        server_now = await self._server_now(health)
        if server_now is None:
            return 0
        published = 0
        for product in self.config.products:
            for tf in self.config.timeframes:
                try:
                    published += await self._poll_series(product, tf, server_now, publish, health)
                except _GaveUp as exc:
                    log.error("candles.poll_failed", product=product, timeframe=tf, error=str(exc))
                except FeedError as exc:
                    health.error()
                    log.error("candles.poll_failed", product=product, timeframe=tf, error=str(exc))
        self.last_poll_ok = health.errors == errors
        self.polls += 1
        self.closes_published += published
        return published

    def statistics(self) -> dict[str, int | bool | None]:
        """Counters for ``marketwake status``."""
        return {
            "polls": self.polls,
            "closes_published": self.closes_published,
            "last_poll_ok": self.last_poll_ok,
            "server_offset_ms": self.offset_ms,
            "redelivered_series": self.redelivered,
        }

    async def _server_now(self, health: FeedHealth) -> int | None:
        """Exchange time; falls back to local + last offset, never to the bare local clock."""
        before = self.clock()
        try:
            body = await self._get("/time", {}, health)
            server = p.parse_server_time(body)
        except FeedError as exc:
            if not isinstance(exc, _GaveUp):
                health.error()
            log.warning("candles.server_time_failed", error=str(exc))
            if self.offset_ms is None:
                return None
            return self.clock() + self.offset_ms
        self.offset_ms = server - (before + self.clock()) // 2
        health.beat()
        return server

    async def _poll_series(
        self, product: str, tf: str, server_now: int, publish: Publish, health: FeedHealth
    ) -> int:
        key = p.partition_key(self.source, product, tf)
        hwm = self._require_store().get(key)
        agents = self._resume.pop(key, None)  # the first poll after a start only
        if agents is not None and hwm is not None and agents < hwm:
            log.info("candles.redeliver", partition=key, from_ms=agents, mark_ms=hwm)
            self.redelivered += 1
            hwm = agents
        todo = p.plan(hwm, server_now, p.timeframe_ms(tf), max_backfill=self.config.max_backfill)
        if todo.skipped:
            log.warning("candles.backfill_capped", partition=key, skipped=todo.skipped)
        path = f"/market/products/{quote(product, safe='')}/candles"
        published = 0
        for window in todo.windows:
            body = await self._get(path, p.candle_params(window, tf), health)
            candles = p.in_window(p.parse_candles(body, tf), window)
            health.beat()
            for candle in candles:
                if hwm is not None and candle.close_time_ms <= hwm:
                    continue  # already published: an overlapping window
                if p.is_closed(candle, server_now, self.settle_ms):
                    hwm = await self._publish_closed(candle, product, tf, publish)
                    published += 1
                elif self.config.emit_updated and candle.close_time_ms > server_now:
                    await self._publish_updated(candle, product, tf, server_now, publish)
        return published

    async def _publish_closed(self, candle: Candle, product: str, tf: str, publish: Publish) -> int:
        """Publish one close, then commit it as the series' mark; returns the new mark."""
        event = p.closed_event(
            candle, source=self.source, symbol=product, timeframe=tf, received_ms=self.clock()
        )
        await publish(event)
        # A kill between these two lines re-emits this close (same eventId) on restart.
        self._require_store().advance(
            p.partition_key(self.source, product, tf), candle.close_time_ms
        )
        return candle.close_time_ms

    async def _publish_updated(
        self, candle: Candle, product: str, tf: str, server_now: int, publish: Publish
    ) -> None:
        event = p.updated_event(
            candle, source=self.source, symbol=product, timeframe=tf, received_ms=server_now
        )
        key = event.partition
        if self._last_updated.get(key) != event.event_id:
            self._last_updated[key] = event.event_id
            await publish(event)

    async def _get(self, path: str, params: dict[str, str], health: FeedHealth) -> bytes:
        """GET with retries on 429/5xx/transport errors; other 4xx fail at once."""
        last = ""
        for attempt in range(self.max_attempts):
            await self._pace()
            retry_after: float | None = None
            try:
                status, retry_header, body = await self._fetch(path, params)
            except (aiohttp.ClientError, TimeoutError) as exc:
                last = f"GET {path}: {type(exc).__name__}: {exc}"
            except FeedError as exc:  # an answer past MAX_REST_BYTES: not read further
                last = str(exc)
            else:
                if status == 200:
                    return body
                last = f"GET {path}: {p.describe_error(status, body)}"
                if status != 429 and status < 500:
                    raise FeedProtocolError(last)
                retry_after = p.parse_retry_after(retry_header, self.clock())
            health.error()
            log.warning("candles.request_failed", attempt=attempt + 1, error=last)
            if attempt + 1 < self.max_attempts:
                await anyio.sleep(self._backoff(attempt, retry_after))
        raise _GaveUp(f"{last} (gave up after {self.max_attempts} attempts)")

    async def _fetch(self, path: str, params: dict[str, str]) -> tuple[int, str | None, bytes]:
        if self._session is None:
            raise FeedError("candles feed used outside open()")
        url = self.config.base_url.rstrip("/") + path
        async with self._session.get(url, params=params) as resp:
            body = await read_capped(resp, MAX_REST_BYTES, f"GET {path}")
            return resp.status, resp.headers.get("Retry-After"), body

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        delay = backoff_delay(attempt, self.backoff_initial, self.backoff_max, jitter=0.5)
        if retry_after is not None:
            delay = max(delay, min(retry_after, _MAX_RETRY_AFTER))
        return delay

    async def _pace(self) -> None:
        """Keep well under the public limit (~10 req/s per IP)."""
        wait = self._last_request + self.min_request_interval - time.monotonic()
        if wait > 0:
            await anyio.sleep(wait)
        self._last_request = time.monotonic()

    def _require_store(self) -> HighWaterStore:
        if self._store is None:
            raise FeedError("candles feed used outside open()")
        return self._store
