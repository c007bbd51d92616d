"""``fetch_technical_snapshot``: 15m, 1h and 4h candles with indicators, and the price,
in one call (seed 002).

The three timeframes and the price are fetched **concurrently**, each within
its own 10 s budget; a part that fails becomes ``null`` with a warning and the
call still answers (``success_count`` says how many of the 4 parts came back).
A timeframe comes from the daemon's state cache when it holds at least 50
closed candles of that series (indicators computed over the whole series),
else built from a finer series it holds (:mod:`daemon.resample`), else from
Coinbase's public candles API (the poller's request format; indicators
computed over the 50 candles, so the 200-period EMA is null). On event time
(a replay) the exchange is never asked: the answer is the replay's own, as of
the run's time. The price is the last tick the daemon saw, else the newest close.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Final, Literal
from urllib.parse import quote

import anyio
import msgspec

from daemon.events import TIMEFRAMES, Candle, iso_ms
from daemon.indicators import CandleIndicators
from daemon.resample import resample
from daemon.tools.base import Problem, Tool, ToolError
from daemon.tools.context import ToolContext
from feeds.candles.protocol import Window, candle_params, parse_candles
from feeds.config import COINBASE_PRODUCT

SNAPSHOT_TIMEFRAMES: Final = ("15m", "1h", "4h")
CANDLES: Final = 50
PART_SECONDS: Final = 10.0
# A Coinbase product id live; on a replay, any symbol it holds (BTCUSDT too).
Product = Annotated[str, msgspec.Meta(pattern=r"^[A-Z0-9]{1,20}(-[A-Z0-9]{1,20})?$")]


class SnapshotRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The product to look at."""

    symbol: Annotated[
        Product,
        msgspec.Meta(description="A Coinbase product id, e.g. BTC-USD (a replay: its symbols)."),
    ]


class TimeframeData(msgspec.Struct, frozen=True):
    """One timeframe: candles oldest first as [openTimeMs, open, high, low, close, volume]."""

    source: Literal["state", "coinbase"]
    ohlcv: list[tuple[int, float, float, float, float, float]]
    indicators: dict[str, Any]
    # Built from this finer series of the state cache (e.g. "5m"), if not held as is.
    resampled_from: str | None = None


class TechnicalSnapshot(msgspec.Struct, frozen=True):
    """Seed 002's response: every part, or null with a warning."""

    symbol: str
    timeframes: dict[str, TimeframeData | None]
    current_price: float
    warnings: list[str]
    success_count: int


def _rows(candles: list[Candle]) -> list[tuple[int, float, float, float, float, float]]:
    return [(c.open_time_ms, c.open, c.high, c.low, c.close, c.volume) for c in candles]


def _indicators(candles: list[Candle]) -> dict[str, Any]:
    ind = CandleIndicators()
    for c in candles:
        ind.update(c.high, c.low, c.close)
    return ind.export()


def from_state(ctx: ToolContext, symbol: str, timeframe: str) -> TimeframeData | None:
    """The series from the state cache when it holds 50+ closed candles of it, else
    built from a finer series it holds (the coarsest that gives 50 whole buckets)."""
    if ctx.state is None:
        return None
    series = ctx.state.series(symbol, timeframe)
    if series is not None and len(series.candles) >= CANDLES:
        last = list(series.candles)[-CANDLES:]
        candles = [msgspec.convert(c, Candle) for c in last]
        return TimeframeData("state", _rows(candles), series.indicators.export())
    step = TIMEFRAMES[timeframe]
    finer = [tf for tf, s in TIMEFRAMES.items() if s < step and step % s == 0]
    for tf in sorted(finer, key=TIMEFRAMES.__getitem__, reverse=True):
        held = ctx.state.series(symbol, tf)
        if held is None or len(held.candles) < CANDLES * step // TIMEFRAMES[tf]:
            continue
        built = resample(msgspec.convert(list(held.candles), list[Candle]), step * 1000)
        if len(built) >= CANDLES:
            return TimeframeData("state", _rows(built[-CANDLES:]), _indicators(built), tf)
    return None


async def elsewhere(ctx: ToolContext, symbol: str, timeframe: str) -> TimeframeData:
    """Live, Coinbase's; on event time none: a replay answers from its own data only,
    so it gives the same answers offline and run after run."""
    if ctx.market_ms is not None:
        raise LookupError(
            f"the replay holds too few candles of {symbol} before {iso_ms(ctx.market_ms)} "
            f"to make {CANDLES} whole {timeframe} candles (a replay never asks the exchange; "
            "[state] max_candles keeps more)"
        )
    return await from_coinbase(ctx, symbol, timeframe)


async def from_coinbase(ctx: ToolContext, symbol: str, timeframe: str) -> TimeframeData:
    """The last 50 closed candles from Coinbase's public REST API."""
    if ctx.catalog is None:
        raise LookupError("no market data source is configured")
    step = TIMEFRAMES[timeframe] * 1000
    end = int(time.time() * 1000) // step * step  # the forming bucket starts here
    window = Window(end - CANDLES * step, end)
    path = f"/market/products/{quote(symbol, safe='-')}/candles"
    status, body = await ctx.catalog.get(path, candle_params(window, timeframe))
    if status != 200:
        raise LookupError(f"Coinbase answered HTTP {status}")
    candles = [c for c in parse_candles(body, timeframe) if c.close_time_ms <= end][-CANDLES:]
    if not candles:
        raise LookupError("Coinbase returned no candles")
    return TimeframeData("coinbase", _rows(candles), _indicators(candles))


async def fetch_technical_snapshot(ctx: ToolContext, req: SnapshotRequest) -> msgspec.Struct:
    """All parts at once; never raises."""
    symbol = req.symbol
    if ctx.market_ms is None and not COINBASE_PRODUCT.match(symbol):
        return ToolError(
            error="invalid_arguments",
            message=f"fetch_technical_snapshot: {symbol!r} is not a Coinbase product id",
            problems=[Problem(path="symbol", message="expected BASE-QUOTE, e.g. BTC-USD")],
            suggestion="use a Coinbase product id such as 'BTC-USD'",
        )
    frames: dict[str, TimeframeData | None] = dict.fromkeys(SNAPSHOT_TIMEFRAMES)
    warnings: list[str] = []

    async def part(tf: str) -> None:
        try:
            with anyio.fail_after(PART_SECONDS):
                frames[tf] = from_state(ctx, symbol, tf) or await elsewhere(ctx, symbol, tf)
        except TimeoutError:
            warnings.append(f"{tf} data unavailable: no answer within {PART_SECONDS:g} s")
        except Exception as exc:  # noqa: BLE001 - one part's failure is a warning, not an error
            warnings.append(f"{tf} data unavailable: {exc}")

    async with anyio.create_task_group() as tg:
        for tf in SNAPSHOT_TIMEFRAMES:
            tg.start_soon(part, tf)
    price = _price(ctx, symbol, frames)
    if price is None:
        warnings.append("current price unavailable")
    ok = sum(f is not None for f in frames.values()) + (price is not None)
    return TechnicalSnapshot(
        symbol=symbol,
        timeframes=frames,
        current_price=price or 0.0,
        warnings=sorted(warnings),
        success_count=ok,
    )


def _price(ctx: ToolContext, symbol: str, frames: dict[str, TimeframeData | None]) -> float | None:
    """The last tick the daemon saw for ``symbol``, else the newest close it holds of
    any timeframe, else the newest close of the parts."""
    if ctx.state is not None:
        price = ctx.state.last_price(symbol)
        if price is not None:
            return price
    newest = max(
        (f.ohlcv[-1] for f in frames.values() if f is not None and f.ohlcv),
        key=lambda row: row[0],
        default=None,
    )
    return newest[4] if newest is not None else None


TOOL: Tool[SnapshotRequest, ToolContext] = Tool(
    name="fetch_technical_snapshot",
    title="Technical snapshot (15m / 1h / 4h + price)",
    description=(
        "Fetch all technical data for one product in ONE call: the last 50 closed "
        "candles of 15m, 1h and 4h, each with indicators (SMA20, EMA20/50/200, RSI14, "
        "MACD, ATR14, Bollinger 20), plus the current price. Use this instead of "
        "separate fetches; call it once per product. Returns partial data when a part "
        "fails: that timeframe is null and `warnings` says why; `success_count` is how "
        "many of the 4 parts came back. Candles are [openTimeMs, open, high, low, close, "
        "volume], oldest first."
    ),
    request=SnapshotRequest,
    run=fetch_technical_snapshot,
    timeout_seconds=PART_SECONDS + 5.0,
)
