"""wait_for_market_event: seed 000's conditions and responses, on ticks and on a live pool."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import anyio
import msgspec
import pytest
from aiohttp import web

from daemon.tools import registry
from daemon.tools.base import ToolError
from daemon.tools.context import ProductCatalog, ToolContext
from daemon.tools.market_watch import (
    Condition,
    Field,
    MarketWatch,
    Operator,
    Subscription,
    TimedOut,
    Triggered,
)
from feeds.coinbase_ws.pool import CoinbaseWsPool, Tick
from feeds.coinbase_ws.protocol import Ticker
from feeds.config import CoinbaseWsSection
from tests.coinbase_fake import FakeCoinbase, fake_server
from tests.loopback import serve_app

pytestmark = pytest.mark.anyio


def tick(
    product: str = "BTC-EUR", price: float | None = 100.0, *, stale: bool = False, **f: float
) -> Tick:
    return Tick(
        ticker=Ticker(product_id=product, event_type="update", index=0, price=price, **f),
        timestamp="2025-01-25T14:30:00.000Z",
        ts_ms=1737815400000,
        received_ms=1737815400100,
        sequence_num=1,
        connection=1,
        stale_after_reconnect=stale,
    )


def sub(product: str, *conds: tuple[str, str, float], logic: str = "any") -> Subscription:
    return Subscription(
        product_id=product,
        conditions=[Condition(field=Field(f), operator=Operator(o), value=v) for f, o, v in conds],
        logic=logic,  # type: ignore[arg-type]
    )


# --- the condition logic, tick by tick -------------------------------------------------


@pytest.mark.parametrize(
    ("op", "price", "met"),
    [
        ("gt", 100.0, False), ("gt", 100.5, True),
        ("gte", 100.0, True), ("gte", 99.9, False),
        ("lt", 100.0, False), ("lt", 99.5, True),
        ("lte", 100.0, True), ("lte", 100.1, False),
    ],
)  # fmt: skip
def test_level_operators_at_the_boundary(op: str, price: float, met: bool) -> None:
    watch = MarketWatch([sub("BTC-EUR", ("price", op, 100.0))])
    assert (watch.observe(tick(price=price)) is not None) is met


def test_cross_needs_a_previous_value_on_the_other_side() -> None:
    watch = MarketWatch([sub("BTC-EUR", ("price", "crossAbove", 100.0))])
    assert watch.observe(tick(price=101)) is None  # no previous value: never a cross
    assert watch.observe(tick(price=102)) is None  # already above
    assert watch.observe(tick(price=99)) is None
    hit = watch.observe(tick(price=100.5))
    assert hit is not None
    assert hit.triggered_conditions[0].actual_value == 100.5
    below = MarketWatch([sub("BTC-EUR", ("price", "crossBelow", 100.0))])
    assert below.observe(tick(price=100.0)) is None
    assert below.observe(tick(price=99.0)) is not None  # previous == threshold counts


def test_the_first_tick_after_a_reconnect_is_never_a_cross() -> None:
    watch = MarketWatch([sub("BTC-EUR", ("price", "crossBelow", 100.0), ("price", "lt", 50.0))])
    assert watch.observe(tick(price=101)) is None
    assert watch.observe(tick(price=90, stale=True)) is None  # jumped while away
    assert watch.observe(tick(price=91)) is None  # the stale tick is the new previous
    level = watch.observe(tick(price=40, stale=True))
    assert level is not None and level.triggered_conditions[0].operator == "lt"


def test_a_seed_tick_checks_levels_but_is_only_a_previous_for_crosses() -> None:
    watch = MarketWatch([sub("BTC-EUR", ("price", "crossAbove", 100.0))])
    assert watch.observe(tick(price=99), seed=True) is None
    assert watch.observe(tick(price=101)) is not None
    level = MarketWatch([sub("BTC-EUR", ("price", "lt", 100.0))])
    assert level.observe(tick(price=99), seed=True) is not None


def test_any_answers_the_first_condition_all_needs_every_one() -> None:
    conds = (("price", "lt", 60000.0), ("percentChange24h", "lt", -5.0))
    any_ = MarketWatch([sub("BTC-EUR", *conds)])
    hit = any_.observe(tick(price=59000, percent_change24h=-6))
    assert hit is not None and [c.field for c in hit.triggered_conditions] == ["price"]
    all_ = MarketWatch([sub("BTC-EUR", *conds, logic="all")])
    assert all_.observe(tick(price=59000, percent_change24h=-2)) is None
    both = all_.observe(tick(price=59000, percent_change24h=-6))
    assert both is not None
    assert [(c.field, c.threshold) for c in both.triggered_conditions] == [
        ("price", 60000.0),
        ("percentChange24h", -5.0),
    ]


def test_a_missing_field_never_meets_a_condition_and_is_null_in_the_ticker() -> None:
    watch = MarketWatch([sub("BTC-EUR", ("volume24h", "gte", 0.0))])
    assert watch.observe(tick(price=None)) is None
    out = watch.timed_out(3.0)
    assert out.last_tickers["BTC-EUR"].price is None
    assert msgspec.to_builtins(out)["lastTickers"]["BTC-EUR"]["price"] is None


def test_conditions_are_per_product() -> None:
    watch = MarketWatch(
        [sub("BTC-EUR", ("price", "lt", 10.0)), sub("ETH-EUR", ("price", "gt", 10.0))]
    )
    assert watch.observe(tick("BTC-EUR", 20)) is None
    hit = watch.observe(tick("ETH-EUR", 20))
    assert hit is not None and hit.product_id == "ETH-EUR"


# --- arguments: the seed's examples pass, the limits are enforced ----------------------

SIMPLE = {"subscriptions": [{"productId": "BTC-EUR", "conditions": [{"field": "price", "operator": "lt", "value": 60000}]}]}  # fmt: skip
COMPLEX = {
    "subscriptions": [
        {
            "productId": "BTC-EUR",
            "conditions": [
                {"field": "price", "operator": "crossBelow", "value": 60000},
                {"field": "percentChange24h", "operator": "lt", "value": -5},
            ],
            "logic": "any",
        },
        {
            "productId": "ETH-EUR",
            "conditions": [{"field": "price", "operator": "crossAbove", "value": 4000}],
        },
    ],
    "timeout": 55,
}


def _cond(i: int = 0) -> dict[str, Any]:
    return {"field": "price", "operator": "gt", "value": i}


@pytest.mark.parametrize(
    ("args", "path"),
    [
        ({"subscriptions": []}, "subscriptions"),
        ({"subscriptions": [{"productId": f"A{i}-USD", "conditions": [_cond()]} for i in range(11)]}, "subscriptions"),
        ({"subscriptions": [{"productId": "BTC-USD", "conditions": [_cond(i) for i in range(6)]}]}, "subscriptions[0].conditions"),
        ({"subscriptions": [{"productId": "BTC-USD", "conditions": []}]}, "subscriptions[0].conditions"),
        ({**SIMPLE, "timeout": 56}, "timeout"),
        ({**SIMPLE, "timeout": 0.5}, "timeout"),
        ({"subscriptions": [{"productId": "BTC-USD", "conditions": [{**_cond(), "operator": "above"}]}]}, "subscriptions[0].conditions[0].operator"),
        ({"subscriptions": [{"productId": "BTC-USD", "conditions": [{**_cond(), "field": "bid"}]}]}, "subscriptions[0].conditions[0].field"),
        ({"subscriptions": [{"productId": "BTC-USD", "conditions": [_cond()], "logic": "xor"}]}, "subscriptions[0].logic"),
        ({"subscriptions": [{"product": "BTC-USD", "conditions": [_cond()]}]}, "subscriptions[0]"),
        ({"subscriptions": [{"productId": "btc-usd", "conditions": [_cond()]}]}, "subscriptions[0].productId"),
    ],
)  # fmt: skip
async def test_bad_arguments_name_the_field_to_fix(args: dict[str, Any], path: str) -> None:
    result = await registry().call(ToolContext(), "wait_for_market_event", args)
    assert isinstance(result, ToolError)
    assert result.error == "invalid_arguments"
    assert [p.path for p in result.problems] == [path], result


async def test_seed_examples_decode_with_defaults() -> None:
    reg = registry()
    simple = reg.decode("wait_for_market_event", SIMPLE)
    assert not isinstance(simple, ToolError)
    assert msgspec.to_builtins(simple)["timeout"] == 55
    assert msgspec.to_builtins(simple)["subscriptions"][0]["logic"] == "any"
    assert not isinstance(reg.decode("wait_for_market_event", COMPLEX), ToolError)
    unknown = await reg.call(ToolContext(), "wait_for_a_miracle", {})
    assert isinstance(unknown, ToolError) and "wait_for_market_event" in (unknown.suggestion or "")


def test_input_schema_is_a_plain_object_with_the_seed_limits() -> None:
    schema = registry().tools["wait_for_market_event"].input_schema()
    assert schema["type"] == "object" and "$ref" not in repr(schema)
    subs = schema["properties"]["subscriptions"]
    assert (subs["minItems"], subs["maxItems"]) == (1, 10)
    conds = subs["items"]["properties"]["conditions"]
    assert (conds["minItems"], conds["maxItems"]) == (1, 5)
    assert (
        schema["properties"]["timeout"]["minimum"],
        schema["properties"]["timeout"]["maximum"],
    ) == (1, 55)
    assert set(conds["items"]["properties"]["operator"]["enum"]) == {"gt", "gte", "lt", "lte", "crossAbove", "crossBelow"}  # fmt: skip


# --- against a loopback Coinbase --------------------------------------------------------


@asynccontextmanager
async def fake_rest(listed: set[str]) -> AsyncIterator[str]:
    """Coinbase's product endpoint: 200 for listed ids, its real 404 body otherwise."""

    async def product(request: web.Request) -> web.Response:
        pid = request.match_info["pid"]
        if pid in listed:
            return web.json_response({"product_id": pid, "price": "1"})
        body = {
            "error": "NOT_FOUND",
            "error_details": "",
            "message": f"Product {pid} not supported",
        }
        return web.json_response(body, status=404)

    app = web.Application()
    app.router.add_get("/market/products/{pid}", product)
    async with serve_app(app) as url:
        yield url


@asynccontextmanager
async def context(
    listed: set[str] | None = None,
) -> AsyncIterator[tuple[FakeCoinbase, ToolContext]]:
    async with fake_server() as (fake, url), fake_rest(listed or {"BTC-EUR", "ETH-EUR"}) as rest:
        settings = CoinbaseWsSection(url=url, backoff_initial_seconds=0.05, backoff_max_seconds=0.2)
        pool = CoinbaseWsPool(settings, subscribe_interval=0.01, lazy=True)
        async with aiohttp.ClientSession() as session, anyio.create_task_group() as tg:
            tg.start_soon(pool.run)
            yield fake, ToolContext(pool=pool, catalog=ProductCatalog(rest, session))
            tg.cancel_scope.cancel()


def ticker_sent(fake: FakeCoinbase, product: str) -> Callable[[], bool]:
    return lambda: any(
        m.get("channel") == "ticker" and product in m["product_ids"]
        for c in fake.received
        for m in c
    )


def unsubscribed(fake: FakeCoinbase, product: str) -> Callable[[], bool]:
    return lambda: any(
        m["type"] == "unsubscribe" and product in m["product_ids"] for c in fake.received for m in c
    )


async def test_triggers_on_a_live_tick_with_the_seed_response() -> None:
    async with context() as (fake, ctx):
        fake.prices["BTC-EUR"] = "61000"
        args = {"subscriptions": [{"productId": "BTC-EUR", "conditions": [{"field": "price", "operator": "crossBelow", "value": 60000}]}], "timeout": 10}  # fmt: skip
        async with anyio.create_task_group() as tg:
            results: list[msgspec.Struct] = []

            async def call() -> None:
                results.append(await registry().call(ctx, "wait_for_market_event", args))

            tg.start_soon(call)
            await fake.wait_for(ticker_sent(fake, "BTC-EUR"))
            await fake.heartbeat(0, 7)  # a string counter: never an error
            # a ticker without best_* fields and an empty number, as seen on the wire
            await fake.raw(0, [{"type": "update", "tickers": [{"type": "ticker", "product_id": "BTC-EUR", "price": "59850.25", "volume_24_h": "", "price_percent_chg_24_h": "-2.34", "high_24_h": "62100", "low_24_h": "59500"}]}])  # fmt: skip
        (result,) = results
        assert isinstance(result, Triggered), result
        data = msgspec.to_builtins(result)
        assert data["status"] == "triggered" and data["productId"] == "BTC-EUR"
        assert data["triggeredConditions"] == [
            {
                "field": "price",
                "operator": "crossBelow",
                "threshold": 60000.0,
                "actualValue": 59850.25,
            }
        ]
        assert data["ticker"] == {
            "price": 59850.25, "volume24h": None, "percentChange24h": -2.34,
            "high24h": 62100.0, "low24h": 59500.0, "timestamp": "2026-05-06T07:08:09.123Z",
        }  # fmt: skip
        assert data["timestamp"].endswith("Z")
        await fake.wait_for(unsubscribed(fake, "BTC-EUR"))  # released after the answer


async def test_times_out_with_the_last_tickers_and_releases_the_products() -> None:
    async with context() as (fake, ctx):
        args = {**COMPLEX, "timeout": 1}
        result = await registry().call(ctx, "wait_for_market_event", args)
        assert isinstance(result, TimedOut), result
        data = msgspec.to_builtins(result)
        assert data["status"] == "timeout"
        assert set(data["lastTickers"]) == {"BTC-EUR", "ETH-EUR"}  # the snapshots
        assert data["lastTickers"]["ETH-EUR"]["price"] == 100.0
        assert 1.0 <= data["duration"] < 2.0
        assert data["warning"] is None  # watched the whole time
        await fake.wait_for(unsubscribed(fake, "ETH-EUR"))
        assert ctx.pool is not None and ctx.pool.statistics().subscribers == 0


async def test_a_timeout_says_when_the_market_was_not_watched() -> None:
    """A wait that ends with Coinbase unreachable, or across a reconnect, does not read
    as "nothing happened": its answer carries a warning."""
    args = {**COMPLEX, "timeout": 1}
    async with context() as (fake, ctx):
        async with anyio.create_task_group() as tg:
            results: list[msgspec.Struct] = []

            async def call() -> None:
                results.append(await registry().call(ctx, "wait_for_market_event", args))

            tg.start_soon(call)
            await fake.wait_for(ticker_sent(fake, "ETH-EUR"))
            fake.drop(0)  # the pool reconnects within the second
        (dropped,) = results
        assert isinstance(dropped, TimedOut) and "dropped and came back" in (dropped.warning or "")
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings = CoinbaseWsSection(url=f"ws://127.0.0.1:{port}", backoff_initial_seconds=0.05)
    pool = CoinbaseWsPool(settings, lazy=True)
    async with anyio.create_task_group() as tg:
        tg.start_soon(pool.run)
        down = await registry().call(ToolContext(pool=pool), "wait_for_market_event", args)
        tg.cancel_scope.cancel()
    assert isinstance(down, TimedOut) and down.last_tickers == {}
    assert "connection is down" in (down.warning or "")


async def test_a_cancelled_wait_releases_its_subscription_at_once() -> None:
    async with context() as (fake, ctx):
        with anyio.move_on_after(0.5):
            await registry().call(ctx, "wait_for_market_event", {**SIMPLE, "timeout": 55})
        assert ctx.pool is not None and ctx.pool.statistics().subscribers == 0
        await fake.wait_for(unsubscribed(fake, "BTC-EUR"))


async def test_an_unknown_product_is_a_clear_error_not_a_55_second_wait() -> None:
    async with context() as (fake, ctx):
        args = {"subscriptions": [{"productId": "NOPE-USD", "conditions": [_cond()]}]}
        with anyio.fail_after(5):
            result = await registry().call(ctx, "wait_for_market_event", args)
        assert isinstance(result, ToolError) and result.error == "not_found"
        assert "NOPE-USD" in result.message
        assert [p.path for p in result.problems] == ["subscriptions[0].productId"]
        assert not ticker_sent(fake, "NOPE-USD")()


async def test_a_held_product_starts_from_the_pools_last_tick() -> None:
    async with context() as (_fake, ctx):
        assert ctx.pool is not None
        with ctx.pool.subscribe(["BTC-EUR"]) as other:
            await other.receive()  # the snapshot (price 100) is the pool's last tick
            args = {"subscriptions": [{"productId": "BTC-EUR", "conditions": [{"field": "price", "operator": "lte", "value": 100}]}], "timeout": 5}  # fmt: skip
            with anyio.fail_after(2):
                result = await registry().call(ctx, "wait_for_market_event", args)
            assert isinstance(result, Triggered)
            assert result.ticker.price == 100.0


async def test_without_a_pool_the_tool_says_it_is_unavailable() -> None:
    result = await registry().call(ToolContext(), "wait_for_market_event", SIMPLE)
    assert isinstance(result, ToolError) and result.error == "unavailable"


async def test_the_product_check_fails_open_and_remembers_for_a_while() -> None:
    """An unreachable REST API lets the wait go ahead, and is not asked again per wait."""
    now = [0.0]
    async with aiohttp.ClientSession() as session:
        catalog = ProductCatalog("http://127.0.0.1:9", session, clock=lambda: now[0])
        with anyio.fail_after(5):
            assert await catalog.unknown(["BTC-USD", "NOPE-USD"]) == []
        assert catalog._cache["BTC-USD"][0] is None
        async with fake_rest({"BTC-USD"}) as rest:
            catalog.base_url = rest
            assert await catalog.unknown(["NOPE-USD"]) == []  # still the remembered non-answer
            now[0] = 61.0
            assert await catalog.unknown(["BTC-USD", "NOPE-USD"]) == ["NOPE-USD"]


async def test_on_event_time_the_last_replayed_tick_answers_at_once() -> None:
    """A replay's run: the agent's last tick (its 24 h fields too) is checked once, at
    the run's time, with no pool; a level it does not meet is a timeout of 0 s that
    says why, with that tick. A symbol of a candle replay (BTCUSDT) is a product too,
    priced at its newest close; one the replay holds no price of is not_found."""
    from daemon.events import MARKET_PRICE_TICK, Candle, FeedEvent, iso_ms
    from daemon.state import StateCache

    state = StateCache()
    payload = {"price": 101.5, "volume24h": 900.0, "percentChange24h": -4.5}
    state.apply(FeedEvent(event_id="t1", ts="2024-03-01T10:00:00.250Z", source="replay",
                          topic=MARKET_PRICE_TICK, payload=payload, symbol="BTC-USD"))  # fmt: skip
    bar = Candle(open=1.0, high=3.0, low=0.5, close=2.5, volume=1.0,
                 open_time_ms=1_709_286_900_000, close_time_ms=1_709_287_200_000)  # fmt: skip
    state.add_closed("BTCUSDT", "5m", bar.payload())
    at = 1_709_287_205_000
    ctx = ToolContext(state=state, market_ms=at)

    async def wait(*subs: tuple[str, str, str, float]) -> Any:
        args = {
            "subscriptions": [
                {"productId": p, "conditions": [{"field": f, "operator": o, "value": v}]}
                for p, f, o, v in subs
            ],
            "timeout": 55,
        }
        return await registry().call(ctx, "wait_for_market_event", args)

    hit = await wait(("BTC-USD", "percentChange24h", "lt", -4))
    assert isinstance(hit, Triggered) and hit.timestamp == iso_ms(at)
    assert hit.ticker.volume24h == 900.0 and hit.ticker.timestamp == "2024-03-01T10:00:00.250Z"
    miss = await wait(("BTC-USD", "price", "crossAbove", 100), ("BTCUSDT", "price", "gt", 3))
    assert isinstance(miss, TimedOut) and miss.duration == 0.0 and miss.timestamp == iso_ms(at)
    assert miss.warning is not None and "replay" in miss.warning
    assert {p: t.price for p, t in miss.last_tickers.items()} == {"BTC-USD": 101.5, "BTCUSDT": 2.5}
    assert miss.last_tickers["BTCUSDT"].timestamp == iso_ms(bar.close_time_ms)
    closing = await wait(("BTCUSDT", "price", "lte", 2.5))
    assert isinstance(closing, Triggered) and closing.product_id == "BTCUSDT"
    unknown = await wait(("BTC-USD", "price", "gt", 1), ("ETH-USD", "price", "gt", 1))
    assert isinstance(unknown, ToolError) and unknown.error == "not_found"
    assert [p.path for p in unknown.problems] == ["subscriptions[1].productId"]
    assert "ETH-USD" in unknown.message and "BTC-USD, BTCUSDT" in str(unknown.suggestion)
