"""``query_similar_patterns``: similar historical market states for a symbol, now.

Builds seed 004's ``current_state`` from the daemon's own state cache with the
very code ingest used for the stored points (:func:`daemon.rag.features.state_columns`
over the cached candles of ``[rag.query_defaults] timeframe``), adds funding and
open interest from the exchange configured in ``[rag.exchange]`` (Binance USD-M,
as ingest) or from its ``funding_file`` / ``open_interest_file``, and calls :meth:`RagService.query_patterns` in-process. The query
time is the close of the newest cached candle, so a replay asks about its own
past, not the wall clock's.

A value that cannot be known is **said, never zero-filled**: the answer is an
``unavailable`` error listing each missing field and why (too few candles, no
funding source, an exchange that did not answer). The 4 h EMAs come from the
cached 4 h series when the base candles do not reach back far enough.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Annotated, Any, Final

import aiohttp
import anyio
import msgspec
import numpy as np

from daemon.errors import FeedError, MarketwakeError, RpcError
from daemon.events import TIMEFRAMES, Candle
from daemon.rag.datafiles import read_funding, read_open_interest
from daemon.rag.exchange import fetch_context
from daemon.rag.features import STATE_COLUMNS, Bars, Observations, state_columns
from daemon.rag.indicators import ema
from daemon.rag.params import CurrentState, QueryConfig
from daemon.rag.service import RagService
from daemon.tools.base import Problem, Tool, ToolError
from daemon.tools.context import ToolContext

H4_PERIODS: Final = {"ema_20_4h": 20, "ema_50_4h": 50}
HOUR_MS: Final = 3_600_000

Symbol = Annotated[str, msgspec.Meta(pattern=r"^[A-Z0-9]{1,20}(-[A-Z0-9]{1,20}|USDT)$")]


class PatternsRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The product, and optionally seed 004's query_config."""

    symbol: Annotated[
        Symbol, msgspec.Meta(description="A product id (BTC-USD) or a perp symbol (BTCUSDT).")
    ]
    query_config: Annotated[
        QueryConfig | None,
        msgspec.Meta(
            description="lookback_days (1-365), top_k (1-50), min_similarity (0-1), "
            "include_regime_filters (OI and funding regime); defaults from [rag]."
        ),
    ] = None


class PatternsResult(msgspec.Struct, frozen=True):
    """Seed 004's response, with the state it was asked about."""

    symbol: str
    timestamp: int
    current_state: dict[str, float | None]
    matches: list[Any]
    statistics: dict[str, Any]
    metadata: dict[str, Any]


def perp_symbol(symbol: str) -> str:
    """``BTC-USD`` -> ``BTCUSDT`` (the stored points are Binance USD-M symbols)."""
    return symbol if "-" not in symbol else symbol.split("-", 1)[0] + "USDT"


def _product_candidates(symbol: str) -> list[str]:
    if "-" in symbol:
        return [symbol]
    base = symbol.removesuffix("USDT")
    return [f"{base}-USD", f"{base}-USDT", f"{base}-USDC", symbol]


def _candles(ctx: ToolContext, symbol: str, timeframe: str) -> tuple[str, list[Candle]]:
    """The cached closed candles of the first product id the state cache holds."""
    if ctx.state is None:
        return symbol, []
    for product in _product_candidates(symbol):
        series = ctx.state.series(product, timeframe)
        if series is not None and series.candles:
            return product, [msgspec.convert(c, Candle) for c in series.candles]
    return symbol, []


def live_state(
    candles: list[Candle],
    tf_ms: int,
    funding: Observations | None,
    oi: Observations | None,
    max_funding_age_ms: int,
    max_oi_age_ms: int,
    candles_4h: list[Candle] | None = None,
) -> dict[str, float | None]:
    """Every state column at the newest candle's close (None where unknown)."""
    rows = np.array(
        [[c.open_time_ms, c.open, c.high, c.low, c.close, c.volume] for c in candles],
        dtype=np.float64,
    )
    cols = state_columns(
        Bars.from_rows(rows), tf_ms, funding, oi, max_funding_age_ms, max_oi_age_ms
    )
    out = {name: float(cols[name][-1]) for name in STATE_COLUMNS}
    for name, period in H4_PERIODS.items():
        if not math.isfinite(out[name]) and candles_4h and len(candles_4h) >= period:
            closes = np.array([c.close for c in candles_4h], dtype=np.float64)
            out[name] = float(ema(closes, period)[-1])
    return {k: (v if math.isfinite(v) else None) for k, v in out.items()}


@functools.lru_cache(maxsize=8)
def _funding_file(path: str) -> Observations:
    """A funding file, read once per daemon (a backtest asks on every run)."""
    return read_funding(Path(path))


@functools.lru_cache(maxsize=8)
def _oi_file(path: str, symbol: str) -> Observations:
    """An open-interest file's series for ``symbol``, read once per daemon."""
    return read_open_interest(Path(path), symbol)


async def _context(
    ctx: ToolContext, perp: str, timeframe: str, now_ms: int
) -> tuple[Observations | None, Observations | None, dict[str, str]]:
    """Funding and open interest, each from its file if one is set, else from the
    exchange; and why each one that could not be had is missing."""
    ex = ctx.rag.exchange
    funding: Observations | None = None
    oi: Observations | None = None
    why: dict[str, str] = {}
    if not (ex.funding_file and ex.open_interest_file):
        try:
            if ctx.http is None:
                raise FeedError("no HTTP session is open")
            with anyio.fail_after(ex.request_timeout_seconds):
                funding, oi = await fetch_context(ctx.http, ex.base_url, perp, timeframe, now_ms)
        except (FeedError, aiohttp.ClientError, TimeoutError) as exc:
            said = f"the exchange did not answer: {str(exc) or type(exc).__name__}"
            why = {"funding": said, "oi": said}
    for kind, path, read in (
        ("funding", ex.funding_file, _funding_file),
        ("oi", ex.open_interest_file, functools.partial(_oi_file, symbol=perp)),
    ):
        if not path:
            continue
        try:
            got = await anyio.to_thread.run_sync(read, path)
        except MarketwakeError as exc:  # the file names itself
            got, why[kind] = None, str(exc)
        else:
            why.pop(kind, None)
        if kind == "funding":
            funding = got
        else:
            oi = got
    return funding, oi, why


def _why(name: str, n_candles: int, timeframe: str, why: dict[str, str]) -> str:
    if name in ("funding_rate", "open_interest_latest", "open_interest_avg_24h"):
        reason = why.get("funding" if name == "funding_rate" else "oi")
        if reason:
            return reason
        return (
            "the exchange (or [rag.exchange] funding_file / open_interest_file) has no "
            "value recent enough ([rag.exchange] max ages)"
        )
    if name.endswith("_4h") and name.startswith("ema"):
        return (
            f"needs {H4_PERIODS[name]} closed 4 h candles: add 4h to [feeds.candles] "
            f"timeframes or keep more {timeframe} candles ([state] max_candles)"
        )
    return f"not enough {timeframe} candles in the state cache ({n_candles})"


async def query_similar_patterns(ctx: ToolContext, req: PatternsRequest) -> msgspec.Struct:
    """Build the state, ask the store; a missing value is an error, never a zero."""
    cfg = ctx.rag
    timeframe = cfg.query_defaults.timeframe
    tf_ms = TIMEFRAMES[timeframe] * 1000
    product, candles = _candles(ctx, req.symbol, timeframe)
    if not candles:
        return ToolError(
            error="not_found",
            message=f"the daemon holds no {timeframe} candles for {req.symbol}",
            suggestion=f"add it to [feeds.candles] products with timeframe {timeframe}",
        )
    perp = perp_symbol(req.symbol)
    now_ms = candles[-1].open_time_ms + tf_ms
    funding, oi, why = await _context(ctx, perp, timeframe, now_ms)
    _, four_hour = _candles(ctx, product, "4h")
    state = live_state(
        candles,
        tf_ms,
        funding,
        oi,
        int(cfg.exchange.max_funding_age_hours * HOUR_MS),
        int(cfg.exchange.max_oi_age_hours * HOUR_MS),
        four_hour,
    )
    required = [
        f for f in CurrentState.__struct_fields__ if f not in ("price_change_1h", "price_change_4h")
    ]
    missing = [name for name in required if state[name] is None]
    if missing:
        return ToolError(
            error="unavailable",
            message=f"the current state of {req.symbol} is incomplete; nothing was queried",
            problems=[
                Problem(
                    path=f"current_state.{name}",
                    message=_why(name, len(candles), timeframe, why),
                )
                for name in missing
            ],
        )
    params = {
        "symbol": perp,
        "timestamp": now_ms,
        "current_state": {k: v for k, v in state.items() if v is not None},
        "query_config": msgspec.to_builtins(req.query_config) if req.query_config else None,
    }
    try:
        service = await _service(ctx)
        result = await anyio.to_thread.run_sync(service.query_patterns, params)
    except RpcError as exc:
        data = exc.data if isinstance(exc.data, dict) else {}
        detail = data.get("reason") or ", ".join(f"{k}: {v}" for k, v in data.items())
        return ToolError(
            error="not_found" if exc.code in (-32001, -32002) else "unavailable",
            message=f"{exc.message}: {detail}" if detail else exc.message,
            suggestion="widen lookback_days or lower min_similarity"
            if exc.code == -32001
            else None,
        )
    except MarketwakeError as exc:
        return ToolError(
            error="unavailable",
            message=f"the pattern store cannot be opened: {exc}",
            suggestion="build it with `marketwake rag ingest` ([rag.store] path)",
        )
    return PatternsResult(
        symbol=perp,
        timestamp=now_ms,
        current_state=state,
        matches=result["matches"],
        statistics=result["statistics"],
        metadata=result["metadata"],
    )


async def _service(ctx: ToolContext) -> RagService:
    """The daemon's RagService, opened on first use (off the event loop)."""
    return await ctx.rag_service.get(ctx.rag)


TOOL: Tool[PatternsRequest, ToolContext] = Tool(
    name="query_similar_patterns",
    title="Similar historical market states (RAG)",
    description=(
        "Find past moments whose market state resembled this product's state now "
        "(RSI, MACD, EMAs on the bar and 4 h timeframes, funding, open interest, "
        "1 h / 4 h change) and what happened after them: each match's outcomes over "
        "1 h, 4 h and 24 h, and statistics over the matches (win rates, averages). "
        "The state is computed by the daemon; you only name the product. Use it to "
        "ground a decision in history; it says which value is missing when the "
        "state cannot be built."
    ),
    request=PatternsRequest,
    run=query_similar_patterns,
    timeout_seconds=30.0,
)
