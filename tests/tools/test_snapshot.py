"""fetch_technical_snapshot: three timeframes and the price at once, partial on failure."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import pytest
from aiohttp import web

from daemon.config import StateSection
from daemon.events import MARKET_PRICE_TICK, Candle, FeedEvent, iso_ms
from daemon.state import StateCache
from daemon.tools import registry
from daemon.tools.base import ToolError
from daemon.tools.context import ProductCatalog, ToolContext
from daemon.tools.snapshot import TechnicalSnapshot
from feeds.candles.protocol import GRANULARITY
from tests.loopback import serve_app

SECONDS = dict.fromkeys(GRANULARITY.values(), 0) | {
    "FIFTEEN_MINUTE": 900, "ONE_HOUR": 3600, "FOUR_HOUR": 14400,
}  # fmt: skip


def price_at(start_ms: int) -> float:
    return 100.0 + (start_ms // 60_000) % 37


class FakeRest:
    """Coinbase's public candles endpoint (newest first, string numbers, the forming
    bucket included); ``broken`` granularities answer 500."""

    def __init__(self, broken: set[str]) -> None:
        self.broken = broken
        self.asked: list[str] = []

    async def candles(self, request: web.Request) -> web.Response:
        q = request.query
        self.asked.append(q["granularity"])
        if q["granularity"] in self.broken:
            return web.json_response({"error": "INTERNAL"}, status=500)
        g = SECONDS[q["granularity"]] * 1000
        start, end = int(q["start"]) * 1000, int(q["end"]) * 1000
        rows = [
            {
                "start": str(b // 1000),
                "open": str(price_at(b)),
                "high": str(price_at(b) + 2),
                "low": str(price_at(b) - 2),
                "close": str(price_at(b) + 1),
                "volume": "3.5",
            }
            for b in range(start, end + 1, g)
        ]
        return web.json_response({"candles": rows[::-1]})


@asynccontextmanager
async def context(
    broken: set[str], state: StateCache | None = None
) -> AsyncIterator[tuple[ToolContext, FakeRest]]:
    fake = FakeRest(broken)
    app = web.Application()
    app.router.add_get("/market/products/{product}/candles", fake.candles)
    async with serve_app(app) as url, aiohttp.ClientSession() as session:
        yield ToolContext(catalog=ProductCatalog(url, session), state=state), fake


async def test_parts_come_back_together_and_a_failed_one_is_a_warning() -> None:
    """15m and 1h from Coinbase (50 closed candles each, the forming one left out),
    4h fails: null plus a warning; the price is the newest close; 3 of 4 parts."""
    async with context({"FOUR_HOUR"}) as (ctx, fake):
        out = await registry().call(ctx, "fetch_technical_snapshot", {"symbol": "BTC-USD"})
    assert isinstance(out, TechnicalSnapshot), out
    assert sorted(fake.asked) == ["FIFTEEN_MINUTE", "FOUR_HOUR", "ONE_HOUR"]
    assert out.timeframes["4h"] is None and out.success_count == 3
    assert out.warnings == ["4h data unavailable: Coinbase answered HTTP 500"]
    m15 = out.timeframes["15m"]
    assert m15 is not None and m15.source == "coinbase" and len(m15.ohlcv) == 50
    now_ms = int(time.time() * 1000)
    assert m15.ohlcv[-1][0] + 900_000 <= now_ms < m15.ohlcv[-1][0] + 2 * 900_000
    closes = [row[4] for row in m15.ohlcv]
    assert m15.indicators["sma20"] == sum(closes[-20:]) / 20
    assert m15.indicators["ema200"] is None  # 50 candles cannot warm a 200-period EMA
    newest = max((f.ohlcv[-1] for f in out.timeframes.values() if f), key=lambda r: r[0])
    assert out.current_price == newest[4]


async def test_the_daemon_state_cache_is_used_when_it_holds_the_series() -> None:
    """A series with 50+ closed candles in the state cache is served from it (its
    indicators cover the whole series); the price is the daemon's last tick."""
    cache = StateCache.from_config(StateSection())
    step = 900_000
    first = (int(time.time() * 1000) // step - 80) * step
    for i in range(60):
        start = first + i * step
        c = Candle(open=1.0, high=3.0, low=0.5, close=2.0 + i, volume=1.0,
                   open_time_ms=start, close_time_ms=start + step)  # fmt: skip
        cache.add_closed("BTC-USD", "15m", c.payload())
    tick = FeedEvent(event_id="t", ts=iso_ms(first), source="cb", topic=MARKET_PRICE_TICK,
                     payload={"price": 123.5}, symbol="BTC-USD")  # fmt: skip
    cache.apply(tick)
    async with context(set(), cache) as (ctx, fake):
        out = await registry().call(ctx, "fetch_technical_snapshot", {"symbol": "BTC-USD"})
    assert isinstance(out, TechnicalSnapshot) and out.success_count == 4, out
    m15 = out.timeframes["15m"]
    assert m15 is not None and m15.source == "state" and m15.ohlcv[-1][4] == 61.0
    assert m15.indicators["count"] == 60
    assert sorted(fake.asked) == ["FOUR_HOUR", "ONE_HOUR"]  # 15m never asked
    assert out.current_price == 123.5


async def test_a_bad_symbol_is_an_error_the_model_can_fix() -> None:
    """Not a product id: invalid_arguments naming the field, nothing fetched."""
    async with context(set()) as (ctx, fake):
        out = await registry().call(ctx, "fetch_technical_snapshot", {"symbol": "btc usd"})
    assert isinstance(out, ToolError) and out.error == "invalid_arguments"
    assert out.problems[0].path == "symbol" and fake.asked == []


async def test_an_answer_past_the_size_bound_is_a_warning_not_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Coinbase answers bigger than MAX_REST_BYTES (here 1 KiB; 50 candles are ~5 KiB)
    are not read further: each part is a warning naming the bound."""
    from daemon.tools import context as tool_context

    monkeypatch.setattr(tool_context, "MAX_REST_BYTES", 1024)
    async with context(set()) as (ctx, _):
        out = await registry().call(ctx, "fetch_technical_snapshot", {"symbol": "BTC-USD"})
    assert isinstance(out, TechnicalSnapshot) and out.success_count == 0
    assert all("over 1024 bytes" in w for w in out.warnings[:3]), out.warnings


def five_minute_cache(n: int, first: int) -> StateCache:
    """``n`` closed 5 m candles from ``first`` (on the hour), no ticks."""
    cache = StateCache(max_candles=n)
    step = 300_000
    for i in range(n):
        start = first + i * step
        c = Candle(open=10.0 + i, high=20.0 + i, low=5.0 + i, close=11.0 + i, volume=1.0,
                   open_time_ms=start, close_time_ms=start + step)  # fmt: skip
        cache.add_closed("BTC-USD", "5m", c.payload())
    return cache


async def test_coarser_timeframes_are_built_from_a_finer_series_the_daemon_holds() -> None:
    """With only 5 m candles held (620: 206 quarters, 51 hours), 15m and 1h are built
    from them (whole buckets, indicators over all of them); 4h, which 620 cannot make,
    is asked of Coinbase. With no tick, the price is the newest close held."""
    first = (int(time.time() * 1000) // 3_600_000 - 100) * 3_600_000
    async with context(set(), five_minute_cache(620, first)) as (ctx, fake):
        out = await registry().call(ctx, "fetch_technical_snapshot", {"symbol": "BTC-USD"})
    assert isinstance(out, TechnicalSnapshot) and out.success_count == 4, out
    assert fake.asked == ["FOUR_HOUR"]
    m15, h1 = out.timeframes["15m"], out.timeframes["1h"]
    assert m15 is not None and h1 is not None
    assert (m15.source, m15.resampled_from, h1.resampled_from) == ("state", "5m", "5m")
    assert m15.indicators["count"] == 206 and h1.indicators["count"] == 51
    # The newest whole hour: 5m candles 600..611 (the last 8 make no whole hour).
    assert h1.ohlcv[-1] == (first + 50 * 3_600_000, 610.0, 631.0, 605.0, 622.0, 12.0)
    assert out.current_price == 11.0 + 619


async def test_on_event_time_nothing_is_asked_of_the_exchange() -> None:
    """A replay's run answers from its own data: a timeframe it cannot make is null
    with a warning naming the run's time, and Coinbase is never asked."""
    first = 1_704_067_200_000
    cache = five_minute_cache(620, first)
    at = first + 620 * 300_000
    async with context(set(), cache) as (ctx, fake):
        ctx.market_ms = at
        out = await registry().call(ctx, "fetch_technical_snapshot", {"symbol": "BTC-USD"})
    assert isinstance(out, TechnicalSnapshot) and fake.asked == []
    assert out.timeframes["4h"] is None and out.success_count == 3
    (warning,) = out.warnings
    assert warning.startswith("4h data unavailable: the replay holds too few candles")
    assert iso_ms(at) in warning


async def test_a_replayed_symbol_need_not_be_a_coinbase_id_but_a_live_one_must() -> None:
    """A replay of Binance's BTCUSDT answers for BTCUSDT from its own candles; live,
    the same symbol is an error naming the field (Coinbase would not know it)."""
    first = 1_704_067_200_000
    cache = StateCache(max_candles=700)
    step = 900_000
    for i in range(60):
        start = first + i * step
        c = Candle(open=1.0, high=3.0, low=0.5, close=2.0 + i, volume=1.0,
                   open_time_ms=start, close_time_ms=start + step)  # fmt: skip
        cache.add_closed("BTCUSDT", "15m", c.payload())
    async with context(set(), cache) as (ctx, fake):
        live = await registry().call(ctx, "fetch_technical_snapshot", {"symbol": "BTCUSDT"})
        ctx.market_ms = first + 60 * step
        replayed = await registry().call(ctx, "fetch_technical_snapshot", {"symbol": "BTCUSDT"})
    assert isinstance(live, ToolError) and live.error == "invalid_arguments"
    assert live.problems[0].path == "symbol" and fake.asked == []
    assert isinstance(replayed, TechnicalSnapshot) and replayed.current_price == 61.0
    assert replayed.timeframes["15m"] is not None and replayed.success_count == 2
