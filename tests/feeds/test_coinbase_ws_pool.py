"""The Coinbase pool and feed against a real loopback ``websockets`` server.

``FakeCoinbase`` speaks the Advanced Trade format: it acks subscriptions,
sends a snapshot per newly subscribed product, and on request sends updates,
heartbeats, error frames and garbage, drops the TCP connection, or goes silent.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import msgspec
import pytest
from websockets.asyncio.server import serve

from daemon.errors import ConfigError
from daemon.events import FeedEvent, parse_iso_ms
from feeds.base import FeedHealth
from feeds.coinbase_ws.feed import CoinbaseWsFeed
from feeds.coinbase_ws.pool import CoinbaseWsPool, Subscription, Tick
from feeds.config import CoinbaseWsSection
from tests.coinbase_fake import TS, WAIT, FakeCoinbase, fake_server, ticker


def settings(url: str, products: Iterable[str] = (), idle: float = 5.0) -> CoinbaseWsSection:
    return CoinbaseWsSection(
        enabled=True,
        url=url,
        products=list(products),
        idle_timeout_seconds=idle,
        backoff_initial_seconds=0.05,
        backoff_max_seconds=0.2,
        max_message_bytes=64 * 1024,
    )


@asynccontextmanager
async def running_pool(url: str, idle: float = 5.0, **kwargs: Any) -> AsyncIterator[CoinbaseWsPool]:
    kwargs.setdefault("subscribe_interval", 0.01)
    pool = CoinbaseWsPool(settings(url, idle=idle), **kwargs)
    async with anyio.create_task_group() as tg:
        tg.start_soon(pool.run)
        yield pool
        tg.cancel_scope.cancel()


async def next_tick(sub: Subscription) -> Tick:
    with anyio.fail_after(WAIT):
        return await sub.receive()


def channels(messages: list[dict[str, Any]]) -> list[tuple[str, str, list[str]]]:
    return [(m["type"], m["channel"], m["product_ids"]) for m in messages]


async def test_two_subscribers_share_one_connection() -> None:
    """Two subscribers ride one socket; each gets only the products it asked for."""
    async with fake_server() as (fake, url), running_pool(url) as pool:
        a = pool.subscribe(["BTC-USD"])
        b = pool.subscribe(["BTC-USD", "ETH-USD"])
        with anyio.fail_after(WAIT):
            await pool.wait_ready()
        await fake.wait_for(lambda: len(fake.sent_by(0)) == 2)
        assert channels(fake.sent_by(0)) == [
            ("subscribe", "heartbeats", []),
            ("subscribe", "ticker", ["BTC-USD", "ETH-USD"]),
        ]
        assert (await next_tick(a)).product_id == "BTC-USD"
        assert sorted([(await next_tick(b)).product_id, (await next_tick(b)).product_id]) == [
            "BTC-USD",
            "ETH-USD",
        ]
        await fake.update(0, ("ETH-USD", "2001"), ("BTC-USD", "50001"))
        tick_a = await next_tick(a)
        assert (tick_a.product_id, tick_a.ticker.price) == ("BTC-USD", 50001.0)
        assert [(await next_tick(b)).product_id for _ in range(2)] == ["ETH-USD", "BTC-USD"]
        assert a.pending() == 0
        assert len(fake.connections) == 1
        stats = pool.statistics()
        assert (stats.connected, stats.connections, stats.subscribers) == (True, 1, 2)
        assert stats.products == ["BTC-USD", "ETH-USD"]


async def test_subscribe_and_unsubscribe_send_only_the_diff() -> None:
    """A new holder subscribes only new products; leaving unsubscribes only unheld ones."""
    async with fake_server() as (fake, url), running_pool(url) as pool:
        a = pool.subscribe(["BTC-USD"])
        await fake.wait_for(lambda: len(fake.sent_by(0)) == 2)
        b = pool.subscribe(["BTC-USD", "ETH-USD"])
        await fake.wait_for(lambda: len(fake.sent_by(0)) == 3)
        assert channels(fake.sent_by(0))[2] == ("subscribe", "ticker", ["ETH-USD"])
        b.close()
        await fake.wait_for(lambda: len(fake.sent_by(0)) == 4)
        assert channels(fake.sent_by(0))[3] == ("unsubscribe", "ticker", ["ETH-USD"])
        assert [t async for t in b] == []
        assert (await next_tick(a)).ticker.event_type == "snapshot"
        await fake.update(0, ("BTC-USD", "123.5"))
        tick = await next_tick(a)
        assert (tick.product_id, tick.ticker.price) == ("BTC-USD", 123.5)
        a.close()
        await fake.wait_for(lambda: len(fake.sent_by(0)) == 5)
        assert channels(fake.sent_by(0))[4] == ("unsubscribe", "ticker", ["BTC-USD"])
        assert pool.statistics().subscribers == 0
        assert len(fake.connections) == 1


async def test_reconnect_resubscribes_and_marks_first_tick_per_product() -> None:
    """After a drop the pool backs off, resubscribes everything and flags first ticks."""
    async with fake_server() as (fake, url), running_pool(url, rand=lambda: 1.0) as pool:
        sub = pool.subscribe(["BTC-USD", "ETH-USD"])
        first = [await next_tick(sub), await next_tick(sub)]
        assert [t.stale_after_reconnect for t in first] == [False, False]
        dropped_at = time.monotonic()
        fake.drop(0)
        await fake.wait_for(lambda: len(fake.sent_by(1)) == 2)
        assert fake.connected_at[1] - dropped_at >= 0.05  # backoff_initial * jitter 1.0
        assert channels(fake.sent_by(1)) == [
            ("subscribe", "heartbeats", []),
            ("subscribe", "ticker", ["BTC-USD", "ETH-USD"]),
        ]
        again = [await next_tick(sub), await next_tick(sub)]
        assert {(t.product_id, t.stale_after_reconnect, t.connection) for t in again} == {
            ("BTC-USD", True, 2),
            ("ETH-USD", True, 2),
        }
        await fake.update(1, ("BTC-USD", "7"), ("ETH-USD", "8"), ("BTC-USD", "9"))
        later = [await next_tick(sub) for _ in range(3)]
        assert [t.stale_after_reconnect for t in later] == [False, False, False]
        stats = pool.statistics()
        assert (stats.reconnects, stats.connections) == (1, 2)


async def test_malformed_frames_never_kill_the_connection() -> None:
    """Garbage, binary and wrong-typed frames are counted; ticks keep flowing."""
    health = FeedHealth("coinbase_ws")
    async with fake_server() as (fake, url):
        pool = CoinbaseWsPool(settings(url), subscribe_interval=0.01)
        async with anyio.create_task_group() as tg:
            tg.start_soon(pool.run, health)
            sub = pool.subscribe(["BTC-USD"])
            await next_tick(sub)
            ws = fake.connections[0]
            for bad in (
                "{not json",
                b"\x00\x01binary",
                "[1, 2, 3]",
                '{"channel":"ticker","sequence_num":"x","events":[]}',
                '{"channel":"ticker","events":{"type":"update"}}',
                '{"channel":"ticker","events":[{"type":"update","tickers":[{"product_id":1}]}]}',
            ):
                await ws.send(bad)
            await ws.send(json.dumps({"type": "error", "message": "failure to subscribe"}))
            await fake.send(0, "status", [{"type": "snapshot", "products": []}])
            await fake.send(0, "ticker", [{"type": "update", "tickers": [ticker("", "")]}])
            await fake.update(0, ("BTC-USD", "42"))
            tick = await next_tick(sub)
            assert tick.ticker.price == 42.0
            stats = pool.statistics()
            assert (stats.malformed, stats.error_frames, stats.skipped_tickers) == (6, 1, 1)
            assert (stats.connections, stats.gaps) == (1, 0)
            assert health.errors == 7
            tg.cancel_scope.cancel()


async def test_sequence_and_heartbeat_gaps_are_counted() -> None:
    """A sequence_num jump and a heartbeat_counter jump are each one counted gap."""
    async with fake_server() as (fake, url), running_pool(url) as pool:
        sub = pool.subscribe(["BTC-USD"])
        await next_tick(sub)
        for counter in ("10", "11", "14"):
            await fake.send(0, "heartbeats", [{"current_time": "x", "heartbeat_counter": counter}])
        await fake.update(0, ("BTC-USD", "1"), skip=3)
        await next_tick(sub)
        stats = pool.statistics()
        assert (stats.gaps, stats.missed_messages, stats.heartbeat_gaps) == (1, 3, 1)
        assert stats.connections == 1


async def test_idle_stall_triggers_reconnect() -> None:
    """A server that goes silent is abandoned after idle_timeout and redialled."""
    async with fake_server() as (fake, url), running_pool(url, idle=0.3) as pool:
        sub = pool.subscribe(["BTC-USD"])
        await next_tick(sub)
        start = time.monotonic()
        await fake.wait_for(lambda: len(fake.sent_by(1)) == 2)
        assert time.monotonic() - start >= 0.25
        assert channels(fake.sent_by(1))[1] == ("subscribe", "ticker", ["BTC-USD"])
        tick = await next_tick(sub)
        assert tick.stale_after_reconnect
        assert pool.statistics().reconnects >= 1


async def test_heartbeats_first_then_ticker_paced_within_five_seconds() -> None:
    """heartbeats and ticker go in separate messages, spaced by the pacing interval."""
    async with fake_server() as (fake, url), running_pool(url, subscribe_interval=0.25) as pool:
        pool.subscribe(["BTC-USD"])
        await fake.wait_for(lambda: len(fake.sent_by(0)) == 2)
        assert channels(fake.sent_by(0)) == [
            ("subscribe", "heartbeats", []),
            ("subscribe", "ticker", ["BTC-USD"]),
        ]
        first, second = fake.received_at[0]
        assert second - fake.connected_at[0] < 5.0
        assert second - first >= 0.2
        with pool.subscribe(["ETH-USD"]), pool.subscribe(["SOL-USD", "BTC-USD"]):
            await fake.wait_for(lambda: len(fake.sent_by(0)) == 3)
            assert channels(fake.sent_by(0))[2] == ("subscribe", "ticker", ["ETH-USD", "SOL-USD"])
            assert fake.received_at[0][2] - second >= 0.2


async def test_feed_publishes_tick_events_after_subscribing() -> None:
    """The feed starts once subscribed and publishes market.price.tick FeedEvents."""
    async with fake_server() as (fake, url):
        fake.prices["BTC-USD"] = "65086.18"
        feed = CoinbaseWsFeed(settings(url, ["ETH-USD", "BTC-USD", "BTC-USD"]))
        send, receive = anyio.create_memory_object_stream[FeedEvent](10)
        health = FeedHealth("coinbase_ws")
        before = health.last_beat
        async with send, receive, anyio.create_task_group() as tg:
            with anyio.fail_after(WAIT):
                await tg.start(feed.run, send.send, health)
            await fake.wait_for(lambda: len(fake.sent_by(0)) == 2)
            assert ("subscribe", "ticker", ["BTC-USD", "ETH-USD"]) in channels(fake.sent_by(0))
            events = {}
            with anyio.fail_after(WAIT):
                for _ in range(2):
                    event = await receive.receive()
                    events[event.symbol] = event
            btc = events["BTC-USD"]
            assert btc.topic == "market.price.tick"
            assert btc.source == "coinbase"
            assert btc.partition_key == "coinbase:BTC-USD:tick"
            assert btc.ts == "2026-05-06T07:08:09.123Z"
            assert btc.received_ts is not None
            assert parse_iso_ms(btc.received_ts) > parse_iso_ms(btc.ts)
            assert btc.event_id == f"coinbase:tick:BTC-USD:{TS}:3:0"
            assert events["ETH-USD"].event_id == f"coinbase:tick:ETH-USD:{TS}:3:1"
            assert btc.payload == {
                "price": 65086.18,
                "volume24h": 10.5,
                "percentChange24h": -2.5,
                "high24h": 999999.0,
                "low24h": 1.0,
                "low52w": None,
                "high52w": 1000000.0,
                "bestBid": 65086.18,
                "bestAsk": 65086.18,
                "bestBidQuantity": 0.1,
                "bestAskQuantity": 0.2,
                "staleAfterReconnect": False,
            }
            assert health.last_beat > before
            stats = feed.statistics()
            assert (stats["connected"], stats["ticks"], stats["products"]) == (
                True,
                2,
                ["BTC-USD", "ETH-USD"],
            )
            tg.cancel_scope.cancel()


async def test_feed_starts_offline_and_connects_when_the_server_appears() -> None:
    """Unreachable Coinbase does not block startup; the pool keeps retrying and connects."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"ws://127.0.0.1:{port}"
    feed = CoinbaseWsFeed(settings(url, ["BTC-USD"]), startup_timeout=0.3)
    send, receive = anyio.create_memory_object_stream[FeedEvent](10)
    async with send, receive, anyio.create_task_group() as tg:
        with anyio.fail_after(2.0):
            await tg.start(feed.run, send.send, FeedHealth("coinbase_ws"))
        stats = feed.pool.statistics()
        assert not stats.connected
        assert stats.connect_failures >= 1
        fake = FakeCoinbase()
        async with serve(fake.handler, "127.0.0.1", port):
            with anyio.fail_after(WAIT):
                event = await receive.receive()
            assert event.symbol == "BTC-USD"
            assert feed.pool.statistics().connected
            tg.cancel_scope.cancel()


def test_bad_settings_and_products_are_config_errors() -> None:
    """A bad URL, backoff, idle timeout or product id fails at construction, naming the key
    (a product id already when the section is built: `config check` sees it)."""
    for url in ("https://example.invalid", "wss://", "ws:///path", "wss://[::1"):
        with pytest.raises(ConfigError, match="url must be a ws:// or wss:// URL with a host"):
            CoinbaseWsPool(settings(url))
    good = settings("ws://127.0.0.1:1")
    for key, value in (
        ("backoff_initial_seconds", 0.0),
        ("backoff_max_seconds", 0.01),
        ("idle_timeout_seconds", 0.0),
        ("max_message_bytes", 10),
    ):
        with pytest.raises(ConfigError, match=key):
            CoinbaseWsPool(msgspec.structs.replace(good, **{key: value}))
    with pytest.raises(ValueError, match=r"products\[1\]: 'btc usd' is not a Coinbase product"):
        settings("ws://127.0.0.1:1", ["BTC-USD", "btc usd"])
    assert CoinbaseWsFeed(
        settings("ws://127.0.0.1:1", ["ETH-USD", "BTC-USD", "ETH-USD"])
    ).products == [
        "BTC-USD",
        "ETH-USD",
    ]


async def test_slow_subscriber_drops_oldest_without_blocking_others() -> None:
    """A full subscriber queue drops its oldest tick and counts it; others get everything."""
    async with fake_server() as (fake, url), running_pool(url, queue_size=2) as pool:
        slow = pool.subscribe(["BTC-USD"])
        fast = pool.subscribe(["BTC-USD"])
        await next_tick(fast)
        for price in ("1", "2", "3"):
            await fake.update(0, ("BTC-USD", price))
            assert (await next_tick(fast)).ticker.price == float(price)
        assert fast.dropped == 0
        assert [(await next_tick(slow)).ticker.price for _ in range(2)] == [2.0, 3.0]
        assert (slow.dropped, pool.statistics().dropped) == (2, 2)


@pytest.mark.parametrize(("healthy_after", "delays"), [(0.0, [0.05] * 3), (60.0, [0.05, 0.1, 0.2])])
async def test_backoff_grows_on_flapping_and_resets_after_healthy(
    healthy_after: float, delays: list[float]
) -> None:
    """Short-lived connections double the backoff; healthy ones reset it."""
    async with (
        fake_server() as (fake, url),
        running_pool(url, rand=lambda: 1.0, healthy_after_seconds=healthy_after) as pool,
    ):
        sub = pool.subscribe(["BTC-USD"])
        seen = []
        for index in range(3):
            await next_tick(sub)
            fake.drop(index)

            def reconnected(i: int = index) -> bool:
                return len(fake.connections) == i + 2

            await fake.wait_for(reconnected)
            seen.append(pool.statistics().last_backoff_seconds)
        assert seen == delays


async def test_last_tick_is_kept_only_for_held_products() -> None:
    """A late subscriber can read the latest tick; it is forgotten once nobody holds it."""
    async with fake_server() as (fake, url), running_pool(url) as pool:
        first = pool.subscribe(["BTC-USD"])
        assert pool.last_tick("BTC-USD") is None
        await next_tick(first)
        await fake.update(0, ("BTC-USD", "5"))
        tick = await next_tick(first)
        late = pool.subscribe(["BTC-USD"])
        assert pool.last_tick("BTC-USD") is tick
        assert late.pending() == 0
        late.close()
        assert pool.last_tick("BTC-USD") is tick
        first.close()
        assert pool.last_tick("BTC-USD") is None


async def test_oversized_frame_reconnects_and_resubscribes() -> None:
    """A frame above max_message_bytes closes that connection; the pool redials."""
    async with fake_server() as (fake, url), running_pool(url) as pool:
        sub = pool.subscribe(["BTC-USD"])
        await next_tick(sub)
        big = [ticker("BTC-USD", "1", padding="x" * 70_000)]
        await fake.send(0, "ticker", [{"type": "update", "tickers": big}])
        await fake.wait_for(lambda: len(fake.sent_by(1)) == 2)
        assert (await next_tick(sub)).stale_after_reconnect
        assert pool.statistics().reconnects == 1


async def test_feed_marks_first_event_per_product_after_reconnect() -> None:
    """The FeedEvent payload carries staleAfterReconnect on the first tick after a drop only."""
    async with fake_server() as (fake, url):
        feed = CoinbaseWsFeed(settings(url, ["BTC-USD"]))
        send, receive = anyio.create_memory_object_stream[FeedEvent](10)
        async with send, receive, anyio.create_task_group() as tg:
            await tg.start(feed.run, send.send, FeedHealth("coinbase_ws"))
            with anyio.fail_after(WAIT):
                assert (await receive.receive()).payload["staleAfterReconnect"] is False
                fake.drop(0)
                first = await receive.receive()
                await fake.update(1, ("BTC-USD", "3"))
                second = await receive.receive()
            assert first.payload["staleAfterReconnect"] is True
            assert second.payload["staleAfterReconnect"] is False
            assert first.event_id != second.event_id
            tg.cancel_scope.cancel()


async def test_a_lazy_pool_connects_only_once_a_product_is_wanted() -> None:
    """``marketwake mcp`` must not hold a Coinbase socket while no tool waits."""
    async with fake_server() as (fake, url), running_pool(url, lazy=True) as pool:
        await anyio.sleep(0.3)
        assert fake.connections == [] and not pool.statistics().connected
        with pool.subscribe(["BTC-USD"]) as sub:
            assert (await next_tick(sub)).product_id == "BTC-USD"
        assert len(fake.connections) == 1


async def test_an_observer_sees_every_tick_and_its_bug_does_not_end_the_connection() -> None:
    """Observers run in the reader (no queue, nothing dropped); one that raises is logged."""
    seen: list[str] = []

    def broken(tick: Tick) -> None:
        raise RuntimeError("observer bug")

    async with fake_server() as (fake, url), running_pool(url, queue_size=2) as pool:
        with (
            pool.subscribe(["BTC-USD"], observer=lambda t: seen.append(repr(t.ticker.price))),
            pool.subscribe(["BTC-USD"], observer=broken),
            pool.subscribe(["BTC-USD"]) as q,
        ):
            await next_tick(q)  # the snapshot
            for i in range(5):
                await fake.update(0, ("BTC-USD", str(200 + i)))
            await fake.update(0, ("BTC-USD", "300"))
            while (await next_tick(q)).ticker.price != 300.0:
                pass
        assert seen == ["100.0", "200.0", "201.0", "202.0", "203.0", "204.0", "300.0"]
        assert pool.statistics().connections == 1


async def test_a_stop_closes_the_connection_normally() -> None:
    """Cancelling the pool (the daemon's stop) closes the socket with 1000, not with
    the 1011 "internal error" a cancelled connection otherwise sends Coinbase."""
    async with fake_server() as (fake, url):
        async with running_pool(url) as pool:
            pool.subscribe(["BTC-USD"])
            with anyio.fail_after(WAIT):
                await pool.wait_ready()
        (ws,) = fake.connections
        with anyio.fail_after(WAIT):
            await ws.wait_closed()
        assert ws.close_code == 1000
