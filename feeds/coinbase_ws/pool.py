"""One shared Coinbase Advanced Trade WebSocket connection for many subscribers.

The pool owns the socket; subscribers only say which products they want and
read ticks from their own bounded queue::

    pool = CoinbaseWsPool(settings)          # tg.start_soon(pool.run, health)
    with pool.subscribe(["BTC-USD"]) as sub:  # later: the wait_for_market_event tool
        async for tick in sub:
            ...

Products are ref-counted across subscribers; a writer task moves the wire
towards the wanted set with the minimal subscribe/unsubscribe diffs, paced to
stay under Coinbase's per-IP message limit. The connection is re-established
with exponential backoff and full jitter after a drop, a failed handshake or an
idle stall, and everything still referenced is subscribed again. A slow
subscriber never blocks the socket: its queue drops the oldest tick (counted).
"""

from __future__ import annotations

import contextlib
import random
import ssl
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from types import TracebackType
from typing import Any, Final, Self

import anyio
import msgspec
import structlog
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import WebSocketException

from daemon.backoff import backoff_delays
from daemon.errors import FeedDisconnected, FeedError, FeedProtocolError
from daemon.events import now_ms
from feeds.base import FeedHealth
from feeds.coinbase_ws.protocol import (
    HEARTBEATS_CHANNEL,
    TICKER_CHANNEL,
    CounterTracker,
    ErrorFrame,
    Frame,
    HeartbeatFrame,
    SubscriptionBook,
    SubscriptionsFrame,
    Ticker,
    TickerFrame,
    diff,
    parse_frame,
    subscribe_message,
    unsubscribe_message,
)
from feeds.config import CoinbaseWsSection

log = structlog.get_logger("feeds.coinbase_ws")

# Coinbase allows 8 unauthenticated messages per second per IP; stay at half.
SUBSCRIBE_INTERVAL_SECONDS: Final = 0.25
CLOSE_SECONDS: Final = 1.0  # at a stop, for the closing handshake at most
_TRANSPORT_ERRORS: Final = (OSError, TimeoutError, WebSocketException, FeedDisconnected)


class Tick(msgspec.Struct, frozen=True, kw_only=True):
    """One ticker as a subscriber receives it.

    ``stale_after_reconnect`` is true for the first tick of each product on a
    connection that replaced a lost one: the price may have jumped while we
    were away, so cross-style conditions must not compare it with the last
    tick seen before the drop.
    """

    ticker: Ticker
    timestamp: str | None
    ts_ms: int | None
    received_ms: int
    sequence_num: int | None
    connection: int
    stale_after_reconnect: bool

    @property
    def product_id(self) -> str:
        """The Coinbase product id, e.g. ``BTC-USD``."""
        return self.ticker.product_id


class PoolStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """Counters of the pool since it started (exported by status and logs)."""

    connected: bool
    connections: int
    reconnects: int
    connect_failures: int
    messages: int
    ticks: int
    malformed: int
    skipped_tickers: int
    error_frames: int
    gaps: int
    missed_messages: int
    heartbeat_gaps: int
    sent: int
    dropped: int
    last_backoff_seconds: float
    subscribers: int
    products: list[str]


class Subscription:
    """One subscriber's product set and bounded tick queue (single reader).

    Iterate it (``async for tick in sub``) or ``await sub.receive()``; it ends
    once :meth:`close` was called. Closing releases the products, and the pool
    unsubscribes those nobody else holds.
    """

    def __init__(
        self,
        pool: CoinbaseWsPool,
        products: frozenset[str],
        queue_size: int,
        observer: Callable[[Tick], None] | None = None,
    ) -> None:
        self.products = products
        self.dropped = 0
        self._pool = pool
        # Called in the reader for every tick instead of queueing it: no task wakes
        # per tick, and nothing can be dropped (wait_for_market_event's conditions).
        self._observer = observer
        self._queue: deque[Tick] = deque(maxlen=queue_size)
        self._wake = anyio.Event()
        self._closed = False

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self._closed

    def pending(self) -> int:
        """Ticks waiting in the queue."""
        return len(self._queue)

    def _push(self, tick: Tick) -> None:
        if self._observer is not None:
            try:
                self._observer(tick)
            except Exception:  # a subscriber's bug must not end the connection
                log.exception("coinbase_ws.observer_failed", product=tick.product_id)
            return
        if len(self._queue) == self._queue.maxlen:
            self.dropped += 1
            self._pool._dropped += 1
        self._queue.append(tick)
        self._wake.set()

    async def receive(self) -> Tick:
        """The next tick; raises ``anyio.EndOfStream`` once the subscription is closed."""
        while not self._queue:
            if self._closed:
                raise anyio.EndOfStream
            self._wake = anyio.Event()
            await self._wake.wait()
        return self._queue.popleft()

    def close(self) -> None:
        """Release the products (idempotent) and end the iteration."""
        if self._closed:
            return
        self._closed = True
        self._queue.clear()
        self._wake.set()
        self._pool._release(self)

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Tick:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class _Connection:
    """Per-connection state: what is on the wire, counters, products seen."""

    def __init__(self, number: int, reconnected: bool) -> None:
        self.number = number
        self.reconnected = reconnected
        self.opened = time.monotonic()
        self.on_wire: set[str] = set()
        self.seen: set[str] = set()
        self.sequence = CounterTracker()
        self.heartbeats = CounterTracker()
        self.data_seen = False
        self.reason = ""


def _log_often(count: int) -> bool:
    """Log the first ten occurrences, then at powers of two (bounded log volume)."""
    return count <= 10 or count & (count - 1) == 0


class CoinbaseWsPool:
    """Owner of the shared connection; see the module docstring for the model."""

    def __init__(
        self,
        settings: CoinbaseWsSection,
        *,
        open_timeout: float = 10.0,
        subscribe_interval: float = SUBSCRIBE_INTERVAL_SECONDS,
        healthy_after_seconds: float = 60.0,
        queue_size: int = 1024,
        max_subscribers: int = 10_000,
        rand: Callable[[], float] = random.random,
        lazy: bool = False,
    ) -> None:
        settings.check()
        self._lazy = lazy  # no connection while no subscriber wants a product
        self._settings = settings
        self._open_timeout = open_timeout
        self._interval = subscribe_interval
        self._healthy_after = healthy_after_seconds
        self._queue_size = queue_size
        self._max_subscribers = max_subscribers
        self._rand = rand
        self._ssl = ssl.create_default_context() if settings.url.startswith("wss://") else None
        self._book: SubscriptionBook[Subscription] = SubscriptionBook()
        self._changed = anyio.Event()
        self._ready = anyio.Event()
        self._health: FeedHealth | None = None
        self._running = False
        self._conn: _Connection | None = None
        self._next_send = 0.0
        self._counts: dict[str, int] = dict.fromkeys(
            (
                "connections",
                "connect_failures",
                "messages",
                "ticks",
                "malformed",
                "skipped_tickers",
                "error_frames",
                "gaps",
                "missed_messages",
                "heartbeat_gaps",
                "sent",
            ),
            0,
        )
        self._dropped = 0
        self._last_backoff = 0.0
        self._last_ticks: dict[str, Tick] = {}

    # --- subscriber API --------------------------------------------------------

    def subscribe(
        self, products: Iterable[str], *, observer: Callable[[Tick], None] | None = None
    ) -> Subscription:
        """A new subscriber for ``products``; only products nobody had are subscribed.

        With ``observer``, every tick is handed to it synchronously in the reader
        (it must be quick and must not block) and nothing is queued."""
        wanted = frozenset(products)
        if not wanted:
            raise ValueError("subscribe needs at least one product id")
        for product in wanted:
            if not isinstance(product, str) or not 0 < len(product) <= 64:
                raise ValueError(f"bad product id {product!r}")
        if len(self._book) >= self._max_subscribers:
            raise FeedError(f"coinbase_ws pool is full ({self._max_subscribers} subscribers)")
        sub = Subscription(self, wanted, self._queue_size, observer)
        if self._book.add(sub, wanted):
            self._notify()
        return sub

    def _release(self, sub: Subscription) -> None:
        gone = self._book.remove(sub)
        for product in gone:
            self._last_ticks.pop(product, None)
        if gone:
            self._notify()

    def last_tick(self, product: str) -> Tick | None:
        """The latest tick of a product someone holds (a late subscriber's starting point).

        Coinbase sends a snapshot only when a product is first subscribed, so a
        second subscriber of a busy product would otherwise start blind.
        """
        return self._last_ticks.get(product)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    def watch(self, health: FeedHealth | None) -> None:
        """Beat ``health`` on every message from now on (a feed riding a pool it
        does not run)."""
        self._health = health

    async def wait_ready(self) -> None:
        """Return once the first connection has subscribed every product wanted so far."""
        await self._ready.wait()

    def statistics(self) -> PoolStatistics:
        """A snapshot of the counters."""
        c = self._counts
        return PoolStatistics(
            connected=self._conn is not None,
            reconnects=max(0, c["connections"] - 1),
            dropped=self._dropped,
            last_backoff_seconds=self._last_backoff,
            subscribers=len(self._book),
            products=sorted(self._book.wanted()),
            **c,
        )

    # --- connection loop -------------------------------------------------------

    async def run(self, health: FeedHealth | None = None) -> None:
        """Keep a connection up until cancelled; beat ``health`` on every message."""
        if self._running:
            raise RuntimeError("CoinbaseWsPool.run is already running")
        self._running = True
        if health is not None:
            self._health = health
        s = self._settings
        delays = backoff_delays(s.backoff_initial_seconds, s.backoff_max_seconds, self._rand)
        try:
            while True:
                while self._lazy and not self._book.wanted():
                    await self._changed.wait()  # connect only once someone wants a product
                if await self._session():
                    delays = backoff_delays(
                        s.backoff_initial_seconds, s.backoff_max_seconds, self._rand
                    )
                delay = self._last_backoff = next(delays)
                log.info("coinbase_ws.reconnect_wait", delay_s=round(delay, 3))
                await anyio.sleep(delay)
        finally:
            self._running = False

    def _connect_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {
            "max_size": self._settings.max_message_bytes,
            "open_timeout": self._open_timeout,
            "close_timeout": 2.0,
            "user_agent_header": "marketwake (websockets)",
        }
        if self._ssl is not None:
            options["ssl"] = self._ssl
        return options

    async def _session(self) -> bool:
        """One connection's life; True if it was healthy enough to reset the backoff."""
        conn = _Connection(self._counts["connections"] + 1, self._counts["connections"] > 0)
        try:
            async with connect(self._settings.url, **self._connect_options()) as ws:
                self._counts["connections"] += 1
                self._conn = conn
                log.info("coinbase_ws.connected", connection=conn.number, url=self._settings.url)
                try:
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(self._guard, self._writer, ws, conn, tg.cancel_scope)
                        await self._guard(self._reader, ws, conn, tg.cancel_scope)
                except anyio.get_cancelled_exc_class():
                    # The daemon's stop: a normal closure (1000). Left to the context
                    # manager, a cancellation closes with 1011, "internal error".
                    with (
                        anyio.move_on_after(CLOSE_SECONDS, shield=True),
                        contextlib.suppress(*_TRANSPORT_ERRORS),
                    ):
                        await ws.close()
                    raise
        except _TRANSPORT_ERRORS as exc:
            if self._conn is None:
                self._counts["connect_failures"] += 1
            conn.reason = conn.reason or f"{type(exc).__name__}: {exc}"
        finally:
            self._conn = None
        lived = time.monotonic() - conn.opened
        log.warning("coinbase_ws.disconnected", connection=conn.number, reason=conn.reason)
        return conn.data_seen and lived >= self._healthy_after

    async def _guard(
        self,
        step: Callable[[ClientConnection, _Connection], Awaitable[None]],
        ws: ClientConnection,
        conn: _Connection,
        scope: anyio.CancelScope,
    ) -> None:
        """Run reader or writer; a transport error ends the whole connection."""
        try:
            await step(ws, conn)
        except _TRANSPORT_ERRORS as exc:
            conn.reason = conn.reason or f"{type(exc).__name__}: {exc}"
            scope.cancel()

    async def _send(self, ws: ClientConnection, text: str) -> None:
        """Send one control frame, at most one per ``subscribe_interval``."""
        now = time.monotonic()
        if self._next_send > now:
            await anyio.sleep(self._next_send - now)
        self._next_send = max(now, self._next_send) + self._interval
        await ws.send(text)
        self._counts["sent"] += 1

    async def _writer(self, ws: ClientConnection, conn: _Connection) -> None:
        """Subscribe heartbeats, then keep the ticker subscription equal to the wanted set."""
        await self._send(ws, subscribe_message(HEARTBEATS_CHANNEL, []))
        while True:
            changed = self._changed
            add, drop = diff(self._book.wanted(), conn.on_wire)
            if add:
                conn.on_wire.update(add)
                await self._send(ws, subscribe_message(TICKER_CHANNEL, add))
            elif drop:
                conn.on_wire.difference_update(drop)
                await self._send(ws, unsubscribe_message(TICKER_CHANNEL, drop))
            else:
                self._ready.set()
                await changed.wait()

    async def _reader(self, ws: ClientConnection, conn: _Connection) -> None:
        """Read frames until the socket fails or stays silent for idle_timeout."""
        idle = self._settings.idle_timeout_seconds
        while True:
            raw: str | bytes | None = None
            with anyio.move_on_after(idle):
                raw = await ws.recv()
            if raw is None:
                raise FeedDisconnected(f"no message for {idle:g} s (idle watchdog)")
            self._on_message(raw, conn)

    # --- message handling ------------------------------------------------------

    def _on_message(self, raw: str | bytes, conn: _Connection) -> None:
        received = now_ms()
        self._counts["messages"] += 1
        if self._health is not None:
            self._health.beat()
        if isinstance(raw, bytes):
            self._malformed("binary frame", raw)
            return
        try:
            frame = parse_frame(raw)
        except FeedProtocolError as exc:
            self._malformed(str(exc), raw)
            return
        self._track_sequence(frame, conn)
        if isinstance(frame, TickerFrame):
            conn.data_seen = True
            self._dispatch(frame, received, conn)
        elif isinstance(frame, HeartbeatFrame):
            conn.data_seen = True
            self._track_heartbeats(frame, conn)
        elif isinstance(frame, ErrorFrame):
            self._counts["error_frames"] += 1
            if self._health is not None:
                self._health.error()
            log.warning("coinbase_ws.error_frame", message=frame.message)
        elif isinstance(frame, SubscriptionsFrame):
            log.debug("coinbase_ws.subscriptions", subscriptions=frame.subscriptions)

    def _malformed(self, reason: str, raw: str | bytes) -> None:
        self._counts["malformed"] += 1
        if self._health is not None:
            self._health.error()
        if _log_often(self._counts["malformed"]):
            preview = raw[:120] if isinstance(raw, str) else repr(raw[:60])
            log.warning(
                "coinbase_ws.malformed",
                reason=reason[:200],
                preview=preview,
                count=self._counts["malformed"],
            )

    def _track_sequence(self, frame: Frame, conn: _Connection) -> None:
        seq = None if isinstance(frame, ErrorFrame) else frame.sequence_num
        if seq is None:
            return
        skipped = conn.sequence.observe(seq)
        if skipped:
            self._counts["gaps"] += 1
            self._counts["missed_messages"] += skipped
            log.warning(
                "coinbase_ws.sequence_gap",
                connection=conn.number,
                missed=skipped,
                at=seq,
            )

    def _track_heartbeats(self, frame: HeartbeatFrame, conn: _Connection) -> None:
        for counter in frame.counters:
            skipped = conn.heartbeats.observe(counter)
            if skipped:
                self._counts["heartbeat_gaps"] += 1
                log.warning(
                    "coinbase_ws.heartbeat_gap", connection=conn.number, missed=skipped, at=counter
                )

    def _dispatch(self, frame: TickerFrame, received: int, conn: _Connection) -> None:
        self._counts["skipped_tickers"] += frame.skipped
        for ticker in frame.tickers:
            holders = self._book.holders(ticker.product_id)
            if not holders:
                continue
            stale = conn.reconnected and ticker.product_id not in conn.seen
            conn.seen.add(ticker.product_id)
            tick = Tick(
                ticker=ticker,
                timestamp=frame.timestamp,
                ts_ms=frame.ts_ms,
                received_ms=received,
                sequence_num=frame.sequence_num,
                connection=conn.number,
                stale_after_reconnect=stale,
            )
            self._counts["ticks"] += 1
            self._last_ticks[ticker.product_id] = tick
            for sub in holders:
                sub._push(tick)
