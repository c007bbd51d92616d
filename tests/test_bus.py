"""The bus: routing, per-partition order, backpressure, tick coalescing, counters."""

from __future__ import annotations

import anyio
import pytest
from anyio.lowlevel import checkpoint

from daemon.bus import Bus
from daemon.events import MARKET_CANDLE_CLOSED, MARKET_PRICE_TICK, FeedEvent


def ev(topic: str, part: str, seq: int) -> FeedEvent:
    return FeedEvent(
        event_id=f"{part}:{seq}",
        ts="2026-01-01T00:00:00.000Z",
        source="t",
        topic=topic,
        payload={"seq": seq},
        partition_key=part,
        sequence=seq,
    )


async def test_routes_by_pattern() -> None:
    """Each subscriber gets exactly the topics its patterns match."""
    bus = Bus(queue_size=16)
    candles = bus.subscribe("market.candle.*")
    everything = bus.subscribe(">")
    ticks = bus.subscribe(["market.price.tick"])
    await bus.publish(ev(MARKET_CANDLE_CLOSED, "a", 1))
    await bus.publish(ev(MARKET_PRICE_TICK, "b", 1))
    await bus.publish(ev("account.order.filled", "c", 1))
    bus.close()
    assert [e.topic async for e in candles] == [MARKET_CANDLE_CLOSED]
    assert [e.topic async for e in ticks] == [MARKET_PRICE_TICK]
    assert len([e async for e in everything]) == 3


async def test_per_partition_order_under_concurrent_publishers_and_backpressure() -> None:
    """Five publishers, a tiny queue and a slow consumer: every partition arrives in order,
    nothing is lost, and the publishers were made to wait."""
    bus = Bus(queue_size=4)
    sub = bus.subscribe("market.>")
    n = 200
    seen: dict[str, list[int]] = {}

    async def publisher(part: str) -> None:
        for i in range(n):
            await bus.publish(ev(MARKET_CANDLE_CLOSED, part, i))

    async def consumer() -> None:
        count = 0
        async for e in sub:
            seen.setdefault(e.partition, []).append(e.payload["seq"])
            count += 1
            if count % 7 == 0:
                await checkpoint()
            if count == 5 * n:
                return

    async with anyio.create_task_group() as tg:
        tg.start_soon(consumer)
        for p in "abcde":
            tg.start_soon(publisher, p)
    assert sorted(seen) == list("abcde")
    for seqs in seen.values():
        assert seqs == list(range(n))
    stats = sub.statistics()
    assert stats.blocked_publishes > 0
    assert stats.max_depth <= 4
    assert bus.statistics().delivered == 5 * n


async def test_ticks_coalesce_to_latest_per_product_when_full() -> None:
    """A full queue keeps the newest tick per product in place and never blocks the feed."""
    bus = Bus(queue_size=2)
    sub = bus.subscribe(">")
    with anyio.fail_after(1):
        for i in range(100):
            await bus.publish(ev(MARKET_PRICE_TICK, "coinbase:BTC-USD:tick", i))
            await bus.publish(ev(MARKET_PRICE_TICK, "coinbase:ETH-USD:tick", i))
    got = []
    while (e := sub.receive_nowait()) is not None:
        got.append((e.partition, e.payload["seq"]))
    assert got == [("coinbase:BTC-USD:tick", 99), ("coinbase:ETH-USD:tick", 99)]
    assert sub.statistics().coalesced == 198


async def test_candle_closes_are_never_dropped() -> None:
    """A full queue makes the candle publisher wait instead of dropping."""
    bus = Bus(queue_size=1)
    sub = bus.subscribe(">")
    await bus.publish(ev(MARKET_CANDLE_CLOSED, "p", 0))
    done = anyio.Event()

    async def second() -> None:
        await bus.publish(ev(MARKET_CANDLE_CLOSED, "p", 1))
        done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(second)
        for _ in range(5):
            await checkpoint()
        assert not done.is_set()
        assert sub.statistics().lag_ms >= 0
        first = await sub.receive()
        await done.wait()
    second_ev = await sub.receive()
    assert (first.payload["seq"], second_ev.payload["seq"]) == (0, 1)


async def test_tick_does_not_jump_ahead_of_same_partition_event() -> None:
    """Coalescing never reorders a tick past a non-tick of the same partition."""
    bus = Bus(queue_size=1)
    sub = bus.subscribe(">")
    await bus.publish(ev(MARKET_PRICE_TICK, "p", 1))

    async def publish_rest() -> None:
        await bus.publish(ev(MARKET_CANDLE_CLOSED, "p", 2))
        await bus.publish(ev(MARKET_PRICE_TICK, "p", 3))

    async with anyio.create_task_group() as tg:
        tg.start_soon(publish_rest)
        got = [(await sub.receive()).payload["seq"] for _ in range(3)]
    assert got == [1, 2, 3]


async def test_closed_subscription_stops_receiving_and_unblocks_publishers() -> None:
    """Closing a subscriber drops it from routing and frees a waiting publisher."""
    bus = Bus(queue_size=1)
    sub = bus.subscribe(">")
    await bus.publish(ev(MARKET_CANDLE_CLOSED, "p", 0))
    async with anyio.create_task_group() as tg:
        tg.start_soon(bus.publish, ev(MARKET_CANDLE_CLOSED, "p", 1))
        await checkpoint()
        sub.close()
    await bus.publish(ev(MARKET_CANDLE_CLOSED, "p", 2))
    assert [e.payload["seq"] async for e in sub] == [0]
    assert bus.statistics().subscriptions == ()


def test_bad_patterns_and_capacity_rejected() -> None:
    """Invalid subscription arguments fail loudly."""
    bus = Bus()
    with pytest.raises(ValueError, match="pattern"):
        bus.subscribe("market..tick")
    with pytest.raises(ValueError, match="capacity"):
        bus.subscribe(">", capacity=0)


async def test_resubscribe_changes_topics_without_losing_queued_or_blocked_events() -> None:
    """Changing a subscription's patterns keeps what is queued and what a publisher is
    blocked on; later publishes follow the new patterns."""
    bus = Bus(queue_size=1)
    sub = bus.subscribe("market.candle.closed")
    await bus.publish(ev(MARKET_CANDLE_CLOSED, "p", 0))
    async with anyio.create_task_group() as tg:
        tg.start_soon(bus.publish, ev(MARKET_CANDLE_CLOSED, "p", 1))
        await checkpoint()
        bus.resubscribe(sub, ["account.>"])
        got = [(await sub.receive()).payload["seq"] for _ in range(2)]
    await bus.publish(ev(MARKET_CANDLE_CLOSED, "p", 2))
    await bus.publish(ev("account.order.filled", "q", 3))
    assert got == [0, 1]
    assert (await sub.receive()).payload["seq"] == 3


async def test_idle_means_every_subscriber_finished_what_was_published() -> None:
    bus = Bus()
    a = bus.subscribe("market.>", name="a")
    b = bus.subscribe("market.candle.*", name="b")
    assert bus.idle()
    await bus.publish(ev(MARKET_PRICE_TICK, "p", 1))
    assert not bus.idle() and b.idle  # queued for a only
    assert a.receive_nowait() is not None
    assert not a.idle  # delivered, not known finished (ticks too)
    assert a.receive_nowait() is None  # asking for more: finished
    assert bus.idle()
    await bus.publish(ev(MARKET_CANDLE_CLOSED, "p", 2))
    assert a.receive_nowait() is not None and b.receive_nowait() is not None
    assert not bus.idle()
    a.receive_nowait(), b.receive_nowait()
    assert bus.idle()


async def test_a_held_publisher_resumes_at_the_low_water_mark_or_at_once_when_hurried() -> None:
    """A publisher held by a full queue goes on once a quarter of it is free (then it
    publishes that much in one go, instead of waking every idle subscriber for each
    event taken); while feeds are being stopped (``hurry``), at the first free slot."""
    bus = Bus(queue_size=8)
    sub = bus.subscribe(">")
    for i in range(8):
        await bus.publish(ev(MARKET_CANDLE_CLOSED, "p", i))
    published = anyio.Event()

    async def ninth() -> None:
        await bus.publish(ev(MARKET_CANDLE_CLOSED, "p", 8))
        published.set()

    async def settle() -> None:
        for _ in range(5):
            await checkpoint()

    async with anyio.create_task_group() as tg:
        tg.start_soon(ninth)
        await settle()
        sub.receive_nowait()  # 7 queued: above the low-water mark of 6
        await settle()
        assert not published.is_set()
        sub.receive_nowait()  # 6 queued
        await published.wait()
    assert sub.depth == 7

    async with anyio.create_task_group() as tg:
        while sub.depth < 8:
            await bus.publish(ev(MARKET_CANDLE_CLOSED, "p", 100 + sub.depth))
        published = anyio.Event()
        tg.start_soon(ninth)
        await settle()
        sub.receive_nowait()  # 7 queued, not hurried: still held
        await settle()
        assert not published.is_set()
        bus.hurry()  # a stop: the free slot is enough
        await published.wait()
