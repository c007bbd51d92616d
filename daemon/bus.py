"""The in-process event bus.

Publishers hand FeedEvents to :meth:`Bus.publish`; each subscription owns one
bounded queue and receives, in publish order, every event whose topic matches
one of its patterns (NATS-style: ``*`` one token, trailing ``>`` the rest).

Ordering: one publisher task per partition (each feed publishes its own
partitions sequentially) and a FIFO queue per subscriber give per-partition
order at every subscriber. Different partitions may interleave.

Slow consumers: when a subscriber's queue is full,

* ticks (``market.price.tick``) *coalesce*: the newest tick replaces the tick
  of the same partition still waiting in that queue, in place. If none is
  waiting, the tick is queued anyway; the overshoot is bounded by the number
  of distinct tick partitions (configured products). Ticks never block a feed
  and the latest price of every product is never lost.
* everything else (candle closes, signals, account events) is never dropped:
  the publisher waits until that subscriber has room. Backpressure reaches
  the feed, which is what we want for data that must be processed, unless
  the subscription has an overflow :class:`~daemon.backlog.Backlog` (a live
  agent's): then what does not fit goes to disk, in order, and is read back
  once the queue is empty, so a slow agent never holds the others back. Once
  spilling, every non-tick event goes to the backlog until it is empty again
  (per-partition order is kept); a full backlog falls back to waiting.

Ordered subscriptions (``ordered=True``, event time: the agents' and their
accounts' broker routes, which step in lockstep) keep the exact publish order
across partitions: their ticks never coalesce and never overtake what waits
on disk; they queue, spill and wait like every other event. Two lockstepped
consumers that saw ticks in different orders would each wait for the other.

Counters: published, delivered, coalesced, blocked publishes, queue depth and
lag (age of the oldest waiting event) per subscriber, via :meth:`statistics`.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import final

import anyio
import structlog

from daemon.backlog import Backlog
from daemon.errors import StoreError
from daemon.events import MARKET_PRICE_TICK, FeedEvent, topic_matches, validate_pattern
from daemon.status import BusStatus, SubscriptionStatus

COALESCING_TOPICS = frozenset({MARKET_PRICE_TICK})
log = structlog.get_logger("bus")


@final
class Subscription:
    """One subscriber's bounded queue. Iterate it to receive events."""

    def __init__(
        self,
        bus: Bus,
        name: str,
        patterns: tuple[str, ...],
        capacity: int,
        overflow: Backlog | None = None,
        *,
        ordered: bool = False,
        spill: Callable[[], bool] | None = None,
    ) -> None:
        self.name = name
        self.ordered = ordered
        # Whether a full queue may spill right now (None: always); once spilling, it
        # goes on until the backlog is empty, so order holds.
        self._may_spill = spill
        self.patterns = patterns
        self.capacity = capacity
        # A publisher waiting on a full queue resumes once it is down to this: it then
        # publishes a quarter of the queue at once instead of one event per event taken
        # (each of which woke every idle subscriber).
        self.low_water = capacity - max(1, capacity // 4)
        self._bus = bus
        # Items are [event, enqueue_ns]; lists so a pending tick can be replaced in place.
        self._queue: deque[list[object]] = deque()
        self._pending_tick: dict[str, list[object]] = {}
        # asyncio's own events (the daemon runs on asyncio): one is made per wait, and
        # anyio's looks up the running backend each time it is made.
        self._readable: asyncio.Event | None = None
        self._writable: asyncio.Event | None = None
        self._closed = False
        self.delivered = 0
        self.coalesced = 0
        self.blocked_publishes = 0
        self.max_depth = 0
        self.overflow = overflow
        self.spilled = 0
        self._spill_failed = False
        self._spilled_at: deque[int] = deque()  # enqueue times of the backlog's events
        self._inflight: FeedEvent | None = None  # delivered, not known finished
        self._busy = False  # an event (of any topic) delivered and not known finished

    def matches(self, topic: str) -> bool:
        """Whether this subscription wants events of ``topic``."""
        return any(topic_matches(p, topic) for p in self.patterns)

    # -- publisher side ----------------------------------------------------

    def _offer(self, event: FeedEvent, now_ns: int) -> bool:
        """Queue the event unless that would block; ``False`` means the caller must wait."""
        queue = self._queue
        if event.topic in COALESCING_TOPICS and not self.ordered:
            key = event.partition
            if len(queue) >= self.capacity:
                slot = self._pending_tick.get(key)
                if slot is not None:
                    slot[0] = event
                    self.coalesced += 1
                    return True
            slot = [event, now_ns]
            self._pending_tick[key] = slot
            queue.append(slot)
        else:
            backlog = self.overflow
            if backlog is not None and (
                len(backlog)
                or (len(queue) >= self.capacity and (self._may_spill is None or self._may_spill()))
            ):
                if backlog.full:
                    return False
                try:
                    backlog.append(event)
                except StoreError as exc:  # disk full or gone: the publisher waits instead
                    if not self._spill_failed:
                        log.error(
                            "backlog write failed; publishers wait", sub=self.name, error=str(exc)
                        )
                    self._spill_failed = True
                    return False
                self._spill_failed = False
                self.spilled += 1
                self._spilled_at.append(now_ns)
                if self._readable is not None:
                    self._readable.set()
                return True
            if len(queue) >= self.capacity:
                return False
            if self._pending_tick:
                self._pending_tick.pop(event.partition, None)
            queue.append([event, now_ns])
        self.max_depth = max(self.max_depth, len(queue))
        if self._readable is not None:
            self._readable.set()
        return True

    async def _put(self, event: FeedEvent, now_ns: int) -> None:
        if self._offer(event, now_ns):
            return
        self.blocked_publishes += 1
        while not self._closed:
            if self._writable is None:
                self._writable = asyncio.Event()
            await self._writable.wait()
            if self._offer(event, now_ns):
                return

    # -- consumer side -----------------------------------------------------

    def receive_nowait(self) -> FeedEvent | None:
        """The next event, or ``None`` when the queue (and the backlog) is empty."""
        self._inflight = None  # asking for the next event means the last one is finished
        self._busy = False
        if not self._queue and not self._refill():
            return None
        slot = self._queue.popleft()
        event = slot[0]
        assert isinstance(event, FeedEvent)
        if event.topic in COALESCING_TOPICS and self._pending_tick.get(event.partition) is slot:
            del self._pending_tick[event.partition]
        self.delivered += 1
        self._bus.delivered += 1
        self._inflight = event if event.topic not in COALESCING_TOPICS else None
        self._busy = True
        if self._writable is not None and len(self._queue) <= (
            self.low_water if self._bus.batching else self.capacity - 1
        ):
            self._writable.set()
            self._writable = None
        return event

    def peek(self, n: int) -> list[FeedEvent]:
        """Up to ``n`` events queued in memory, in the order they will be received
        (for an ordered subscription that order is final: nothing coalesces)."""
        out: list[FeedEvent] = []
        for slot in itertools.islice(self._queue, n):
            event = slot[0]
            assert isinstance(event, FeedEvent)
            out.append(event)
        return out

    def wake_publisher(self) -> None:
        """Let a waiting publisher try again now if there is room."""
        if self._writable is not None and len(self._queue) < self.capacity:
            self._writable.set()
            self._writable = None

    def _refill(self) -> bool:
        """Move the backlog's oldest events into the empty queue; False if none."""
        backlog = self.overflow
        if backlog is None or not len(backlog):
            return False
        events = backlog.take(max(1, self.capacity // 2))
        for event in events:
            self._queue.append([event, self._spilled_at.popleft() if self._spilled_at else 0])
        if not len(backlog):
            self._spilled_at.clear()
        return bool(self._queue)

    def release(self) -> None:
        """Close the backlog file (the daemon stops). What the consumer had not
        finished (the event it was on, then its queue, ticks aside: they are only
        worth their moment) goes back on disk in front, for the next start."""
        if self.overflow is not None:
            queued = [slot[0] for slot in self._queue]
            held = [self._inflight, *queued]
            self.overflow.close(
                put_back=[
                    e for e in held if isinstance(e, FeedEvent) and e.topic not in COALESCING_TOPICS
                ]
            )

    @property
    def bus(self) -> Bus:
        """The bus this subscription reads."""
        return self._bus

    @property
    def depth(self) -> int:
        """Events queued in memory (not counting the backlog on disk)."""
        return len(self._queue)

    @property
    def idle(self) -> bool:
        """Nothing queued, nothing on disk, and the consumer has asked for more after
        its last event (it finished it)."""
        return not self._queue and not self.backlog and not self._busy

    @property
    def backlog(self) -> int:
        """Events waiting on disk."""
        return len(self.overflow) if self.overflow is not None else 0

    async def receive(self) -> FeedEvent:
        """Wait for the next event; raises ``anyio.EndOfStream`` once closed and drained."""
        while True:
            event = self.receive_nowait()
            if event is not None:
                return event
            if self._closed:
                if self.overflow is not None:  # drained to the end: nothing left on disk
                    self.overflow.close()
                raise anyio.EndOfStream
            self._readable = asyncio.Event()
            await self._readable.wait()
            self._readable = None

    def __aiter__(self) -> AsyncIterator[FeedEvent]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[FeedEvent]:
        while True:
            try:
                yield await self.receive()
            except anyio.EndOfStream:
                return

    def close(self) -> None:
        """Stop receiving new events; what is queued (and on disk) can still be
        drained. What is left on disk when the process stops waits for the next
        start (see :meth:`release`)."""
        if self._closed:
            return
        self._closed = True
        self._bus._remove(self)
        for ev in (self._readable, self._writable):
            if ev is not None:
                ev.set()

    def statistics(self, now_ns: int | None = None) -> SubscriptionStatus:
        """A snapshot of this subscriber's counters."""
        now_ns = time.perf_counter_ns() if now_ns is None else now_ns
        lag_ms = 0.0
        if self._queue:
            enq = self._queue[0][1]
            assert isinstance(enq, int)
            lag_ms = (now_ns - enq) / 1e6 if enq else 0.0
        elif self._spilled_at:
            lag_ms = (now_ns - self._spilled_at[0]) / 1e6
        return SubscriptionStatus(
            self.name,
            self.patterns,
            len(self._queue),
            self.max_depth,
            self.delivered,
            self.coalesced,
            self.blocked_publishes,
            round(lag_ms, 3),
            backlog=self.backlog,
            spilled=self.spilled,
        )


@dataclass(frozen=True, slots=True)
class Pending:
    """The subscribers an event still has to reach (the first one is full)."""

    subs: tuple[Subscription, ...]
    now_ns: int


@final
class Bus:
    """Topic-pattern pub/sub between feeds and consumers, in one process."""

    def __init__(self, *, queue_size: int = 4096) -> None:
        self.queue_size = queue_size
        self.published = 0
        self.delivered = 0
        # Publishers held by a full queue resume at its low-water mark (see hurry()).
        self.batching = True
        self._hurried = 0
        self._subs: list[Subscription] = []
        self._routes: dict[str, tuple[Subscription, ...]] = {}
        self._closed = False
        # The last event published per partition: where a new subscriber starts.
        self.last_published: dict[str, FeedEvent] = {}
        # The first one of this process: events before it (an agent's backlog carried
        # over a restart) were published, and applied by the broker, in an earlier run.
        self.first_published: dict[str, FeedEvent] = {}

    def subscribe(
        self,
        patterns: str | Iterable[str],
        *,
        name: str = "",
        capacity: int | None = None,
        overflow: Backlog | None = None,
        ordered: bool = False,
        spill: Callable[[], bool] | None = None,
    ) -> Subscription:
        """A new subscription; close it (or the bus) to stop receiving. With
        ``overflow``, what its queue cannot hold goes there instead of waiting
        (when ``spill()`` says so, if given); ``ordered``: in publish order across
        partitions, ticks included (see above)."""
        pats = (patterns,) if isinstance(patterns, str) else tuple(patterns)
        if not pats:
            raise ValueError("a subscription needs at least one topic pattern")
        for p in pats:
            validate_pattern(p)
        cap = self.queue_size if capacity is None else capacity
        if cap < 1:
            raise ValueError("capacity must be at least 1")
        sub = Subscription(
            self,
            name or f"sub{len(self._subs) + 1}",
            pats,
            cap,
            overflow,
            ordered=ordered,
            spill=spill,
        )
        if self._closed:
            sub.close()
            return sub
        self._subs.append(sub)
        self._routes.clear()
        return sub

    def resubscribe(self, sub: Subscription, patterns: Iterable[str]) -> None:
        """Change what ``sub`` receives from the next publish on, keeping its queue:
        nothing already queued, or blocked on the way in, is lost."""
        pats = tuple(patterns)
        if not pats:
            raise ValueError("a subscription needs at least one topic pattern")
        for p in pats:
            validate_pattern(p)
        sub.patterns = pats
        self._routes.clear()

    def _remove(self, sub: Subscription) -> None:
        if sub in self._subs:
            self._subs.remove(sub)
            self._routes.clear()

    def _route(self, topic: str) -> tuple[Subscription, ...]:
        subs = self._routes.get(topic)
        if subs is None:
            subs = tuple(s for s in self._subs if s.matches(topic))
            if len(self._routes) > 10_000:  # bound the cache against topic floods
                self._routes.clear()
            self._routes[topic] = subs
        return subs

    async def publish(self, event: FeedEvent) -> bool:
        """Deliver to every matching subscriber, waiting where the policy says so;
        True if some subscriber made it wait."""
        rest = self.offer(event)
        if rest is None:
            return False
        await self.deliver(event, rest)
        return True

    def offer(self, event: FeedEvent) -> Pending | None:
        """Deliver ``event`` as far as no subscriber makes it wait: None when every one
        took it, else what is left for :meth:`deliver` (from the first full queue on,
        in order). Nothing here awaits, so nothing can cut a delivery in half."""
        if self._closed:
            return None
        self.published += 1
        self.last_published[event.partition] = event
        if event.partition not in self.first_published:
            self.first_published[event.partition] = event
        now_ns = time.perf_counter_ns()
        subs = self._route(event.topic)
        for i, sub in enumerate(subs):
            if not sub._offer(event, now_ns):
                return Pending(subs[i:], now_ns)
        return None

    async def deliver(self, event: FeedEvent, rest: Pending) -> None:
        """Finish what :meth:`offer` left: wait for each full queue, in order."""
        first, *others = rest.subs
        await first._put(event, rest.now_ns)
        for sub in others:
            if not sub._offer(event, rest.now_ns):
                await sub._put(event, rest.now_ns)

    def hurry(self, on: bool = True) -> None:
        """While feeds are being stopped (``on``; a stop, a reload): a publisher waiting
        on a full queue resumes at its first free slot, not at its low-water mark (a
        feed must reach its next event and end, not wait for a slow agent to work
        through a quarter of its queue). ``on=False`` ends one ``hurry()``."""
        self._hurried += 1 if on else -1
        self.batching = self._hurried <= 0
        if on:
            for sub in self._subs:
                sub.wake_publisher()

    def held(self) -> dict[str, int]:
        """What subscribers still hold: ``queued`` in memory, ``on_disk`` in backlogs
        (for the log lines of a stop)."""
        subs = self._subs
        return {
            "queued": sum(len(s._queue) for s in subs),
            "on_disk": sum(s.backlog for s in subs),
        }

    def idle(self) -> bool:
        """Whether every subscriber has finished everything published so far."""
        return all(sub.idle for sub in self._subs)

    def close(self) -> None:
        """End every subscription after it drains; later publishes are ignored."""
        self._closed = True
        for sub in list(self._subs):
            sub.close()

    def statistics(self) -> BusStatus:
        """Counters for ``marketwake status`` and the periodic status log line."""
        now_ns = time.perf_counter_ns()
        subs = tuple(s.statistics(now_ns) for s in self._subs)
        return BusStatus(self.published, self.delivered, sum(s.coalesced for s in self._subs), subs)
